"""Scaling benchmark: `dpsynth generate` on DirectRunner vs the in-memory
reference, over n (rows) and d (embedding dimension).

    nice -n 10 python benchmarks/scaling.py                  # defaults below
    python benchmarks/scaling.py --dims 384 --sizes 10000,100000 --modes direct

Data: labelled Gaussian-mixture embeddings (10 classes, float32), written
once as several .npz shards under ``benchmarks/cache/`` (git-ignored; 1M x
1280 float32 is 5 GB). Every measured run is a child process, so wall time
and peak RSS (sampled with psutil over the child and all its descendants,
e.g. the DirectRunner's worker processes) are its own:

* ``reference``: ``benchmarks.reference.generate`` on the whole array in memory
  (also times its stages, the vote filter among them);
* ``direct``: ``python -m dpsynth.pipelines.cli.generate --materialise-blocks`` on
  DirectRunner, in process (one materialised PCollection of blocks);
* ``direct2``: the same with ``--direct_num_workers=2`` (multi_processing);
* ``dask2``: ``--runner dask`` on a ``distributed.LocalCluster`` of 2
  single-threaded worker processes (loopback) that the child starts;
* ``...-reread``: generate's default layout, where every pass re-reads the
  input files (``dpsynth.transforms.aggregate.RereadBlocks``);
* ``floor`` (issue 15): one read of the input with the job's own reader
  (``dpsynth.transforms.io`` ranges and decoder) and one float32 pass of sum x and
  x^T x over its blocks, on one BLAS thread; read and compute timed apart.
  With the vote filter it also times the exact vote's nearest-neighbour
  arithmetic (``vote_nn_floor``: rows x candidates x d at the one-thread
  float32 GEMM peak), which the issue's floor leaves out.

``--configs default,k16,vote`` (issue 15) runs each named configuration
(generate's defaults; ``--clusters 16``; ``--vote-filter``) with the modes
reference, direct2-reread and floor, and adds a table: the passes the Beam
run made (the names generate hands its progress printer: phase 1 and
phase 2 of the adaptive plan both count), floor = passes x (read +
compute), Beam/in-memory and Beam/floor. ``--save`` keeps every run as a
JSON line; ``--report-from`` reports such a file without running.

``--files N --format tfrecord|parquet|npz`` writes the same rows (chunks of
100k rows, one random stream each) as N files of that format instead of
the default .npz shards: ``--files 1 --format tfrecord`` is one large file,
read in ``--split-bytes`` ranges by every worker. Each run records the
load average before and after it and the peak RSS of every worker process.

``--workers 1,2,... [--engines direct,dask] [--configs ...]`` (issue 27)
runs each configuration on each engine (``ENGINES``: DirectRunner
multi_processing, dpsynth's Dask runner on a LocalCluster; Flink, Spark
and Prism plug in there) with each worker count, every pass re-reading
the files, and reports job time, speed-up, efficiency, Amdahl's serial
fraction f = (W/S - 1)/(W - 1) (W = 2: 2/S(2) - 1), the load average, the
machine's memory just before each run (``benchmarks/machine_probe.py``:
first touch of fresh memory and a page-cache write, ``--probe-mb``), and
a per-stage table from the stage trace (``dpsynth.transforms.progress``: which
worker processes ran each stage, busy vs elapsed time) to
``results/scaling-workers.md``:

    nice -n 5 python benchmarks/scaling.py --workers 1,2 \
        --configs default,k16,vote --dims 384 --sizes 300000 \
        --gen-args "--output-format parquet" --section after

``--hosts 1,2 [--repeat R]`` (issue 52): the same job on the multi-host
harness (``benchmarks/hosts.py``, root), input and output on its GCS
emulator; see ``benchmarks/scaling_hosts.py``.

The report (Markdown) goes between markers in ``--out``, so hand-written
notes around it survive a rerun; ``--section`` names the block (e.g.
``before`` / ``after``). ``--profile`` adds a cProfile of one in-process
DirectRunner run; ``--vote-bench`` times the vote filter's nearest-neighbour
search alone.
"""

from __future__ import annotations

import argparse
import cProfile
import io as _io
import json
import math
import os
import platform
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Iterable, Iterator, Optional, Sequence

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks import machine_probe  # noqa: E402

DEFAULT_CACHE = os.path.join(ROOT, "benchmarks", "cache")
DEFAULT_OUT = os.path.join(ROOT, "benchmarks", "results", "scaling.md")
MODES = ("reference", "direct", "direct2", "direct-reread", "direct2-reread",
         "dask2", "dask2-reread", "floor")
# Issue 15's configurations: name -> (clusters, vote filter); the rest are
# generate's defaults (k=1 with --covariance auto is the adaptive plan).
CONFIGS = {"default": (1, False), "k16": (16, False), "vote": (1, True)}
FLOOR_MODES = ("reference", "direct2-reread", "floor")
DATA_FORMATS = ("npz", "tfrecord", "parquet")
EXTENSIONS = {"npz": "npz", "tfrecord": "tfrecord", "parquet": "parquet"}
DEFAULT_MODES = ("reference", "direct", "direct2")
CLASSES = 10
SHARD_ROWS = 100_000
MIN_SHARDS = 4
MIN_CHUNKS = 10  # make_files: up to 10 files hold the same rows


# ------------------------------------------------------------------- data

def data_dir(cache: str, n: int, d: int, files: Optional[int] = None,
             fmt: str = "npz") -> str:
    if files is None:
        return os.path.join(cache, f"gmm-d{d}-n{n}")
    return os.path.join(cache, f"gmm-d{d}-n{n}-{fmt}-f{files}")


def _fresh(out: str, d: int, classes: int, comps: int,
           seed: int) -> np.ndarray:
    """Empties ``out`` for a new data set; returns its class/component
    centres (they depend on d only: every n draws from one distribution)."""
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    return np.random.default_rng([seed, d]).normal(
        size=(classes, comps, d)) / math.sqrt(d)


