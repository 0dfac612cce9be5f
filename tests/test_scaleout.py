"""No serial stage on a 2-worker cluster (issue 27).

Every stage of the release path whose work grows with n (the reads, the
per-class sums, drawing and writing the shards) must run on both workers
of a 2-worker Dask cluster and of DirectRunner ``multi_processing`` with
2 workers, and one class's shards must be written by both. The workers
record which process ran each span in the stage trace
(``dpsynth.transforms.progress``, ``DPSYNTH_STAGE_TRACE``: set before the workers
start, so they inherit it). The data has one large class and a small one;
``--rows-per-shard 100`` makes the large class ~20 shards.

DirectRunner ``multi_processing`` splits each stage's input between its
worker processes (Beam's FnApiRunner gives every worker a share of the
bundle), so the same check applies; its read stage is fused with the sums
and the passes' PrepareBlocks, so its ``read:`` spans cover both.
Before issue 27, Beam's Dask translation made ``Reshuffle`` a no-op: all
shards of the default plan (its mixtures come from one element) were one
Dask partition, drawn and written by one worker.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

distributed = pytest.importorskip(
    "distributed", reason="the Dask tests need pip install -e '.[test]' "
    "(apache-beam[dask])")

from dpsynth.pipelines import cli  # noqa: E402
from tests.conftest import dask_test_cluster, gmm_data  # noqa: E402
from dpsynth.transforms import progress  # noqa: E402


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    """The stage trace file, in the environment while this module runs
    (the workers of the cluster below and DirectRunner's inherit it)."""
    path = str(tmp_path_factory.mktemp("trace") / "trace.tsv")
    old = os.environ.get(progress.TRACE_ENV)
    os.environ[progress.TRACE_ENV] = path
    yield path
    if old is None:
        del os.environ[progress.TRACE_ENV]
    else:
        os.environ[progress.TRACE_ENV] = old


@pytest.fixture(scope="module")
def scheduler(trace_file, tmp_path_factory):
    yield from dask_test_cluster(tmp_path_factory)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Four .npz files, 2,400 rows: class 0 ~90 % of them, class 1 the
    rest."""
    root = tmp_path_factory.mktemp("files")
    x, _ = gmm_data(2400, d=8, classes=2, seed=3)
    y = (np.random.default_rng(4).random(2400) < 0.1).astype(np.int64)
    for i in range(4):
        part = slice(i * 600, (i + 1) * 600)
        np.savez(root / f"part-{i}.npz", embeddings=x[part], labels=y[part])
    return str(root / "part-*")


FLAGS = ["--num-classes", 2, "--epsilon", 8, "--noise-seed", 3,
         "--rows-per-shard", 100, "--block-size", 100,
         "--output-format", "parquet"]
CONFIGS = {"default": [],  # the adaptive plan
           "k-means+vote": ["--clusters", 2, "--vote-filter",
                            "--vote-threshold", 1]}


def _run(trace: str, out, *flags) -> dict:
    """Runs generate; the trace's processes per stage."""
    open(trace, "w").close()
    assert cli.main(["generate", "--output", str(out),
                     *map(str, flags)]) == 0
    workers: dict = {}
    for stage, pid, _, _ in progress.read_trace(trace):
        workers.setdefault(stage, set()).add(pid)
    workers["spans"] = progress.read_trace(trace)
    return workers


def _assert_spread(workers: dict, one_task_per_range: bool = False) -> None:
    reads = [s for s in workers if s.startswith("read:")]
    # Dask: one task per read range (4 files), no task holds several
    # files' blocks (DirectRunner: one span per bundle)
    for stage in reads if one_task_per_range else []:
        assert sum(1 for span in workers["spans"] if span[0] == stage) == 4
    sums = [s for s in workers if s.startswith("sums:")]
    assert reads and sums and "write:class0" in workers, sorted(workers)
    for stage in reads + sums + ["write:class0"]:
        assert len(workers[stage]) == 2, (stage, sorted(workers.items()))


# Dask steps (ParDo tasks, the runner's own trace) of the release path
# whose work grows with n: reading, preparing the blocks, the per-class
# sums (named by the summed function), the vote, drawing and writing.
DASK_STEPS = {"default": ["_ReadBlocksFn", "_PrepareFn", "_AccumulateFn",
                          "_WriteShard"],
              "k-means+vote": ["_ReadBlocksFn", "_PrepareFn", "_Votes",
                               "_WriteShard"]}


def _assert_dask_steps_spread(workers: dict, config: str) -> None:
    """Each named step ran as several tasks on both workers: none ran as
    one partition. (Steps on small collections, e.g. Beam's
    CombineGlobally default on the counts, may run on one worker.)"""
    tasks: dict = {}
    for stage, _, _, _ in workers["spans"]:
        tasks[stage] = tasks.get(stage, 0) + 1
    for step in DASK_STEPS[config]:
        stage = f"step:{step}"
        assert tasks.get(stage, 0) >= 2, (stage, sorted(tasks.items()))
        assert len(workers[stage]) == 2, (stage, sorted(tasks.items()))


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_dask_runs_every_stage_on_both_workers(trace_file, scheduler, files,
                                               tmp_path, config):
    workers = _run(trace_file, tmp_path / "rel", *FLAGS, *CONFIGS[config],
                   "--input", files, "--runner", "dask",
                   f"--dask_client_address={scheduler}")
    _assert_spread(workers, one_task_per_range=True)
    _assert_dask_steps_spread(workers, config)


def test_direct_runner_runs_every_stage_on_both_workers(trace_file, files,
                                                        tmp_path):
    workers = _run(trace_file, tmp_path / "rel", *FLAGS, "--input", files,
                   "--direct_num_workers", 2, "--direct_running_mode",
                   "multi_processing")
    _assert_spread(workers)


def test_stage_table_and_busy_profile():
    """The benchmark's per-stage table and Amdahl estimate from a trace."""
    from benchmarks.scaling import busy_profile, busy_work, timeline_serial
    spans = [("read:Moments", 1, 0.0, 10.0), ("sums:x", 1, 2.0, 3.0),
             ("write:class0", 2, 5.0, 10.0), ("write:class1", 1, 10.0, 11.0)]
    table = {r["stage"]: r for r in progress.stage_table(spans)}
    assert table["write"]["workers"] == 2 and table["write"]["spans"] == 2
    assert table["read:Moments"]["busy_s"] == 10.0
    profile = busy_profile(spans, 0.0, 12.0)
    assert profile == [1.0, 6.0, 5.0]  # idle 11-12; one 0-5, 10-11; two 5-10
    # on one worker: 1 + 6 + 2 * 5 = 17 s against 12 s: S = 17/12
    assert timeline_serial(profile, 2) == pytest.approx(2 * 12 / 17 - 1)
    assert busy_work(profile) == pytest.approx(16.0)  # 6 + 2 * 5


def test_repeated_runs_report_medians_and_pairs():
    """--repeat: f from the median job times, and each repeat's own pair."""
    from benchmarks.scaling import median_run, workers_report
    runs = [dict(config="default", engine="direct", n=10, d=4, flags="",
                 workers=w, repeat=rep, work_s=t, rc=0)
            for rep, (t1, t2) in enumerate([(10.0, 6.0), (12.0, 6.5),
                                            (11.0, 9.0)])
            for w, t in ((1, t1), (2, t2))]
    assert median_run([r for r in runs if r["workers"] == 2])["work_s"] == 6.5
    text = workers_report(runs)
    # medians 11.0 / 6.5: f = 2 * 6.5 / 11 - 1; pairs 0.20, 0.08, 0.64
    assert (f"| default | direct | 2 | 3 | 6.5 | 6.0-9.0 | 1.69x | "
            f"{2 * 6.5 / 11 - 1:.2f} | 0.20, 0.08, 0.64 |") in text
    assert "| default | direct | 2 | 3 | 9.0 | 1.22x |" in text  # its own W=1
