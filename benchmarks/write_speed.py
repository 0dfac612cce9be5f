"""Release writer speed: rows/s for the ways of writing the synthetic rows.

The release's data shards hold n x d float32 rows (one class per shard,
``--rows-per-shard`` 50,000 by default). Writers compared, each timed on
the same rows (d = 384; one 50,000-row block reused for every shard, 10
classes) and each writing through its own file API to local disk:

* ``vectorised``: ``dpsynth.transforms.write.tfrecord_bytes`` (numpy fills the fixed
  tf.train.Example byte layout around the float32 rows and the TFRecord
  frames; google-crc32c per record), one ``FileSystems.create`` per shard.
  The writer the pipeline uses.
* ``tf-example-idiomatic``: ``tf.train.Example`` built per row as the
  TensorFlow docs show (``FloatList(value=row)``), ``tf.io.TFRecordWriter``.
* ``tf-example-tuned``: one reused ``Example`` message per shard, the row
  set with ``.extend(row.tolist())`` (the fastest protobuf use we found),
  ``tf.io.TFRecordWriter``.
* ``tf-writer-framing-only``: pre-built payloads (the vectorised layout)
  framed by ``tf.io.TFRecordWriter``: what TensorFlow's framing costs alone.
* ``beam-WriteToTFRecord``: a DirectRunner pipeline, shard descriptors ->
  payloads (tuned Example per row) -> ``beam.io.WriteToTFRecord``.
* ``beam-framing-only``: the same pipeline with pre-built payloads: Beam's
  sink cost alone.
* ``parquet``: ``dpsynth.transforms.write.parquet_bytes`` (pyarrow, fixed-size list
  of float32 + int64 label), one ``FileSystems.create`` per shard.

Every output is read back (first shard, first rows) and compared with the
rows written. Wall times on the shared 2-core machine are upper bounds; the
CPU time of this process (``time.process_time``: all its threads, Beam's
in-process runner and TensorFlow's writer included) moves less with the
other jobs, so the ratios are taken on it.

    nice -n 10 python benchmarks/write_speed.py                 # 1M rows fast, 200k slow
    nice -n 10 python benchmarks/write_speed.py --rows 100000   # quick

Results: benchmarks/results/write_speed.md (appended section) and printed.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import platform
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import publish  # noqa: E402
from dpsynth.transforms import write  # noqa: E402

DIM = 384
SHARD = 50_000
CLASSES = 10
RESULTS = os.path.join(ROOT, "benchmarks", "results", "write_speed.md")


@functools.lru_cache(maxsize=1)
def the_block() -> np.ndarray:
    """The rows every shard holds (built once per process, so Beam's
    functions do not carry 77 MB in their pickled closures)."""
    return np.random.default_rng(0).standard_normal((SHARD, DIM)).astype(
        np.float32)


def shards(rows: int) -> list[tuple[int, int, int]]:
    """(label, shard index, rows) for ``rows`` rows over CLASSES classes."""
    per_class = rows // CLASSES
    out = []
    for label in range(CLASSES):
        for i, start in enumerate(range(0, per_class, SHARD)):
            out.append((label, i, min(SHARD, per_class - start)))
    return out


def _path(out: str, label: int, i: int, ext: str) -> str:
    return os.path.join(out, f"synthetic-class{label:05d}-{i:05d}.{ext}")


def run_vectorised(block, plan, out):
    from apache_beam.io.filesystems import FileSystems
    for label, i, n in plan:
        with FileSystems.create(_path(out, label, i, "tfrecord")) as f:
            f.write(write.tfrecord_bytes(block[:n], label))


def run_parquet(block, plan, out):
    from apache_beam.io.filesystems import FileSystems
    for label, i, n in plan:
        with FileSystems.create(_path(out, label, i, "parquet")) as f:
            f.write(write.parquet_bytes(block[:n], label))


def _idiomatic(row, label):
    import tensorflow as tf
    return tf.train.Example(features=tf.train.Features(feature={
        "embedding": tf.train.Feature(float_list=tf.train.FloatList(value=row)),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
    })).SerializeToString()


def _tuned_payloads(rows, label):
    import tensorflow as tf
    example = tf.train.Example()
    example.features.feature["label"].int64_list.value.append(label)
    values = example.features.feature["embedding"].float_list.value
    for row in rows:
        del values[:]
        values.extend(row.tolist())
        yield example.SerializeToString()


def _layout_payloads(rows, label):
    head, tail = write.example_layout(rows.shape[1], label)
    for row in rows:
        yield head + row.tobytes() + tail


def run_tf(block, plan, out, payloads):
    import tensorflow as tf
    for label, i, n in plan:
        with tf.io.TFRecordWriter(_path(out, label, i, "tfrecord")) as w:
            for record in payloads(block[:n], label):
                w.write(record)


def run_tf_idiomatic(block, plan, out):
    run_tf(block, plan, out,
           lambda rows, label: (_idiomatic(r, label) for r in rows))


def run_tf_tuned(block, plan, out):
    run_tf(block, plan, out, _tuned_payloads)


def run_tf_framing(block, plan, out):
    run_tf(block, plan, out, _layout_payloads)


def run_beam(block, plan, out, payloads):
    """One WriteToTFRecord per class (the file names must name the class)."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    options = PipelineOptions(["--runner=DirectRunner",
                               "--direct_running_mode=in_memory"])
    with beam.Pipeline(options=options) as p:
        for label in sorted({s[0] for s in plan}):
            mine = [s for s in plan if s[0] == label]
            _ = (p | f"Shards{label}" >> beam.Create(mine)
                 | f"Rows{label}" >> beam.FlatMap(
                     lambda s: payloads(the_block()[:s[2]], s[0]))
                 | f"Write{label}" >> beam.io.WriteToTFRecord(
                     os.path.join(out, f"synthetic-class{label:05d}"),
                     file_name_suffix=".tfrecord", num_shards=len(mine)))


