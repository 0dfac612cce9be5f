"""What the release-writing stage costs when several workers write at once.

The write stage draws each shard's synthetic rows and writes them as a
Parquet file (``dpsynth.transforms.write``: ``generator.sample_rows`` piece by
piece into a ``ParquetShard``). On the 2-core machine it grew 14-16 % in
busy worker-seconds from one worker to two (issue 27, session 20), more
than any pass over the input. This benchmark separates the three parts
of that stage and times each one in one process alone and then in P
processes at once, each pinned to its own core and doing the same work:

* ``draw``: the synthetic rows only (``sample_rows``, float32);
* ``encode``: the rows drawn and encoded as Parquet into a sink that
  drops the bytes (no file system);
* ``release``: the rows drawn, encoded and written to files under
  ``--dir`` (the write stage's work);
* ``file``: the same number of bytes written to files from one ready
  buffer, 12.6 MB a call (the kernel's page-cache writes alone, no dpsynth
  code and no Python per byte).

A ratio (P at once / alone) near 1 means the part scales over cores; the
difference between ``release`` and ``encode`` is what writing the files
adds to drawing and encoding: the file system, and what the streams share
(on the 2-core machine, warm, ``file`` alone scaled and ``release`` grew
18 %: session 21 in benchmarks/results/scaling-workers.md).

    python benchmarks/write_contention.py                 # 2M rows a process
    python benchmarks/write_contention.py --rows 200000 --dir /dev/shm

Results: printed, and appended to benchmarks/results/write_contention.md
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
from typing import Any, Iterator, Optional, Sequence

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks import publish, run_pinned  # noqa: E402
from dpsynth.dp_ops import generator  # noqa: E402
from dpsynth.dp_ops.config import GeneratorConfig  # noqa: E402
from dpsynth.transforms.write import WRITE_PIECE, ParquetShard  # noqa: E402

DIM = 384
RANK = 128  # the default --covariance-rank: two matrix products a chunk
SHARD = 45_000  # rows a shard, as the 2M-row scaling job writes them
MODES = ("draw", "encode", "release", "file")
RESULTS = os.path.join(ROOT, "benchmarks", "results", "write_contention.md")


class _DropSink:
    """A binary file that keeps nothing (Parquet encoding without I/O)."""

    closed = False

    def write(self, data) -> int:
        return memoryview(data).nbytes

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def _mixture() -> generator.ClassMixture:
    """A public stand-in for one class's DP mixture (the sampler's cost
    depends on d and the rank, not on the values)."""
    rng = np.random.default_rng(0)
    return generator.ClassMixture(
        0, np.ones(1), rng.normal(size=(1, DIM)) * 0.05,
        np.full((1, DIM), 1e-3), 0.0,
        factors=rng.normal(size=(DIM, RANK)) * 0.01)


def _pieces(rows: int) -> Iterator[list[tuple[int, int]]]:
    """[start, stop) of each shard's ``WRITE_PIECE``-row pieces."""
    for first in range(0, rows, SHARD):
        last = min(rows, first + SHARD)
        yield [(a, min(last, a + WRITE_PIECE))
               for a in range(first, last, WRITE_PIECE)]


def run_mode(mode: str, rows: int, folder: str) -> None:
    """One process's work of ``mode`` (files go under ``folder``)."""
    cfg = GeneratorConfig(labels=(0,))
    mix = _mixture()
    if mode == "file":
        buf = np.zeros((WRITE_PIECE, DIM), np.float32).tobytes()
    for index, pieces in enumerate(_pieces(rows)):
        path = os.path.join(folder, f"shard-{index:05d}")
        if mode == "file":
            with open(path, "wb") as f:
                for a, b in pieces:
                    f.write(memoryview(buf)[:(b - a) * DIM * 4])
            continue
        sink = open(path, "wb") if mode == "release" else _DropSink()
        shard = ParquetShard(sink, 0) if mode != "draw" else None
        for a, b in pieces:
            x = generator.sample_rows(mix, cfg, rows, a, b)
            if shard is not None:
                shard.write(x)
        if shard is not None:
            shard.close()
        sink.close()


def _child(mode: str, rows: int, folder: str, core: Optional[int],
           start: Any, results: Any) -> None:
    """One timed process: ``start`` a Barrier, ``results`` a Queue of the
    spawn context."""
    if core is not None:
        os.sched_setaffinity(0, {core})
    run_mode(mode, min(rows, WRITE_PIECE), folder)  # first-call costs
    for name in os.listdir(folder):
        os.unlink(os.path.join(folder, name))
    start.wait()
    wall, cpu = time.perf_counter(), time.process_time()
    run_mode(mode, rows, folder)
    results.put((time.perf_counter() - wall, time.process_time() - cpu))


def timed(mode: str, rows: int, processes: int, root: str) -> list[tuple]:
    """(wall s, CPU s) of each of ``processes`` processes running
    ``mode`` at once, each on its own core where there are enough."""
    return run_pinned(_child, lambda i, folder: (mode, rows, folder),
                      processes, root, f"contention-{mode}-")


def measure(modes: Sequence[str], rows: int, processes: int,
            root: str) -> list[dict]:
    """Each mode alone, then ``processes`` at once."""
    table = []
    for mode in modes:
        alone = timed(mode, rows, 1, root)[0]
        together = timed(mode, rows, processes, root)
        wall = statistics.median(t[0] for t in together)
        cpu = statistics.median(t[1] for t in together)
        table.append({"mode": mode, "alone_s": alone[0],
                      "alone_cpu_s": alone[1], "together_s": wall,
                      "together_cpu_s": cpu, "ratio": wall / alone[0]})
        print(f"{mode:<8} alone {alone[0]:6.2f} s  {processes} at once "
              f"{wall:6.2f} s  x{wall / alone[0]:.2f}", flush=True)
    return table


def report(table: list[dict], rows: int, processes: int, root: str,
           section: str) -> str:
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    lines = [f"\n## {section or 'run'} ({stamp}, {platform.node()}, "
             f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f})\n",
             f"{rows:,} rows x {DIM} float32 a process, shards of {SHARD:,} "
             f"rows, {WRITE_PIECE:,}-row pieces, files under `{root}`; "
             f"median of the {processes} processes run at once.\n",
             "| part | alone s | alone CPU s | "
             f"{processes} at once s | {processes} at once CPU s | "
             "at once / alone |",
             "|---|---|---|---|---|---|"]
    for r in table:
        lines.append(f"| {r['mode']} | {r['alone_s']:.2f} | "
                     f"{r['alone_cpu_s']:.2f} | {r['together_s']:.2f} | "
                     f"{r['together_cpu_s']:.2f} | {r['ratio']:.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=2_000_000,
                   help="rows each process draws and writes (default 2M)")
    p.add_argument("--processes", type=int, default=os.cpu_count() or 1,
                   help="processes at once (default: the cores)")
    p.add_argument("--modes", default=",".join(MODES),
                   help=f"parts to time, of {','.join(MODES)}")
    p.add_argument("--dir", default=tempfile.gettempdir(),
                   help="where the files go (default: the temp folder)")
    p.add_argument("--section", default="", help="label of the results section")
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args(argv)
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        p.error(f"--modes: unknown {','.join(unknown)} (known: "
                f"{','.join(MODES)})")
    if args.rows < 1 or args.processes < 1:
        p.error("--rows and --processes must be at least 1")
    if not os.path.isdir(args.dir):
        p.error(f"--dir {args.dir}: not a folder")
    text = report(measure(modes, args.rows, args.processes, args.dir),
                  args.rows, args.processes, args.dir, args.section)
    publish(text, RESULTS, not args.no_save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
