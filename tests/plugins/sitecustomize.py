"""Subprocesses of the GCS emulator tests get this folder on PYTHONPATH
(tests/gcs_emulator.py, GcsEmulator.env()): apply the batch shim when they
talk to the emulator."""

import os

if os.environ.get("STORAGE_EMULATOR_HOST"):
    try:
        import gcs_batch_shim
        gcs_batch_shim.apply()
    except ImportError:  # google-cloud-storage absent: nothing to patch
        pass
