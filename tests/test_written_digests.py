"""Issue 58 (items 1, 4, 5, 6): the proof of a release's bytes comes from
the process that made them, tried as an attacker who can write beside
--output would, locally and on the GCS emulator.

1. Shards rewritten (same size, real input rows) after the writers finished
   and before the launcher hashed them were published as private: the
   staged manifest's digests now come from the writers' buffers, through
   a record the attacker cannot forge (``transforms/digests.py``), and the
   store records the digest of the manifest bytes the launcher wrote.
4. Without a store, a retry re-published a staged folder someone rewrote
   (shards and the manifest's ``files`` together): it now draws again.
5. ``deploy.publish`` with the run's store accepts only the manifest the
   store recorded for the run.
6. Placed files were hard links of staged ones: a write into a staged file
   rewrote the live release. Local placement is now a rename.
Plus the suite's gaps: same-size content changes (a flipped byte, a
``_gmm.npz`` of the same shapes) refused by publish, verify and the
readers, and the gs:// conditional manifest write tested directly.
"""

from __future__ import annotations

import hashlib
import io as stdio
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from apache_beam.io.filesystems import FileSystems

from dpsynth.pipelines.budget import store as bs
from dpsynth.pipelines.release import protocol, publisher, reading, release
from dpsynth.transforms import digests, write

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gcs_emulator import gcs, gcs_server  # noqa: E402,F401  (fixtures)
from test_release_integrity import (_data, _files, _generate,  # noqa: E402
                                    _one_line_error, _put, _staged)

RUN = "nightly"


def _where(tmp_path, request, where: str) -> tuple[str, str]:
    """(--output, --budget-store) locally or on the emulator."""
    if where == "local":
        return str(tmp_path / "out"), str(tmp_path / "budgets")
    emulator = request.getfixturevalue("gcs")
    return emulator.uri("rel", "out"), emulator.uri("budgets")


def _store(store: str) -> list[str]:
    return ["--run-id", RUN, "--epsilon", "1", "--budget-store", store,
            "--dataset-id", "d", "--lifetime-epsilon", "10"]


# ------------------------------------------------------------- the attacker

def _real_rows(data: Path) -> tuple[np.ndarray, np.ndarray]:
    with np.load(data) as f:
        return f["embeddings"].astype(np.float32), f["labels"]


