"""The serial fraction the machine itself sets for the default job (issue 27).

dpsynth's f = 2/S(2) - 1 on the 2-core machine (``scaling.py --workers``)
mixes two things: what the framework (runner, shuffles, stage changes,
the driver) adds, and what the machine loses when both cores work at once
(shared caches, memory bandwidth, the page cache). This benchmark measures
the second alone. It runs the default job's per-row work with the
product's own functions and no runner at all:

* ``phase1``: read every block, ``block_phase1`` (the DP centre's clipped
  sum and the class counts);
* ``moments``: read every block again, ``prepare_block`` (normalise,
  centre, clip), then per class the grid sum and the second moment's
  upper triangle (``adaptive.block_class_sum``,
  ``covariance.add_second_moment_upper``), as the per-class mode does;
* ``write``: draw the release's rows and write them as Parquet shards of
  the job's size to files (``write_contention.run_mode("release")``).

P processes each take every P-th read range of the input and 1/P of the
release's rows, each pinned to its own core, and wait for each other
between parts (as the job's stages do). A part's time is from one barrier
to the next. With P = 1 and P = 2 alternating, f of each part and of the
sum is the machine's floor for dpsynth's f: the framework's share is the
difference. Nothing here is the job's DP output: the DP centre is a zero
stand-in (the same arithmetic), the release a public stand-in mixture.

    python benchmarks/floor_scaling.py                 # 2M x 384, P = 1, 2
    python benchmarks/floor_scaling.py --processes 1,16 --repeat 2  # 16 cores

Results: printed, and appended to benchmarks/results/floor_scaling.md
unless ``--no-save``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any, Optional, Sequence

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks import publish, run_pinned, scaling  # noqa: E402

PARTS = ("phase1", "moments", "write")
RESULTS = os.path.join(ROOT, "benchmarks", "results", "floor_scaling.md")
FLAGS = ["--num-classes", str(scaling.CLASSES), "--noise-seed", "1",
         "--output-format", "parquet"]


def _blocks(data: str, index: int, processes: int):
    """A function giving this process's blocks afresh: every
    ``processes``-th read range of the job's own reader, from ``index``."""
    spec, reader = scaling.job_reader(data, FLAGS)
    ranges = reader.ranges[index::processes]

    def blocks():
        for x, y, _ in scaling.range_blocks(spec, reader, ranges):
            yield x, y
    return blocks, reader.dim


def _phase1(blocks, cfg) -> None:
    from dpsynth.transforms.two_phase import block_phase1
    for x, y in blocks():
        block_phase1((x, y), cfg, cfg.labels)


def _moments(blocks, cfg, dim: int) -> None:
    from dpsynth.dp_ops import adaptive, covariance, generator
    from dpsynth.transforms.aggregate import prepare_block
    proj, planes = generator.projection(dim, cfg), generator.planes(cfg, dim)
    centre = np.zeros(dim)  # a stand-in for the DP centre: same arithmetic
    sums: dict = {}
    second: dict = {}
    for x, y in blocks():
        block, _ = prepare_block(x, y, cfg, proj, planes, centre)
        for label, rows in block.by_class():
            if label not in sums:
                sums[label] = np.zeros(dim)
                second[label] = np.zeros((dim, dim))
            sums[label] += adaptive.block_class_sum(rows.x, cfg.clip_norm)
            covariance.add_second_moment_upper(second[label], rows.x,
                                               cfg.clip_norm)


