"""Where a dataset's budget document lives and how a transaction on it is
atomic: a local file under an exclusive ``fcntl`` lock, replaced
atomically (``_LocalDocument``), or a ``gs://`` object updated by
compare-and-swap on its generation (``_GcsDocument``); both give the
store's clock, never a launcher's (``_transact``)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import tempfile
import time
from typing import Callable, Iterator, Optional

from dpsynth.pipelines.budget.record import _validate


_GCS_CAS_ATTEMPTS = 50


def _dumps(doc: dict) -> str:
    """The document as strict JSON: a NaN or inf is refused (ValueError),
    never written as ``NaN`` / ``Infinity``, which other readers reject."""
    return json.dumps(doc, indent=1, sort_keys=True, allow_nan=False)


def _document_uri(store_uri: str, dataset_id: str) -> str:
    return f"{store_uri.rstrip('/')}/{dataset_id}.budget.json"


def _backend(store_uri: str, dataset_id: str):
    if not store_uri:
        raise ValueError("--budget-store: empty path")
    uri = _document_uri(store_uri, dataset_id)
    if uri.startswith("gs://"):
        return _GcsDocument(uri)
    if "://" in uri and not uri.startswith("file://"):
        raise ValueError(f"--budget-store {store_uri}: only local paths and "
                         "gs:// are supported (they allow atomic updates)")
    return _LocalDocument(uri.removeprefix("file://"))


def _transact(store_uri: str, dataset_id: str,
              update: Callable[[Optional[dict], float], Optional[dict]]
              ) -> None:
    """Atomically applies ``update(doc, now)`` (None = no write) to the
    document; ``now`` is the store's clock (see ``_LocalDocument.clock``,
    ``_GcsDocument.clock``), never this launcher's: a launcher whose clock is
    fast must not see a live owner's lease as expired.

    ``update`` may run several times (gs:// retries after a lost race), so it
    must only depend on the document and time it is given.
    """
    _backend(store_uri, dataset_id).transact(update)


class _LocalDocument:
    """A JSON file guarded by an exclusive fcntl lock on ``<path>.lock``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def read(self) -> Optional[dict]:
        try:
            with open(self.path, encoding="utf-8") as f:
                return _validate(json.load(f), self.path)
        except FileNotFoundError:
            return None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        with open(self.path + ".lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def transact(self, update) -> None:
        with self._locked():
            new = update(self.read(), self.clock())
            if new is not None:
                self._write(new)

    def clock(self) -> float:
        """Now, as the store's file system stamps a write (under the lock):
        the mtime of ``<document>.clock`` just rewritten. On a shared mount
        that is the file server's time, the same for every launcher."""
        path = self.path + ".clock"
        with open(path, "w") as f:
            f.write("t")
            f.flush()
            return os.fstat(f.fileno()).st_mtime

    def _write(self, doc: dict) -> None:
        folder = os.path.dirname(os.path.abspath(self.path))
        fd, tmp = tempfile.mkstemp(prefix=".budget-", dir=folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(_dumps(doc))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise


class _GcsDocument:
    """A GCS object updated by compare-and-swap on its generation."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.bucket, _, self.name = uri[len("gs://"):].partition("/")

    def _blob(self):
        from google.cloud import storage  # only gs:// stores need it
        # Object operations need no project; passing None explicitly avoids
        # failing where credentials carry none.
        client = storage.Client(
            project=os.environ.get("GOOGLE_CLOUD_PROJECT") or None)
        return client.bucket(self.bucket).blob(self.name)

    def _get(self) -> tuple[Optional[dict], int]:
        """(document, generation); generation 0 when it does not exist."""
        blob = self._blob()
        blob = blob.bucket.get_blob(self.name)
        if blob is None:
            return None, 0
        # Pinning the generation makes the body match the generation we CAS on.
        data = blob.download_as_bytes(if_generation_match=blob.generation)
        return _validate(json.loads(data), self.uri), int(blob.generation)

    def clock(self) -> float:
        """Now, as GCS stamps a write: the ``updated`` time of
        ``<document>.clock``, rewritten for the purpose."""
        from google.cloud.storage.retry import DEFAULT_RETRY
        blob = self._blob().bucket.blob(self.name + ".clock")
        # Unconditional, so retried explicitly (GCS throttles rapid
        # rewrites of one object with 429).
        blob.upload_from_string(b"t", retry=DEFAULT_RETRY)
        return blob.updated.timestamp()

    def read(self) -> Optional[dict]:
        from google.api_core import exceptions
        for _ in range(_GCS_CAS_ATTEMPTS):
            try:
                return self._get()[0]
            except (exceptions.PreconditionFailed, exceptions.NotFound):
                time.sleep(random.uniform(0.05, 0.2))  # changed mid-read
        raise RuntimeError(f"{self.uri}: kept changing while being read")

    def transact(self, update) -> None:
        from google.api_core import exceptions
        for attempt in range(_GCS_CAS_ATTEMPTS):
            try:
                doc, generation = self._get()
                new = update(doc, self.clock())
                if new is None:
                    return
                self._blob().upload_from_string(
                    _dumps(new),
                    content_type="application/json",
                    if_generation_match=generation)
                return
            except (exceptions.PreconditionFailed, exceptions.NotFound):
                # Another writer changed the document between our read and
                # write: re-read it and re-check the budget.
                time.sleep(random.uniform(0.05, 0.2) * min(attempt + 1, 10))
        raise RuntimeError(f"{self.uri}: gave up after {_GCS_CAS_ATTEMPTS} "
                           "concurrent-update conflicts")