def _rewrite_shards(folder: str, data: Path) -> dict[str, bytes]:
    """Every TFRecord shard under ``folder/data`` rewritten with real input
    rows of its class, the same number of rows: the same size, so only
    the sha256 tells. Returns name -> the attacker's bytes."""
    x, y = _real_rows(data)
    planted = {}
    for name, body in _files(folder).items():
        if not name.startswith("data/"):
            continue
        label = int(name.split("class")[1].split("-")[0])
        per_row = write.record_bytes(x.shape[1], label)
        rows = x[y == label]
        rows = np.resize(rows, (len(body) // per_row, x.shape[1]))
        fake = write.tfrecord_bytes(rows, label)
        assert len(fake) == len(body) and fake != body
        _put(folder, name, fake)
        planted[name] = fake
    return planted


def _forge_records(folder: str) -> None:
    """Every digest record the attacker can reach made to list the files as
    they are now: the writers' record (its tag kept: the key is the run's
    secret) and the staged manifest's ``files``."""
    record = release.io.join(folder, digests.RECORD)
    if FileSystems.exists(record):
        with FileSystems.open(record) as f:
            doc = json.loads(f.read())
        doc["files"] = release.file_digests(folder)
        doc["files"].pop(digests.RECORD, None)
        _put(folder, digests.RECORD, json.dumps(doc).encode())
    if release.staged_manifest(folder) is not None:
        manifest = release.staged_manifest(folder)
        manifest["files"] = release.file_digests(folder)
        publisher.write_manifest(folder, manifest)


def _attack(output: str, data: Path, planted: dict) -> None:
    for folder in release.staging_folders(output, RUN).values():
        planted.update(_rewrite_shards(folder, data))
        _forge_records(folder)


def _everything_under(output: str) -> list[bytes]:
    found = FileSystems.match([output.rstrip("/") + "/**"])[0].metadata_list
    out = []
    for m in found:
        with FileSystems.open(m.path) as f:
            out.append(f.read())
    return out


# ------------------ 1. shards rewritten between the writers and the publish

STEPS = ["pipeline-done", "staged", "committed", "placing"]


def _attack_at(monkeypatch, steps, output, data, planted) -> None:
    def checkpoint(step):
        if step in steps:
            _attack(output, data, planted)
    monkeypatch.setattr(protocol, "checkpoint", checkpoint)
    if "placing" in steps:  # after the staged check, before the move
        real = publisher._place_all

        def place_all(staging, root, manifest):
            _attack(output, data, planted)
            real(staging, root, manifest)
        monkeypatch.setattr(publisher, "_place_all", place_all)


@pytest.mark.parametrize("where,steps", [
    *[pytest.param("local", [s], id=f"local-{s}") for s in STEPS],
    pytest.param("local", STEPS, id="local-every-step"),
    pytest.param("gcs", STEPS, id="gcs-every-step"),
    pytest.param("gcs", ["pipeline-done"], id="gcs-pipeline-done")])
def test_shards_rewritten_after_the_writers_are_never_published(
        monkeypatch, tmp_path, capsys, request, where, steps):
    data = _data(tmp_path)
    out, store = _where(tmp_path, request, where)
    planted: dict = {}
    _attack_at(monkeypatch, steps, out, data, planted)
    capsys.readouterr()
    rc = _generate(data, out, *_store(store))
    assert planted, "the attack found no staged shard"
    err = _one_line_error(capsys)
    assert rc == 2 and "not published" in err, err
    assert not release.release_exists(out)
    (entry,) = bs.history(store, "d")
    assert entry["status"] == bs.FAILED  # rejected, its spend stays
    assert not set(planted.values()) & set(_everything_under(out))


def test_without_a_store_rewritten_shards_are_never_published(monkeypatch,
                                                              tmp_path,
                                                              capsys):
    data, out = _data(tmp_path), str(tmp_path / "out")
    planted: dict = {}
    _attack_at(monkeypatch, ["pipeline-done"], out, data, planted)
    capsys.readouterr()
    assert _generate(data, out, "--run-id", RUN) == 2
    err = _one_line_error(capsys)
    assert planted and "not written by this run's workers" in err, err
    assert not release.release_exists(out)
    assert release.staging_folders(out, RUN) == {}  # nothing kept


def test_the_store_records_the_manifest_the_launcher_wrote(monkeypatch,
                                                           tmp_path):
    """The digest recorded is of the bytes written, not of a read-back."""
    data, out, store = _data(tmp_path), str(tmp_path / "out"), \
        str(tmp_path / "b")
    written = []
    real = publisher.write_manifest

    def write_manifest(folder, manifest, generation=None):
        digest = real(folder, manifest, generation)
        written.append((folder, digest))
        return digest
    monkeypatch.setattr(publisher, "write_manifest", write_manifest)
    monkeypatch.setattr(release, "file_digests", None)  # never called
    assert _generate(data, out, *_store(store)) == 0
    (entry,) = bs.history(store, "d")
    staged = [d for f, d in written if ".staging-" in f]
    assert entry["staged"]["manifest_sha256"] == staged[0]
    assert release.manifest_digest(out) == staged[0]


def test_the_record_is_bound_to_the_run_key_and_staging_folder(tmp_path):
    files = {"data/a": {"bytes": 3, "sha256": hashlib.sha256(b"abc")
                        .hexdigest()}}
    staging, key = str(tmp_path / "s"), os.urandom(32)
    os.makedirs(staging)
    digests.put_record(staging, files, key)
    assert digests.read_record(staging, key) == files
    with pytest.raises(digests.ForgedRecord):
        digests.read_record(staging, os.urandom(32))  # another run's key
    moved = str(tmp_path / "t")
    os.rename(staging, moved)  # another launch's folder
    with pytest.raises(digests.ForgedRecord):
        digests.read_record(moved, key)
    os.rename(moved, staging)
    record = json.loads(Path(staging, digests.RECORD).read_text())
    record["files"]["data/a"]["sha256"] = "0" * 64
    Path(staging, digests.RECORD).write_text(json.dumps(record))
    with pytest.raises(digests.ForgedRecord):
        digests.read_record(staging, key)


def test_one_file_two_different_writes_is_refused():
    one = {"bytes": 1, "sha256": "a" * 64}
    assert digests.merge([("x", one), ("x", dict(one))]) == {"x": one}
    with pytest.raises(digests.ForgedRecord, match="written twice"):
        digests.merge([("x", one), ("x", {"bytes": 1, "sha256": "b" * 64})])


@pytest.mark.parametrize("fmt", write.OUTPUT_FORMATS)
def test_a_writer_reports_the_digest_of_the_bytes_it_wrote(tmp_path, fmt):
    x = np.random.default_rng(0).normal(size=(250, 4)).astype(np.float32)
    fn = write._WriteShard(str(tmp_path), "embedding", "label", fmt, None)
    for task in write.shard_tasks((6, x), 100):
        for info in fn.process(task):
            body = (tmp_path / write.DATA_DIR / info["shard"]).read_bytes()
            assert info["bytes"] == len(body)
            assert info["sha256"] == hashlib.sha256(body).hexdigest()


def test_the_noise_key_derives_the_record_key_one_way():
    from dpsynth.dp_ops.noise import SeededNoise, SecureNoise
    from dpsynth.transforms.keyed_noise import StoredKeyNoise
    a = SecureNoise()
    assert a.derived_key(digests.PURPOSE) != a.export_key()
    assert a.derived_key(digests.PURPOSE) != SecureNoise().derived_key(
        digests.PURPOSE)
    assert SeededNoise(3).derived_key("x") == SeededNoise(3).derived_key("x")
    stored = StoredKeyNoise("unused", a.export_key())
    assert stored.derived_key(digests.PURPOSE) == a.derived_key(
        digests.PURPOSE)


# -------------------- 4. no store: a rewritten staged folder is drawn again

def _killed_at_committed(monkeypatch, data, out, *extra,
                         cleanup: bool = False) -> None:
    """A launch stopped after staging; ``cleanup`` False: SIGKILLed,
    nothing of its own cleanup runs (no store: no lease to give back)."""
    class Killed(BaseException):
        pass

    def checkpoint(step):
        if step == "committed":
            raise Killed()
    with monkeypatch.context() as patch:
        patch.setattr(protocol, "checkpoint", checkpoint)
        if not cleanup:
            patch.setattr(protocol, "_stop_attempt", lambda *a, **k: None)
        with pytest.raises(Killed):
            _generate(data, out, *extra)


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_without_a_store_a_rewritten_staged_release_is_drawn_again(
        monkeypatch, tmp_path, capsys, request, where):
    data = _data(tmp_path)
    out, _ = _where(tmp_path, request, where)
    _killed_at_committed(monkeypatch, data, out, "--run-id", RUN)
    (folder,) = release.staging_folders(out, RUN).values()
    planted = _rewrite_shards(folder, data)
    _forge_records(folder)  # shards and the manifest's files together
    rewritten = release.staged_manifest(folder)
    release.verify_files(folder, rewritten)  # it checks out on its own
    assert _generate(data, out, "--run-id", RUN) == 0
    published = reading.verify_release(out)
    assert published["root"] != rewritten["root"]  # a fresh draw
    assert not set(planted.values()) & set(_everything_under(out))
    assert release.staging_folders(out, RUN) == {}
    assert "draws again" in capsys.readouterr().err


def test_without_a_store_a_killed_publish_leaves_no_draw_behind(
        monkeypatch, tmp_path):
    """Killed while moving its files: the retry draws again and removes
    the first draw's files from their unpublished version folder."""
    class Killed(BaseException):
        pass
    data, out = _data(tmp_path), str(tmp_path / "out")
    real = publisher._place

    def place(sources, targets):
        real(sources[:1], targets[:1])
        raise Killed()
    with monkeypatch.context() as patch:
        patch.setattr(publisher, "_place", place)
        patch.setattr(publisher, "_remove_unpublished", lambda *a: None)
        patch.setattr(protocol, "_stop_attempt", lambda *a, **k: None)
        with pytest.raises(Killed):
            _generate(data, out, "--run-id", RUN)
    (folder,) = release.staging_folders(out, RUN).values()
    first = release.staged_manifest(folder)["root"]
    assert os.listdir(os.path.join(out, first))  # one file was moved
    assert _generate(data, out, "--run-id", RUN) == 0
    assert sorted(os.listdir(out)) == sorted(
        ["_manifest.json", release.read_manifest(out)["root"]])
    assert release.read_manifest(out)["root"] != first


# ------------- 5. deploy.publish: only the manifest the store recorded

def _rewrite_published(out: str, data: Path) -> dict:
    root = release.release_root(out)
    planted = _rewrite_shards(root, data)
    manifest = release.read_manifest(out)
    manifest["files"] = release.file_digests(root)
    publisher.write_manifest(out, manifest)
    reading.verify_release(out)  # it checks out on its own
    return planted


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_latest_json_pins_only_the_manifest_the_store_recorded(
        tmp_path, capsys, request, where):
    from dpsynth.deploy import publish
    data = _data(tmp_path)
    out, store = _where(tmp_path, request, where)
    root = out.rsplit("/", 1)[0]
    assert _generate(data, out, *_store(store)) == 0
    (entry,) = bs.history(store, "d")
    args = ["--output", out, "--run-id", RUN, "--output-root", root,
            "--budget-store", store, "--dataset-id", "d"]
    capsys.readouterr()
    assert publish.main(args) == 0  # the release as made
    latest = json.loads(capsys.readouterr().out)
    assert latest["manifest_sha256"] == entry["staged"]["manifest_sha256"]
    FileSystems.delete([f"{root}/LATEST.json"])

    _rewrite_published(out, data)
    assert publish.main(args) == 1
    err = capsys.readouterr().err
    assert "not the one budget store" in err and "\n" not in err.strip()
    assert not FileSystems.exists(f"{root}/LATEST.json")
    # A run the store never recorded is refused as well.
    assert publish.main([*args[:2], "--run-id", "other", *args[4:]]) == 1
    assert "recorded no staged or published release" in \
        capsys.readouterr().err


def test_the_recorded_digest_check_is_typed(tmp_path):
    from dpsynth.deploy import publish
    data, out, store = _data(tmp_path), str(tmp_path / "r" / "out"), \
        str(tmp_path / "b")
    assert _generate(data, out, *_store(store)) == 0
    _rewrite_published(out, data)
    with pytest.raises(release.ReleaseChanged):
        publish.summary(out, RUN, store, "d")


def test_publish_flags_go_together(capsys):
    from dpsynth.deploy import publish
    with pytest.raises(SystemExit):
        publish.main(["--output", "o", "--run-id", "r", "--output-root",
                      "x", "--budget-store", "b"])
    assert "go together" in capsys.readouterr().err


def test_the_nightly_dag_passes_the_store_to_publish():
    dag = (Path(__file__).resolve().parent.parent / "deploy" / "airflow"
           / "dpsynth_nightly.py").read_text()
    call = dag.split('"dpsynth.deploy.publish"', 1)[1].split("])", 1)[0]
    assert '"--budget-store"' in call and '"--dataset-id"' in call


# ----------------- 6. a placed file shares no storage with staging

def _parquet_data(out: str) -> str:
    return release.io.join(release.release_root(out), "data")


def test_a_write_into_staging_after_publishing_leaves_the_release(
        monkeypatch, tmp_path):
    """The attacker writes into every staged file at the moment the
    release is published (before the launch removes its staging)."""
    import pandas as pd
    data, out = _data(tmp_path), str(tmp_path / "out")
    x, _ = _real_rows(data)
    seen: list = []

    def checkpoint(step):
        if step == "committed":  # the staged shards' paths
            for folder in release.staging_folders(out, RUN).values():
                seen.extend(Path(folder).rglob("*.parquet"))
        if step == "published":  # written through those paths
            for path in seen:
                path.write_bytes(write.parquet_bytes(x, 0))
    monkeypatch.setattr(protocol, "checkpoint", checkpoint)
    assert _generate(data, out, "--run-id", RUN, "--output-format",
                     "parquet") == 0
    assert seen
    manifest = reading.verify_release(out)  # untouched
    frame = pd.read_parquet(_parquet_data(out))
    assert len(frame) == manifest["samples_total"]
    assert not np.isin(np.stack(frame["embedding"]), x).all(axis=1).any()


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_a_staged_file_rewritten_after_an_api_publish(tmp_path, request,
                                                       where):
    base = (str(tmp_path) if where == "local"
            else request.getfixturevalue("gcs").uri("rel"))
    staging, out = _staged(f"{base}/s", "r", "v-1"), f"{base}/out"
    publisher.publish(staging, out)
    _put(staging, "data/s-0.tfrecord", b"y" * len(
        _files(release.release_root(out))["data/s-0.tfrecord"]))
    reading.verify_release(out)  # the live release is not the staged file


def test_local_publish_moves_no_bytes(tmp_path, monkeypatch):
    staging, out = _staged(str(tmp_path / "s"), "r", "v-1"), \
        str(tmp_path / "out")
    inodes = {n: os.stat(os.path.join(staging, n)).st_ino
              for n in release.staged_manifest(staging)["files"]}
    monkeypatch.setattr(publisher.shutil, "copyfile", None)  # no copy
    publisher.publish(staging, out)
    root = release.release_root(out)
    for name, inode in inodes.items():
        assert os.stat(os.path.join(root, name)).st_ino == inode
        assert not os.path.exists(os.path.join(staging, name))


def test_a_failed_local_publish_puts_the_files_back(tmp_path, monkeypatch):
    """Placing moves the files: a publish that fails before the switch (the
    manifest's write: a full disk) leaves staging whole for a retry and
    nothing in the version folder; the published release is untouched."""
    base = str(tmp_path)
    out = f"{base}/out"
    publisher.publish(_staged(f"{base}/a", "a", "v-1", body=b"A"), out)
    staging = _staged(f"{base}/b", "b", "v-2", body=b"B")
    before = _files(staging)
    real = publisher.write_manifest

    def full_disk(folder, manifest, generation=None):
        if folder == out:
            raise OSError(28, "No space left on device")
        return real(folder, manifest, generation)
    with monkeypatch.context() as patch:
        patch.setattr(publisher, "write_manifest", full_disk)
        with pytest.raises(OSError, match="No space"):
            publisher.publish(staging, out, overwrite=True)
    assert _files(staging) == before  # whole again
    assert not os.path.exists(f"{out}/v-2")
    assert reading.verify_release(out)["run_id"] == "a"
    publisher.publish(staging, out, overwrite=True)  # the retry publishes it
    assert reading.verify_release(out)["run_id"] == "b"


def test_a_killed_publish_is_resumed_from_where_its_files_are(tmp_path):
    """SIGKILLed half-way through the moves: some files in the version
    folder, the rest in staging; the retry gathers them and publishes."""
    staging, out = _staged(str(tmp_path / "s"), "r", "v-1"), \
        str(tmp_path / "out")
    names = sorted(release.staged_manifest(staging)["files"])
    publisher._place([os.path.join(staging, names[0])],
                   [os.path.join(out, "v-1", names[0])])
    manifest = publisher.publish(staging, out)
    assert reading.verify_release(out) == manifest


# ------------------------- gaps: same-size content changes, every reader

def _flip_byte(folder: str, name: str) -> None:
    body = bytearray(_files(folder)[name])
    body[len(body) // 2] ^= 0x01
    _put(folder, name, bytes(body))


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_a_flipped_byte_is_refused_by_publish(tmp_path, request, where):
    base = (str(tmp_path) if where == "local"
            else request.getfixturevalue("gcs").uri("rel"))
    staging, out = _staged(f"{base}/s", "r", "v-1"), f"{base}/out"
    before = _files(staging)
    _flip_byte(staging, "data/s-0.tfrecord")
    with pytest.raises(release.ReleaseChanged, match="differs \\(sha256\\)"):
        publisher.publish(staging, out)
    assert not release.release_exists(out)
    assert not FileSystems.match([f"{out}/v-1/**"])[0].metadata_list
    assert {n: len(b) for n, b in _files(staging).items()} == \
        {n: len(b) for n, b in before.items()}  # only the content changed


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_a_flipped_byte_is_refused_by_verify_and_readers(tmp_path, request,
                                                         where):
    from dpsynth.deploy import publish
    base = (str(tmp_path) if where == "local"
            else request.getfixturevalue("gcs").uri("rel"))
    out = f"{base}/out"
    publisher.publish(_staged(f"{base}/s", "r", "v-1"), out)
    _flip_byte(release.release_root(out), "data/s-1.tfrecord")
    with pytest.raises(release.ReleaseChanged, match="differs \\(sha256\\)"):
        reading.verify_release(out)
    with pytest.raises(release.ReleaseChanged, match="differs \\(sha256\\)"):
        reading.load_release(out)
    with pytest.raises(release.ReleaseChanged):
        publish.summary(out, "r")
    assert not FileSystems.exists(f"{base}/LATEST.json")


def _same_shapes_gmm(body: bytes) -> bytes:
    with np.load(stdio.BytesIO(body)) as f:
        arrays = {k: f[k] for k in f.files}
    for k in arrays:
        if k.endswith("_means"):
            arrays[k] = arrays[k] * 1.5
    buf = stdio.BytesIO()
    np.savez(buf, **arrays)
    fake = buf.getvalue()
    assert len(fake) == len(body) and fake != body
    return fake


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_a_same_shape_gmm_is_refused_everywhere(tmp_path, monkeypatch,
                                                 request, where):
    data = _data(tmp_path)
    out, store = _where(tmp_path, request, where)
    assert _generate(data, out, "--run-id", RUN) == 0
    root = release.release_root(out)
    _put(root, write.GMM_FILE, _same_shapes_gmm(_files(root)[write.GMM_FILE]))
    for read, on_gcs in ((reading.verify_release, "md5"),
                         (reading.load_release, "md5"),
                         (reading.load_gmm, "sha256")):  # of the bytes read
        with pytest.raises(release.ReleaseChanged,
                           match=on_gcs if where == "gcs" else "sha256"):
            read(out)
    # ... and by the publish of a staged release: killed after staging,
    # its mixture swapped, the retry (with a store) refuses it.
    out2 = out + "-2"
    _killed_at_committed(monkeypatch, data, out2, *_store(store),
                         cleanup=True)
    (folder,) = release.staging_folders(out2, RUN).values()
    _put(folder, write.GMM_FILE,
         _same_shapes_gmm(_files(folder)[write.GMM_FILE]))
    assert _generate(data, out2, *_store(store)) == 2
    assert not release.release_exists(out2)
    assert bs.history(store, "d")[-1]["status"] == bs.FAILED


# ---------------------- gap: the gs:// conditional manifest write itself

def test_the_gcs_manifest_write_is_conditional(gcs):
    folder = gcs.uri("rel", "out")
    first = {"run_id": "a", "root": "v-1"}
    publisher.write_manifest(folder, first, generation=0)  # must not exist
    with pytest.raises(release.ManifestMoved):
        publisher.write_manifest(folder, {"run_id": "b"}, generation=0)
    doc, generation = release._gcs_read(release.manifest_path(folder))
    assert doc == first and generation > 0  # the loser changed nothing
    with pytest.raises(release.ManifestMoved):
        publisher.write_manifest(folder, {"run_id": "c"},
                                 generation=generation + 1)  # stale / wrong
    assert release.read_manifest(folder) == first
    second = {"run_id": "d", "root": "v-2"}
    publisher.write_manifest(folder, second, generation=generation)
    doc, newer = release._gcs_read(release.manifest_path(folder))
    assert doc == second and newer != generation
    with pytest.raises(release.ManifestMoved):  # the old generation is gone
        publisher.write_manifest(folder, first, generation=generation)
    assert release.read_manifest(folder) == second
