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

A file written to GCS also gets the md5 of its bytes, in the form the
store reports for every object it holds (``md5Hash``, base64): the store
computes that digest itself from the bytes it keeps (it is read-only
metadata), so a publish or a reader can check every object against its
writer's digest without moving a byte through the launcher. md5 has known
collisions for pairs an attacker makes together, but no second preimage:
nobody can make other bytes with the md5 of bytes a writer made (CRC32C,
the store's other digest, is linear and forgeable, so it is not used).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Iterable, Mapping, Optional

from apache_beam.io.filesystems import FileSystems

from dpsynth.transforms import io

RECORD = "_file_digests.json"  # in the staging folder; never published
FIELDS = ("bytes", "sha256", "md5")  # a file's entry in the manifest
PURPOSE = "release-file-digests/v1"
_FORMAT = "dpsynth-file-digests/1"


class ForgedRecord(RuntimeError):
    """The writers' digest record is missing, unreadable or not
    authenticated by this run's secret: its files cannot be trusted."""


def store_md5(path: str) -> bool:
    """Whether a file at ``path`` also gets an md5: on GCS, whose objects
    carry the md5 the store computed (see the module docstring)."""
    return path.startswith("gs://")


class DigestingFile:
    """A binary file being written (``f``, at ``path``) that keeps the size
    and sha256 (and, on GCS, md5) of exactly the buffers written through
    it."""

    def __init__(self, f, path: str = "") -> None:
        self._f = f
        self._sha256 = hashlib.sha256()
        self._md5 = hashlib.md5(usedforsecurity=False) if store_md5(path) \
            else None
        self.size = 0

    def write(self, data) -> int:
        view = memoryview(data)  # numpy rows, bytes, Arrow buffers
        if not view.nbytes:  # an empty shard's rows: nothing to write
            return 0
        view = view.cast("B")
        self._sha256.update(view)
        if self._md5 is not None:
            self._md5.update(view)
        self._f.write(view)
        self.size += view.nbytes
        return view.nbytes

    def digest(self) -> dict:
        out = {"bytes": self.size, "sha256": self._sha256.hexdigest()}
        if self._md5 is not None:
            out["md5"] = base64.b64encode(self._md5.digest()).decode()
        return out

    def __getattr__(self, name: str):  # tell, flush, closed (pyarrow asks)
        return getattr(self._f, name)


def put(path: str, data: bytes) -> dict:
    """Writes ``data`` at ``path``; its size and sha256 (of ``data``)."""
    with FileSystems.create(path) as f:
        out = DigestingFile(f, path)
        out.write(data)
    return out.digest()


def entry(info: Mapping) -> dict:
    """A file's digest fields out of a writer's report."""
    return {k: info[k] for k in FIELDS if k in info}


def merge(entries: Iterable[tuple[str, dict]]) -> dict:
    """name -> digest; one name reported twice with different digests (a
    runner delivering two different writes of one file) is refused."""
    files: dict = {}
    for name, digest in entries:
        if files.setdefault(name, digest) != digest:
            raise ForgedRecord(f"{name} was written twice with different "
                               "bytes; its release cannot be trusted")
    return dict(sorted(files.items()))


def hmac_tag(key: bytes, signed: Mapping) -> str:
    """HMAC-SHA256 under ``key`` of ``signed`` as canonical JSON: a
    record's payload together with where it belongs (its path or staging
    folder), so a record copied elsewhere does not verify."""
    body = json.dumps(dict(signed), sort_keys=True,
                      separators=(",", ":")).encode()
    return hmac.new(key, body, "sha256").hexdigest()


def tagged_payload(path: str, field: str, key: bytes,
                   where: tuple[str, str]) -> Optional[dict]:
    """The dict under ``field`` of the JSON record at ``path`` when its
    "hmac_sha256" verifies as ``hmac_tag(key, {where[0]: where[1], field:
    payload})``; None when the record is missing, unreadable, malformed or
    forged (the callers raise their own refusal)."""
    try:
        with FileSystems.open(path) as f:
            record = json.loads(f.read().decode())
        payload, tag = record[field], record["hmac_sha256"]
        signed = {where[0]: where[1], field: payload}
        if (isinstance(payload, dict) and isinstance(tag, str)
                and hmac.compare_digest(tag, hmac_tag(key, signed))):
            return payload
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _tag(key: bytes, staging: str, files: Mapping[str, dict]) -> str:
    return hmac_tag(key, {"staging": staging, "files": files})


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
    files = tagged_payload(path, "files", key, ("staging", staging))
    if files is None:
        raise ForgedRecord(
            f"{path}: the writers' record of the staged files' digests is "
            "missing or was not written by this run's workers (its tag does "
            "not verify): the staged files cannot be trusted")
    return files


def discard_record(staging: str) -> None:
    path = io.join(staging, RECORD)
    if FileSystems.exists(path):
        FileSystems.delete([path])
