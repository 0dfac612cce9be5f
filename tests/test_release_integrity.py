"""Release integrity under an operator's layout (issue 50, items 1-3), tried
as an attacker and as a careless operator would, locally and on the GCS
emulator:

1. a budget store or noise-key location under --output is refused before
   any data is read; publishing removes only the files of the release it
   replaced, never anything else under --output;
2. the manifest lists every file's size and sha256: a staged release whose
   files were swapped (for an --epsilon inf run's), deleted or truncated
   after a crash is not re-published, its attempt stays charged and the
   retry is a new, charged attempt; readers check the files too;
3. the manifest switch is conditional: two publishers racing with a slow
   copy never both publish one run id, and the manifest always names one
   complete version folder.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from apache_beam.io.filesystems import FileSystems

from dpsynth.pipelines.budget import store as bs
from dpsynth.pipelines import cli, job
from dpsynth.pipelines.release import protocol, publisher, reading, release
from dpsynth.pipelines.api import (BudgetOptions, GenerateSpec, InputOptions,
                                   OutputOptions, RunOptions)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gcs_emulator import gcs, gcs_server  # noqa: E402,F401  (fixtures)


# The attempt protocol's tests' injected crash and small input.
from tests.test_attempt_ownership import Crash, _data  # noqa: E402


def _generate(data: Path, output: str, *extra: str) -> int:
    return cli.main(["generate", "--input", str(data), "--output", output,
                     "--num-classes", "2", "--accountant", "rdp", *extra])


def _crash_after_commit(monkeypatch, *args) -> None:
    """A launch killed right after its staged release was recorded."""
    def checkpoint(step):
        if step == "committed":
            raise Crash("crash right after commit_staged")
    with monkeypatch.context() as patch:
        patch.setattr(protocol, "checkpoint", checkpoint)
        with pytest.raises(Crash):
            _generate(*args)


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error" in line]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


# ------------------------------------ 1. locations under --output refused

UNDER = [("out", "out/budgets"), ("out/", "out//budgets/"),
         ("out", "elsewhere/../out/b"), ("out", "out"),
         ("out", "out.staging-run@1/b"), ("gs://b/out", "gs://b/out/x"),
         ("gs://b/out/", "gs://b/out//x/"), ("gs://b/out", "gs://b/out"),
         ("gs://b/out", "gs://b/x/../out/y"), ("gs://b/out/../rel", "gs://b/rel/k"),
         ("gs://b/out", "gs://b/out.staging-r@1/k"), ("gs://b", "gs://b/k")]
APART = [("out", "outside"), ("out", "out-budgets"), ("gs://b/out", "gs://b/outx"),
         ("gs://b/out", "gs://c/out/x"), ("out", "gs://b/out/x"),
         ("gs://b/out/x", "gs://b/out")]


@pytest.mark.parametrize("output,path", UNDER)
def test_paths_under_the_output_in_any_spelling(output, path):
    assert release.lies_under(path, output)


@pytest.mark.parametrize("output,path", APART)
def test_paths_beside_the_output(output, path):
    assert not release.lies_under(path, output)


def test_a_link_into_the_output_is_under_it(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "out")
    assert release.lies_under(str(tmp_path / "link" / "budgets"),
                              str(tmp_path / "out"))


def test_a_budget_store_under_output_is_refused_before_reading(tmp_path,
                                                                capsys):
    """The review's repro: the ledger under --output was deleted by the
    first publish and the next run at eps=1 went past the pinned cap."""
    out = str(tmp_path / "out")
    # an input that exists (a missing one is refused even earlier)
    missing = tmp_path / "not-read.npz"
    np.savez(missing, embeddings=np.zeros((4, 3), np.float32),
             labels=np.array([0, 1, 0, 1]))
    rc = _generate(missing, out, "--epsilon", "1", "--budget-store",
                   str(tmp_path / "out" / "budgets"), "--dataset-id", "d",
                   "--lifetime-epsilon", "1.2")
    err = _one_line_error(capsys)
    assert rc == 2 and "--budget-store" in err and "lies under --output" \
        in err, err
    assert not os.path.exists(out)  # nothing written, nothing charged


def test_a_noise_key_location_under_output_is_a_typed_api_error(tmp_path):
    out = tmp_path / "releases" / "out"
    spec = GenerateSpec(
        input=InputOptions(path=str(tmp_path / "not-read.npz"), num_classes=2),
        output=OutputOptions(path=str(out), run_id="r"),
        budget=BudgetOptions(),
        run=RunOptions(noise_key_location=f"{out}/../out/keys"))
    with pytest.raises(release.PathOverlap, match="--noise-key-location"):
        job.run(spec)


def _plant(put, names):
    for name in names:
        put(name, b"the operator's, not dpsynth's")


def test_publishing_removes_only_what_dpsynth_recorded_local(tmp_path):
    data, out = _data(tmp_path), tmp_path / "out"
    store = ["--budget-store", str(tmp_path / "budgets"), "--dataset-id",
             "d", "--lifetime-epsilon", "10", "--epsilon", "1"]
    assert _generate(data, str(out), "--run-id", "a", *store) == 0
    first = release.read_manifest(str(out))["root"]
    planted = ["notes.txt", "mine/keep.txt", f"{first}/operator.txt",
               "v-0123456789ab/theirs.bin"]

    def put(name, body):
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(body)
    _plant(put, planted)
    assert _generate(data, str(out), "--run-id", "a", *store) == 0  # again
    assert _generate(data, str(out), "--run-id", "b", "--overwrite",
                     *store) == 0
    manifest = reading.verify_release(str(out))
    assert manifest["run_id"] == "b"
    for name in planted:
        assert (out / name).read_bytes() == b"the operator's, not dpsynth's"
    # The replaced release's own files are gone, the operator's are not.
    assert sorted(p.name for p in (out / first).rglob("*")) == ["operator.txt"]
    assert bs.history(str(tmp_path / "budgets"), "d")[-1]["status"] == \
        bs.PUBLISHED


def test_publishing_removes_only_what_dpsynth_recorded_gcs(tmp_path, gcs):
    data, out = _data(tmp_path), gcs.uri("releases", "out")
    planted = ["releases/out/notes.txt", "releases/out/mine/keep.txt",
               "releases/out.txt"]
    bucket = gcs.client().bucket(gcs.bucket)
    _plant(lambda n, b: bucket.blob(n).upload_from_string(b), planted)
    store = ["--budget-store", gcs.uri("budgets"), "--dataset-id", "d",
             "--lifetime-epsilon", "10", "--epsilon", "1", "--run-id", "a"]
    assert _generate(data, out, *store) == 0
    assert _generate(data, out, *store) == 0  # a re-run: already published
    assert set(planted) <= set(gcs.names("releases/"))
    reading.verify_release(out)


# ------------------------------------------- 2. every file is verified

def _files(folder: str) -> dict[str, bytes]:
    prefix = folder.rstrip("/") + "/"
    found = FileSystems.match([prefix + "**"])[0].metadata_list
    out = {}
    for m in found:
        with FileSystems.open(m.path) as f:
            out[m.path[len(prefix):]] = f.read()
    return out


def _put(folder: str, name: str, body: bytes) -> None:
    path = release.io.join(folder, name)
    if release.is_local(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    with FileSystems.create(path) as f:
        f.write(body)


def _swap_in(victim: str, donor: str) -> None:
    """The attacker's swap: the victim's staged mixture and shards replaced
    by the donor's (an --epsilon inf run: exact class counts)."""
    old = [n for n in _files(victim) if n.startswith("data/")]
    FileSystems.delete([release.io.join(victim, n) for n in old])
    for name, body in _files(donor).items():
        if name.startswith("data/") or name == "_gmm.npz":
            _put(victim, name, body)


