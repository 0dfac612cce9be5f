"""Subprocesses of the GCS emulator tests get this folder on PYTHONPATH
(tests/gcs_emulator.py, GcsEmulator.env()). When they talk to the emulator:

* apply the batch Content-ID shim (gcs_batch_shim.py) once
  google-cloud-storage's batch module is imported, and
* make Beam skip its Google credential lookup (anonymous, as the emulator
  expects): with Beam's gcp extra installed and no credentials, that lookup
  retries with back-off for ~30 s in every process. Done lazily, when Beam's
  auth module is first imported, so processes that never use Beam pay nothing.
"""

import os

if os.environ.get("STORAGE_EMULATOR_HOST"):
    import importlib.abc
    import importlib.util
    import sys

    class _AfterImport(importlib.abc.MetaPathFinder):
        """Runs ``patch(module)`` once ``target`` has been imported. Lazy:
        at start-up a helper venv (deploy/dataflow/job_graph.py's
        overlay) may not yet see every part of the ``google`` namespace
        (its own namespace .pth files run first), and processes that never
        use the module pay nothing."""

        def __init__(self, target, patch):
            self.target, self.patch = target, patch

        def find_spec(self, name, path=None, target=None):
            if name != self.target:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            if spec is None or spec.loader is None:
                return spec
            original, patch = spec.loader.exec_module, self.patch

            def exec_module(module):
                original(module)
                patch(module)

            spec.loader.exec_module = exec_module
            return spec

    def _content_ids(module):
        import gcs_batch_shim
        gcs_batch_shim.apply()

    def _anonymous(module):
        module._Credentials._credentials_init = True
        module._Credentials._credentials = None

    sys.meta_path.insert(0, _AfterImport("google.cloud.storage.batch",
                                         _content_ids))
    sys.meta_path.insert(0, _AfterImport("apache_beam.internal.gcp.auth",
                                         _anonymous))
