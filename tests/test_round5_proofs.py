"""Issue 71 (release integrity, round 5), items 3, 5 and 6 and the suite's
gaps, tried as an attacker who can write beside --output (or edit the
dataset's Variable) would, locally and on the GCS emulator.

3. Phase 1's DP outputs (``--covariance auto``) went through
   ``<staging>/phase1.json`` unauthenticated: replaced between its write
   and its read, the attacker's counts and centre steered phase 2 and were
   published. The file now carries a tag under a key derived from the
   run's secret in the worker that writes it.
5. ``LATEST.json`` is written only with the store's record of the run
   (``deploy.publish`` needs ``--budget-store``/``--dataset-id``) and
   names it; ``load_latest(budget_store=...)`` checks the pinned digest
   against the store.
6. "Already published" comes from the store's record, never from the
   folder: a manifest planted at --output naming the coming run id is
   refused in one line (no store: nothing can prove it), and a staged
   folder planted under the run id is set aside, not obeyed.
Gaps: the record key never travels in the pickled job graph; image runs
pin the images' label feature; extra files in the version folder before
the switch are refused.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
from apache_beam.io.filesystems import FileSystems

from dpsynth.pipelines import graph, job_plan
from dpsynth.pipelines.release import protocol
from dpsynth.pipelines.budget import record
from dpsynth.pipelines.budget import store as bs
from dpsynth.pipelines.release import publisher, reading, release

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gcs_emulator import gcs, gcs_server  # noqa: E402,F401  (fixtures)
from test_release_integrity import (_data, _generate,  # noqa: E402
                                    _one_line_error, _put)
from test_written_digests import (RUN, _everything_under, _store,  # noqa: E402
                                  _where)


def _no_staging_left(out: str) -> None:
    assert release.staging_folders(out, RUN) == {}


# ------------------------------- 3. phase 1's DP outputs, authenticated

FAKE_COUNTS = [123456.0, 654321.0]


@pytest.mark.parametrize("where", ["local", "gcs"])
@pytest.mark.parametrize("form", ["plain", "tagged"])
def test_phase1_replaced_before_its_read_is_never_published(
        monkeypatch, tmp_path, capsys, request, where, form):
    """The attacker rewrites phase1.json between the phase-1 pipeline's
    write and the launcher's read: as the old plain document, and with a
    tag they made up."""
    data = _data(tmp_path)
    out, store = _where(tmp_path, request, where)
    real = graph.read_phase1
    replaced: list = []

    def attacked(path, *args):
        doc = {"centre": [0.0] * 8, "noisy_counts": FAKE_COUNTS}
        body = doc if form == "plain" else {"doc": doc,
                                            "hmac_sha256": "0" * 64}
        folder, name = path.rsplit("/", 1)
        _put(folder, name, json.dumps(body).encode())
        replaced.append(path)
        return real(path, *args)
    monkeypatch.setattr(graph, "read_phase1", attacked)
    capsys.readouterr()
    rc = _generate(data, out, *_store(store))
    assert replaced, "the run had no phase 1"
    err = _one_line_error(capsys)
    assert rc == 2 and "phase 1" in err and "not published" in err, err
    assert not release.release_exists(out)
    (entry,) = bs.history(store, "d")
    assert entry["status"] == bs.FAILED  # read data: its spend stays
    _no_staging_left(out)
    assert not any(b"123456" in body for body in _everything_under(out))


def test_phase1_as_written_is_read(tmp_path):
    from dpsynth.dp_ops.noise import SecureNoise
    from dpsynth.transforms import two_phase
    noise, path = SecureNoise(), str(tmp_path / two_phase.PHASE1_FILE)
    two_phase.write_phase1({"centre": [0.5], "noisy_counts": [3.25]}, path,
                          noise)
    key = noise.derived_key(two_phase.PHASE1_PURPOSE)
    centre, counts = two_phase.read_phase1(path, key)
    assert centre.tolist() == [0.5] and counts.tolist() == [3.25]
    with pytest.raises(two_phase.ForgedPhase1):  # another run's key
        two_phase.read_phase1(path, SecureNoise().derived_key(
            two_phase.PHASE1_PURPOSE))
    moved = str(tmp_path / "other.json")  # another launch's file
    os.rename(path, moved)
    with pytest.raises(two_phase.ForgedPhase1):
        two_phase.read_phase1(moved, key)


# ------------------ 6. "already published" is proven, never read from a folder

def _plant_release(out: str, data: Path, run_id: str = RUN) -> dict:
    """A self-consistent release of real input rows, its manifest naming
    the coming run id and ``"private": true``."""
    from test_written_digests import _real_rows
    from dpsynth.transforms import write
    x, y = _real_rows(data)
    root = f"{out}/v-0123456789ab"
    shard = "class0-00000-of-00001.tfrecord"
    _put(root, f"data/{shard}", write.tfrecord_bytes(x[y == 0], 0))
    manifest = {"format": "dpsynth-release/3", "run_id": run_id,
                "root": "v-0123456789ab", "private": True,
                "embedding_dim": int(x.shape[1]),
                "classes": [{"label": 0, "shards": [shard],
                             "samples": int((y == 0).sum())}],
                "files": release.file_digests(root)}
    publisher.write_manifest(out, manifest)
    assert reading.load_release(out)[0].shape[0] == (y == 0).sum()
    return manifest


@pytest.mark.parametrize("where", ["local", "gcs"])
@pytest.mark.parametrize("with_store", [False, True])
def test_a_planted_manifest_naming_the_run_is_not_already_published(
        monkeypatch, tmp_path, capsys, request, where, with_store):
    data = _data(tmp_path)
    out, store = _where(tmp_path, request, where)
    planted = _plant_release(out, data)
    steps: list = []
    monkeypatch.setattr(protocol, "checkpoint", steps.append)
    capsys.readouterr()
    flags = _store(store) if with_store else ["--run-id", RUN]
    rc = _generate(data, out, *flags)
    err = _one_line_error(capsys)
    assert rc == 2 and ("not vouching" in err or "never recorded" in err), err
    assert "nothing to do" not in err
    assert "running" not in steps  # no data read
    if with_store:
        assert bs.history(store, "d") == []  # nothing charged or marked
    assert release.read_manifest(out) == planted  # not ours: untouched
    _no_staging_left(out)


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_a_planted_staging_folder_is_set_aside_not_obeyed(
        tmp_path, capsys, request, where):
    """A complete staged release planted under the predictable run id,
    with a store that never charged it: the run goes on and publishes its
    own draw; the planted folder is never published and is cleaned up."""
    from test_release_integrity import _staged
    data = _data(tmp_path)
    out, store = _where(tmp_path, request, where)
    folder = release.staging_dir(out, RUN, "0123456789abcdef")
    _staged(folder, RUN, "v-0123456789ab")
    rc = _generate(data, out, *_store(store))
    assert rc == 0, capsys.readouterr().err
    manifest = reading.verify_release(out)
    assert manifest["root"] != "v-0123456789ab"
    (entry,) = bs.history(store, "d")
    assert entry["status"] == bs.PUBLISHED
    assert entry["staged"]["manifest_sha256"] == release.manifest_digest(out)
    _no_staging_left(out)
    # The retry the proof is for: the store recorded this release, so a
    # re-run does nothing and spends nothing.
    before = release.manifest_digest(out)
    capsys.readouterr()
    assert _generate(data, out, *_store(store)) == 0
    assert "nothing to do" in capsys.readouterr().err
    assert release.manifest_digest(out) == before
    assert len(bs.history(store, "d")) == 1


@pytest.mark.parametrize("where", ["local", "gcs"])
@pytest.mark.parametrize("with_store", [False, True])
def test_the_staged_manifest_copied_to_output_before_the_switch(
        monkeypatch, tmp_path, request, where, with_store):
    """The attacker copies the staged manifest to --output before the
    switch: it names a version folder nobody filled. The launch still
    places its files: the release loads, and the store's record is true."""
    data = _data(tmp_path)
    out, store = _where(tmp_path, request, where)

    def checkpoint(step):
        if step == "committed":
            (folder,) = release.staging_folders(out, RUN).values()
            with FileSystems.open(release.manifest_path(folder)) as f:
                _put(out, release.MANIFEST, f.read())
    monkeypatch.setattr(protocol, "checkpoint", checkpoint)
    flags = _store(store) if with_store else ["--run-id", RUN]
    assert _generate(data, out, *flags) == 0
    x, _, manifest = reading.load_release(out)
    assert len(x) == manifest["samples_total"] > 0
    if with_store:
        (entry,) = bs.history(store, "d")
        assert entry["status"] == bs.PUBLISHED
        assert entry["staged"]["manifest_sha256"] == \
            release.manifest_digest(out)
    _no_staging_left(out)



