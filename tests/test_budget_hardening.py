"""Issue 50 item 6: the budget store and the attempt protocol under a
careless operator and a skewed launcher clock.

* lease times come from the store's clock (a local file's mtime written by
  the store; a GCS object's ``updated``), so a launcher whose clock is 300 s
  fast cannot take over a live owner, nor a slow one wait out a dead one;
* an owner whose attempt was taken over stops at the next pass boundary
  (one line), it does not run the rest of the pipeline;
* an infinite lifetime cap is refused (one line) and the store never writes
  ``Infinity``/``NaN`` into its JSON;
* a SIGKILLed attempt's noise key is removed by the retry; a failed delete
  is reported;
* one line, not a traceback: set-cap with a blank reason, a staged entry of
  an older ledger format, a launch whose staging was cleaned under it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest

from dpsynth.dp_ops.ledger import Mechanism
from dpsynth.pipelines.budget import record, storage
from dpsynth.pipelines.budget import store as bs
from dpsynth.pipelines.budget.lease import Lease
from dpsynth.pipelines.release import protocol, publisher, release
from tests.test_attempt_ownership import _data
from tests.test_attempt_ownership import _generate as generate_nightly

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gcs_emulator import gcs, gcs_server  # noqa: E402,F401  (fixtures)

REPO = Path(__file__).resolve().parent.parent
DELTA = 1e-5


def _mechanisms() -> list[Mechanism]:
    return [Mechanism("class=0/count", "moments", "class=0", 1.0, 3.0)]


@pytest.fixture(params=["local", "gcs"])
def store(request, tmp_path) -> str:
    if request.param == "local":
        return str(tmp_path / "budgets")
    return request.getfixturevalue("gcs").uri("budgets")


def _launcher_clock(monkeypatch, skew: float) -> None:
    """This launcher's clock (what the budget storage would read) is off by
    ``skew`` seconds; the store's clock is not."""
    real = time.time
    fake = types.SimpleNamespace(time=lambda: real() + skew,
                                 sleep=time.sleep, monotonic=time.monotonic)
    monkeypatch.setattr(storage, "time", fake)


# ------------------------------------------------------ the store's clock

def test_a_launcher_300s_fast_does_not_take_over_a_live_owner(
        store, monkeypatch):
    owner = bs.reserve(store, "d", "run", _mechanisms(), 1.0, DELTA, 50,
                       DELTA, owner="owner", lease=120)
    bs.mark_running(owner)
    _launcher_clock(monkeypatch, +300)
    with pytest.raises(record.AttemptInProgress, match="another launch"):
        bs.reserve(store, "d", "run", _mechanisms(), 1.0, DELTA, None, None,
                   owner="fast")
    (entry,) = bs.history(store, "d")
    assert entry["owner"] == "owner" and entry["status"] == bs.RUNNING
    bs.renew(owner)  # the owner still owns it


def test_a_launcher_300s_slow_takes_over_once_the_store_says_expired(
        store, monkeypatch):
    bs.reserve(store, "d", "run", _mechanisms(), 1.0, DELTA, 50, DELTA,
               owner="dead", lease=0.5)
    _launcher_clock(monkeypatch, -300)
    time.sleep(1.0)
    retry = bs.reserve(store, "d", "run", _mechanisms(), 1.0, DELTA, None,
                       None, owner="slow")
    assert retry.owner == "slow" and retry.already_spent  # reserved: free


def test_an_owner_taken_over_stops_at_the_next_pass_boundary(tmp_path):
    store = str(tmp_path / "b")
    zombie = bs.reserve(store, "d", "run", _mechanisms(), 1.0, DELTA, 50,
                        DELTA, owner="zombie", lease=0.3)
    bs.mark_running(zombie)
    time.sleep(0.5)  # SIGSTOPped past its lease
    bs.reserve(store, "d", "run", _mechanisms(), 1.0, DELTA, None, None,
               owner="retry")
    lease = Lease(zombie)
    with pytest.raises(record.AttemptLost, match="taken over"):
        lease.verify()
    assert lease.lost is not None


