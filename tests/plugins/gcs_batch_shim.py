"""Test-only client shim for fake-gcs-server's JSON batch endpoint.

fake-gcs-server (the emulator of tests/gcs_emulator.py) answers a batch
request (``POST /batch/storage/v1``, which Beam's gcsio uses for every
``FileSystems.copy``/``rename``/``delete`` on gs://) only for parts that carry
a ``Content-ID`` header. Real GCS does not require one and
google-cloud-storage does not send it, so the emulator silently returned an
empty batch. ``apply()`` makes each batch part carry a unique Content-ID; the
requests still go to the emulator, otherwise unchanged. Harmless against real
GCS (Content-ID is part of the documented batch format).
"""

from __future__ import annotations

import itertools

_ids = itertools.count(1)


def apply() -> None:
    from google.cloud.storage import batch
    cls = batch.MIMEApplicationHTTP
    if getattr(cls, "_dpsynth_content_id", False):
        return
    original = cls.__init__

    def init_with_content_id(self, method, uri, headers, body):
        original(self, method, uri, headers, body)
        self["Content-ID"] = f"<dpsynth-{next(_ids)}>"

    cls.__init__ = init_with_content_id
    cls._dpsynth_content_id = True