def _child(data: str, rows: int, index: int, processes: int, folder: str,
           core: Optional[int], barrier: Any, results: Any) -> None:
    """One process's share of every part, timed barrier to barrier."""
    from threadpoolctl import threadpool_limits
    from benchmarks import write_contention
    if core is not None:
        os.sched_setaffinity(0, {core})
    threadpool_limits(1)  # one core a process, as a pinned worker has
    cfg = scaling._config(FLAGS)
    blocks, dim = _blocks(data, index, processes)
    write_contention.run_mode("release", write_contention.WRITE_PIECE,
                              folder)  # first-call costs (imports)
    work = {"phase1": lambda: _phase1(blocks, cfg),
            "moments": lambda: _moments(blocks, cfg, dim),
            "write": lambda: write_contention.run_mode(
                "release", rows // processes, folder)}
    times = {}
    barrier.wait()
    edge = time.perf_counter()
    for part in PARTS:
        work[part]()
        barrier.wait()  # the part ends when every process has done it
        now = time.perf_counter()
        times[part], edge = now - edge, now
    results.put((index, times))


def timed(data: str, rows: int, processes: int, root: str) -> dict:
    """{part: s} of one run of ``processes`` processes (every process
    sees the same barriers, so the first one's times are the run's)."""
    out = dict(run_pinned(
        _child, lambda i, folder: (data, rows, i, processes, folder),
        processes, root, "floor-"))
    return out[0]


def serial_fraction(one: float, many: float, processes: int) -> float:
    """Amdahl's f from 1 to ``processes`` processes: (P / S - 1) / (P - 1),
    S = one / many (P = 2: 2 / S(2) - 1, issue 27's measure)."""
    return (processes * many / one - 1) / (processes - 1)


def measure(data: str, rows: int, counts: Sequence[int], repeats: int,
            root: str) -> list[dict]:
    """``repeats`` rounds of one run per process count, every other round
    in reverse order (1, 2, 2, 1, ...) so that a slow spell of the machine
    hits every count."""
    runs = []
    for rep in range(repeats):
        for processes in (counts if rep % 2 == 0 else counts[::-1]):
            times = timed(data, rows, processes, root)
            load = os.getloadavg()[0]
            runs.append({"repeat": rep, "processes": processes,
                         "times": times, "load": load})
            print(f"  #{rep + 1} P={processes:<3d} " + "  ".join(
                f"{k} {v:6.2f} s" for k, v in times.items())
                + f"  total {sum(times.values()):6.2f} s  load {load:.1f}",
                flush=True)
    return runs


def _seconds(run: dict, part: str) -> float:
    times = run["times"]
    return sum(times.values()) if part == "total" else times[part]


def table(runs: list[dict]) -> list[dict]:
    """Per part: the median s of each process count, and f of the medians
    for every count above 1."""
    counts = sorted({r["processes"] for r in runs})
    rows = []
    for part in (*PARTS, "total"):
        med = {p: statistics.median(_seconds(r, part) for r in runs
                                    if r["processes"] == p) for p in counts}
        rows.append({"part": part, "seconds": med, "f": {
            p: serial_fraction(med[1], med[p], p)
            for p in counts if p > 1 and 1 in med}})
    return rows


def report(runs: list[dict], rows: int, root: str) -> str:
    counts = sorted({r["processes"] for r in runs})
    many = [p for p in counts if p > 1]
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    lines = [f"\n## {stamp}, {platform.node()}, {os.cpu_count()} cores\n",
             f"{rows:,} x 384 float32 (`benchmarks/scaling.py`'s .npz "
             f"files; the release as Parquet), the default job's work with "
             f"no runner; {max(r['repeat'] for r in runs) + 1} rounds of "
             f"P = {', '.join(map(str, counts))} processes, release files "
             f"under `{root}`; medians over the rounds, Amdahl f = (P / S - "
             f"1) / (P - 1) (P = 2: 2 T(2) / T(1) - 1).\n",
             "| part | " + " | ".join(f"P = {p} s" for p in counts)
             + "".join(f" | f, P = {p}" for p in many) + " |",
             "|---" * (1 + len(counts) + len(many)) + "|"]
    for r in table(runs):
        lines.append(f"| {r['part']} | " + " | ".join(
            f"{r['seconds'][p]:.2f}" for p in counts) + "".join(
            f" | {r['f'][p]:.2f}" for p in many if p in r["f"]) + " |")
    lines.append("\nRuns: " + "; ".join(
        f"P={r['processes']} " + ", ".join(
            f"{k} {v:.2f}" for k, v in r["times"].items())
        + f" (load {r['load']:.1f})" for r in runs) + "\n")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--processes", type=scaling._ints, default=[1, 2],
                   help="process counts, comma-separated (1 must be one)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--cache", default=scaling.DEFAULT_CACHE,
                   help="where the input data is made once and kept")
    p.add_argument("--dir", default=tempfile.gettempdir(),
                   help="where the release files go (deleted after)")
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args(argv)
    data = scaling.make_data(args.cache, args.rows, 384)
    counts = sorted(set(args.processes))
    if 1 not in counts:
        p.error("--processes must include 1 (f compares with one process)")
    runs = measure(data, args.rows, counts, args.repeat, args.dir)
    publish(report(runs, args.rows, args.dir), RESULTS, not args.no_save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
