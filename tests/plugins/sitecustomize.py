"""Subprocesses of the GCS emulator tests get this folder on PYTHONPATH
(tests/gcs_emulator.py, GcsEmulator.env()). When they talk to the emulator:

* apply the batch Content-ID shim (gcs_batch_shim.py), and
* make Beam skip its Google credential lookup (anonymous, as the emulator
  expects): with Beam's gcp extra installed and no credentials, that lookup
  retries with back-off for ~30 s in every process. Done lazily, when Beam's
  auth module is first imported, so processes that never use Beam pay nothing.
"""

import os

if os.environ.get("STORAGE_EMULATOR_HOST"):
    import importlib.abc
    import sys

    try:
        import gcs_batch_shim
        gcs_batch_shim.apply()
    except ImportError:  # google-cloud-storage absent: nothing to patch
        pass

    class _AnonymousBeamAuth(importlib.abc.MetaPathFinder):
        target = "apache_beam.internal.gcp.auth"

        def find_spec(self, name, path=None, target=None):
            if name != self.target:
                return None
            sys.meta_path.remove(self)
            import importlib.util
            spec = importlib.util.find_spec(name)
            if spec is None or spec.loader is None:
                return spec
            original = spec.loader.exec_module

            def exec_module(module):
                original(module)
                module._Credentials._credentials_init = True
                module._Credentials._credentials = None

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _AnonymousBeamAuth())
