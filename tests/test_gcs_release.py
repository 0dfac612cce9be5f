"""gs:// I/O against a real GCS emulator (fake-gcs-server on 127.0.0.1).

Covers: google-cloud-storage <-> Beam FileSystems round trip; a real
`python -m dpsynth.pipelines.cli.generate` run that reads its input from gs:// and
publishes its release to gs://; and the atomic publication protocol of
pipelines/release/ (publisher, reading) on an object store (the manifest is the commit point; a
crash at any step leaves no readable release).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gcs_emulator import gcs, gcs_server  # noqa: E402,F401  (fixtures)

REPO = Path(__file__).resolve().parent.parent


def _release_modules():
    """The release room's shared storage, its publisher and its reader."""
    try:
        from dpsynth.pipelines.release import publisher, reading, release
    except ImportError as e:
        pytest.skip(f"dpsynth.pipelines.release.release is not importable yet: {e}")
    return release, publisher, reading


def test_storage_client_and_beam_filesystems_round_trip(gcs):
    from apache_beam.io.filesystems import FileSystems
    gcs.client().bucket(gcs.bucket).blob("in/a.txt").upload_from_string(
        b"written by google-cloud-storage")
    with FileSystems.open(gcs.uri("in/a.txt")) as f:
        assert f.read() == b"written by google-cloud-storage"
    with FileSystems.create(gcs.uri("out/b.bin")) as f:
        f.write(b"\x00written by beam" * 1000)
    blob = gcs.client().bucket(gcs.bucket).get_blob("out/b.bin")
    assert blob.size == 16 * 1000
    matched = FileSystems.match([gcs.uri("**")])[0].metadata_list
    assert sorted(m.path for m in matched) == [gcs.uri("in/a.txt"),
                                               gcs.uri("out/b.bin")]
    FileSystems.rename([gcs.uri("out/b.bin")], [gcs.uri("out/c.bin")])
    assert gcs.names("out/") == ["out/c.bin"]


def test_beam_pipeline_reads_and_writes_gs(gcs):
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    lines = [f"row-{i}" for i in range(50)]
    gcs.client().bucket(gcs.bucket).blob("in/rows.txt").upload_from_string(
        "\n".join(lines))
    with beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner"])) as p:
        _ = (p | beam.io.ReadFromText(gcs.uri("in/rows.txt"))
             | beam.Map(str.upper)
             | beam.io.WriteToText(gcs.uri("out/rows"), num_shards=2))
    names = gcs.names("out/")
    assert len(names) == 2 and all(n.startswith("out/rows-") for n in names)
    got = sorted(line for n in names for line in gcs.client().bucket(
        gcs.bucket).blob(n).download_as_text().splitlines())
    assert got == sorted(s.upper() for s in lines)


def test_npz_ranges_read_the_same_rows_through_gs(gcs, monkeypatch):
    """A stored .npz on gs:// read in byte ranges (zip directory, local
    headers and rows through Beam's GCS reads) holds exactly the rows of
    the whole-file read."""
    for name, value in gcs.env().items():
        monkeypatch.setenv(name, value)
    from dpsynth.transforms import io as dio
    x = np.random.default_rng(0).normal(size=(700, 6)).astype(np.float32)
    y = np.arange(700) % 3
    buf = io.BytesIO()
    np.savez(buf, embeddings=x, labels=y)
    gcs.client().bucket(gcs.bucket).blob("private/r.npz") \
        .upload_from_string(buf.getvalue())
    path = gcs.uri("private/r.npz")
    spec = dio.InputSpec(path, block_size=100, split_bytes=3000)
    ranges = dio.list_ranges(path, spec)
    assert len(ranges) > 4
    blocks = [b for r in ranges for b in dio.read_range_blocks(r, spec)]
    got_x = np.vstack([b[0] for b in blocks])
    np.testing.assert_array_equal(got_x, x.astype(np.float64))
    np.testing.assert_array_equal(np.concatenate([b[1] for b in blocks]), y)


