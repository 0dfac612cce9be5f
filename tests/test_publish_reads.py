"""Issue 60, item 4: the launcher off the data path. Publishing checks every
file against its writer's digest without the launcher re-reading what it
need not: locally each file is hashed once (after the rename that places
it), on GCS not at all (the store's own md5 of each object, compared with
the md5 its writer took of the bytes it wrote: transforms/digests.py).
Tampering is still caught: a same-size rewrite differs in its md5."""

from __future__ import annotations

import base64
import collections
import hashlib
import io as stdio
import sys
from pathlib import Path

import pytest

from dpsynth.pipelines.release import reading, release
from dpsynth.transforms import digests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gcs_emulator import gcs, gcs_server  # noqa: E402,F401  (fixtures)
from test_release_integrity import _data, _files, _generate  # noqa: E402


def _hashed_while(monkeypatch, run) -> collections.Counter:
    """Which files the launcher read and hashed (sha256) while ``run``."""
    seen: collections.Counter = collections.Counter()
    real = release._sha256_all

    def spy(folder, names):
        seen.update(names)
        return real(folder, names)
    monkeypatch.setattr(release, "_sha256_all", spy)
    assert run() == 0
    return seen


def test_a_local_publish_hashes_each_file_once(tmp_path, monkeypatch):
    out = str(tmp_path / "out")
    seen = _hashed_while(monkeypatch,
                         lambda: _generate(_data(tmp_path), out))
    files = release.read_manifest(out)["files"]
    assert any(n.startswith("data/") for n in files)
    assert seen == collections.Counter(list(files))  # each once, no other


def test_a_gcs_publish_reads_no_release_file(tmp_path, monkeypatch, gcs):
    out = gcs.uri("rel", "out")
    seen = _hashed_while(monkeypatch,
                         lambda: _generate(_data(tmp_path), out))
    assert not seen
    files = release.read_manifest(out)["files"]
    for name, body in _files(release.release_root(out)).items():
        md5 = base64.b64encode(hashlib.md5(body).digest()).decode()
        assert files[name]["md5"] == md5  # the writer's, of its bytes
        assert files[name]["sha256"] == hashlib.sha256(body).hexdigest()


def test_a_same_size_rewrite_on_gcs_differs_in_md5(tmp_path, gcs):
    out = gcs.uri("rel", "out")
    assert _generate(_data(tmp_path), out) == 0
    root = release.release_root(out)
    name = next(n for n in _files(root) if n.startswith("data/"))
    body = bytearray(_files(root)[name])
    body[-1] ^= 1  # one bit, the same size
    with release.FileSystems.create(release.io.join(root, name)) as f:
        f.write(bytes(body))
    with pytest.raises(release.ReleaseChanged,
                       match=rf"{name} differs \(md5\)"):
        reading.verify_release(out)


def test_an_object_without_a_stored_md5_is_read(tmp_path, monkeypatch, gcs):
    """A composed object has no md5 in the store: it is hashed instead."""
    out = gcs.uri("rel", "out")
    assert _generate(_data(tmp_path), out) == 0
    root = release.release_root(out)
    stored = release._stored_md5s(root)
    name = next(n for n in stored if n.startswith("data/"))
    stored[name] = (stored[name][0], None)
    monkeypatch.setattr(release, "_stored_md5s", lambda folder: stored)
    seen = _hashed_while(monkeypatch, lambda: reading.verify_release(out)
                         and 0)
    assert seen == collections.Counter([name])


def test_writers_take_an_md5_only_for_the_store():
    data = b"rows" * 1000
    local, remote = stdio.BytesIO(), stdio.BytesIO()
    digests.DigestingFile(local, "/tmp/x").write(data)
    on_gcs = digests.DigestingFile(remote, "gs://b/x")
    on_gcs.write(data)
    assert "md5" not in digests.DigestingFile(local, "/tmp/x").digest()
    assert on_gcs.digest() == {
        "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
        "md5": base64.b64encode(hashlib.md5(data).digest()).decode()}
    assert remote.getvalue() == data
