"""Input reader speed: seconds to read the same rows as .npz, TFRecord and
Parquet through ``dpsynth.transforms.io`` (issue 27 item 2).

Writes n x d float32 rows (default 100,000 x 384, labels 0..9) into a temp
dir as

* ``npz``: ``np.savez`` (embeddings, labels);
* ``tfrecord``: ``dpsynth.transforms.write.tfrecord_bytes`` (the release's layout);
* ``parquet-fixed``: pyarrow, a fixed-size list of float32 (the release's
  Parquet layout), 64k-row row groups;
* ``parquet-list``: pyarrow, a variable-length ``list<float>`` column (what
  ``pa.array(list_of_lists)`` or pandas write), 64k-row row groups;

then reads each file whole (``io.read_file_blocks``) and as split ranges
(``io.file_ranges`` at ``--split-bytes``, planning included), the blocks
validated as in the pipeline, and prints each reader's seconds and its
ratio to .npz, all measured in one run. Each read is repeated
(``--repeats``) and the fastest kept; ``os.getloadavg()`` is printed before
and after (the machine is shared: compare ratios, not seconds).

    nice -n 5 python benchmarks/read_speed.py
    nice -n 5 python benchmarks/read_speed.py --rows 20000   # quick
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from dpsynth.transforms import io, write  # noqa: E402
from dpsynth.transforms.formats import SPLIT_BYTES  # noqa: E402


def write_inputs(folder: str, x: np.ndarray, y: np.ndarray) -> dict:
    """The same rows in each format; {name: path}."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    paths = {name: os.path.join(folder, f"rows.{ext}") for name, ext in (
        ("npz", "npz"), ("tfrecord", "tfrecord"),
        ("parquet-fixed", "fixed.parquet"), ("parquet-list", "list.parquet"))}
    np.savez(paths["npz"], embeddings=x, labels=y)
    with open(paths["tfrecord"], "wb") as f:
        for start in range(0, len(y), 4096):  # rows in file order
            xs, ys = x[start:start + 4096], y[start:start + 4096]
            for label in np.unique(ys).tolist():
                f.write(write.tfrecord_bytes(xs[ys == label], label))
    fixed = pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), x.shape[1])
    pq.write_table(pa.table({"embedding": fixed, "label": pa.array(y)}),
                   paths["parquet-fixed"], row_group_size=65536)
    offsets = pa.array(np.arange(0, x.size + 1, x.shape[1], dtype=np.int32))
    listed = pa.ListArray.from_arrays(offsets, pa.array(x.ravel()))
    pq.write_table(pa.table({"embedding": listed, "label": pa.array(y)}),
                   paths["parquet-list"], row_group_size=65536)
    return paths


def read_all(path: str, split_bytes: int) -> tuple[int, float]:
    """Rows read and their checksum (so that nothing is optimised away)."""
    spec = io.InputSpec(path, split_bytes=split_bytes)
    ranges = io.file_ranges(path, os.path.getsize(path), spec)
    rows, total = 0, 0.0
    for r in ranges:
        for x, y, _ in io.read_range_blocks(r, spec):
            rows += len(y)
            total += float(x[:, 0].sum(dtype=np.float64))
    return rows, total


def fastest(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--split-bytes", type=int, default=SPLIT_BYTES)
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.rows, args.dim)).astype(np.float32)
    y = rng.integers(0, 10, args.rows)
    print(f"load average before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="read-speed-") as folder:
        paths = write_inputs(folder, x, y)
        expected = None
        seconds = {}
        for name, path in paths.items():
            for how, split in (("whole", 1 << 62), ("split", args.split_bytes)):
                rows, total = read_all(path, split)  # warm: page cache, imports
                assert rows == args.rows, (name, rows)
                if expected is None:
                    expected = total
                # blocks cut at other rows sum in another order
                assert math.isclose(total, expected, rel_tol=1e-9), (
                    name, total, expected)
                seconds[name, how] = fastest(
                    lambda: read_all(path, split), args.repeats)
        print(f"load average after: {os.getloadavg()}")
        print(f"{args.rows} x {args.dim} float32; split reads at "
              f"--split-bytes {args.split_bytes}; fastest of {args.repeats}")
        print(f"{'reader':<15}{'MB':>8}{'whole s':>10}{'x npz':>8}"
              f"{'split s':>10}{'x npz':>8}")
        for name, path in paths.items():
            mb = os.path.getsize(path) / 1e6
            whole, split = seconds[name, "whole"], seconds[name, "split"]
            print(f"{name:<15}{mb:>8.1f}{whole:>10.3f}"
                  f"{whole / seconds['npz', 'whole']:>8.2f}{split:>10.3f}"
                  f"{split / seconds['npz', 'split']:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