def _swap_after_crash_then_retry(monkeypatch, tmp_path, capsys, out: str,
                                 store: str) -> None:
    data = _data(tmp_path)
    donor = _exact_release(data, str(tmp_path / "inf-out"))
    budget = ["--epsilon", "1", "--run-id", "nightly", "--budget-store",
              store, "--dataset-id", "d", "--lifetime-epsilon", "10"]
    _crash_after_commit(monkeypatch, data, out, *budget)
    (victim,) = release.staging_folders(out, "nightly").values()
    _swap_in(victim, donor)
    capsys.readouterr()

    assert _generate(data, out, *budget) == 2
    err = _one_line_error(capsys)
    assert "not the ones its manifest lists" in err and "new, charged" in err
    assert not release.release_exists(out)
    assert release.staging_folders(out, "nightly") == {}  # removed
    (entry,) = bs.history(store, "d")
    assert entry["status"] == bs.FAILED  # its spend stays

    assert _generate(data, out, *budget) == 0  # a new, charged attempt
    first, second = bs.history(store, "d")
    assert second["attempt"] == 2 and second["status"] == bs.PUBLISHED
    manifest = reading.verify_release(out)
    assert manifest["private"] and _files(
        release.release_root(out))["_gmm.npz"] != _files(donor)["_gmm.npz"]