# ----------------------------------- 5. LATEST.json carries checkable proof

def _publish_args(out: str, root: str, store: str) -> list[str]:
    return ["--output", out, "--run-id", RUN, "--output-root", root,
            "--budget-store", store, "--dataset-id", "d"]


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_latest_pointed_at_a_self_consistent_copy_is_refused_with_the_store(
        tmp_path, capsys, request, where):
    from dpsynth.deploy import publish
    data = _data(tmp_path)
    out, store = _where(tmp_path, request, where)
    root = out.rsplit("/", 1)[0]
    assert _generate(data, out, *_store(store)) == 0
    capsys.readouterr()
    assert publish.main(_publish_args(out, root, store)) == 0
    latest = json.loads(capsys.readouterr().out)
    assert (latest["budget_store"], latest["dataset_id"]) == (store, "d")
    x, _, _ = reading.load_latest(root, budget_store=store, dataset_id="d")
    assert len(x) > 0
    # The attacker's copy: real rows, "private": true, self-consistent,
    # and LATEST.json rewritten to pin it (naming the run and the store).
    fake = root + "/fake"
    _plant_release(fake, data)
    with FileSystems.open(f"{root}/LATEST.json") as f:
        doc = json.loads(f.read())
    doc.update(release=fake, manifest_sha256=release.manifest_digest(fake))
    _put(root, "LATEST.json", json.dumps(doc).encode())
    reading.load_latest(root)  # unchecked: what a reader without the store gets
    reads: list = []
    real_blocks = reading._all_blocks
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reading, "_all_blocks",
                      lambda *a, **k: reads.append(a) or real_blocks(*a, **k))
        with pytest.raises(release.ReleaseChanged,
                           match="never recorded") as err:
            reading.load_latest(root, budget_store=store, dataset_id="d")
    assert "\n" not in str(err.value) and reads == []  # before any row


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_publish_without_the_store_of_a_release_made_with_one_is_refused(
        tmp_path, capsys, request, where):
    """Round 5's report: a self-consistent rewrite of a release made with
    a store, then ``deploy.publish`` without --budget-store/--dataset-id."""
    from dpsynth.deploy import publish
    from test_written_digests import _rewrite_published
    data = _data(tmp_path)
    out, store = _where(tmp_path, request, where)
    root = out.rsplit("/", 1)[0]
    assert _generate(data, out, *_store(store)) == 0
    _rewrite_published(out, data)  # checks out on its own
    args = _publish_args(out, root, store)[:6]  # no store flags
    for attempt in ("rewritten", "as made"):
        capsys.readouterr()
        assert publish.main(args) == 1, attempt
        err = capsys.readouterr().err.strip()
        assert "--budget-store" in err and "\n" not in err, err
        assert not FileSystems.exists(f"{root}/LATEST.json")
    assert publish.main(_publish_args(out, root, store)) == 1  # the record