def test_generate_reads_gs_input_and_publishes_gs_release(gcs):
    release, publisher, reading = _release_modules()
    from dpsynth.pipelines import demo
    train, _ = demo.demo_files()
    gcs.client().bucket(gcs.bucket).blob("private/digits-train.npz") \
        .upload_from_filename(train)
    output = gcs.uri("releases/2026-01-01")
    cmd = [sys.executable, "-m", "dpsynth.pipelines.cli.generate",
           "--input", gcs.uri("private/*.npz"), "--num-classes", "10",
           "--epsilon", "2", "--output", output, "--run-id", "gcs-e2e",
           "--runner=DirectRunner"]
    env = gcs.env()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]

    names = gcs.names("releases/")
    final = [n for n in names if n.startswith("releases/2026-01-01/")]
    assert set(names) == set(final), "staging objects left behind"
    assert "releases/2026-01-01/_manifest.json" in final
    x, y, manifest = reading.load_release(output)  # reads through gs://
    root = f"releases/2026-01-01/{manifest['root']}/"
    assert f"{root}_gmm.npz" in final
    shards = [n for n in final if n.startswith(f"{root}data/")]
    assert shards and all(n.rsplit("/", 1)[1].startswith("synthetic-")
                          and n.endswith(".tfrecord") for n in shards)
    assert set(final) == {"releases/2026-01-01/_manifest.json"} | {
        n for n in final if n.startswith(root)}
    assert manifest["run_id"] == "gcs-e2e"
    assert "files" not in manifest["input"]
    assert x.shape[0] == manifest["samples_total"] == len(y) > 0
    assert set(np.unique(y)) <= set(range(10))
    # the shuffled form reads the shards on several threads
    xs, ys = reading.load_release(output, as_="numpy")
    order = np.random.default_rng(0).permutation(len(y))
    np.testing.assert_array_equal(xs, x[order].astype(np.float32))
    np.testing.assert_array_equal(ys, y[order])


# ------------------------------------------------------- atomic publication


def _stage(release, gcs, run: str, shards: int) -> str:
    """A complete staging directory on gs:// (what a run leaves before
    publishing): data shards, gmm.npz, the staged manifest naming them."""
    from apache_beam.io.filesystems import FileSystems

    from dpsynth.pipelines.release import publisher
    staging = release.staging_dir(gcs.uri("rel/final"), run, "t0")
    names = [f"synthetic-{i:05d}-of-{shards:05d}.tfrecord"
             for i in range(shards)]
    for name in names:
        with FileSystems.create(f"{staging}/data/{name}") as f:
            f.write(f"{run}:{name}".encode())
    buf = io.BytesIO()
    np.savez(buf, run=np.array([run]))
    with FileSystems.create(f"{staging}/gmm.npz") as f:
        f.write(buf.getvalue())
    publisher.write_manifest(staging, {
        "run_id": run, "root": f"v-{run}", "embedding_dim": 2,
        "classes": [{"label": 0, "shards": names}],
        "files": release.file_digests(staging)})
    return staging


class Crash(RuntimeError):
    pass


class CopySpy:
    """Wraps FileSystems.copy: records what the final prefix held before each
    copy and, while ``crash_on`` is set, crashes on the copy whose
    destinations include a path ending with it."""

    def __init__(self, monkeypatch, gcs, crash_on=None):
        from apache_beam.io.filesystems import FileSystems
        self.real, self.gcs, self.crash_on = FileSystems.copy, gcs, crash_on
        self.seen: list = []
        monkeypatch.setattr(FileSystems, "copy", staticmethod(self.copy))

    def copy(self, sources, destinations):
        self.seen.append((list(destinations), self.gcs.names("rel/final/")))
        if self.crash_on and any(d.endswith(self.crash_on)
                                 for d in destinations):
            raise Crash(f"simulated crash copying to {destinations}")
        return self.real(sources, destinations)


