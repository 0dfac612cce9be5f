"""What this machine lends the job (no Beam, no Dask: imported by both
runners' modules)."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (``taskset``, a
    container's cpuset), not the machine's count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity API (macOS)
        return os.cpu_count() or 1