def _edit(store: str, dataset_id: str, change) -> None:
    """Edits a local store's document by hand (as an operator, or an older
    dpsynth, could)."""
    path = Path(bs._document_uri(store, dataset_id))
    doc = json.loads(path.read_text())
    change(doc["releases"][-1])
    path.write_text(json.dumps(doc))


def _generate(data: Path, output: str, *extra: str) -> int:
    return generate_nightly(data, output, "--epsilon", "1", *extra)


def test_a_launch_taken_over_mid_pipeline_publishes_nothing_in_one_line(
        monkeypatch, tmp_path, capsys):
    """Right after it marked its attempt running, another launch takes it
    over (this one was SIGSTOPped past its lease): it stops at a pass
    boundary, before staging anything, and says so in one line."""
    data, out, store = _data(tmp_path), str(tmp_path / "out"), str(
        tmp_path / "b")
    reached = []

    def checkpoint(step):
        reached.append(step)
        if step == "running":  # its lease ran out while it was stopped
            _edit(store, "patients", lambda e: e.update(lease_until=0))
            bs.reserve(store, "patients", "nightly-1",
                       [bs._mechanism_from_dict(m) for m in
                        bs.history(store, "patients")[0]["mechanisms"]],
                       1.0, DELTA, None, None, owner="retry")

    monkeypatch.setattr(protocol, "checkpoint", checkpoint)
    code = _generate(data, out, "--budget-store", store, "--dataset-id",
                     "patients", "--lifetime-epsilon", "10")
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [l for l in err.splitlines() if "error" in l]
    assert len(lines) == 1 and "taken over" in lines[0], err
    assert "Traceback" not in err
    assert "pipeline-done" not in reached  # it stopped before staging
    assert not release.release_exists(out)
    first, second = bs.history(store, "patients")
    assert first["status"] == bs.ABANDONED  # charged, as the protocol says
    assert second["owner"] == "retry"


def test_a_launch_whose_staging_was_cleaned_under_it_says_so_in_one_line(
        monkeypatch, tmp_path, capsys):
    """Without a store: another launch of the run id published and removed
    this zombie's staging folder while it ran."""
    data, out = _data(tmp_path), str(tmp_path / "out")

    def checkpoint(step):
        if step == "pipeline-done":
            for folder in release.staging_folders(out, "nightly-1").values():
                publisher.discard(folder)

    monkeypatch.setattr(protocol, "checkpoint", checkpoint)
    code = _generate(data, out)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and "lost its files" in err
    assert not release.release_exists(out)


# ------------------------------------------------------ infinite caps

def test_an_infinite_lifetime_cap_is_refused_everywhere(tmp_path, capsys):
    store = str(tmp_path / "b")
    for cap in (float("inf"), float("nan")):
        with pytest.raises(ValueError, match="finite"):
            bs.reserve(store, "d", "run", _mechanisms(), 1.0, DELTA, cap,
                       DELTA)
        with pytest.raises(ValueError, match="finite"):
            bs.set_cap(store, "d", cap, DELTA, "more releases")
    assert not os.path.exists(bs._document_uri(store, "d"))
    with pytest.raises(SystemExit) as stop:  # a flag error: argparse's
        _generate(_data(tmp_path), str(tmp_path / "out"),
                  "--budget-store", store, "--dataset-id", "d",
                  "--lifetime-epsilon", "inf")
    code = stop.value.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "--lifetime-epsilon" in err and "finite" in err


def test_the_store_never_writes_infinity_into_json(tmp_path):
    store = str(tmp_path / "b")
    bs.reserve(store, "d", "run", _mechanisms(), 1.0, DELTA, 50, DELTA)
    before = Path(bs._document_uri(store, "d")).read_text()

    def poison(doc, now):
        doc["lifetime_cap"]["epsilon"] = float("inf")
        return doc

    with pytest.raises(ValueError):
        bs._transact(store, "d", poison)
    text = Path(bs._document_uri(store, "d")).read_text()
    assert text == before and "Infinity" not in text
    json.loads(text, parse_constant=lambda c: pytest.fail(c))