def test_manifest_is_committed_last_on_gcs(gcs, monkeypatch):
    release, publisher, reading = _release_modules()
    final = gcs.uri("rel/final")
    staging = _stage(release, gcs, "run-a", shards=3)
    seen = CopySpy(monkeypatch, gcs).seen
    before_manifest = []
    real_write = publisher.write_manifest

    def spy_write(folder, doc, *generation):
        before_manifest.append(gcs.names("rel/final/"))
        return real_write(folder, doc, *generation)
    monkeypatch.setattr(publisher, "write_manifest", spy_write)
    publisher.publish(staging, final)

    assert seen and len(before_manifest) == 1
    # neither the manifest nor its pre-format-3 name exists before the data
    assert not {f"rel/final/{release.MANIFEST}",
                f"rel/final/{release.LEGACY_MANIFEST}"} & set(before_manifest[0])
    assert {f"rel/final/v-run-a/data/synthetic-{i:05d}-of-00003.tfrecord"
            for i in range(3)} <= set(before_manifest[0])
    assert release.read_manifest(final)["run_id"] == "run-a"
    assert reading.release_files(final)[0].startswith(
        gcs.uri("rel/final/v-run-a/data/"))


def test_crash_midway_leaves_no_readable_release(gcs, monkeypatch):
    release, publisher, reading = _release_modules()
    final = gcs.uri("rel/final")
    staging = _stage(release, gcs, "run-a", shards=3)
    CopySpy(monkeypatch, gcs, crash_on=".tfrecord")
    with pytest.raises(Crash):
        publisher.publish(staging, final)
    assert not release.release_exists(final)
    with pytest.raises(release.ReleaseError):
        reading.load_release(final)
    assert release.staged_manifest(staging)["run_id"] == "run-a"


def test_crash_while_replacing_keeps_the_old_release_whole(gcs, monkeypatch):
    """The old manifest names the old version folder until the new one is
    complete: readers see the old release or the new, never a mix."""
    release, publisher, reading = _release_modules()
    final = gcs.uri("rel/final")
    publisher.publish(_stage(release, gcs, "run-old", shards=2), final)
    spy = CopySpy(monkeypatch, gcs, crash_on=".tfrecord")
    with pytest.raises(Crash):
        publisher.publish(_stage(release, gcs, "run-new", shards=3), final,
                          overwrite=True)
    assert release.read_manifest(final)["run_id"] == "run-old"
    assert all("v-run-old" in f for f in reading.release_files(final))
    spy.crash_on = None
    publisher.publish(release.staging_dir(final, "run-new", "t0"), final,
                      overwrite=True)
    assert release.read_manifest(final)["run_id"] == "run-new"


def test_republish_after_crash_leaves_no_orphan_objects(gcs, monkeypatch):
    release, publisher, reading = _release_modules()
    final = gcs.uri("rel/final")
    spy = CopySpy(monkeypatch, gcs, crash_on=".tfrecord")
    with pytest.raises(Crash):
        publisher.publish(_stage(release, gcs, "run-crashed", shards=4), final)
    spy.crash_on = None  # the retry runs to completion
    publisher.publish(_stage(release, gcs, "run-retry", shards=2), final)
    manifest = release.read_manifest(final)
    listed = {f"rel/final/v-run-retry/data/{n}" for c in manifest["classes"]
              for n in c["shards"]}
    assert set(gcs.names("rel/final/")) == listed | {
        "rel/final/_manifest.json", "rel/final/v-run-retry/gmm.npz"}


def test_budget_store_document_is_json_on_gcs(gcs):
    """The ledger object is plain JSON readable by any GCS client."""
    from dpsynth.dp_ops.ledger import Mechanism
    from dpsynth.pipelines.budget import store as budget_store
    m = [Mechanism("class=0/count", "moments", "class=0", 1.0, 5.0)]
    budget_store.reserve(gcs.uri("budgets"), "digits", "r1", m, 0.5, 1e-5,
                         5.0, 1e-5)
    blob = gcs.client().bucket(gcs.bucket).get_blob(
        "budgets/digits.budget.json")
    doc = json.loads(blob.download_as_bytes())
    assert doc["releases"][0]["run_id"] == "r1"
    assert doc["releases"][0]["mechanisms"][0]["sigma"] == 5.0
    assert os.environ["STORAGE_EMULATOR_HOST"] == gcs.url
