"""Python's cyclic garbage collector in the process that runs a job.

A full collection scans every container object of the process. When a job
starts, its process holds ~230,000 of them (the modules, classes and
functions that Beam, PipelineDP, Dask and dpsynth imported), which live as
long as the process does: a full collection of those alone takes 0.10-0.12 s
on a 2-core test machine, and it falls where the job's own process works
while no worker does. Measured in a 2M x 384 default job on 2 workers:
DirectRunner ran one full collection (0.14 s, between the adaptive plan's
phases), Dask two (0.12 and 0.15 s, the second while the scheduler, which
runs in this process, built the moments pass's tasks).

``startup_heap_frozen`` keeps the objects alive at the job's start out of
the collector's scans while the job runs (``gc.freeze``: they are still
freed when nothing refers to them, only cycles among them wait) and hands
them back afterwards (``gc.unfreeze``), so that a process running job after
job (a test session, a notebook) collects them as before.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator


@contextlib.contextmanager
def startup_heap_frozen() -> Iterator[None]:
    """The block runs with the objects alive now frozen (see the module
    docstring); a process that froze objects itself is left as it is."""
    if gc.get_freeze_count():  # the host application manages its own
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