def _chunk(n: int, d: int, i: int, bounds, centres, classes: int,
           comps: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows bounds[i]..bounds[i+1]: one random stream per chunk."""
    rows = int(bounds[i + 1] - bounds[i])
    rng = np.random.default_rng([seed, d, n, i])
    y = rng.integers(0, classes, rows)
    c = rng.integers(0, comps, rows)
    x = centres[y, c] + (0.5 / math.sqrt(d)) * rng.standard_normal((rows, d))
    return x.astype(np.float32), y.astype(np.int64)


def make_files(cache: str, n: int, d: int, files: int, fmt: str,
               classes: int = CLASSES, comps: int = 4, seed: int = 0) -> str:
    """n rows in chunks of at most SHARD_ROWS (at least MIN_CHUNKS: the
    same rows whatever ``files`` up to that), written as ``files`` files of
    ``fmt`` chunk by chunk (bounded memory). At n >= 1M the rows are those
    of ``make_data``."""
    out = data_dir(cache, n, d, files, fmt)
    done = os.path.join(out, "DONE")
    if os.path.exists(done):
        return out
    centres = _fresh(out, d, classes, comps, seed)
    chunks = max(MIN_CHUNKS, math.ceil(n / SHARD_ROWS))
    if files > chunks:
        raise SystemExit(f"--files {files}: at most {chunks} files at n={n}")
    bounds = np.linspace(0, n, chunks + 1).astype(int)
    jobs = [(os.path.join(out, f"part-{f:04d}.{EXTENSIONS[fmt]}"), fmt,
             [int(i) for i in part], n, d, bounds, centres, classes, comps,
             seed)
            for f, part in enumerate(np.array_split(np.arange(chunks), files))]
    # One process a file (each file is its own chunks' random streams, so
    # the bytes do not depend on how many run at once).
    procs = max(1, min(len(jobs), os.cpu_count() or 1))
    if procs == 1:
        for job in jobs:
            _write_file(*job)
    else:
        import concurrent.futures as cf
        import multiprocessing
        with cf.ProcessPoolExecutor(
                procs, mp_context=multiprocessing.get_context("fork")) as ex:
            list(ex.map(_write_file, *zip(*jobs)))
    with open(done, "w") as fh:
        fh.write(f"{n} rows, {d} dims, {files} {fmt} files\n")
    return out


def _write_file(path: str, fmt: str, chunk_ids: Sequence[int], n: int,
                d: int, bounds, centres, classes: int, comps: int,
                seed: int) -> None:
    _write(path, fmt, (_chunk(n, d, i, bounds, centres, classes, comps, seed)
                       for i in chunk_ids))


def _write(path: str, fmt: str, parts) -> None:
    if fmt == "npz":
        xs, ys = zip(*parts)
        np.savez(path, embeddings=np.concatenate(xs), labels=np.concatenate(ys))
    elif fmt == "tfrecord":
        from dpsynth.transforms.write import tfrecord_bytes
        with open(path, "wb") as fh:
            for x, y in parts:
                for label in np.unique(y).tolist():
                    fh.write(tfrecord_bytes(x[y == label], label))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq
        writer = None
        for x, y in parts:
            d = x.shape[1]
            emb = pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), d)
            table = pa.table({"embedding": emb, "label": pa.array(y)})
            writer = writer or pq.ParquetWriter(path, table.schema)
            writer.write_table(table, row_group_size=65_536)
        writer.close()


def make_data(cache: str, n: int, d: int, classes: int = CLASSES,
              comps: int = 4, seed: int = 0) -> str:
    """Writes n labelled rows as float32 .npz shards once; returns the dir.

    Class/component centres depend on d only, so every n draws from the same
    distribution. Each shard is generated on its own (bounded memory).
    """
    out = data_dir(cache, n, d)
    done = os.path.join(out, "DONE")
    if os.path.exists(done):
        return out
    centres = _fresh(out, d, classes, comps, seed)
    shards = max(MIN_SHARDS, math.ceil(n / SHARD_ROWS))
    bounds = np.linspace(0, n, shards + 1).astype(int)
    for i in range(shards):
        x, y = _chunk(n, d, i, bounds, centres, classes, comps, seed)
        np.savez(os.path.join(out, f"part-{i:04d}.npz"), embeddings=x,
                 labels=y)
    with open(done, "w") as f:
        f.write(f"{n} rows, {d} dims, {shards} shards\n")
    return out


def load_dir(path: str) -> tuple[np.ndarray, np.ndarray]:
    files = sorted(f for f in os.listdir(path) if f.endswith(".npz"))
    if not files:  # TFRecord / Parquet
        from dpsynth.transforms import io
        return io.load_arrays(os.path.join(path, "part-*"))
    xs, ys = [], []
    for name in files:
        with np.load(os.path.join(path, name)) as z:
            xs.append(z["embeddings"])
            ys.append(z["labels"])
    return np.concatenate(xs), np.concatenate(ys)


# ------------------------------------------------------- measured children

def _gen_flags(args: argparse.Namespace) -> list[str]:
    flags = ["--num-classes", str(CLASSES), "--clusters", str(args.clusters),
             "--epsilon", str(args.epsilon), "--noise-seed", "1",
             "--block-size", str(args.block_size)]
    if args.vote:
        flags.append("--vote-filter")
    if args.vote_max_candidates:
        flags += ["--vote-max-candidates", str(args.vote_max_candidates)]
    return flags + args.gen_args.split()


def _config(flags: Sequence[str]):
    """GeneratorConfig from generate's own parser (same defaults)."""
    from dpsynth.dp_ops.config import labels_from
    from dpsynth.pipelines import job_plan
    from dpsynth.pipelines.cli import generate
    args, _ = _parse_generate(flags)
    # As the job resolves it ("auto" outside the adaptive plan: "shared").
    return job_plan.resolve_config(generate.spec_from_args(args), tuple(
        labels_from(args.num_classes, args.labels)))


def _input_flags(data: str) -> list[str]:
    """``--input`` of a data folder, with ``--embedding-dim`` where its
    format does not record d (TFRecord): generate takes d from public
    configuration only, never from a row (read here: synthetic data)."""
    from dpsynth.transforms import io
    pattern = os.path.join(data, "part-*")
    first = io.match_files(pattern)[0]
    if io.detect_format(first) != "tfrecord":
        return ["--input", pattern]
    dim = io.peek_dim(first, io.InputSpec(first))
    return ["--input", pattern, "--embedding-dim", str(dim)]


def _parse_generate(flags: Sequence[str]):
    from dpsynth.pipelines.cli import generate
    parser = generate.parser()
    flags = list(flags)
    if any("--record-timings" in a.option_strings for a in parser._actions):
        flags.append("--record-timings")
    return parser.parse_known_args(flags)


def rows_of(data: str) -> tuple[np.ndarray, np.ndarray]:
    """The rows of a ``make_files`` folder, drawn again in memory (float32,
    chunk order): parsing 1M TFRecord rows into float64 blocks and stacking
    them needs ~6 GB on top of the reference's own memory."""
    n, d = (int(v) for v in
            open(os.path.join(data, "DONE")).read().split()[0:3:2])
    centres = np.random.default_rng([0, d]).normal(
        size=(CLASSES, 4, d)) / math.sqrt(d)
    chunks = max(MIN_CHUNKS, math.ceil(n / SHARD_ROWS))
    bounds = np.linspace(0, n, chunks + 1).astype(int)
    parts = [_chunk(n, d, i, bounds, centres, CLASSES, 4, 0)
             for i in range(chunks)]
    return (np.concatenate([x for x, _ in parts]),
            np.concatenate([y for _, y in parts]))


def child_reference(data: str, flags: Sequence[str], result: str) -> None:
    from dpsynth.dp_ops import plan
    from benchmarks import reference
    from dpsynth.dp_ops.noise import SeededNoise
    t0 = time.perf_counter()
    cfg = _config(flags)
    made = os.path.basename(data).rsplit("-", 2)[-2:]
    x, y = (rows_of(data) if made[0] in ("tfrecord", "parquet")
            else load_dir(data))
    t_load = time.perf_counter() - t0
    timings: dict = {}
    t1 = time.perf_counter()
    if cfg.covariance in ("auto", "subspace"):  # the two-phase plan
        _, xs, _, _, _ = reference.generate_adaptive(
            x, y, cfg, SeededNoise(1), timings=timings)
    else:
        _, xs, _ = reference.generate(x, y, cfg, plan.make_ledger(cfg),
                                      SeededNoise(1), timings=timings)
    work = time.perf_counter() - t1
    _dump(result, {"load_s": t_load, "work_s": work, "stages_s": timings,
                   "samples": int(len(xs))})


def child_beam(data: str, flags: Sequence[str], result: str,
               profile: Optional[str] = None, reread: bool = False,
               dask_workers: int = 0) -> None:
    from dpsynth.pipelines import console, job
    from dpsynth.pipelines.cli import generate
    # Re-reading the files every pass is generate's default layout; the
    # other modes keep one materialised copy of the blocks.
    layout = [] if reread else ["--materialise-blocks"]
    out = tempfile.mkdtemp(prefix="dpsynth-bench-")
    if dask_workers:  # generate's own local cluster, started here
        from dpsynth.pipelines.runners.dask.cluster import local_cluster
        local_cluster(dask_workers)
        layout += ["--runner", "dask"]
    try:
        args, beam_argv = _parse_generate(
            [*_input_flags(data),
             "--output", os.path.join(out, "rel"), *flags, *layout])
        console.setup_logging()
        passes: list[str] = []
        _recording_progress(passes)
        t0 = time.perf_counter()
        if profile:
            prof = cProfile.Profile()
            prof.runcall(job.run, generate.spec_from_args(args, beam_argv))
            prof.dump_stats(profile)
        else:
            job.run(generate.spec_from_args(args, beam_argv))
        work = time.perf_counter() - t0
        with open(os.path.join(out, "rel", "_manifest.json")) as f:
            manifest = json.load(f)  # the pointer: samples, no timings
        plan = manifest.get("adaptive_plan") or {}
        _dump(result, {"work_s": work, "passes": passes,
                       "plan_mode": plan.get("mode"),
                       "samples": manifest["samples_total"]})
    finally:
        if dask_workers:
            from dpsynth.pipelines.runners.dask.cluster import close_local_cluster
            close_local_cluster()
        shutil.rmtree(out, ignore_errors=True)


def timed_moments(blocks: Iterable) -> dict:
    """One pass over ``(x, y, ...)`` blocks: Σx and xᵀx in float32.

    Time spent inside the iterator (decoding the input) is ``read_s``;
    time spent on the sums (cast included) is ``compute_s``. Timing each
    block separately splits one interleaved pass without holding the rows.
    """
    read_s = compute_s = 0.0
    rows, total, gram = 0, None, None
    it = iter(blocks)
    while True:
        t0 = time.perf_counter()
        block = next(it, None)
        t1 = time.perf_counter()
        read_s += t1 - t0
        if block is None:
            break
        x = np.asarray(block[0], dtype=np.float32)
        if total is None:
            total = np.zeros(x.shape[1], np.float32)
            gram = np.zeros((x.shape[1], x.shape[1]), np.float32)
        total += x.sum(axis=0)
        gram += x.T @ x
        rows += len(x)
        compute_s += time.perf_counter() - t1
    return {"rows": rows, "read_s": read_s, "compute_s": compute_s,
            "sum": total, "gram": gram}


def floor_seconds(passes: int, read_s: float, compute_s: float) -> float:
    """Issue 15's physical floor: every pass reads once and sums once."""
    return passes * (read_s + compute_s)


def job_reader(data: str, flags: Sequence[str]):
    """(InputSpec, ReadEmbeddingBlocks) of a data folder, as the job makes
    them from generate's parser: the reader lists the read ranges
    (TFRecord: --split-bytes byte ranges) and peeks at the schema (decoder
    imports) here, before any timing; no pipeline."""
    from dpsynth.transforms import io
    args, _ = _parse_generate([*_input_flags(data),
                               "--output", "unused", *flags])
    spec = io.InputSpec(args.input, args.input_format, args.embedding_feature,
                        args.label_feature, None, args.non_finite,
                        args.block_size, args.split_bytes)
    return spec, io.ReadEmbeddingBlocks(spec, args.embedding_dim)


def range_blocks(spec, reader, ranges) -> Iterator:
    """The validated blocks of ``ranges`` of ``reader``'s input
    (``dpsynth.transforms.io.read_range_blocks``)."""
    from dpsynth.transforms import io
    return (block for r in ranges for block in
            io.read_range_blocks(r, spec, reader.dim, reader.dim_source))


def _job_blocks(data: str, flags: Sequence[str]) -> Iterator:
    """The input's validated blocks, read as the job reads them."""
    spec, reader = job_reader(data, flags)
    return range_blocks(spec, reader, reader.ranges)


def child_floor(data: str, flags: Sequence[str], result: str) -> None:
    """One read + one float32 moments pass on one BLAS thread (issue 15);
    with the vote filter also its nearest-neighbour arithmetic floor."""
    from threadpoolctl import threadpool_limits
    with threadpool_limits(limits=1):
        blocks = _job_blocks(data, flags)
        t = timed_moments(blocks)
        doc = {"rows": t["rows"], "read_s": t["read_s"],
               "compute_s": t["compute_s"]}
        args, _ = _parse_generate(["--input", "unused", "--output", "unused",
                                   *flags])
        dim = t["gram"].shape[0]
        if args.vote_filter:
            doc.update(vote_nn_floor(t["rows"], dim, args.vote_oversample,
                                     args.vote_max_candidates))
        doc.update(output_floor(t["rows"], dim))
    _dump(result, doc)


def output_floor(rows: int, dim: int) -> dict:
    """The release's own work, which the issue's floor leaves out: drawing
    ``rows`` synthetic rows (``generator.sample_rows``: d + 128 normals a
    row, the rank-128 factor product, the projection onto the sphere) and
    encoding them as TFRecords (``dpsynth.transforms.write.tfrecord_bytes``), in
    the writer's pieces, on the current (one) BLAS thread."""
    import numpy as np
    from dpsynth.dp_ops import adaptive, generator
    from dpsynth.dp_ops.config import GeneratorConfig
    from dpsynth.transforms.write import WRITE_PIECE, tfrecord_bytes
    rng = np.random.default_rng(0)
    rank = min(adaptive.RuleConstants().shared_rank, dim)
    mix = generator.ClassMixture(
        label=0, weights=np.ones(1), means=rng.normal(0, 0.05, (1, dim)),
        variances=np.full((1, dim), 1e-3), noisy_count=float(rows),
        factors=rng.normal(0, 0.01, (dim, rank)), centre=np.zeros(dim))
    cfg = GeneratorConfig(labels=(0,))
    t0 = time.perf_counter()
    for start in range(0, rows, WRITE_PIECE):
        x = generator.sample_rows(mix, cfg, rows, start,
                                  min(rows, start + WRITE_PIECE))
        tfrecord_bytes(x, 0)
    return {"output_s": time.perf_counter() - t0}


def vote_nn_flops(rows: int, dim: int, oversample: float,
                  cap: Optional[int], classes: int = CLASSES) -> float:
    """Multiply-adds x 2 of the vote's exact nearest-neighbour search: every
    real row of a class against each of the class's candidates
    (min(oversample x class rows, cap); the benchmark's classes are equal)."""
    per_class = rows / classes
    cands = oversample * per_class if cap is None else min(
        oversample * per_class, cap)
    return 2.0 * rows * cands * dim


def sgemm_rate(dim: int, repeats: int = 10) -> float:
    """Peak float32 flop/s of the vote kernel's tile product (ROW_TILE rows
    x CANDIDATE_TILE candidates, dim deep) on the current BLAS threads."""
    import numpy as np
    from dpsynth.dp_ops import vote
    rng = np.random.default_rng(0)
    a = rng.standard_normal((vote.ROW_TILE, dim)).astype(np.float32)
    b = rng.standard_normal((vote.CANDIDATE_TILE, dim)).astype(np.float32)
    a @ b.T  # warm up
    best = math.inf  # the peak: the fastest of the repeats (shared cores)
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b.T
        best = min(best, time.perf_counter() - t0)
    return 2.0 * a.shape[0] * b.shape[0] * dim / best


def vote_nn_floor(rows: int, dim: int, oversample: float,
                  cap: Optional[int]) -> dict:
    """The exact vote's arithmetic at the measured one-thread sgemm peak:
    work no implementation of the exact vote can skip (the issue's floor
    counts read + sums only)."""
    flops = vote_nn_flops(rows, dim, oversample, cap)
    rate = sgemm_rate(dim)
    return {"vote_nn_flops": flops, "sgemm_gflops": rate / 1e9,
            "vote_nn_s": flops / rate}


def _recording_progress(seen: list) -> None:
    """Records the pass names generate hands its progress printer (one
    printer per Beam pipeline: the passes the run really makes)."""
    from dpsynth.pipelines import console
    base = console.ProgressPrinter

    class Recording(base):
        def __init__(self, path, passes, *a, **kw) -> None:
            seen.extend(passes)
            super().__init__(path, passes, *a, **kw)

    console.ProgressPrinter = Recording


def _dump(path: str, doc: dict) -> None:
    with open(path, "w") as f:
        json.dump(doc, f)


def _resident(proc) -> int:
    """A process's share of resident memory (PSS): pages shared with others
    count once in a sum (DirectRunner's workers are forked from one
    server and share its pages; their RSS would count them once each).
    RSS where PSS cannot be read."""
    import psutil
    try:
        return proc.memory_full_info().pss
    except (psutil.AccessDenied, AttributeError):
        return proc.memory_info().rss


# Seconds between PSS readings of a run's processes. Reading PSS walks
# each process's page tables: ~25 ms of CPU for a two-worker 2M-row job
# here, and it holds the process's memory map lock while its workers fault
# pages. Read at every 0.2 s poll (until session 25), that took ~11 % of a
# core beside the run: free at W = 1 (a pinned run leaves the other core
# idle) but taken from the workers at W = 2, so f came out higher than the
# pipeline's own (the moments pass: 1.13 x W = 1's work against 1.03 in
# the same job unpolled).
PSS_EVERY_S = 2.0


def measure(cmd: list[str], timeout: float, max_rss: float = float("inf"),
            poll: float = 0.2, pss_every: float = PSS_EVERY_S,
            env: Optional[dict] = None) -> dict:
    """Runs cmd; wall time, peak resident memory (PSS, see ``_resident``)
    of any one process and of their sum.

    The run is killed past ``timeout`` seconds or when its processes
    together hold more than ``max_rss`` bytes (the machine is shared).
    Every ``poll`` seconds the processes' RSS is read (cheap); their PSS
    every ``pss_every`` seconds (see ``PSS_EVERY_S``) and whenever the RSS
    sum passes ``max_rss`` (RSS counts shared pages once per process, so
    only PSS decides a kill). Peaks are of the PSS readings.
    """
    import psutil
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    root = psutil.Process(proc.pid)
    peak_one = peak_sum = 0
    peak_procs = 0
    per_proc: dict[int, int] = {}  # pid -> peak PSS, workers included
    load_before = os.getloadavg()[0]
    timed_out = over_memory = False
    last_pss = -float("inf")
    while proc.poll() is None:
        try:
            tree = [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            break
        now = time.perf_counter()
        if (now - last_pss >= pss_every
                or _rss_sum(tree) > max_rss):
            last_pss = now
            rss = []
            for p in tree:
                try:
                    rss.append(_resident(p))
                    per_proc[p.pid] = max(per_proc.get(p.pid, 0), rss[-1])
                except psutil.Error:
                    pass
            peak_one = max(peak_one, max(rss, default=0))
            peak_sum = max(peak_sum, sum(rss))
            peak_procs = max(peak_procs, len(rss))
            over_memory = sum(rss) > max_rss
        timed_out = now - t0 > timeout
        if timed_out or over_memory:
            for p in reversed(tree):
                try:
                    p.kill()
                except psutil.Error:
                    pass
            break
        try:  # returns as soon as the run ends
            proc.wait(timeout=poll)
        except subprocess.TimeoutExpired:
            pass
    output = proc.communicate()[0]
    return {"wall_s": time.perf_counter() - t0, "rc": proc.returncode,
            "timed_out": timed_out, "over_memory": over_memory,
            "peak_rss_one": peak_one,
            "peak_rss_sum": peak_sum, "processes": peak_procs,
            # every process but the child itself: the runner's workers
            "peak_rss_workers": sorted((v for k, v in per_proc.items()
                                        if k != proc.pid), reverse=True),
            "load": (load_before, os.getloadavg()[0]),
            "log_tail": output[-3000:]}


def _rss_sum(tree) -> int:
    """The processes' summed RSS (/proc/PID/statm: no page-table walk)."""
    import psutil
    total = 0
    for p in tree:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def run_mode(mode: str, data: str, args: argparse.Namespace) -> dict:
    fd, result = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    flags = _gen_flags(args)
    me = [sys.executable, os.path.abspath(__file__)]
    if mode == "reference":
        cmd = me + ["_reference", data, result, *flags]
    elif mode == "floor":
        cmd = me + ["_floor", data, result, *flags]
    else:
        extra = (["--direct_num_workers=2",
                  "--direct_running_mode=multi_processing"]
                 if mode.startswith("direct2") else
                 ["--dask-workers=2"] if mode.startswith("dask2") else [])
        if mode.endswith("-reread"):
            extra.append("--reread")
        cmd = me + ["_beam", data, result, *flags, *extra]
    return run_child(cmd, result, args, args.timeout)


def run_child(cmd: list[str], result: str, args: argparse.Namespace,
              timeout: float) -> dict:
    """Runs one measured child (at --nice) that writes its JSON to
    ``result``; its measurements plus that JSON (``failed`` if none)."""
    cmd = ["nice", "-n", str(args.nice)] + cmd if args.nice else cmd
    stats = measure(cmd, timeout, args.max_rss_gb * 2 ** 30)
    try:
        with open(result) as f:
            stats.update(json.load(f))
    except (OSError, ValueError):
        stats["failed"] = True
    os.remove(result)
    return stats


# ---------------------------------------------------------------- vote bench

def untiled_votes(x: np.ndarray, candidates: np.ndarray,
                  chunk: int = 4096) -> np.ndarray:
    """The vote search before ISSUE 6, for comparison: float64, all
    candidates per 4096-row chunk (a chunk x m distance matrix), the
    candidates' norms recomputed per call."""
    from dpsynth.dp_ops.kmeans import nearest
    hist = np.zeros(len(candidates))
    for start in range(0, len(x), chunk):
        hist += np.bincount(nearest(x[start:start + chunk], candidates),
                            minlength=len(candidates))
    return hist


def vote_bench(dims: Sequence[int], rows: int, cands: Sequence[int],
               seed: int = 0, untiled_max: int = 30_000) -> list[dict]:
    """Times the exact vote histogram (nearest candidate of every row):
    the tiled float32 search of ``dpsynth.dp_ops.vote`` and, up to ``untiled_max``
    candidates (its memory is 4096 x m x 8 bytes x 2), the old one."""
    from dpsynth.dp_ops import vote
    out = []
    rng = np.random.default_rng(seed)
    for d in dims:
        x = rng.standard_normal((rows, d))
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        for m in cands:
            c = rng.standard_normal((m, d))
            c /= np.linalg.norm(c, axis=1, keepdims=True)
            runs = [("tiled float32", lambda: vote.block_votes(x, c))]
            if m <= untiled_max:
                runs.append(("untiled float64", lambda: untiled_votes(x, c)))
            for name, fn in runs:
                t0 = time.perf_counter()
                hist = fn()
                dt = time.perf_counter() - t0
                assert hist.sum() == rows
                out.append({"d": d, "rows": rows, "candidates": m,
                            "method": name, "s": dt,
                            "gflops": 2.0 * rows * m * d / dt / 1e9})
    return out


# ------------------------------------------------------------------ report

def fit_exponent(ns: Sequence[int], ts: Sequence[float]) -> Optional[float]:
    """Least-squares slope of log t vs log n."""
    if len(ns) < 2:
        return None
    return float(np.polyfit(np.log(ns), np.log(ts), 1)[0])


def _gb(b: float) -> str:
    return f"{b / 2 ** 30:.2f}"


def _workers(r: dict, top: int = 2) -> str:
    """Peak RSS of the largest worker processes (not the child itself)."""
    peaks = r.get("peak_rss_workers") or []
    return ", ".join(_gb(v) for v in peaks[:top]) or "-"


def _load(r: dict) -> str:
    load = r.get("load")
    return "-" if not load else f"{load[0]:.1f} / {load[1]:.1f}"


def report(results: list[dict], votes: list[dict], profile_text: str,
           args: argparse.Namespace, flags: Optional[str] = None) -> str:
    data = ("default .npz shards" if args.files is None else
            f"{args.files} {args.format} file(s)")
    lines = [f"Run {time.strftime('%Y-%m-%d %H:%M')} on {platform.node()} "
             f"({os.cpu_count()} cores, shared; children under nice "
             f"{args.nice}). Input: {data}. "
             f"Flags: `{flags or ' '.join(_gen_flags(args))}`. "
             "Wall = the child process end to end (imports, reading the "
             "input, the run; dask2: starting and closing its cluster too); "
             "work = the generate call inside it (reference: excluding the "
             "load). Peak RSS sampled every 0.2 s: max = largest single "
             "process, sum = all processes of the run, worker peaks = the "
             "largest processes other than the child (Beam's or Dask's "
             "workers; Dask's scheduler runs in the child).",
             "",
             "| d | n | mode | wall s | work s | rows/s (wall) | peak RSS max GB "
             "| peak RSS sum GB | procs | worker peaks GB | load 1-min "
             "before/after | note |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if r.get("skipped"):
            lines.append(f"| {r['d']} | {r['n']:,} | {r['mode']} | - | - | - "
                         f"| - | - | - | - | - | skipped: {r['skipped']} |")
            continue
        ok = not r.get("failed") and r["rc"] == 0
        note = ("timed out" if r["timed_out"] else
                "killed at --max-rss-gb" if r.get("over_memory") else
                "" if ok else f"failed rc={r['rc']}")
        work = r.get("work_s")
        work = "-" if work is None else f"{work:.1f}"
        lines.append(
            f"| {r['d']} | {r['n']:,} | {r['mode']} | {r['wall_s']:.1f} | "
            f"{work} | {r['n'] / r['wall_s']:,.0f} | {_gb(r['peak_rss_one'])} "
            f"| {_gb(r['peak_rss_sum'])} | {r['processes']} | "
            f"{_workers(r)} | {_load(r)} | {note} |")
    lines += ["", "Ratios and scaling (wall time):", "",
              "| d | mode | exponent (fit over n) | t(1M)/t(100k) | "
              "Beam/reference per n |", "|---|---|---|---|---|"]
    good = [r for r in results if not r.get("skipped") and r["rc"] == 0
            and not r.get("failed")]
    for d in sorted({r["d"] for r in good}):
        ref = {r["n"]: r["wall_s"] for r in good
               if r["d"] == d and r["mode"] == "reference"}
        for mode in MODES:
            rows = sorted((r["n"], r["wall_s"]) for r in good
                          if r["d"] == d and r["mode"] == mode)
            if not rows:
                continue
            ns, ts = zip(*rows)
            exp = fit_exponent(ns, ts)
            t = dict(rows)
            step = (f"{t[1_000_000] / t[100_000]:.2f}"
                    if 1_000_000 in t and 100_000 in t else "-")
            ratio = ("-" if mode == "reference" else ", ".join(
                f"{n:,}: {t[n] / ref[n]:.2f}" for n in ns if n in ref) or "-")
            lines.append(f"| {d} | {mode} | "
                         f"{'-' if exp is None else f'{exp:.2f}'} | {step} | "
                         f"{ratio} |")
    stage_rows = [r for r in good if r["mode"] == "reference"
                  and r.get("stages_s")]
    if stage_rows:
        names = list(stage_rows[0]["stages_s"])
        lines += ["", "Reference stage times (s, summed over classes):", "",
                  "| d | n | " + " | ".join(names) + " |",
                  "|---|---|" + "---|" * len(names)]
        for r in stage_rows:
            lines.append(f"| {r['d']} | {r['n']:,} | " + " | ".join(
                f"{r['stages_s'].get(k, 0):.2f}" for k in names) + " |")
    if votes:
        lines += ["", "Vote filter alone (`dpsynth.dp_ops.vote.block_votes`, exact "
                  "nearest candidate of every row):", "",
                  "| d | real rows | candidates | method | s | GFLOP/s |",
                  "|---|---|---|---|---|---|"]
        for v in votes:
            lines.append(f"| {v['d']} | {v['rows']:,} | {v['candidates']:,} "
                         f"| {v['method']} | {v['s']:.2f} | "
                         f"{v['gflops']:.1f} |")
    if profile_text:
        lines += ["", "cProfile of the in-process DirectRunner run "
                  "(top functions by cumulative time):", "", "```",
                  profile_text.rstrip(), "```"]
    return "\n".join(lines) + "\n"


def _ok(r: Optional[dict]) -> bool:
    return bool(r) and not r.get("skipped") and not r.get("failed") \
        and r.get("rc") == 0


def _ratio(a: Optional[dict], b: Optional[float]) -> str:
    return f"{a['wall_s'] / b:.2f}" if _ok(a) and b else "-"


def floor_row(runs: dict) -> dict:
    """Issue 15's numbers for one (config, n) from its mode -> result map:
    the passes the Beam run made, the floor they imply, the ratios."""
    beam, ref, flo = (runs.get(m) for m in ("direct2-reread", "reference",
                                            "floor"))
    passes = beam.get("passes") if _ok(beam) else None
    floor = (floor_seconds(len(passes), flo["read_s"], flo["compute_s"])
             if passes and _ok(flo) else None)
    nn = flo.get("vote_nn_s") if _ok(flo) else None
    out = flo.get("output_s") if _ok(flo) else None
    return {"passes": passes, "floor": floor, "vote_nn_s": nn,
            "output_s": out,
            "beam_floor_out": _ratio(beam, floor + (nn or 0) + out)
            if floor is not None and out else "-",
            "beam_ref": _ratio(beam, ref["wall_s"] if _ok(ref) else None),
            "beam_floor": _ratio(beam, floor),
            "beam_floor_nn": _ratio(beam, floor + nn)
            if floor is not None and nn else "-"}


def _wall(r: Optional[dict]) -> str:
    return "not run" if not r else f"{r['wall_s']:.1f}" if _ok(r) \
        else "failed"


def _floor_line(config: str, d: int, n: int, runs: dict) -> str:
    row = floor_row(runs)
    beam, ref, flo = (runs.get(m) for m in ("direct2-reread", "reference",
                                            "floor"))
    passes = row["passes"]
    names = f"{len(passes)}: {', '.join(passes)}" if passes else "-"
    read, comp = ((f"{flo['read_s']:.1f}", f"{flo['compute_s']:.1f}")
                  if _ok(flo) else ("-", "-"))
    floor = "-" if row["floor"] is None else f"{row['floor']:.1f}"
    return (f"| {config} (d={d}) | {n:,} | {names} | {_wall(beam)} | "
            f"{_wall(ref)} | {read} | {comp} | {floor} | {row['beam_ref']} | "
            f"{row['beam_floor']} | "
            f"{'-' if not row['vote_nn_s'] else format(row['vote_nn_s'], '.1f')}"
            f" | {row['beam_floor_nn']} | "
            f"{'-' if not row['output_s'] else format(row['output_s'], '.1f')}"
            f" | {row['beam_floor_out']} | {_workers(beam) if beam else '-'} | "
            f"{_load(beam) if beam else '-'} | "
            f"{(beam or {}).get('plan_mode') or '-'} |")


def floor_report(results: list[dict]) -> str:
    """The issue 15 table: config, n, passes, Beam / in-memory / floor."""
    lines = ["Issue 15 table. Beam = `direct2-reread` (DirectRunner, 2 "
             "worker processes, multi_processing, every pass re-reads the "
             "files); in-memory = `reference`; floor = passes x (read + "
             "compute) from the `floor` child (one BLAS thread: one read of "
             "the input with dpsynth.transforms.io's range reader, one float32 pass "
             "of sum x and x^T x in the job's blocks); passes = the names "
             "generate handed its progress printer in the Beam run. Vote NN "
             "s (vote config only): the exact vote's nearest-neighbour "
             "arithmetic (2 x rows x candidates per class x d flops) at the "
             "one-thread float32 GEMM rate measured in the floor child; the "
             "issue's floor leaves it out. Output s: drawing and encoding "
             "the release's rows with the job's own sampler and TFRecord "
             "encoder on one thread (``output_floor``), which the issue's "
             "floor also leaves out.", "",
             "| config | n | passes | Beam wall s | in-memory wall s | read s "
             "| compute s | floor s | Beam/in-memory | Beam/floor | vote NN s "
             "| Beam/(floor + NN) | output s | Beam/(floor + NN + output) | "
             "peak RSS per worker GB (Beam) | load before/after (Beam) | "
             "plan mode |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
             "---|---|"]
    keys = sorted({(r["config"], r["d"], r["n"]) for r in results},
                  key=lambda k: (list(CONFIGS).index(k[0]), k[1], k[2]))
    for config, d, n in keys:
        runs = {r["mode"]: r for r in results
                if (r["config"], r["d"], r["n"]) == (config, d, n)}
        lines.append(_floor_line(config, d, n, runs))
    lines += fixed_cost_lines(results)
    lines += ["", "Flags per config: " + "; ".join(
        f"{c}: `{f}`" for c, f in dict((r["config"], r["flags"])
                                       for r in results).items())]
    return "\n".join(lines) + "\n"


def fixed_cost_lines(results: list[dict]) -> list[str]:
    """Beam wall = fixed + per-row x n, through the two largest sizes of a
    config: what start-up, stage changes and the noise step cost whatever
    n, and the per-row part at the largest n against the floor."""
    lines = ["", "Fixed and per-row cost of the Beam run (a line through its "
             "two largest sizes: wall = fixed + per-row x n; per-row part = "
             "wall - fixed at the largest n):", "",
             "| config | n | fixed s | per-row part s | floor s | "
             "per-row part / floor | per-row part / (floor + NN + output) |",
             "|---|---|---|---|---|---|---|"]
    for config in dict.fromkeys(r["config"] for r in results):
        sizes = sorted({r["n"] for r in results if r["config"] == config
                        and r["mode"] == "direct2-reread" and _ok(r)})
        if len(sizes) < 2:
            continue
        n1, n2 = sizes[-2:]
        runs = {n: {r["mode"]: r for r in results
                    if r["config"] == config and r["n"] == n}
                for n in (n1, n2)}
        d = runs[n2]["direct2-reread"]["d"]
        w1, w2 = (runs[n]["direct2-reread"]["wall_s"] for n in (n1, n2))
        fixed = w1 - (w2 - w1) / (n2 - n1) * n1
        row = floor_row(runs[n2])
        if row["floor"] is None:
            continue
        extra = (row["vote_nn_s"] or 0) + (row["output_s"] or 0)
        per_row = w2 - fixed
        lines.append(f"| {config} (d={d}) | {n2:,} | {fixed:.1f} | "
                     f"{per_row:.1f} | {row['floor']:.1f} | "
                     f"{per_row / row['floor']:.2f} | "
                     f"{per_row / (row['floor'] + extra):.2f} |")
    return lines if len(lines) > 5 else []


def write_section(path: str, name: str, text: str) -> None:
    begin, end = f"<!-- scaling:{name}:begin -->", f"<!-- scaling:{name}:end -->"
    block = f"{begin}\n{text}{end}\n"
    old = open(path).read() if os.path.exists(path) else "# Scaling benchmark\n\n"
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        new = head + block + rest.split(end, 1)[1].lstrip("\n")
    else:
        new = old.rstrip("\n") + f"\n\n## {name}\n\n" + block
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(new)


def profile_run(data: str, args: argparse.Namespace, top: int = 30) -> str:
    fd, stats_path = tempfile.mkstemp(suffix=".prof")
    os.close(fd)
    fd, result = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    me = [sys.executable, os.path.abspath(__file__)]
    cmd = me + ["_beam", data, result, "--profile-to", stats_path,
                *_gen_flags(args)]
    if args.profile_reread:
        cmd.append("--reread")
    if args.nice:
        cmd = ["nice", "-n", str(args.nice)] + cmd
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=args.timeout)
    buf = _io.StringIO()
    st = pstats.Stats(stats_path, stream=buf)
    st.sort_stats("cumulative").print_stats(top)
    os.remove(stats_path)
    os.remove(result)
    text = buf.getvalue()
    return text[text.find("   ncalls"):] if "   ncalls" in text else text


# -------------------------------------------------------------------- main

def _ints(text: str) -> list[int]:
    return [int(float(v)) for v in text.split(",") if v.strip()]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dims", type=_ints, default=[384, 1280])
    p.add_argument("--sizes", type=_ints, default=None,
                   help="rows; default 10k,100k,1M (1M only for d <= 384 "
                   "unless --max-cells allows it)")
    p.add_argument("--max-cells", type=float, default=5e8,
                   help="default sizes skip n*d above this (time, disk)")
    p.add_argument("--ref-max-cells", type=float, default=5e8,
                   help="skip the in-memory reference above n*d (it holds "
                   "the data in float64 twice)")
    p.add_argument("--modes", default=",".join(DEFAULT_MODES),
                   help=f"comma-separated, from {', '.join(MODES)}")
    p.add_argument("--configs", default="",
                   help="issue 15: comma-separated from "
                   f"{', '.join(CONFIGS)} (each sets --clusters and the vote "
                   "filter); modes default to "
                   f"{','.join(FLOOR_MODES)} and the report gains the floor "
                   "table")
    p.add_argument("--save", default="",
                   help="append every run's result here (JSON lines)")
    p.add_argument("--report-from", default="",
                   help="no runs: report the JSON lines of --save")
    p.add_argument("--clusters", type=int, default=16)
    p.add_argument("--epsilon", type=float, default=4.0)
    p.add_argument("--block-size", type=int, default=4096)
    p.add_argument("--no-vote", dest="vote", action="store_false")
    p.add_argument("--vote-max-candidates", type=int, default=None)
    p.add_argument("--gen-args", default="",
                   help="more `dpsynth generate` flags, e.g. "
                   "'--covariance-rank 0'")
    p.add_argument("--files", type=int, default=None,
                   help="write the rows as this many files (default: .npz "
                   "shards of 100k rows, at least 4)")
    p.add_argument("--format", choices=DATA_FORMATS, default="npz",
                   help="file format with --files (tfrecord/parquet files "
                   "are read in --split-bytes ranges)")
    p.add_argument("--cache", default=DEFAULT_CACHE)
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--section", default="latest")
    p.add_argument("--timeout", type=float, default=900,
                   help="seconds a run may take")
    p.add_argument("--budget", type=float, default=0,
                   help="with --workers: seconds for the whole sweep; runs "
                   "that no longer fit (--min-run) are skipped")
    p.add_argument("--min-run", type=float, default=20)
    p.add_argument("--nice", type=int, default=10)
    p.add_argument("--max-rss-gb", type=float, default=8.0,
                   help="kill a run whose processes hold more than this")
    p.add_argument("--profile", action="store_true",
                   help="cProfile one in-process DirectRunner run "
                   "(the largest d/n run)")
    p.add_argument("--profile-reread", action="store_true",
                   help="profile the -reread variant")
    p.add_argument("--workers", type=_ints, default=None,
                   help="issue 27: run each --configs (default: default) on "
                   "each --engines with these worker counts, e.g. 1,2; "
                   "report speed-up, efficiency, Amdahl's serial fraction "
                   "and a per-stage table (to --out, default "
                   "results/scaling-workers.md)")
    p.add_argument("--repeat", type=int, default=1,
                   help="with --workers: run every (config, engine, W) this "
                   "many times, interleaved; the report adds medians and f "
                   "from the median job times")
    p.add_argument("--probe-mb", type=int, default=256,
                   help="with --workers: before each run, time the first "
                   "touch of this many MB of fresh memory and a page-cache "
                   "write of as many (benchmarks/machine_probe.py); 0: off")
    p.add_argument("--no-pin", dest="pin", action="store_false",
                   help="with --workers: let every run use every core (by "
                   "default a run with W workers runs on W cores: Amdahl's "
                   "f needs one core at W = 1)")
    p.add_argument("--engines", default="direct,dask",
                   help=f"with --workers: comma-separated from "
                   f"{', '.join(ENGINES)}")
    p.add_argument("--hosts", type=_ints, default=None,
                   help="issue 52: run --configs' first (default: default) "
                   "on the multi-host harness (benchmarks/hosts.py, root) "
                   "with these worker-host counts, e.g. 1,2, input and "
                   "output on its GCS emulator (--dims[0] x --sizes[0]); "
                   "report the speed-up and the emulator's I/O (section "
                   "`hosts` of --out)")
    p.add_argument("--warmup", action="store_true",
                   help="with --hosts: one unrecorded job on the fewest "
                   "hosts before the sweep (the emulator's first job after "
                   "the upload ran 29 s slower at 2M x 384: its collector)")
    p.add_argument("--vote-bench", action="store_true")
    p.add_argument("--vote-bench-rows", type=int, default=20_000)
    p.add_argument("--vote-bench-candidates", type=_ints,
                   default=[2_000, 10_000, 30_000])
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "_reference":
        child_reference(argv[1], argv[3:], argv[2])
        return 0
    if argv and argv[0] == "_floor":
        child_floor(argv[1], argv[3:], argv[2])
        return 0
    if argv and argv[0] == "_workers":
        pin_cores(int(argv[5]))
        child_workers(argv[1], argv[6:], argv[2], argv[3], int(argv[4]))
        return 0
    if argv and argv[0] == "_beam":
        rest, profile = argv[3:], None
        if "--profile-to" in rest:
            i = rest.index("--profile-to")
            profile = rest[i + 1]
            del rest[i:i + 2]
        reread = "--reread" in rest
        workers = [a for a in rest if a.startswith("--dask-workers=")]
        rest = [a for a in rest if a != "--reread" and a not in workers]
        child_beam(argv[1], rest, argv[2], profile, reread,
                   int(workers[0].split("=")[1]) if workers else 0)
        return 0
    args = parser().parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    bad = set(modes) - set(MODES)
    if bad:
        raise SystemExit(f"--modes: unknown {sorted(bad)}; choose from {MODES}")
    configs = [c for c in args.configs.split(",") if c]
    if set(configs) - set(CONFIGS):
        raise SystemExit(f"--configs: choose from {', '.join(CONFIGS)}")
    if configs and args.modes == ",".join(DEFAULT_MODES):
        modes = list(FLOOR_MODES)
    if args.hosts:  # issue 52: speed-up over worker hosts
        return hand_over("benchmarks.scaling_hosts", argv)
    if args.workers:  # issue 27: speed-up over worker counts
        return sweep_workers(args, configs)
    if args.report_from:  # re-report saved runs (e.g. a cut-short sweep)
        with open(args.report_from) as f:
            results = [json.loads(line) for line in f if line.strip()]
        return finish(results, args, configs)
    results = []
    for config in configs or [None]:
        if config is not None:
            args.clusters, args.vote = CONFIGS[config]
        results += run_grid(args, modes, config)
    return finish(results, args, configs)


def hand_over(module: str, argv: Optional[Sequence[str]]) -> int:
    """Runs ``python -m module`` with these flags (its exit code): a sweep
    that builds on this module runs as its own command, which this module
    does not import (no import circle)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (ROOT, env.get("PYTHONPATH")) if p)
    return subprocess.call([sys.executable, "-m", module,
                            *(sys.argv[1:] if argv is None else argv)],
                           env=env)


def sweep_workers(args: argparse.Namespace, configs: Sequence[str]) -> int:
    """--workers: run (or --report-from) the sweep, print and write it."""
    engines = [e for e in args.engines.split(",") if e]
    if args.repeat < 1:
        raise SystemExit(f"--repeat must be >= 1, got {args.repeat}")
    if set(engines) - set(ENGINES):
        raise SystemExit(f"--engines: choose from {', '.join(ENGINES)}")
    if args.report_from:
        with open(args.report_from) as f:
            results = [json.loads(line) for line in f if line.strip()]
    else:
        results = run_workers(args, configs or ["default"], engines,
                              args.workers)
    text = workers_report(results)
    print(text)
    out = (args.out if args.out != DEFAULT_OUT else
           os.path.join(ROOT, "benchmarks", "results", "scaling-workers.md"))
    write_section(out, args.section, text)
    return 0


def run_grid(args: argparse.Namespace, modes: Sequence[str],
             config: Optional[str]) -> list[dict]:
    """Every (d, n, mode) of one configuration."""
    results = []
    for d in args.dims:
        sizes = args.sizes or [n for n in (10_000, 100_000, 1_000_000)
                               if n * d <= args.max_cells]
        for n in sizes:
            t0 = time.perf_counter()
            data = (make_data(args.cache, n, d) if args.files is None else
                    make_files(args.cache, n, d, args.files, args.format))
            print(f"data d={d} n={n}: {data} ({time.perf_counter() - t0:.0f} s)",
                  flush=True)
            for mode in modes:
                if mode == "reference" and n * d > args.ref_max_cells:
                    results.append({"d": d, "n": n, "mode": mode,
                                    "skipped": "n*d > --ref-max-cells"})
                    continue
                r = run_mode(mode, data, args)
                r.update(d=d, n=n, mode=mode, config=config,
                         flags=" ".join(_gen_flags(args)))
                results.append(r)
                if args.save:  # one JSON line per run, as soon as it ends
                    with open(args.save, "a") as f:
                        f.write(json.dumps(r) + "\n")
                if mode == "floor":
                    print(f"  floor     read {r.get('read_s', 0):.1f} s  "
                          f"compute {r.get('compute_s', 0):.1f} s",
                          flush=True)
                if r.get("passes"):
                    print(f"  passes: {', '.join(r['passes'])}", flush=True)
                print(f"  {mode:9s} wall {r['wall_s']:7.1f} s  work "
                      f"{r.get('work_s', float('nan')):7.1f} s  peak "
                      f"{_gb(r['peak_rss_one'])}/{_gb(r['peak_rss_sum'])} GB"
                      f"  rc={r['rc']}", flush=True)
                if r["rc"] != 0 or r.get("failed"):
                    print(r["log_tail"], flush=True)
    return results


# ------------------------------------------------ worker sweep (issue 27)
# One engine = how `dpsynth generate` gets W workers. Flink, Spark and
# Prism go here too (dpsynth.deploy.runner_options.flink_args / spark_args / prism_args
# with parallelism W), one entry each; start()/stop() bracket the job for
# engines that need a cluster started for it.

class Engine:
    """W workers of one runner: the Beam flags, and any cluster to start
    (before the timed job; its start and stop are reported apart)."""

    name = ""

    def flags(self, workers: int) -> list[str]:
        raise NotImplementedError

    def launch(self, workers: int) -> None:
        """What ``dpsynth generate`` starts as soon as its flags parse,
        before it imports the pipeline (the child calls it first)."""

    def start(self, workers: int) -> None:
        pass

    def stop(self) -> None:
        pass


class DirectEngine(Engine):
    """DirectRunner, W SDK worker processes (multi_processing even for 1,
    so W = 1 pays the same start-up as W > 1)."""

    name = "direct"

    def flags(self, workers: int) -> list[str]:
        from dpsynth.deploy.runner_options import direct_args
        return direct_args(workers, "multi_processing")

    def launch(self, workers: int) -> None:
        # the worker fork server, whose imports then overlap the child's
        from dpsynth.pipelines.runners import direct_runner
        direct_runner.start_worker_server_for(self.flags(workers))


class DirectSpawnEngine(DirectEngine):
    """DirectRunner as above, its workers started as Beam starts them (a
    fresh interpreter each, importing Beam and PipelineDP) instead of
    forked from dpsynth's worker server: the baseline of that change."""

    name = "direct-spawn"

    def launch(self, workers: int) -> None:
        from dpsynth.pipelines.runners import direct_runner
        direct_runner.fork_workers(False)


class DaskEngine(Engine):
    """dpsynth's Dask runner on a LocalCluster of W single-threaded worker
    processes (generate reuses the cluster started here)."""

    name = "dask"

    def flags(self, workers: int) -> list[str]:
        from dpsynth.deploy.runner_options import dask_args
        return dask_args()

    def start(self, workers: int) -> None:
        from dpsynth.pipelines.runners.dask.cluster import local_cluster
        local_cluster(workers)

    def stop(self) -> None:
        from dpsynth.pipelines.runners.dask.cluster import close_local_cluster
        close_local_cluster()


ENGINES: dict[str, Engine] = {e.name: e for e in (DirectEngine(),
                                                   DaskEngine(),
                                                   DirectSpawnEngine())}


def child_workers(data: str, flags: Sequence[str], result: str, engine: str,
                  workers: int) -> None:
    """One job on ``engine`` with ``workers`` workers, every pass reading
    the files (generate's default layout); job time = generate.run (the
    engine's cluster start and stop timed apart); the stage trace
    (dpsynth.transforms.progress) of every worker. The engine is launched first,
    as the command line does (the fork server's imports run beside the
    pipeline's)."""
    eng = ENGINES[engine]
    eng.launch(workers)
    from dpsynth.pipelines import console, job
    from dpsynth.pipelines.cli import generate
    from dpsynth.pipelines.runners import cores
    from dpsynth.transforms import progress
    out = tempfile.mkdtemp(prefix="dpsynth-bench-")
    trace = os.path.join(out, "trace.tsv")
    os.environ[progress.TRACE_ENV] = trace  # before any worker starts
    try:
        args, beam_argv = _parse_generate(
            [*_input_flags(data),
             "--output", os.path.join(out, "rel"), *flags,
             *eng.flags(workers)])
        console.setup_logging()
        # The cluster is started and stopped outside the job's time (the
        # issue's "cluster start excluded"; a deployment's cluster is up
        # already) and timed on its own: the job leaves a cluster it did
        # not start running (pipelines/runners/dask/runner.py).
        t_start = time.time()
        eng.start(workers)
        t0 = time.time()
        try:
            job.run(generate.spec_from_args(args, beam_argv))
            work = time.time() - t0
        finally:
            t_stop = time.time()
            eng.stop()
            cluster = {"start": t0 - t_start, "stop": time.time() - t_stop}
        with open(os.path.join(out, "rel", "_manifest.json")) as f:
            manifest = json.load(f)
        spans = (progress.read_trace(trace) if os.path.exists(trace)
                 else [])
        _dump(result, {"work_s": work, "t0": t0, "cluster_s": cluster,
                       "stages": progress.stage_table(spans),
                       "busy_profile": busy_profile(spans, t0, t0 + work),
                       "samples": manifest["samples_total"],
                       "cores": os.cpu_count(),
                       "cores_used": cores.usable_cores(),
                       "release_sha256": release_digest(
                           os.path.join(out, "rel"))})
    finally:
        shutil.rmtree(out, ignore_errors=True)


def release_digest(rel: str) -> str:
    """One sha256 over the release's data files and its Gaussian mixture
    (names and contents, sorted by name): with a fixed --noise-seed every
    engine and worker count must give the same digest. The manifest (run
    id, timestamps) is left out."""
    import hashlib
    digest = hashlib.sha256()
    for root, _, names in sorted(os.walk(rel)):
        for name in sorted(names):
            if name.endswith(".json") or name.startswith("."):
                continue
            path = os.path.join(root, name)
            # Paths below the version folder (its name holds the run id).
            key = os.path.relpath(path, rel).split(os.sep, 1)[-1]
            digest.update(key.encode() + b"\0")
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 24), b""):
                    digest.update(chunk)
    return digest.hexdigest()