def test_swapped_staged_files_are_not_republished_local(monkeypatch,
                                                        tmp_path, capsys):
    _swap_after_crash_then_retry(monkeypatch, tmp_path, capsys,
                                 str(tmp_path / "out"), str(tmp_path / "b"))


def test_swapped_staged_files_are_not_republished_gcs(monkeypatch, tmp_path,
                                                      capsys, gcs):
    _swap_after_crash_then_retry(monkeypatch, tmp_path, capsys,
                                 gcs.uri("releases", "out"), gcs.uri("budgets"))


def _exact_release(data: Path, out: str) -> str:
    """The files of an --epsilon inf run (exact class counts): the
    attacker's donor."""
    assert _generate(data, out, "--epsilon", "inf", "--run-id", "exact") == 0
    return release.release_root(out)


def _staged(folder: str, run_id: str, root: str, body: bytes = b"x") -> str:
    """A small staged release (publish-level tests)."""
    for name in ("_gmm.npz", "data/s-0.tfrecord", "data/s-1.tfrecord"):
        _put(folder, name, body + name.encode() * 200)
    publisher.write_manifest(folder, {
        "run_id": run_id, "root": root, "classes": [
            {"label": 0, "shards": ["s-0.tfrecord", "s-1.tfrecord"]}],
        "files": release.file_digests(folder)})
    return folder


def _delete_shard(folder):
    FileSystems.delete([release.io.join(folder, "data/s-1.tfrecord")])


def _truncate(folder):
    body = _files(folder)["data/s-0.tfrecord"]
    _put(folder, "data/s-0.tfrecord", body[:-1])


def _add_shard(folder):
    _put(folder, "data/s-2.tfrecord", b"extra rows")


@pytest.mark.parametrize("tamper", [_delete_shard, _truncate, _add_shard])
def test_a_changed_staged_file_is_never_published(tmp_path, tamper):
    staging = _staged(str(tmp_path / "s"), "r", "v-1")
    tamper(staging)
    with pytest.raises(release.ReleaseChanged, match="manifest lists"):
        publisher.publish(staging, str(tmp_path / "out"))
    assert not release.release_exists(str(tmp_path / "out"))


def test_readers_verify_the_files(tmp_path):
    out = str(tmp_path / "out")
    publisher.publish(_staged(str(tmp_path / "s"), "r", "v-1"), out)
    reading.verify_release(out)
    _truncate(release.release_root(out))
    with pytest.raises(release.ReleaseChanged, match="s-0.tfrecord has"):
        reading.verify_release(out)
    with pytest.raises(release.ReleaseChanged):
        reading.load_release(out)


def test_latest_json_never_points_at_a_changed_release(tmp_path, capsys):
    from dpsynth.deploy import publish
    root = tmp_path / "releases"
    out = str(root / "2026-01-01")
    publisher.publish(_staged(str(tmp_path / "s"), "nightly", "v-1"), out)
    _delete_shard(release.release_root(out))
    assert publish.main(["--output", out, "--run-id", "nightly",
                         "--output-root", str(root)]) == 1
    assert "s-1.tfrecord is missing" in capsys.readouterr().err
    assert not (root / "LATEST.json").exists()


# --------------------------------------- 3. the conditional manifest switch

def _slow_place(monkeypatch, seconds: float = 0.3) -> None:
    real = publisher._place

    def place(sources, targets):
        time.sleep(seconds)  # a slow copy: the other publisher runs now
        real(sources, targets)
    monkeypatch.setattr(publisher, "_place", place)


def _race(stagings: list[str], output: str, overwrite: bool) -> list:
    """Publishes the staged releases at once; returns each one's outcome
    (the manifest, or the error) and every root a reader saw meanwhile."""
    outcomes: list = [None] * len(stagings)
    seen: set = set()
    done = threading.Event()

    def publish(i):
        try:
            outcomes[i] = publisher.publish(stagings[i], output, overwrite)
        except release.ReleaseError as err:
            outcomes[i] = err

    def root():
        try:
            return release.read_manifest(output)["root"]
        except release.ReleaseError:
            return None  # no release yet

    def watch():
        while not done.is_set():
            time.sleep(0.005)  # a reader polling, not a busy loop
            before = root()
            if before is None:
                continue
            try:
                reading.verify_release(output)
                seen.add(before)
            except Exception as err:  # noqa: BLE001  (a file went away)
                if root() == before:  # named all along, and not whole
                    seen.add(f"incomplete: {err}")
    threads = [threading.Thread(target=publish, args=(i,))
               for i in range(len(stagings))]
    watcher = threading.Thread(target=watch)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    watcher.join()
    return outcomes, seen