def run_beam_tuned(block, plan, out):
    run_beam(block, plan, out, _tuned_payloads)


def run_beam_framing(block, plan, out):
    run_beam(block, plan, out, _layout_payloads)


WRITERS = {
    "vectorised": (run_vectorised, "fast"),
    "parquet": (run_parquet, "fast"),
    "tf-writer-framing-only": (run_tf_framing, "fast"),
    "tf-example-tuned": (run_tf_tuned, "slow"),
    "tf-example-idiomatic": (run_tf_idiomatic, "slow"),
    "beam-framing-only": (run_beam_framing, "slow"),
    "beam-WriteToTFRecord": (run_beam_tuned, "slow"),
}


def check(out: str, block: np.ndarray) -> None:
    """The first shard written reads back as the rows written."""
    from dpsynth.transforms import io
    first = sorted(os.listdir(out))[0]
    path = os.path.join(out, first)
    spec = io.InputSpec(path, io.detect_format(path))
    x, y, _ = next(io.read_file_blocks(path, spec))
    np.testing.assert_array_equal(x.astype(np.float32), block[:len(x)])
    assert (y == 0).all(), first


def measure(name: str, rows: int, block: np.ndarray) -> dict:
    fn, _ = WRITERS[name]
    plan = shards(rows)
    out = tempfile.mkdtemp(prefix=f"write-speed-{name}-")
    try:
        if not name.startswith("beam"):  # first-call costs (imports, caches)
            fn(block, [(0, 0, 100)], out)  # a pipeline's start-up is its cost
        start, cpu = time.perf_counter(), time.process_time()
        fn(block, plan, out)
        wall = time.perf_counter() - start
        cpu = time.process_time() - cpu
        size = sum(os.path.getsize(os.path.join(out, f))
                   for f in os.listdir(out))
        check(out, block)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    total = sum(s[2] for s in plan)
    return {"writer": name, "rows": total, "seconds": wall, "cpu": cpu,
            "rows_per_s": total / wall, "us_per_row_cpu": 1e6 * cpu / total,
            "bytes_per_row": size / total}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000,
                   help="rows for the fast writers (default 1M)")
    p.add_argument("--slow-rows", type=int, default=200_000,
                   help="rows for the per-row protobuf writers (default 200k)")
    p.add_argument("--writers", default=",".join(WRITERS))
    p.add_argument("--section", default="", help="label of the results section")
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args(argv)
    import tensorflow  # noqa: F401  (import time out of the measurements)
    import apache_beam  # noqa: F401
    block = the_block()
    results = []
    for name in args.writers.split(","):
        rows = args.rows if WRITERS[name][1] == "fast" else args.slow_rows
        r = measure(name, rows, block)
        results.append(r)
        print(f"{name:<24} {r['rows']:>9,} rows {r['seconds']:8.2f} s "
              f"{r['rows_per_s']:>12,.0f} rows/s {r['us_per_row_cpu']:7.1f} "
              f"CPU us/row {r['bytes_per_row']:7.1f} B/row", flush=True)
    base = next((r for r in results if r["writer"] == "vectorised"), None)
    lines = [f"\n## {args.section or 'run'} "
             f"({datetime.datetime.now():%Y-%m-%d %H:%M}, d={DIM}, "
             f"{platform.node()}, load {os.getloadavg()[0]:.1f})\n",
             "| writer | rows | wall s | rows/s (wall) | CPU us/row | "
             "CPU time vs vectorised | bytes/row |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        ratio = (f"{r['us_per_row_cpu'] / base['us_per_row_cpu']:.1f}x"
                 if base and r is not base else "1")
        lines.append(f"| {r['writer']} | {r['rows']:,} | {r['seconds']:.2f} | "
                     f"{r['rows_per_s']:,.0f} | {r['us_per_row_cpu']:.1f} | "
                     f"{ratio} | {r['bytes_per_row']:.0f} |")
    text = "\n".join(lines) + "\n"
    publish(text, RESULTS, not args.no_save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