def run_workers(args: argparse.Namespace, configs: Sequence[str],
                engines: Sequence[str], workers: Sequence[int]) -> list[dict]:
    """Every (config, W, engine) on one data set (--dims[0] x --sizes[0]),
    in the order given (W outer, so both engines get each W before the
    next), --repeat times per config (each repeat runs every W before the
    next repeat starts, so a slow spell of a shared machine hits one pair,
    not one worker count); with --budget, a run that may not finish in
    what is left is skipped and reported so."""
    deadline = time.time() + args.budget if args.budget else None
    d, n = args.dims[0], (args.sizes or [200_000])[0]
    data = (make_data(args.cache, n, d) if args.files is None else
            make_files(args.cache, n, d, args.files, args.format))
    results = []
    for config in configs:
        args.clusters, args.vote = CONFIGS[config]
        for rep, w, engine in ((r, w, e) for r in range(args.repeat)
                               for w in workers for e in engines):
            timeout = args.timeout
            if deadline is not None:
                timeout = min(timeout, deadline - time.time())
                if timeout < args.min_run:
                    print(f"  {config:8s} {engine:6s} W={w:<3d} skipped:"
                          f" {max(timeout, 0):.0f} s of --budget left",
                          flush=True)
                    continue
            fd, result = tempfile.mkstemp(suffix=".json")
            os.close(fd)
            cmd = [sys.executable, os.path.abspath(__file__), "_workers",
                   data, result, engine, str(w), str(w if args.pin else 0),
                   *_gen_flags(args)]
            state = (machine_probe.probe(tempfile.gettempdir(),
                                         args.probe_mb)
                     if args.probe_mb > 0 else {})
            r = run_child(cmd, result, args, timeout)
            r.update(machine=state, d=d, n=n, config=config, engine=engine,
                     workers=w, repeat=rep, pinned=bool(args.pin),
                     flags=" ".join(_gen_flags(args)))
            results.append(r)
            if args.save:
                with open(args.save, "a") as f:
                    f.write(json.dumps(r) + "\n")
            print(f"  {config:8s} {engine:6s} W={w:<3d} #{rep + 1} job "
                  f"{r.get('work_s', float('nan')):6.1f} s  wall "
                  f"{r['wall_s']:6.1f} s  load {_load(r)}  memory "
                  f"{machine_probe.describe(state)}  rc={r['rc']}",
                  flush=True)
            if r["rc"] != 0 or r.get("failed"):
                print(r["log_tail"], flush=True)
    return results


