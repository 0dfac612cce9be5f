"""Each release file's size and sha256, taken by the process that wrote it.

The staged manifest's ``files`` (every file's size and sha256, which every
later check compares the files against) must not come from reading the
files back: someone who can write beside ``--output`` could rewrite a
staged shard (say, with real input rows of the same size) after its writer
finished and before it was read, and the rewritten bytes would then be
listed, checked and published as the release. So each writer hashes the
buffers it hands to the file (``DigestingFile``), the digests travel with
the pipeline's elements to the step that writes the summary, and that step
writes one record of every file (``put_record``) for the launcher.

The record lies in the staging folder, where the same person could rewrite
it too, so it is authenticated: an HMAC-SHA-256 under a secret of the run
(``NoiseSource.derived_key(PURPOSE)``, derived from the noise key, so it
reaches the workers exactly as that key does and is never written beside
the release) over the staging folder's name (one launch's own: a record of
another launch does not verify) and the files. The launcher reads the
record once (``read_record``), refuses it unless the tag verifies
(``ForgedRecord``), deletes it and builds the staged manifest from it.
Writers are deterministic (public sampling streams, keyed noise), so a
re-executed bundle writes the same bytes and reports the same digest; two
different digests for one file are refused where the record is written.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Iterable, Mapping

from apache_beam.io.filesystems import FileSystems

from dpsynth.transforms import io

RECORD = "_file_digests.json"  # in the staging folder; never published
PURPOSE = "release-file-digests/v1"
_FORMAT = "dpsynth-file-digests/1"


class ForgedRecord(RuntimeError):
    """The writers' digest record is missing, unreadable or not
    authenticated by this run's secret: its files cannot be trusted."""


class DigestingFile:
    """A binary file being written (``f``) that keeps the size and sha256
    of exactly the buffers written through it."""

    def __init__(self, f) -> None:
        self._f = f
        self._sha256 = hashlib.sha256()
        self.size = 0

    def write(self, data) -> int:
        view = memoryview(data)  # numpy rows, bytes, Arrow buffers
        if not view.nbytes:  # an empty shard's rows: nothing to write
            return 0
        view = view.cast("B")
        self._sha256.update(view)
        self._f.write(view)
        self.size += view.nbytes
        return view.nbytes

    def digest(self) -> dict:
        return {"bytes": self.size, "sha256": self._sha256.hexdigest()}

    def __getattr__(self, name: str):  # tell, flush, closed (pyarrow asks)
        return getattr(self._f, name)


def put(path: str, data: bytes) -> dict:
    """Writes ``data`` at ``path``; its size and sha256 (of ``data``)."""
    with FileSystems.create(path) as f:
        out = DigestingFile(f)
        out.write(data)
    return out.digest()


def merge(entries: Iterable[tuple[str, dict]]) -> dict:
    """name -> digest; one name reported twice with different digests (a
    runner delivering two different writes of one file) is refused."""
    files: dict = {}
    for name, digest in entries:
        if files.setdefault(name, digest) != digest:
            raise ForgedRecord(f"{name} was written twice with different "
                               "bytes; its release cannot be trusted")
    return dict(sorted(files.items()))


def _tag(key: bytes, staging: str, files: Mapping[str, dict]) -> str:
    body = json.dumps({"staging": staging, "files": files}, sort_keys=True,
                      separators=(",", ":")).encode()
    return hmac.new(key, body, "sha256").hexdigest()


def put_record(staging: str, files: Mapping[str, dict], key: bytes) -> None:
    record = {"format": _FORMAT, "files": dict(files),
              "hmac_sha256": _tag(key, staging, files)}
    with FileSystems.create(io.join(staging, RECORD)) as f:
        f.write(json.dumps(record, sort_keys=True).encode())


def read_record(staging: str, key: bytes) -> dict:
    """The writers' name -> {"bytes", "sha256"} of ``staging``, after
    checking the record's tag; ``ForgedRecord`` otherwise
    (``FileNotFoundError``: no record at all, as when the folder was
    removed under the launch)."""
    path = io.join(staging, RECORD)
    if not FileSystems.exists(path):  # another launch cleaned staging up?
        raise FileNotFoundError(2, "no digest record", path)
    try:
        with FileSystems.open(path) as f:
            record = json.loads(f.read().decode())
        files, tag = record["files"], record["hmac_sha256"]
        ok = (isinstance(files, dict) and isinstance(tag, str)
              and hmac.compare_digest(tag, _tag(key, staging, files)))
    except (OSError, ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        raise ForgedRecord(
            f"{path}: the writers' record of the staged files' digests is "
            "missing or was not written by this run's workers (its tag does "
            "not verify): the staged files cannot be trusted")
    return files


def discard_record(staging: str) -> None:
    path = io.join(staging, RECORD)
    if FileSystems.exists(path):
        FileSystems.delete([path])
