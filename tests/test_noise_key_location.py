"""The noise key stays out of the job graph (``--noise-key-location``):
only a reference is pickled, the workers read the key, the launcher deletes
it after the run, and the draws equal the in-memory key's."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

from dpsynth.dp_ops.noise import KeyedNoise
from dpsynth.pipelines import cli, graph, job_plan
from dpsynth.pipelines.release import protocol
from dpsynth.pipelines.release import release
from tests.conftest import gmm_data
from dpsynth.transforms.keyed_noise import StoredKeyNoise, key_uri, write_key

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gcs_emulator import gcs, gcs_server  # noqa: E402,F401  (fixtures)

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
    from dpsynth.pipelines.cli import generate
    x, y = gmm_data(40, d=4, classes=2)
    np.savez(tmp_path / "in.npz", embeddings=x, labels=y)
    (tmp_path / "keys").mkdir(mode=0o700)  # only ours (issue 58)
    args, _ = cli.build_parser().parse_known_args(
        ["generate", "--input", str(tmp_path / "in.npz"), "--num-classes",
         "2", "--output", str(tmp_path / "out"), "--noise-key-location",
         str(tmp_path / "keys")])
    spec = generate.spec_from_args(args)
    j = job_plan.prepare(spec)
    key = j.noise.export_key()
    uri = graph.store_noise_key(j, spec)
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
    keys.mkdir(mode=0o700)  # only ours (issue 58)
    seen, keys_used = [], []
    real = graph.store_noise_key

    def spy(j, spec):
        keys_used.append(j.noise.export_key())  # the run's real key
        uri = real(j, spec)
        seen.append((uri, Path(uri).exists()))
        return uri
    monkeypatch.setattr(graph, "store_noise_key", spy)
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


# ------------------------------------------- issue 58 item 2: the key's folder

def _argv(tmp_path: Path, keys: str) -> list[str]:
    x, y = gmm_data(60, d=4, classes=2)
    np.savez(tmp_path / "in.npz", embeddings=x, labels=y)
    return ["generate", "--input", str(tmp_path / "in.npz"), "--num-classes",
            "2", "--output", str(tmp_path / "out"), "--noise-key-location",
            keys]


@pytest.mark.parametrize("mode", [0o755, 0o750, 0o705, 0o722, 0o702, 0o777,
                                  0o740])
def test_a_key_folder_others_can_read_or_write_is_refused_before_any_data(
        tmp_path, monkeypatch, capsys, mode):
    """A reviewer pointed the key at a folder they could read, copied the
    key mid-run and removed the noise of every class count: a local key
    folder that group or others may read or write is refused in one line
    (KeyLocationError), before any data is read; nothing is written to it
    and nothing is published."""
    from dpsynth.transforms.keyed_noise import KeyLocationError, check_key_folder
    keys = tmp_path / "keys"
    keys.mkdir()
    keys.chmod(mode)
    with pytest.raises(KeyLocationError) as err:
        check_key_folder(str(keys))
    assert type(err.value) is KeyLocationError and "\n" not in str(err.value)
    steps = []
    monkeypatch.setattr(protocol, "checkpoint", steps.append)
    for location in (str(keys), "file://" + str(keys)):
        assert cli.main(_argv(tmp_path, location)) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and f"{mode:04o}" in lines[0], lines
        assert "--noise-key-location" in lines[0]
    assert steps == []  # no attempt started, no data read
    assert list(keys.iterdir()) == []
    assert (keys.stat().st_mode & 0o777) == mode  # left as it was
    assert not (tmp_path / "out").exists()


def test_a_key_folder_of_another_user_is_refused(tmp_path, capsys):
    import os
    if os.geteuid() != 0:
        pytest.skip("needs root to give a folder to another user")
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    os.chown(keys, 65534, 65534)
    assert cli.main(_argv(tmp_path, str(keys))) == 2
    err = capsys.readouterr().err
    assert "another user" in err and len(err.strip().splitlines()) == 1
    assert list(keys.iterdir()) == []


def test_the_key_file_is_0600_in_a_folder_dpsynth_makes_0700(tmp_path,
                                                             monkeypatch):
    """A missing key folder is created 0700; the key file is created new,
    mode 0600 whatever the umask, and deleted after the run."""
    import os
    import stat
    from dpsynth.transforms import keyed_noise
    keys = tmp_path / "made" / "keys"
    seen = []
    real = keyed_noise.write_key

    def spy(uri, key):
        real(uri, key)
        seen.append(stat.S_IMODE(os.stat(uri).st_mode))
    monkeypatch.setattr(keyed_noise, "write_key", spy)
    old = os.umask(0)  # the most permissive umask
    try:
        assert cli.main(_argv(tmp_path, str(keys))) == 0
    finally:
        os.umask(old)
    assert seen == [0o600]
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    assert list(keys.iterdir()) == []  # deleted after the run


def test_write_key_never_writes_through_an_existing_file_or_link(tmp_path):
    from dpsynth.transforms.keyed_noise import write_key
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    bait = tmp_path / "readable-by-all"
    bait.write_bytes(b"")
    uri = key_uri(str(keys), "run", "owner")
    Path(uri).symlink_to(bait)
    with pytest.raises(OSError):
        write_key(uri, KEY)
    assert bait.read_bytes() == b""
    Path(uri).unlink()
    write_key(uri, KEY)
    with pytest.raises(FileExistsError):
        write_key(uri, KEY)  # an attempt's key is created, never replaced


def test_a_gcs_key_location_is_left_to_the_stores_access_control(gcs):
    """gs:// (emulator): no folder check or mode applies; the key is one
    object written, read back and deleted."""
    from dpsynth.transforms.keyed_noise import (check_key_folder,
                                                delete_key, read_key)
    location = gcs.uri("keys")
    check_key_folder(location)  # nothing to check, nothing created
    uri = key_uri(location, "run", "owner")
    write_key(uri, KEY)
    assert read_key(uri) == KEY
    assert delete_key(uri)