def _pinning(runs: Sequence[dict]) -> str:
    if all(r.get("pinned") for r in runs):
        return "each run pinned to W cores (its runner, workers, cluster); "
    if any(r.get("pinned") for r in runs):
        return "some runs pinned to W cores (`pinned` in the JSON); "
    return "every run on all cores; "


def pin_cores(count: int) -> None:
    """Runs this process, and every process it starts (the runner's
    workers, the Dask cluster), on its first ``count`` usable cores (0:
    all). W workers on W cores: with every core, one DirectRunner worker
    draws its synthetic rows with all the machine's BLAS threads, and
    S(W) and f then compare W cores with more than one."""
    if count:
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:count])


def busy_profile(spans, start: float, end: float) -> list[float]:
    """Seconds of [start, end] during which exactly k worker processes
    were busy (k = 0, 1, ...): each process's spans merged first (a DoFn's
    span nests in its Dask task's)."""
    per_pid: dict = {}
    for _, pid, a, b in spans:
        per_pid.setdefault(pid, []).append((max(a, start), min(b, end)))
    events = []
    for items in per_pid.values():
        items.sort()
        cur = None
        for a, b in items:
            if b <= a:
                continue
            if cur and a <= cur[1]:
                cur[1] = max(cur[1], b)
            else:
                if cur:
                    events += [(cur[0], 1), (cur[1], -1)]
                cur = [a, b]
        if cur:
            events += [(cur[0], 1), (cur[1], -1)]
    events.sort()
    seconds = [0.0] * (len(per_pid) + 1)
    busy, t = 0, start
    for when, delta in events:
        seconds[busy] += when - t
        busy, t = busy + delta, when
    seconds[busy] += max(end - t, 0.0)
    return seconds


