"""Lifetime budget ledger: accounting, refusal, idempotency, races.

The gs:// variants run against the fake-gcs-server emulator (tests/gcs_emulator.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dpsynth.dp_ops.ledger import Mechanism, PrivacyLedger, compose_epsilon
from dpsynth.pipelines.budget import record
from dpsynth.pipelines.budget import store as bs
from dpsynth.pipelines.budget.storage import _GcsDocument

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gcs_emulator import gcs, gcs_server  # noqa: E402,F401  (fixtures)

REPO = Path(__file__).resolve().parent.parent
DELTA = 1e-5


def release(sigma: float = 3.0, classes: int = 2) -> list[Mechanism]:
    """A small release: per class a count and a sum, plus one global."""
    out = [Mechanism("global/total", "tree", "global", 1.0, 4 * sigma)]
    for c in range(classes):
        out += [Mechanism(f"class={c}/count", "moments", f"class={c}", 1.0,
                          sigma),
                Mechanism(f"class={c}/sum", "moments", f"class={c}", 2.0,
                          2 * sigma, count=2)]
    return out


def eps_of(n_releases: int, sigma: float = 3.0) -> float:
    """Reference: n sequential releases composed directly, worst class."""
    one_class = [m for m in release(sigma) if m.partition in
                 ("global", "class=0")]
    return compose_epsilon(one_class * n_releases, DELTA)


@pytest.fixture(params=["local", "gcs"])
def store(request, tmp_path) -> str:
    if request.param == "local":
        return str(tmp_path / "budgets")
    emulator = request.getfixturevalue("gcs")
    return emulator.uri("budgets")


def test_accounting_is_sequential_across_releases_parallel_across_classes(
        store):
    r1 = bs.reserve(store, "digits", "run-1", release(), 1.0, DELTA,
                    lifetime_epsilon=10, lifetime_delta=DELTA)
    assert not r1.already_spent and r1.status == bs.RESERVED
    # One release: the worst class with the global mechanism, as the ledger.
    ledger = PrivacyLedger(10, DELTA)
    for m in release():
        ledger.register(m)
    assert r1.lifetime_epsilon_spent == pytest.approx(
        ledger.spent_epsilon(), rel=1e-6)
    r2 = bs.reserve(store, "digits", "run-2", release(), 1.0, DELTA, 10, DELTA)
    # Two releases compose sequentially: more than one, less than the sum.
    assert r2.lifetime_epsilon_spent == pytest.approx(eps_of(2), rel=1e-6)
    assert r1.lifetime_epsilon_spent < r2.lifetime_epsilon_spent \
        < 2 * r1.lifetime_epsilon_spent
    # Adding classes (parallel) does not change the worst-class epsilon.
    assert bs.lifetime_spent(store, "digits", DELTA) == pytest.approx(
        eps_of(2), rel=1e-6)
    assert [e["run_id"] for e in bs.history(store, "digits")] == [
        "run-1", "run-2"]
    # Another dataset id has its own budget.
    assert bs.lifetime_spent(store, "other", DELTA) == 0.0


def test_merging_identical_mechanisms_is_exact():
    """Many releases are accounted as fast as one, with the same result."""
    entries = [{"mechanisms": [bs._mechanism_to_dict(m) for m in release()]}
               for _ in range(6)]
    merged = bs._compose(entries, DELTA, "pld")
    assert merged == pytest.approx(eps_of(6), rel=1e-6)
    rdp = bs._compose(entries, DELTA, "rdp")
    assert rdp >= merged * 0.99  # RDP is looser than PLD


def test_refuses_over_the_cap_and_writes_nothing(store):
    cap = (eps_of(1) + eps_of(2)) / 2  # one release fits, two do not
    bs.reserve(store, "digits", "run-1", release(), 1.0, DELTA, cap, DELTA)
    before = bs.history(store, "digits")
    with pytest.raises(bs.BudgetExceeded) as err:
        bs.reserve(store, "digits", "run-2", release(), 1.0, DELTA, cap, DELTA)
    message = str(err.value)
    assert "run-2" in message and "--lifetime-epsilon" in message
    assert "Nothing was run or written" in message
    assert bs.history(store, "digits") == before


def test_refuses_first_release_over_cap_without_creating_the_store(tmp_path):
    store = str(tmp_path / "budgets")
    with pytest.raises(bs.BudgetExceeded):
        bs.reserve(store, "digits", "r", release(), 1.0, DELTA, 0.1, DELTA)
    assert not (tmp_path / "budgets" / "digits.budget.json").exists()
    assert bs.history(store, "digits") == []


def test_retry_before_any_data_was_read_spends_nothing(store):
    cap = eps_of(1) * 1.01
    first = bs.reserve(store, "digits", "nightly-2026-01-01", release(), 1.0,
                       DELTA, cap, DELTA)
    bs.release_failed(first)  # stopped before reading: gives its lease back
    again = bs.reserve(store, "digits", "nightly-2026-01-01", release(), 1.0,
                       DELTA, cap, DELTA)
    assert again.already_spent and again.attempt == first.attempt == 1
    assert again.owner != first.owner  # taken over: the first owns nothing
    with pytest.raises(record.AttemptLost):
        bs.mark_running(first)
    assert again.lifetime_epsilon_spent == pytest.approx(
        first.lifetime_epsilon_spent)
    assert len(bs.history(store, "digits")) == 1
    # Same run id, other configuration: refused, not silently re-spent.
    with pytest.raises(bs.RunConflict, match="different mechanisms"):
        bs.reserve(store, "digits", "nightly-2026-01-01", release(sigma=5.0),
                   1.0, DELTA, None, None)


def test_published_run_id_is_refused(store):
    r = bs.reserve(store, "digits", "n-1", release(), 1.0, DELTA, 10, DELTA)
    bs.mark_running(r)
    bs.commit_staged(r, "gs://out/2026-01-01.staging-n-1@x", "ab" * 32)
    bs.commit(r, "gs://out/2026-01-01")
    bs.commit(r, "gs://out/2026-01-01")  # committing twice is a no-op
    with pytest.raises(bs.RunConflict, match="already published at "
                       "gs://out/2026-01-01"):
        bs.reserve(store, "digits", "n-1", release(), 1.0, DELTA, 10, DELTA)
    with pytest.raises(ValueError, match="published"):
        bs.commit(r, "/releases/other")
    assert len(bs.history(store, "digits")) == 1


def test_retry_after_data_was_read_is_charged_again(store):
    """The crashed attempt read the data (its noise may have been drawn):
    it stays charged, and the retry is a new attempt that must fit too."""
    r = bs.reserve(store, "digits", "run-1", release(), 1.0, DELTA, 10, DELTA)
    bs.mark_running(r)
    bs.release_failed(r)
    (entry,) = bs.history(store, "digits")
    assert entry["status"] == bs.FAILED
    assert bs.lifetime_spent(store, "digits", DELTA) == pytest.approx(
        eps_of(1), rel=1e-6)
    with pytest.raises(bs.BudgetExceeded, match="attempt 2"):
        bs.reserve(store, "digits", "run-1", release(), 1.0, DELTA,
                   eps_of(1) * 1.01, DELTA)
    retry = bs.reserve(store, "digits", "run-1", release(), 1.0, DELTA, 10,
                       DELTA)
    assert not retry.already_spent and retry.attempt == 2
    assert bs.lifetime_spent(store, "digits", DELTA) == pytest.approx(
        eps_of(2), rel=1e-6)


def test_staged_release_is_republished_at_no_new_cost(store):
    r = bs.reserve(store, "digits", "run-1", release(), 1.0, DELTA,
                   eps_of(1) * 1.01, DELTA)
    bs.mark_running(r)
    staged = {"folder": "/releases/1.staging-run-1@" + r.owner,
              "manifest_sha256": "cd" * 32}
    bs.commit_staged(r, **staged)
    bs.release_failed(r)  # e.g. a crash while publishing: stays staged
    again = bs.reserve(store, "digits", "run-1", release(), 1.0, DELTA,
                       eps_of(1) * 1.01, DELTA)
    assert again.already_spent and again.attempt == 1
    assert again.status == bs.STAGED and again.staged == staged
    assert r.owner in bs.run_owners(store, "digits", "run-1")
    with pytest.raises(bs.RunConflict, match="refusing to publish another"):
        bs.commit_staged(again, "/releases/1.staging-run-1@other", "ef" * 32)
    bs.commit_staged(again, **staged)
    bs.commit(again, "/releases/1")
    (entry,) = bs.history(store, "digits")
    assert entry["status"] == bs.PUBLISHED
    with pytest.raises(ValueError, match="published"):
        bs.mark_running(again)


def test_mark_published_finishes_a_crash_after_the_manifest(store):
    r = bs.reserve(store, "digits", "run-1", release(), 1.0, DELTA, 10, DELTA)
    digest = "ab" * 32
    with pytest.raises(ValueError, match="not staged"):
        bs.mark_published(store, "digits", "run-1", "/releases/1", digest)
    bs.mark_running(r)
    bs.commit_staged(r, "/releases/1.staging-run-1@x", digest)
    with pytest.raises(bs.RunConflict, match="digests differ"):
        bs.mark_published(store, "digits", "run-1", "/releases/1", "00" * 32)
    bs.mark_published(store, "digits", "run-1", "/releases/1", digest)
    bs.mark_published(store, "digits", "run-1", "/releases/1", digest)
    (entry,) = bs.history(store, "digits")
    assert entry["status"] == bs.PUBLISHED
    assert entry["release_uri"] == "/releases/1"


def test_bad_inputs_have_clear_errors(tmp_path):
    store = str(tmp_path)
    with pytest.raises(ValueError, match="--dataset-id"):
        bs.reserve(store, "../etc", "r", release(), 1, DELTA, 10, DELTA)
    with pytest.raises(ValueError, match="--lifetime-delta"):
        bs.reserve(store, "d", "r", release(), 1, DELTA, 10, 0.0)
    with pytest.raises(ValueError, match="--lifetime-epsilon"):
        bs.reserve(store, "d", "r", release(), 1, DELTA, -1, DELTA)
    with pytest.raises(ValueError, match="only local paths and gs://"):
        bs.reserve("s3://bucket/x", "d", "r", release(), 1, DELTA, 10, DELTA)
    (tmp_path / "d.budget.json").write_text("{}")
    with pytest.raises(ValueError, match="not a dpsynth-budget-ledger"):
        bs.history(store, "d")


def test_gcs_compare_and_swap_rechecks_after_a_lost_race(gcs):
    """Deterministic interleaving: another writer commits between our read
    and our write; the CAS fails, we re-read, and the cap now refuses us."""
    store = gcs.uri("budgets")
    cap = (eps_of(1) + eps_of(2)) / 2
    doc = _GcsDocument(bs._document_uri(store, "digits"))
    original_get = doc._get
    calls = []

    def racing_get():
        result = original_get()
        if not calls:  # the other run reserves right after our first read
            bs.reserve(store, "digits", "other", release(), 1.0, DELTA, cap,
                       DELTA)
        calls.append(result[1])
        return result

    doc._get = racing_get
    entry = {"mechanisms": [bs._mechanism_to_dict(m) for m in release()]}

    def update(current, now):
        current = current or bs._new_document("digits")
        spent = bs._compose(current["releases"] + [entry], DELTA, "pld")
        if spent > cap:
            raise bs.BudgetExceeded("over")
        current["releases"].append({**entry, "run_id": "mine"})
        return current

    with pytest.raises(bs.BudgetExceeded):
        doc.transact(update)
    assert calls[0] == 0 and calls[1] > 0  # read twice, second saw "other"
    assert [e["run_id"] for e in bs.history(store, "digits")] == ["other"]


RACER = textwrap.dedent("""
    import json, os, sys, time
    sys.path.insert(0, {repo!r})
    from dpsynth.dp_ops.ledger import Mechanism
    from dpsynth.pipelines.budget import store as bs
    mechs = [Mechanism(**m) for m in json.loads({mechs!r})]
    open({ready!r}, "w").close()
    while not os.path.exists({go!r}):
        time.sleep(0.005)
    try:
        r = bs.reserve({store!r}, "digits", sys.argv[1], mechs, 1.0, {delta!r},
                       {cap!r}, {delta!r})
        print("RESERVED", r.lifetime_epsilon_spent)
    except bs.BudgetExceeded as e:
        print("REFUSED", e)
