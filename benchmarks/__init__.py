"""Measurements of dpsynth (see each module's docstring)."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import tempfile
from typing import Callable


def publish(text: str, results: str, save: bool) -> None:
    """Prints a benchmark's report and, with ``save``, appends it to its
    results file."""
    print(text)
    if save:
        with open(results, "a") as f:
            f.write(text)


def run_pinned(target: Callable, args: Callable[[int, str], tuple],
               processes: int, root: str, prefix: str) -> list:
    """Runs ``processes`` spawned processes at once and returns what each
    put on its queue, in the order they came. Process i gets a fresh folder
    under ``root`` (removed after) and is called as ``target(*args(i,
    folder), core, barrier, results)``: core i where the machine has enough
    cores (else None), a Barrier of all of them, a Queue for one result."""
    ctx = multiprocessing.get_context("spawn")  # no inherited BLAS state
    cores = sorted(os.sched_getaffinity(0))
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    folders = [tempfile.mkdtemp(prefix=prefix, dir=root)
               for _ in range(processes)]
    os.sync()  # start clean: no earlier run's dirty pages being written back
    try:
        procs = [ctx.Process(target=target, args=(
            *args(i, folder), cores[i] if processes <= len(cores) else None,
            barrier, results)) for i, folder in enumerate(folders)]
        for p in procs:
            p.start()
        out = [results.get() for _ in procs]
        for p in procs:
            p.join()
            if p.exitcode:
                raise RuntimeError(f"a process exited {p.exitcode}")
    finally:
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
    return out