def timeline_serial(profile: Sequence[float], workers: int) -> Optional[float]:
    """Amdahl's f from one run's busy profile: the run on one worker would
    take sum(max(k, 1) * s_k) (the idle time s_0, driver and start-up, stays),
    so S = that / sum(s_k). Less sensitive to other jobs' load than two
    timed runs (both phases see the same machine), but still an estimate:
    contention stretches spans, and untraced work counts as idle."""
    total = sum(profile)
    if workers < 2 or total <= 0:
        return None
    one = sum(max(k, 1) * s for k, s in enumerate(profile))
    return amdahl_serial(one / total, workers)


def busy_work(profile: Sequence[float]) -> float:
    """Worker-seconds of traced work in one run's busy profile (k workers
    busy for s_k seconds: sum k * s_k). W workers doing W = 1's work with
    no overhead give the same; more is work the run added or the machine
    slowed (on a 2-vCPU VM two busy workers each run slower than one)."""
    return sum(k * s for k, s in enumerate(profile))


def amdahl_serial(speedup: float, workers: int) -> Optional[float]:
    """Amdahl's serial fraction from S(W): f = (W/S - 1) / (W - 1)
    (W = 2: f = 2/S - 1)."""
    if workers < 2 or not speedup:
        return None
    return (workers / speedup - 1) / (workers - 1)