# --------------------- gap: the record's key never travels in the job graph

def _graph_only(monkeypatch) -> None:
    """``pipeline_run`` builds the graph and serialises it as a runner
    does (every DoFn pickled), runs nothing; phase 1's result is a
    stand-in (no file is written)."""
    import contextlib

    import apache_beam as beam

    @contextlib.contextmanager
    def built(options):
        p = beam.Pipeline()
        yield p
        p.to_runner_api()
    monkeypatch.setattr(graph, "pipeline_run", built)
    monkeypatch.setattr(graph, "read_phase1", lambda path, key: (
        np.zeros(4), np.array([100.0, 100.0])))
    monkeypatch.setattr(FileSystems, "delete", lambda paths: None)


@pytest.mark.parametrize("covariance", ["shared", "auto"])
def test_the_record_key_never_travels_in_the_job_graph(tmp_path, monkeypatch,
                                                       covariance):
    """With --noise-key-location the graph holds the key object's URI;
    neither the noise key nor any key derived from it (the writers'
    record key, phase 1's tag key) may be pickled with it: whoever reads
    the job description could then forge the record of the staged files
    (or phase 1's counts)."""
    import apache_beam as beam

    from dpsynth.pipelines.cli import generate
    from dpsynth.transforms import digests, two_phase
    from test_noise_key_location import pickled_payloads
    data = _data(tmp_path)
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    args, _ = job_parser().parse_known_args(
        ["generate", "--input", str(data), "--num-classes", "2", "--output",
         str(tmp_path / "out"), "--noise-key-location", str(keys),
         "--covariance", covariance])
    spec = generate.spec_from_args(args)
    j = job_plan.prepare(spec)
    assert (j.adaptive_mu is None) == (covariance == "shared")
    secrets = [j.noise.export_key(), j.noise.derived_key(digests.PURPOSE),
               j.noise.derived_key(two_phase.PHASE1_PURPOSE)]
    uri = graph.store_noise_key(j, spec).encode()
    blobs = pickled_payloads(monkeypatch)
    _graph_only(monkeypatch)
    reader = job_plan.make_reader(j, spec)
    if j.adaptive_mu is None:
        with graph.pipeline_run(None) as p:
            graph.build(p, j, reader, spec)
    else:
        _, counts = graph.run_phase1(j, reader, None)
        graph.choose_phase2(j, reader.dim, counts)
        with graph.pipeline_run(None) as p:
            graph.build_adaptive(p, j, job_plan.make_reader(j, spec), spec,
                                 np.zeros(reader.dim), counts)
    assert any(uri in blob for blob in blobs)  # the reference travels
    for secret in secrets:
        assert not any(secret in blob or secret.hex().encode() in blob
                       for blob in blobs)