""")


def race(store: str, tmp_path: Path, env: dict) -> list[str]:
    """Two processes released at the same instant reserve the last budget."""
    cap = (eps_of(1) + eps_of(2)) / 2
    mechs = json.dumps([bs._mechanism_to_dict(m) for m in release()])
    go = tmp_path / "go"
    procs = []
    for i in range(2):
        ready = tmp_path / f"ready-{i}"
        code = RACER.format(repo=str(REPO), mechs=mechs, ready=str(ready),
                            go=str(go), store=store, delta=DELTA, cap=cap)
        procs.append(subprocess.Popen(
            [sys.executable, "-c", code, f"racer-{i}"], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    deadline = time.time() + 60
    while not all((tmp_path / f"ready-{i}").exists() for i in range(2)):
        assert time.time() < deadline, "racers did not start"
        assert all(p.poll() is None for p in procs), procs[0].stderr.read()
        time.sleep(0.01)
    go.touch()
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs.append(out.split()[0])
    return outs


def test_two_processes_race_for_the_last_budget_local(tmp_path):
    store = str(tmp_path / "budgets")
    outs = race(store, tmp_path, dict(os.environ))
    assert sorted(outs) == ["REFUSED", "RESERVED"]
    assert len(bs.history(store, "digits")) == 1


def test_two_processes_race_for_the_last_budget_gcs(gcs, tmp_path):
    store = gcs.uri("budgets")
    bs.reserve(store, "digits", "earlier", release(sigma=40.0), 0.1, DELTA,
               100, DELTA)  # the document exists: racers CAS on a generation
    outs = race(store, tmp_path, gcs.env())
    assert sorted(outs) == ["REFUSED", "RESERVED"]
    assert [e["run_id"] for e in bs.history(store, "digits")][0] == "earlier"
    assert len(bs.history(store, "digits")) == 2


def test_cli_show_and_check(tmp_path):
    store = str(tmp_path / "budgets")
    cap = (eps_of(1) + eps_of(2)) / 2
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"privacy": {"mechanisms": [
        m.to_dict() for m in release()]}}))

    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "dpsynth.pipelines.budget.store", *args],
            cwd=REPO, capture_output=True, text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)})

    common = ["--budget-store", store, "--dataset-id", "digits"]
    ok = cli("check", *common, "--lifetime-epsilon", str(cap),
             "--mechanisms-json", str(manifest))
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["fits"] is True
    bs.reserve(store, "digits", "run-1", release(), 1.0, DELTA, cap, DELTA)
    refused = cli("check", *common, "--lifetime-epsilon", str(cap),
                  "--mechanisms-json", str(manifest))
    assert refused.returncode == 3 and "refusing" in refused.stderr
    same_run = cli("check", *common, "--lifetime-epsilon", str(cap),
                   "--mechanisms-json", str(manifest), "--run-id", "run-1")
    assert same_run.returncode == 0, same_run.stderr  # no data read yet
    (entry,) = bs.history(store, "digits")
    r1 = bs._reservation(store, "digits", entry, False, 0.0, DELTA, 120.0)
    bs.mark_running(r1)
    bs.release_failed(r1)  # crashed after reading: a retry is charged again
    retry = cli("check", *common, "--lifetime-epsilon", str(cap),
                "--mechanisms-json", str(manifest), "--run-id", "run-1")
    assert retry.returncode == 3, retry.stdout
    wider = cli("check", *common, "--lifetime-epsilon", "1000",
                "--epsilon", "1.0", "--num-classes", "3")
    assert wider.returncode == 3 and "pinned" in wider.stderr
    changed = cli("set-cap", *common, "--lifetime-epsilon", "1000",
                  "--lifetime-delta", str(DELTA), "--reason", "new contract")
    assert changed.returncode == 0 and "new contract" in changed.stderr
    planned = cli("check", *common, "--epsilon", "1.0", "--num-classes", "3")
    assert planned.returncode == 0, planned.stderr
    shown = cli("show", *common)
    assert json.loads(shown.stdout)["history"][0]["run_id"] == "run-1"