def _cluster(r: dict) -> str:
    c = r.get("cluster_s") or {}
    return (f"{c['start']:.1f} / {c['stop']:.1f}"
            if c.get("start", 0) + c.get("stop", 0) >= 0.05 else "-")


def identity_line(ok: Sequence[dict]) -> str:
    """Whether each config's releases (fixed --noise-seed) are byte-identical
    over its engines and worker counts."""
    parts = []
    for config in CONFIGS:
        digests = {r["release_sha256"] for r in ok
                   if r["config"] == config and r.get("release_sha256")}
        runs = sum(1 for r in ok if r["config"] == config
                   and r.get("release_sha256"))
        if runs:
            parts.append(f"`{config}`: {runs} runs, " + (
                "all byte-identical" if len(digests) == 1 else
                f"{len(digests)} DIFFERENT releases"))
    return ("Releases (sha256 of data files and mixture): "
            + "; ".join(parts) + "." if parts else "")


def _same_repeat(runs: Sequence[dict], r: dict, workers: int
                 ) -> Optional[dict]:
    """The run of ``runs`` with ``workers`` workers in r's repeat (and
    of r's size)."""
    return next((b for b in runs if b["workers"] == workers
                 and b.get("repeat", 0) == r.get("repeat", 0)
                 and b["n"] == r["n"]), None)


