"""How this machine treats fresh memory just now: a reading taken beside
each timed run, so a slow run can be told apart from slow code.

On the 2-vCPU Firecracker guests this project is measured on, the first
touch of fresh memory cost 0.56 s a GB one day and 2.0-2.6 s the next (the
guest's balloon hands freed pages back to the host within seconds, so
memory freed a little earlier is a first touch again), and writing files
through the page cache, which the release-writing stage does, pays it
(benchmarks/results/scaling-workers.md, "2 cores, session 21").

    python benchmarks/machine_probe.py [--mb 256] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

# Run in a new process: its allocations are fresh pages, as a new worker's.
_TOUCH = ("import sys, time, numpy as np; n = int(sys.argv[1]) * 2 ** 20; "
          "t = time.perf_counter(); a = np.ones(n // 8); "
          "print(time.perf_counter() - t)")
_CHUNK = 8 * 2 ** 20


def first_touch(mb: int = 256) -> float:
    """Seconds a GB to fill ``mb`` MB of fresh memory in a new process."""
    out = subprocess.run([sys.executable, "-c", _TOUCH, str(mb)],
                         capture_output=True, text=True, check=True)
    return float(out.stdout) * 1024 / mb


def page_cache_write(folder: str, mb: int = 256) -> float:
    """GB a second writing a new ``mb`` MB file in ``folder`` through the
    page cache (no sync: what a shard write costs a worker); the file is
    removed."""
    block = os.urandom(_CHUNK)
    chunks = max(1, mb * 2 ** 20 // _CHUNK)
    fd, path = tempfile.mkstemp(dir=folder, prefix="dpsynth-probe-")
    try:
        start = time.perf_counter()
        with os.fdopen(fd, "wb") as f:
            for _ in range(chunks):
                f.write(block)
        took = time.perf_counter() - start
    finally:
        os.remove(path)
    return (chunks * _CHUNK / 2 ** 30) / took


def probe(folder: str, mb: int = 256) -> dict:
    """Both readings, for a run's record."""
    return {"first_touch_s_per_gb": first_touch(mb),
            "page_cache_write_gb_s": page_cache_write(folder, mb)}


def describe(reading: dict) -> str:
    """'2.31 / 0.42': first touch s a GB / page-cache write GB a second."""
    if not reading:
        return "-"
    return (f"{reading['first_touch_s_per_gb']:.2f} / "
            f"{reading['page_cache_write_gb_s']:.2f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=int, default=256)
    p.add_argument("--dir", default=tempfile.gettempdir())
    args = p.parse_args(argv)
    print(json.dumps(probe(args.dir, args.mb)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