def _two_launches_of_one_run_id(monkeypatch, base: str, tries: int) -> None:
    _slow_place(monkeypatch)
    for i in range(tries):
        output = f"{base}/out-{i}"
        stagings = [_staged(release.staging_dir(output, "r", f"t{k}"), "r",
                            f"v-{i}{k}", body=f"draw {k}".encode())
                    for k in range(2)]
        outcomes, seen = _race(stagings, output, overwrite=False)
        won = [o for o in outcomes if isinstance(o, dict)]
        lost = [o for o in outcomes if isinstance(o, Exception)]
        assert len(won) == 1 and len(lost) == 1, outcomes
        assert "one run id has one release" in str(lost[0])
        assert seen <= {won[0]["root"]}, seen  # one release, always whole
        assert reading.verify_release(output)["root"] == won[0]["root"]
        loser = ({f"v-{i}0", f"v-{i}1"} - {won[0]["root"]}).pop()
        assert not FileSystems.match([f"{output}/{loser}/**"])[0] \
            .metadata_list  # the loser removed what it had placed


def test_two_launches_of_one_run_id_race_local(monkeypatch, tmp_path):
    _two_launches_of_one_run_id(monkeypatch, str(tmp_path), tries=5)


def test_two_launches_of_one_run_id_race_gcs(monkeypatch, gcs):
    _two_launches_of_one_run_id(monkeypatch, gcs.uri("rel"), tries=5)


def _two_run_ids_overwrite(monkeypatch, base: str, tries: int) -> None:
    _slow_place(monkeypatch)
    for i in range(tries):
        output = f"{base}/out-{i}"
        publisher.publish(_staged(f"{base}/p-{i}", "old", f"v-old{i}"), output)
        stagings = [_staged(f"{base}/s-{i}-{k}", f"run-{k}", f"v-{i}{k}",
                            body=f"run {k}".encode()) for k in range(2)]
        outcomes, seen = _race(stagings, output, overwrite=True)
        assert any(isinstance(o, dict) for o in outcomes), outcomes
        final = reading.verify_release(output)["root"]
        assert not [s for s in seen if s.startswith("incomplete")], seen
        # Only the final release's files remain.
        names = [m.path[len(output) + 1:] for m in
                 FileSystems.match([f"{output}/**"])[0].metadata_list]
        left = {n.split("/")[0] for n in names if n.startswith("v-")}
        assert left == {final}, left


def test_two_run_ids_with_overwrite_race_local(monkeypatch, tmp_path):
    _two_run_ids_overwrite(monkeypatch, str(tmp_path), tries=5)


def test_two_run_ids_with_overwrite_race_gcs(monkeypatch, gcs):
    _two_run_ids_overwrite(monkeypatch, gcs.uri("rel"), tries=5)


def test_the_losing_launch_exits_2_with_one_line(monkeypatch, tmp_path,
                                                 capsys):
    """A launch of run "nightly" without a store, while another launch of
    that run id publishes its own draw (it holds the switch meanwhile)."""
    data, out = _data(tmp_path), str(tmp_path / "out")
    rival = _staged(str(tmp_path / "rival"), "nightly", "v-rival")
    real, placing = publisher._place, threading.Event()

    def place(sources, targets):
        if rival in sources[0]:
            placing.set()
            time.sleep(1.0)
        real(sources, targets)
    monkeypatch.setattr(publisher, "_place", place)
    other = threading.Thread(target=publisher.publish, args=(rival, out))

    def checkpoint(step):
        if step == "committed":  # ours is staged: the rival switches now
            other.start()
            placing.wait()
    monkeypatch.setattr(protocol, "checkpoint", checkpoint)
    capsys.readouterr()
    rc = _generate(data, out, "--run-id", "nightly")
    other.join()
    err = _one_line_error(capsys)
    assert rc == 2 and "one run id has one release" in err, err
    assert reading.verify_release(out)["root"] == "v-rival"
    assert sorted(os.listdir(out)) == ["_manifest.json", "v-rival"]