def _budget_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dpsynth.pipelines.budget.store", *args],
        cwd=REPO, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.parametrize("cap, reason", [("inf", "more releases"),
                                         ("5", "   ")])
def test_set_cap_refuses_inf_and_a_blank_reason_in_one_line(tmp_path, cap,
                                                            reason):
    proc = _budget_cli("set-cap", "--budget-store", str(tmp_path / "b"),
                       "--dataset-id", "d", "--lifetime-epsilon", cap,
                       "--lifetime-delta", str(DELTA), "--reason", reason)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert ("finite" if cap == "inf" else "reason") in proc.stderr
    assert not (tmp_path / "b" / "d.budget.json").exists()


# ---------------------------------------------- an older ledger format

def test_a_staged_entry_of_an_older_format_is_refused_in_one_line(tmp_path):
    store = str(tmp_path / "b")
    bs.reserve(store, "d", "run", _mechanisms(), 1.0, DELTA, 50, DELTA,
               owner="old", lease=0.1)

    def old_format(entry):  # as an older dpsynth recorded a staging
        entry.update(status=bs.STAGED, lease_until=0)
        entry.pop("staged", None)

    _edit(store, "d", old_format)
    with pytest.raises(bs.RunConflict) as err:
        bs.reserve(store, "d", "run", _mechanisms(), 1.0, DELTA, None, None)
    assert "older ledger format" in str(err.value)
    assert "\n" not in str(err.value)


# ------------------------------------------------------ noise keys

KILLED = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {repo!r})
    from dpsynth.pipelines import cli, job
    from dpsynth.pipelines.release import protocol

    def checkpoint(step):
        if step == "running":  # its key is written: SIGKILL, no cleanup
            os.kill(os.getpid(), signal.SIGKILL)

    protocol.checkpoint = checkpoint
    cli.main({argv!r})
""")


def test_a_retry_removes_the_noise_key_a_sigkilled_attempt_left(tmp_path):
    data, keys = _data(tmp_path), tmp_path / "keys"
    keys.mkdir(mode=0o700)  # only ours (issue 58)
    argv = ["generate", "--input", str(data), "--output",
            str(tmp_path / "out"), "--num-classes", "2", "--epsilon", "1",
            "--run-id", "nightly-1", "--budget-store", str(tmp_path / "b"),
            "--dataset-id", "patients", "--lifetime-epsilon", "10",
            "--noise-key-location", str(keys)]
    env = {**os.environ, "PYTHONPATH": str(REPO),
           "DPSYNTH_LEASE_SECONDS": "1"}
    killed = subprocess.run(
        [sys.executable, "-c", KILLED.format(repo=str(REPO), argv=argv)],
        env=env, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr
    (left,) = os.listdir(keys)  # the killed attempt's key stayed
    time.sleep(1.5)  # its lease runs out
    retry = subprocess.run([sys.executable, "-m", "dpsynth.pipelines.cli",
                            *argv], env=env, capture_output=True, text=True,
                           timeout=300)
    assert retry.returncode == 0, retry.stderr
    assert os.listdir(keys) == [], left
    first, second = bs.history(str(tmp_path / "b"), "patients")
    assert first["status"] == bs.ABANDONED  # settled, and charged
    assert second["status"] == bs.PUBLISHED


def test_a_failed_key_delete_is_reported_in_one_line(tmp_path, monkeypatch,
                                                     caplog):
    from apache_beam.io.filesystems import FileSystems

    from dpsynth.transforms import keyed_noise
    key = tmp_path / "dpsynth-noise-key-run-x"
    key.write_bytes(os.urandom(32))

    def refuse(paths):
        raise PermissionError("403 storage.objects.delete denied\nmore")

    monkeypatch.setattr(FileSystems, "delete", staticmethod(refuse))
    with caplog.at_level("WARNING", logger="dpsynth"):
        assert keyed_noise.delete_key(str(key)) is False
    (record,) = [r for r in caplog.records if r.name == "dpsynth"]
    assert str(key) in record.getMessage()
    assert "\n" not in record.getMessage()
    assert keyed_noise.delete_key(str(tmp_path / "never-written")) is True