def job_parser():
    from dpsynth.pipelines import cli
    return cli.build_parser()


# ------------------- gap: image runs pin the images' own label feature

def _image_spec(tmp_path, store: str, run_id: str, label_feature: str):
    """An API caller's spec: the images' label feature set on
    ``ImageOptions`` (the encoder reads it), ``InputOptions``' left at its
    default (it names the embedding input's, unused here)."""
    import dataclasses

    from dpsynth.pipelines.cli import generate
    args, _ = job_parser().parse_known_args(
        ["generate", "--images", str(tmp_path / "images-*.npz"),
         "--num-classes", "2", "--epsilon", "1", "--run-id", run_id,
         "--output", str(tmp_path / run_id), "--budget-store", store,
         "--dataset-id", "d", "--lifetime-epsilon", "1.2"])
    spec = generate.spec_from_args(args)
    images = dataclasses.replace(spec.input.images,
                                 label_feature=label_feature)
    return dataclasses.replace(spec, input=dataclasses.replace(
        spec.input, images=images, label_feature="label"))


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_an_image_run_pins_the_images_label_feature(tmp_path, request,
                                                   where):
    """The relabelling attack on images: the same image records released
    by their "label" feature and then by "label2" are two views of every
    record; the store must see two rules, not the embedding input's
    (unused) label feature twice."""
    _, store = _where(tmp_path, request, where)
    first = _image_spec(tmp_path, store, "r1", "label")
    second = _image_spec(tmp_path, store, "r2", "label2")
    assert job_plan.label_rule(second, job_plan.prepare(second).cfg)[
        "label_feature"] == "label2"
    j = job_plan.prepare(first)
    job_plan.reserve(j, first)
    doc = bs._backend(store, "d").read()
    assert doc["label_rule"]["label_feature"] == "label"
    with pytest.raises(record.LabelRuleConflict) as err:
        job_plan.reserve(job_plan.prepare(second), second)
    assert "\n" not in str(err.value)
    assert bs._backend(store, "d").read() == doc  # nothing charged


# ------------ gap: files planted in the version folder before the switch

@pytest.mark.parametrize("where", ["local", "gcs"])
def test_a_file_planted_in_the_version_folder_is_never_published(
        monkeypatch, tmp_path, capsys, request, where):
    """The staged manifest names its version folder (readable beside
    --output); the attacker puts a shard of real rows there before the
    switch, where a reader of <version>/data would read it with the
    release."""
    from test_written_digests import _real_rows
    from dpsynth.transforms import write
    data = _data(tmp_path)
    out, store = _where(tmp_path, request, where)
    x, _ = _real_rows(data)
    fake = write.tfrecord_bytes(x[:50], 0)
    planted: list = []

    def checkpoint(step):
        if step == "committed":
            (folder,) = release.staging_folders(out, RUN).values()
            root = release.staged_manifest(folder)["root"]
            _put(f"{out}/{root}", "data/class0-99999-of-99999.tfrecord", fake)
            planted.append(root)
    monkeypatch.setattr(protocol, "checkpoint", checkpoint)
    capsys.readouterr()
    rc = _generate(data, out, *_store(store))
    assert planted, "the attack found no staged manifest"
    err = _one_line_error(capsys)
    assert rc == 2 and "not in the manifest" in err, err
    assert not release.release_exists(out)
    (entry,) = bs.history(store, "d")
    assert entry["status"] == bs.FAILED  # refused, its spend stays
    _no_staging_left(out)
    # Only the planted file is left (not dpsynth's to remove).
    left = FileSystems.match([out.rstrip("/") + "/**"])[0].metadata_list
    assert [m.path.rsplit("/", 1)[-1] for m in left] == [
        "class0-99999-of-99999.tfrecord"]