def median_run(runs: Sequence[dict]) -> dict:
    """The run with the median job time (the lower one of an even count)."""
    ranked = sorted(runs, key=lambda r: r["work_s"])
    return ranked[(len(ranked) - 1) // 2]


def _run_row(r: dict, base: Optional[dict], repeated: bool) -> str:
    """One run's row of the per-run table (``base``: its W=1 run)."""
    w, t = r["workers"], r["work_s"]
    s = base["work_s"] / t if base else None
    f = amdahl_serial(s, w) if s else None
    prof = r.get("busy_profile") or []
    ft = timeline_serial(prof, w)
    base_work = busy_work(base.get("busy_profile") or []) if base else 0.0
    work = (f"{busy_work(prof) / base_work:.2f}"
            if prof and base_work else "-")
    rep = f" {r.get('repeat', 0) + 1} |" if repeated else ""
    return (f"| {r['config']} | {r['engine']} | {w} |{rep} {t:.1f} | "
            f"{'-' if s is None else f'{s:.2f}x'} | "
            f"{'-' if s is None else f'{100 * s / w:.0f} %'} | "
            f"{'-' if f is None else f'{f:.2f}'} | "
            f"{'-' if ft is None else f'{ft:.2f}'} | "
            f"{' / '.join(f'{v:.1f}' for v in prof) or '-'} | "
            f"{work} | {_cluster(r)} | {_load(r)} | "
            f"{(r.get('release_sha256') or '-')[:12]} | "
            f"{machine_probe.describe(r.get('machine') or {})} |")


def _median_rows(config: str, engine: str, runs: Sequence[dict]
                 ) -> list[str]:
    """Rows of the medians table for one config and engine."""
    by_w: dict[int, list[dict]] = {}
    for r in runs:
        by_w.setdefault(r["workers"], []).append(r)
    base = by_w.get(1)
    base_t = statistics.median(r["work_s"] for r in base) if base else None
    rows = []
    for w in sorted(by_w):
        times = [r["work_s"] for r in by_w[w]]
        t = statistics.median(times)
        s = base_t / t if base_t else None
        f = amdahl_serial(s, w) if s else None
        pairs = []
        for r in sorted(by_w[w], key=lambda r: r.get("repeat", 0)):
            b = _same_repeat(runs, r, 1)
            fp = amdahl_serial(b["work_s"] / r["work_s"], w) if b else None
            if fp is not None:
                pairs.append(f"{fp:.2f}")
        rows.append(
            f"| {config} | {engine} | {w} | {len(times)} | {t:.1f} | "
            f"{min(times):.1f}-{max(times):.1f} | "
            f"{'-' if s is None else f'{s:.2f}x'} | "
            f"{'-' if f is None else f'{f:.2f}'} | "
            f"{', '.join(pairs) or '-'} |")
    return rows


def workers_report(results: list[dict], top_share: float = 0.03) -> str:
    """Speed-up table per (config, engine) and the per-stage table of each
    engine's widest run."""
    ok = [r for r in results if r.get("rc") == 0 and not r.get("failed")]
    if not ok:
        return "no successful runs\n"
    first = ok[0]
    lines = [f"{first['n']:,} x {first['d']} float32, {CLASSES} classes, "
             f"flags `{first['flags']}` + each config's; every pass re-reads "
             f"the files. Job time = `generate.run` (planning, both pipelines of "
             f"the adaptive plan with their SDK-worker starts, staging, "
             f"publish); a Dask LocalCluster is started before and stopped "
             f"after it, timed apart (cluster s = start / stop). "
             f"Machine: {first.get('cores') or os.cpu_count()} cores "
             f"({platform.processor() or platform.machine()}); "
             f"{_pinning(ok)}"
             f"load = 1-min load average before / after the run (shared "
             f"machine). Amdahl f = (W/S - 1)/(W - 1) from the job times "
             f"(W = 2: 2/S(2) - 1); f from trace: the same from one run's "
             f"busy profile (seconds with 0, 1, 2.. worker processes "
             f"running traced work; see `timeline_serial`); work vs W=1: "
             f"the run's busy worker-seconds over W = 1's (`busy_work`; "
             f"above 1: the same work took longer on W workers); memory: "
             f"just before the run, s a GB to touch fresh memory / GB a "
             f"second written through the page cache "
             f"(`benchmarks/machine_probe.py`, `--probe-mb`).", "",
             "| config | engine | W | job s | speed-up | efficiency | "
             "Amdahl f | f from trace | s with 0/1/2.. workers busy | "
             "work vs W=1 | cluster s | load | release | memory |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
             "| --- | --- | --- | --- |"]
    keys = sorted({(r["config"], r["engine"]) for r in ok},
                  key=lambda k: (list(CONFIGS).index(k[0]), k[1]))
    repeated = any(r.get("repeat", 0) for r in ok)
    if repeated:  # which repeat each run is: its speed-up is against its own
        lines[-2] = lines[-2].replace("| W |", "| W | repeat |")
        lines[-1] += " --- |"
    for config, engine in keys:
        mine = [r for r in ok if (r["config"], r["engine"]) == (config, engine)]
        for r in sorted(mine, key=lambda r: (r.get("repeat", 0), r["workers"])):
            lines.append(_run_row(r, _same_repeat(mine, r, 1), repeated))
    if repeated:
        lines += ["", "Medians over the repeats (speed-up and f from the "
                  "median job times; f per repeat: each repeat's W=1 and W "
                  "runs paired):", "",
                  "| config | engine | W | runs | median job s | min-max s | "
                  "speed-up | Amdahl f | f per repeat |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for config, engine in keys:
            mine = [r for r in ok
                    if (r["config"], r["engine"]) == (config, engine)]
            lines += _median_rows(config, engine, mine)
    lines += ["", identity_line(ok)]
    lines += ["", "Per stage (the widest run of each config and engine; "
              "stages with at least "
              f"{100 * top_share:.0f} % of the traced busy time): spans, "
              "distinct worker processes, busy s (sum of spans), elapsed s "
              "(first start to last end) and parallelism = busy / elapsed. "
              "`read:<pass>` / `sums:<fn>` / `write`: dpsynth's DoFns (on "
              "DirectRunner a span is a whole fused bundle, read included); "
              "`step:<label>`: every ParDo task on Dask. A stage with 1 "
              "worker and a large busy time is serial.", ""]
    for config, engine in keys:
        mine = [r for r in ok if (r["config"], r["engine"]) == (config, engine)]
        top = max(r["workers"] for r in mine)
        widest = median_run([r for r in mine if r["workers"] == top])
        lines += [f"`{config}` on {engine}, W={widest['workers']} "
                  f"(job {widest['work_s']:.1f} s):", "",
                  "| stage | spans | workers | busy s | elapsed s | "
                  "starts at s | parallelism |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        stages = widest.get("stages") or []
        total = sum(st["busy_s"] for st in stages) or 1.0
        for st in stages:
            if st["busy_s"] / total < top_share:
                continue
            lines.append(
                f"| {st['stage']} | {st['spans']} | {st['workers']} | "
                f"{st['busy_s']:.2f} | {st['elapsed_s']:.2f} | "
                f"{st['start'] - widest.get('t0', st['start']):.1f} | "
                f"{st['parallelism']:.2f} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def finish(results: list[dict], args: argparse.Namespace,
           configs: Sequence[str]) -> int:
    """Vote bench, profile, the report (printed and written)."""
    votes = []
    if args.vote_bench:
        votes = vote_bench(args.dims, args.vote_bench_rows,
                           args.vote_bench_candidates)
        for v in votes:
            print(f"  vote d={v['d']} m={v['candidates']} {v['method']}: "
                  f"{v['s']:.2f} s", flush=True)
    profile_text = ""
    if args.profile and results:
        last = max((r for r in results if not r.get("skipped")),
                   key=lambda r: r["n"] * r["d"])
        profile_text = profile_run(data_dir(args.cache, last["n"], last["d"],
                                            args.files, args.format), args)
        profile_text = f"d={last['d']} n={last['n']:,}\n" + profile_text
    if configs:
        text = floor_report(results) + "".join(
            f"\nRuns of config `{c}`:\n\n" + report(
                [r for r in results if r.get("config") == c], [], "", args,
                next(r["flags"] for r in results if r.get("config") == c))
            for c in CONFIGS if any(r.get("config") == c for r in results))
    else:
        text = report(results, votes, profile_text, args)
    print(text)
    write_section(args.out, args.section, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
