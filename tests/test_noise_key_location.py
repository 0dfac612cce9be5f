"""The noise key stays out of the job graph (``--noise-key-location``):
only a reference is pickled, the workers read the key, the launcher deletes
it after the run, and the draws equal the in-memory key's."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from dpsynth.dp_ops.noise import KeyedNoise
from dpsynth.pipelines import cli, job, release
from tests.conftest import gmm_data
from dpsynth.transforms.noise import StoredKeyNoise, key_uri, write_key

KEY = bytes(range(32))


def test_only_the_reference_is_pickled_and_draws_are_the_keys(tmp_path):
    uri = key_uri(str(tmp_path), "run", "owner")
    write_key(uri, KEY)
    stored = StoredKeyNoise(uri, KEY)
    blob = pickle.dumps(stored)
    assert KEY not in blob and KEY.hex().encode() not in blob
    worker = pickle.loads(blob)  # what a worker gets
    expected = KeyedNoise(KEY).gaussian(2.0, 50, "class=0/sum")
    np.testing.assert_array_equal(worker.gaussian(2.0, 50, "class=0/sum"),
                                  expected)


def test_the_launcher_gives_the_job_a_reference_not_the_key(tmp_path):
    """What the job's steps pickle after ``store_noise_key`` is the key
    object's URI, never the run's key (the fast check; the run below
    checks every payload a real multi_processing job pickles)."""
    from dpsynth.pipelines import generate
    x, y = gmm_data(40, d=4, classes=2)
    np.savez(tmp_path / "in.npz", embeddings=x, labels=y)
    (tmp_path / "keys").mkdir()
    args, _ = cli.build_parser().parse_known_args(
        ["generate", "--input", str(tmp_path / "in.npz"), "--num-classes",
         "2", "--output", str(tmp_path / "out"), "--noise-key-location",
         str(tmp_path / "keys")])
    spec = generate.spec_from_args(args)
    j = job.prepare(spec)
    key = j.noise.export_key()
    uri = job.store_noise_key(j, spec)
    blob = pickle.dumps(j.noise)
    assert uri.encode() in blob
    assert key not in blob and key.hex().encode() not in blob
    assert Path(uri).read_bytes() == key


def pickled_payloads(monkeypatch) -> list[bytes]:
    """Records the raw pickle of everything Beam pickles into the job
    (its pickler compresses and base64-encodes each payload)."""
    import base64
    import bz2
    import zlib

    from apache_beam.internal import pickler
    lib, blobs = pickler.desired_pickle_lib, []
    real = lib.dumps

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        raw = base64.b64decode(out)
        try:
            blobs.append(zlib.decompress(raw))
        except zlib.error:
            blobs.append(bz2.decompress(raw))
        return out
    monkeypatch.setattr(lib, "dumps", spy)
    return blobs


def test_a_run_with_a_key_location_writes_reads_and_deletes_the_key(
        tmp_path, monkeypatch):
    x, y = gmm_data(300, d=4, classes=2)
    data = tmp_path / "in.npz"
    np.savez(data, embeddings=x, labels=y)
    keys = tmp_path / "keys"
    keys.mkdir()
    seen, keys_used = [], []
    real = job.store_noise_key

    def spy(j, spec):
        keys_used.append(j.noise.export_key())  # the run's real key
        uri = real(j, spec)
        seen.append((uri, Path(uri).exists()))
        return uri
    monkeypatch.setattr(job, "store_noise_key", spy)
    pickled = pickled_payloads(monkeypatch)
    out = str(tmp_path / "out")
    # Worker processes (multi_processing) unpickle the reference and read
    # the key object themselves.
    assert cli.main(["generate", "--input", str(data), "--num-classes", "2",
                     "--output", out, "--noise-key-location", str(keys),
                     "--runner", "DirectRunner", "--direct_num_workers", "2",
                     "--direct_running_mode", "multi_processing"]) == 0
    assert seen and seen[0][1]  # written for the run
    # What the workers receive (every pickled DoFn, read by the worker
    # processes) names the key object and never holds the run's key.
    (key,), uri = keys_used, seen[0][0].encode()
    assert any(uri in blob for blob in pickled)
    assert not any(key in blob or key.hex().encode() in blob
                   for blob in pickled)
    assert list(keys.iterdir()) == []  # and deleted after it
    manifest = release.read_manifest(out)
    assert manifest["samples_total"] > 0 and manifest["private"] is True
    for path in Path(out).rglob("*"):
        if path.is_file():
            assert KEY not in path.read_bytes()
