"""dpsynth on a real Dask cluster: a scheduler and two worker processes on
loopback (``distributed.LocalCluster``), driven by ``--runner dask``.

* The Beam 2.77 bug that ``dpsynth.pipelines.runners.dask.runner`` works around is still
  there (when this test fails, Beam fixed it: drop the workaround, see
  deploy/README.md "Dask").
* With ``--noise-seed`` a Dask release is byte-identical to DirectRunner's
  (the demo; several files with DP k-means and the vote filter, one of them
  a TFRecord file read in several ranges against whole-file reading).
* One file is read by both workers (split reads).
* A step read by two branches runs once; with secure noise the release is
  self-consistent.
* A GroupByKey runs on one partition per worker thread, not one per input
  partition (Dask's task shuffle of n partitions is ~n² tasks).
* Without a scheduler address, ``python -m dpsynth.pipelines.cli.generate --runner
  dask`` starts one local cluster for both phases of the adaptive plan,
  keeps Dask's logs and dashboard off the console and leaves no files.
"""

from __future__ import annotations

import ast
import json
import math
import os
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

distributed = pytest.importorskip(
    "distributed", reason="the Dask tests need pip install -e '.[test]' "
    "(apache-beam[dask])")

import apache_beam as beam  # noqa: E402

from dpsynth.pipelines import cli
from dpsynth.pipelines.cli import generate  # noqa: E402
from dpsynth.pipelines.runners.options import beam_options  # noqa: E402
from tests.conftest import (assert_same_release, dask_test_cluster,  # noqa: E402
                            gmm_data, release_dir)
from dpsynth.transforms import io  # noqa: E402
from dpsynth.transforms.write import tfrecord_bytes  # noqa: E402

REPO = Path(__file__).resolve().parent.parent

# Fields of manifest.json that name the run, not the release ("root": the
# random version folder).


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory):
    """Address of a 2-worker test cluster (closed after the module)."""
    yield from dask_test_cluster(tmp_path_factory)


def _generate(out, *flags) -> None:
    assert cli.main(["generate", "--output", str(out),
                     *map(str, flags)]) == 0


def _dask(address: str) -> list[str]:
    return ["--runner", "dask", f"--dask_client_address={address}"]



# ------------------------------------------------------------------ flags

@pytest.mark.parametrize("runner", [
    "dask", "DaskRunner", "apache_beam.runners.dask.dask_runner.DaskRunner"])
def test_dask_flags_pass_the_strict_check(runner):
    """Every Dask name selects dpsynth's runner, and Beam's --dask_* options
    pass generate's strict flag check."""
    from dpsynth.pipelines.runners.options import beam_options, check_beam_args
    argv = ["--runner", runner, "--dask_client_address", "tcp://10.0.0.5:8786",
            "--dask_npartitions=4", "--dask_dashboard=127.0.0.1:8787"]
    check_beam_args(argv, generate.parser(), "generate")
    assert beam_options(argv).get_all_options()["runner"] == \
        "dpsynth.pipelines.runners.dask.runner.DaskRunner"


@pytest.mark.parametrize("argv, message", [
    (["--runner", "dask", "--dask_clinet_address=tcp://a:1"],
     "did you mean --dask_client_address"),
    (["--dask_client_address=tcp://a:1"], "add --runner dask"),
    (["--runner", "dsak"], "did you mean dask"),
    (["--dask_dashboard=127.0.0.1:8787"], "add --runner dask"),
])
def test_bad_dask_flags_are_refused(argv, message):
    from dpsynth.pipelines.runners.options import UsageError, check_beam_args
    with pytest.raises(UsageError, match=message):
        check_beam_args(argv, generate.parser(), "generate")


@pytest.mark.parametrize("argv, local", [
    (["--runner", "dask"], True),  # dpsynth starts a local cluster
    (["--runner", "dask", "--dask_client_address=tcp://127.0.0.1:8786"], True),
    (["--runner", "dask", "--dask_client_address=tcp://10.0.0.5:8786"], False),
    (["--runner", "dask", "--dask_scheduler_file=/shared/s.json"], False),
])
def test_local_dask_clusters_count_as_local(argv, local):
    """Workers on this machine write the operator's progress file."""
    from dpsynth.pipelines.runners.options import beam_options, is_local
    assert is_local(beam_options(argv)) is local


# ----------------------------------------------------------- upstream bug

def _singleton_of_total(p):
    total = p | beam.Create([1, 2, 3]) | beam.CombineGlobally(sum)
    _ = total | beam.Map(lambda v, t: v + t, beam.pvalue.AsSingleton(total))


def test_beam_dask_bug_is_still_there_and_worked_around(scheduler):
    """Beam's own DaskRunner fails on CombineGlobally + AsSingleton of it;
    dpsynth's runner does not. If the first half fails, Beam fixed the bug:
    drop dpsynth.pipelines.runners.dask.runner.install_workaround (deploy/README.md)."""
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.dask import transform_evaluator
    from dpsynth.pipelines.runners.dask import runner as dask_runner
    patched = transform_evaluator.apply_dofn_to_bundle
    original = getattr(patched, "beam_original", patched)
    transform_evaluator.apply_dofn_to_bundle = original
    try:
        p = beam.Pipeline(options=PipelineOptions([
            "--runner=apache_beam.runners.dask.dask_runner.DaskRunner",
            f"--dask_client_address={scheduler}"]))
        _singleton_of_total(p)
        result = p.run()
        try:
            with pytest.raises(Exception, match="accessed as a singleton"):
                result.wait_until_finish()
        finally:
            result.client.close()
    finally:
        transform_evaluator.apply_dofn_to_bundle = patched
    with beam.Pipeline(options=beam_options(_dask(scheduler))) as p:
        _singleton_of_total(p)
    assert transform_evaluator.apply_dofn_to_bundle is \
        dask_runner.apply_dofn_to_bundle


def _draw(_):
    """Stands for a secure noise draw: a different value on every run."""
    return np.random.default_rng().random()


def _save(value, path: str, name: str) -> None:
    with open(os.path.join(path, name), "w") as f:
        f.write(repr(value))


def test_a_step_read_by_two_branches_runs_once(scheduler, tmp_path):
    """A draw read as a side input by one branch and as the main input by
    another, each branch a sink: both sinks run (Beam's DaskRunner computes
    only the last transform's ancestors: "main" would not be written) and
    see the same draw (shared collections are computed once)."""
    with beam.Pipeline(options=beam_options(_dask(scheduler))) as p:
        drawn = p | beam.Create([None]) | beam.Map(_draw)
        _ = drawn | "Main" >> beam.Map(_save, str(tmp_path), "main")
        side = beam.pvalue.AsSingleton(drawn)
        _ = (p | "One" >> beam.Create([None])
             | "Side" >> beam.Map(lambda _, v: v, side)
             | "SaveSide" >> beam.Map(_save, str(tmp_path), "side"))
    assert (tmp_path / "main").read_text() == (tmp_path / "side").read_text()


class _Counted:
    """A value that leaves a file in ``out`` each time it is unpickled:
    one file per fetch of a side input that holds it."""

    def __init__(self, out: str) -> None:
        self.out = out

    def __reduce__(self):
        return _counted_load, (self.out,)


def _counted_load(out: str) -> _Counted:
    _save(os.getpid(), out, f"fetch-{uuid.uuid4().hex}")
    return _Counted(out)


def _note_side(element, side, out: str):
    """Records which process read the side input."""
    _save(os.getpid(), out, f"read-{uuid.uuid4().hex}")
    return element


def _assert_once_in_each_reader(notes, reads: int) -> None:
    """``reads`` elements were read (``_note_side``), and each process that
    read one unpickled the ``_Counted`` value exactly once."""
    def pids(prefix):
        return [int(f.read_text()) for f in notes.glob(prefix + "-*")]
    readers = set(pids("read"))
    assert len(pids("read")) == reads
    fetches = [pid for pid in pids("fetch") if pid in readers]
    assert sorted(fetches) == sorted(readers)


def test_a_side_input_is_fetched_once_per_worker_process(scheduler,
                                                          tmp_path):
    """Tasks that read a stored side input share one fetched copy per
    worker process (each task fetched it again: the class mixtures for
    each shard a 2M-row job writes)."""
    out = str(tmp_path)
    with beam.Pipeline(options=beam_options(_dask(scheduler))) as p:
        side = beam.pvalue.AsSingleton(
            p | "Value" >> beam.Create([None])
            | beam.Map(lambda _: _Counted(out)))
        _ = (p | beam.Create(list(range(12)))
             | beam.Reshuffle()
             | beam.Map(_note_side, side, out))

    _assert_once_in_each_reader(tmp_path, 12)


def test_a_run_leaves_no_stored_collection_on_the_cluster(scheduler):
    """Side inputs are stored on the cluster as published datasets while
    the graph runs; a cluster that outlives the job (a deployment's) holds
    none of them afterwards (they are unpublished in one call)."""
    with beam.Pipeline(options=beam_options(_dask(scheduler))) as p:
        sides = [beam.pvalue.AsSingleton(p | f"Value{i}" >> beam.Create([i]))
                 for i in range(3)]
        _ = (p | beam.Create([0])
             | beam.Map(lambda x, a, b, c: x + a + b + c, *sides))
    with distributed.Client(scheduler) as client:
        assert not [n for n in client.list_datasets()
                    if str(n).startswith("dpsynth-")]


def test_stored_collections_go_one_by_one_where_a_list_is_refused():
    """An older distributed unpublishes one name a call: the list is
    refused and every name still goes."""
    from dpsynth.pipelines.runners.dask import runner as dask_runner
    gone = []

    class _OldClient:
        def unpublish_dataset(self, name):
            if isinstance(name, list):
                raise TypeError("unhashable type: 'list'")
            gone.append(name)

    stored = dask_runner._Stored()
    stored._names = {"dpsynth-c/b", "dpsynth-c/a"}
    stored.drop(_OldClient())
    assert gone == ["dpsynth-c/a", "dpsynth-c/b"]
    assert not stored._names


def test_a_step_is_unpickled_once_per_worker_process(scheduler, tmp_path):
    """The 12 tasks of a step share one copy of its DoFn and arguments per
    worker process (each task unpickled its own: ~1 ms a task, all of a
    pass's tasks before its first ran), and every element still comes out
    once."""
    out = str(tmp_path)
    with beam.Pipeline(options=beam_options(_dask(scheduler))) as p:
        _ = (p | beam.Create(list(range(12)))
             | beam.Reshuffle()
             | beam.Map(lambda x, counted: _note_side(x, None, out),
                        _Counted(out))
             | beam.combiners.Count.Globally()
             | beam.Map(_save, out, "count"))

    assert (tmp_path / "count").read_text() == "12"
    _assert_once_in_each_reader(tmp_path, 12)


def test_step_arguments_are_pickled_once_and_shared_in_a_process(
        monkeypatch):
    import pickle

    from dpsynth.pipelines.runners.dask import runner as dask_runner
    monkeypatch.setattr(dask_runner, "_STEP_ARGS", {})
    step = dask_runner._StepArgs(([1, 2], {"k": 3}), "dpsynth-Client-a/s")
    blob = pickle.dumps(step)
    assert step._blob is not None
    kept = step._blob
    pickle.dumps(step)
    assert step._blob is kept  # pickled once
    first, again = pickle.loads(blob), pickle.loads(blob)
    assert first is again and first.args == ([1, 2], {"k": 3})
    other = dask_runner._StepArgs((), "dpsynth-Client-b/s")
    pickle.loads(pickle.dumps(other))  # a new run: the old run's go
    assert sorted(dask_runner._STEP_ARGS) == ["dpsynth-Client-b/s"]


def _triple(x):
    return 3 * x


def test_each_step_has_its_own_task_name(scheduler, tmp_path):
    """Dask learns how long a task takes by its name: each ParDo step's
    tasks carry the step's (they all carried one, so a 0.4 s shard write
    was expected to last as long as the average step, and the scheduler
    seldom moved the last shards of a busy worker to an idle one)."""
    with beam.Pipeline(options=beam_options(_dask(scheduler))) as p:
        _ = (p | beam.Create(list(range(6))) | beam.Reshuffle()
             | "Triple" >> beam.Map(_triple)
             | beam.Map(_save, str(tmp_path), "x"))
    with distributed.Client(scheduler) as client:
        prefixes = client.run_on_scheduler(
            lambda dask_scheduler: sorted(dask_scheduler.task_prefixes))
    # (Dask names a fused chain of steps by its last ones)
    assert any(name.startswith("dpsynth__save") for name in prefixes), \
        prefixes


def test_another_librarys_function_is_named_per_step():
    """One library function (PipelineDP's map_values lambda) serves many
    steps, most of them trivial: each step's tasks get a name of their own
    (a digest of the Beam label), or Dask estimates the noise step's
    duration from the trivial steps'. dpsynth's own functions have one
    purpose each and keep their plain names (durations learnt across
    passes)."""
    import operator

    from apache_beam.runners.common import DoFnSignature
    from dpsynth.pipelines.runners.dask import runner as dask_runner
    from dpsynth.transforms.write import shard_tasks

    def name(fn, label: str) -> str:
        signature = DoFnSignature(beam.Map(fn).fn)
        return dask_runner._StepCall(([signature], {}, None), label).__name__

    first, second = name(operator.neg, "A/Neg"), name(operator.neg, "B/Neg")
    assert first.startswith("dpsynth_neg_") and first != second
    assert first == name(operator.neg, "A/Neg")  # the same in every run
    assert (name(shard_tasks, "A/Shards") == name(shard_tasks, "B/Shards")
            == "dpsynth_shard_tasks")


def test_bundles_at_the_same_time_get_their_own_step_arguments():
    """A worker with several threads runs a step's bundles side by side:
    each running bundle holds its own copy of the arguments (one output
    list each), and a finished bundle's copy serves the next."""
    from dpsynth.pipelines.runners.dask import runner as dask_runner
    step = dask_runner._StepArgs(([1], {}), "dpsynth-Client-a/s")
    first = step.take()
    second = step.take()  # while the first runs
    assert first is step.args and second is not first
    assert second == first
    step.give(second)
    step.give(first)
    assert step.take() is first and step.take() is second


def test_side_values_keep_only_the_newest_runs(monkeypatch):
    from dpsynth.pipelines.runners.dask import runner as dask_runner
    fetched = []

    class _Future:
        def __init__(self, name):
            self._name = name

        def result(self):
            fetched.append(self._name)
            return [self._name.upper()]

    class _Client:
        def get_dataset(self, name):
            return [_Future(name)]

    monkeypatch.setattr(dask_runner, "_SIDE_VALUES", {})
    monkeypatch.setattr(distributed, "get_client", lambda: _Client())
    monkeypatch.setattr(distributed, "futures_of", lambda stored: stored)
    read = dask_runner._side_values
    assert read("dpsynth-Client-a/x") == ["DPSYNTH-CLIENT-A/X"]
    assert read("dpsynth-Client-a/x") == ["DPSYNTH-CLIENT-A/X"]
    assert read("dpsynth-Client-a/y") == ["DPSYNTH-CLIENT-A/Y"]
    assert fetched == ["dpsynth-Client-a/x", "dpsynth-Client-a/y"]
    read("dpsynth-Client-b/x")  # a new run: the old run's values go
    assert sorted(dask_runner._SIDE_VALUES) == ["dpsynth-Client-b/x"]


class _NoteBundles(beam.DoFn):
    """Writes each bundle's groups to a file of its own in ``out``."""

    def __init__(self, out: str) -> None:
        self._out = out

    def start_bundle(self):
        self._groups = []

    def process(self, kv):
        self._groups.append((kv[0], sorted(kv[1])))

    def finish_bundle(self):
        _save(self._groups, self._out, uuid.uuid4().hex)


def test_group_by_key_runs_on_one_partition_per_worker(scheduler, tmp_path,
                                                       monkeypatch):
    """A GroupByKey of 12 one-element partitions groups right and its
    output is 2 partitions (the cluster's 2 worker threads), not 12:
    Dask's task shuffle of n partitions is ~n^2 tasks. The shuffle is
    named, so Dask's lookup does not import dask.dataframe."""
    import dask
    import dask.bag.core
    lookup = dask.bag.core.get_default_shuffle_method

    def named():
        assert dask.config.get("dataframe.shuffle.method") == "tasks"
        return lookup()
    monkeypatch.setattr(dask.bag.core, "get_default_shuffle_method", named)
    flags = [*_dask(scheduler), "--dask_partition_size=1"]
    with beam.Pipeline(options=beam_options(flags)) as p:
        _ = (p | beam.Create([(i % 3, i) for i in range(12)])
             | beam.GroupByKey()
             | beam.ParDo(_NoteBundles(str(tmp_path))))
    bundles = [ast.literal_eval((tmp_path / name).read_text())
               for name in os.listdir(tmp_path)]
    assert len(bundles) == 2
    groups = sorted(g for bundle in bundles for g in bundle)
    assert groups == [(k, list(range(k, 12, 3))) for k in range(3)]


def _note_run(value, out: str):
    """Test-only: one file per call (counts how often a step ran)."""
    with open(os.path.join(out, uuid.uuid4().hex), "w") as f:
        f.write(repr(value))
    return value


@pytest.mark.parametrize("side_first", [False, True])
def test_blocks_read_by_two_branches_are_not_stored(scheduler, tmp_path,
                                                    monkeypatch, side_first):
    """Blocks read by a main branch and by a side input's branch run once.
    Built before the side input, the main branch is computed with it, so
    the blocks themselves are not kept on the cluster (at 1M x 384 that
    held every block); built after it, the blocks are stored (fallback)."""
    from dpsynth.pipelines.runners.dask import runner as dask_runner
    stored_labels: list[str] = []
    original = dask_runner._Pending.store_with

    def recording(self, side_node, bags):
        out = original(self, side_node, bags)
        stored_labels.extend(n.full_label for n in out)
        return out
    monkeypatch.setattr(dask_runner._Pending, "store_with", recording)
    notes = tmp_path / "notes"
    notes.mkdir()
    with beam.Pipeline(options=beam_options(_dask(scheduler))) as p:
        blocks = (p | beam.Create([1, 2, 3])
                  | "Blocks" >> beam.Map(_note_run, str(notes)))

        def main_branch():
            return blocks | "Main" >> beam.Map(lambda v: 10 * v)
        main = None if side_first else main_branch()
        total = blocks | "Total" >> beam.CombineGlobally(sum)
        main = main_branch() if side_first else main
        _ = (main
             | "AddTotal" >> beam.Map(lambda v, t: v + t,
                                      beam.pvalue.AsSingleton(total))
             | "Save" >> beam.combiners.ToList()
             | beam.Map(lambda vs: _save(sorted(vs), str(tmp_path), "out")))
    assert (tmp_path / "out").read_text() == "[16, 26, 36]"
    assert len(os.listdir(notes)) == 3  # each block made once
    assert ("Blocks" in stored_labels) == side_first, stored_labels


# ------------------------------------------------------ same as DirectRunner

def test_demo_is_byte_identical_to_direct_runner(scheduler, tmp_path):
    _generate(tmp_path / "direct", "--noise-seed", 7)
    _generate(tmp_path / "dask", "--noise-seed", 7, *_dask(scheduler))
    assert_same_release(tmp_path / "direct", tmp_path / "dask")


def _write_tfrecord(path, x, y) -> None:
    with open(path, "wb") as f:
        for start in range(0, len(y), 50):  # classes interleaved in the file
            xs, ys = x[start:start + 50], y[start:start + 50]
            for label in np.unique(ys).tolist():
                f.write(tfrecord_bytes(xs[ys == label], label))


@pytest.fixture(scope="module")
def several_files(tmp_path_factory):
    """Three .npz files and one TFRecord file of 2,400 rows in all."""
    root = tmp_path_factory.mktemp("files")
    x, y = gmm_data(2400, d=8, classes=3, seed=5)
    for i in range(3):
        np.savez(root / f"part-{i}.npz", embeddings=x[i * 400:(i + 1) * 400],
                 labels=y[i * 400:(i + 1) * 400])
    _write_tfrecord(root / "part-3.tfrecord", x[1200:], y[1200:])
    return str(root / "part-*")


FLAGS = ["--num-classes", 3, "--clusters", 4, "--accountant", "rdp",
         "--epsilon", 3, "--rows-per-shard", 200, "--block-size", 128]


def test_k_means_and_vote_filter_on_several_files(scheduler, several_files,
                                                  tmp_path):
    """Dask with the TFRecord file split in 7 ranges and each .npz in 2 ==
    DirectRunner reading every file whole (same --noise-seed)."""
    flags = [*FLAGS, "--input", several_files, "--vote-filter",
             "--vote-threshold", 2, "--noise-seed", 11]
    _generate(tmp_path / "direct", *flags)
    _generate(tmp_path / "dask", *flags, "--split-bytes", 16_000,
              *_dask(scheduler))
    assert_same_release(tmp_path / "direct", tmp_path / "dask")


# ------------------------------------------------------------ split reads

def _note_worker(block, out: str) -> None:
    """Test-only: one file per block, named by the worker that read it."""
    worker = distributed.get_worker().address.replace("/", "_")
    with open(os.path.join(out, f"{worker}-{uuid.uuid4().hex}"), "w") as f:
        f.write(str(len(block[1])))


def test_one_file_is_read_by_both_workers(scheduler, tmp_path):
    x, y = gmm_data(3000, d=8, classes=3, seed=2)
    path = tmp_path / "one.tfrecord"
    _write_tfrecord(path, x, y)
    spec = io.InputSpec(str(path), split_bytes=os.path.getsize(path) // 8)
    reader = io.ReadEmbeddingBlocks(spec, dim=8)  # TFRecord: public d
    assert len(reader.ranges) >= 8
    notes = tmp_path / "notes"
    notes.mkdir()
    p = beam.Pipeline(options=beam_options(_dask(scheduler)))
    _ = p | reader | beam.Map(_note_worker, str(notes))
    result = p.run()
    result.wait_until_finish()
    assert result.metrics().query()["counters"] == []  # none on Dask
    workers = {name.rsplit("-", 1)[0] for name in os.listdir(notes)}
    rows = sum(int((notes / name).read_text()) for name in os.listdir(notes))
    assert rows == 3000 and len(workers) == 2


# ----------------------------------------------------------- secure noise

def test_secure_noise_release_is_self_consistent(scheduler, tmp_path):
    """Rows per class in the shards == summary.json's samples == the noisy
    class count in gmm.npz (no vote filter: samples = round(noisy count)).

    Holds because dpsynth's runner runs every step once (shared collections
    are computed once, see the test above). Beam's own DaskRunner recomputed
    side-input branches and redrew secure noise; a worker lost mid-run still
    makes Dask recompute its results, which only the keyed noise of the
    privacy change (noise = f(per-run secret key, mechanism)) makes
    harmless."""
    from dpsynth.pipelines.release.reading import load_gmm, load_release
    out = tmp_path / "rel"
    _generate(out, *_dask(scheduler))
    _, y, manifest = load_release(str(out))
    gmm = load_gmm(str(out))
    summary = json.loads((release_dir(out) / "_summary.json").read_text())
    for entry in summary:
        label = entry["label"]
        assert int((y == label).sum()) == entry["samples"], label
        assert entry["samples"] == int(round(
            gmm.mixtures[label].noisy_count)), label
        assert entry["noisy_count"] == gmm.mixtures[label].noisy_count
    assert manifest["samples_total"] == len(y)


def test_a_task_on_a_worker_unlike_the_launcher_refuses_before_its_rows():
    """Every step's task carries the launcher's identity and checks it in
    its worker process before it runs (a worker that joined after the
    launcher's check, or restarted on other code)."""
    from dpsynth.pipelines.runners.dask import cluster as dask_cluster, runner as dask_runner
    from dpsynth.pipelines.runners.options import ClusterMismatch
    dask_cluster.check_this_worker(dask_cluster.launcher_identity())
    other = {**dask_cluster.launcher_identity(), "source_sha256": "1" * 64}
    ran = []
    with pytest.raises(ClusterMismatch, match="refused before reading a row"):
        call = dask_runner._StepCall.__new__(dask_runner._StepCall)
        call.identity = other
        call([1, 2], lambda items, *a: ran.append(items), None)
    assert ran == []


def test_a_worker_that_joined_after_the_check_is_refused(scheduler, tmp_path,
                                                        monkeypatch, capsys):
    """A run whose tasks meet a worker unlike the launcher stops in one
    line: simulated by tasks that carry another identity than the workers'
    (the launcher's own check, before the run, passes)."""
    from dpsynth.pipelines.runners.dask import cluster as dask_cluster
    other = {**dask_cluster.launcher_identity(), "beam": "0.0.1"}
    monkeypatch.setattr(dask_cluster, "launcher_identity", lambda: other)
    rc = cli.main(["generate", "--output", str(tmp_path / "rel"),
                   "--noise-seed", "1", *_dask(scheduler)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and not (tmp_path / "rel").exists()
    assert err[-1].startswith("dpsynth: error: a Dask worker runs dpsynth")
    assert "refused before reading a row" in err[-1]


def _left_in_worker():
    """What a worker process still holds of the runs before (run there)."""
    import gc
    from dpsynth.dp_ops.noise import KeyedNoise
    from dpsynth.pipelines.runners.dask import runner as dask_runner
    gc.collect()
    return (len(dask_runner._STEP_ARGS), len(dask_runner._SIDE_VALUES),
            sum(isinstance(o, KeyedNoise) for o in gc.get_objects()))


def test_no_key_or_step_argument_is_left_in_the_workers_after_a_run(
        scheduler, tmp_path):
    """A long-lived worker kept the run's step arguments (the DoFns and
    their noise, its key) and side inputs "until the next run": a client
    connecting later read the key back. The run's end wipes them."""
    _generate(tmp_path / "rel", *_dask(scheduler))
    with distributed.Client(scheduler, set_as_default=False) as client:
        left = client.run(_left_in_worker)
    assert left and set(left.values()) == {(0, 0, 0)}, left


def test_a_failed_run_leaves_no_step_argument_in_the_workers(
        scheduler, tmp_path):
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=np.ones((40, 4), np.float32),
             y=np.array([0, 1] * 19 + [7, 7]))  # a label outside 0..1
    assert cli.main(["generate", "--input", str(bad), "--num-classes", "2",
                     "--output", str(tmp_path / "rel"),
                     *_dask(scheduler)]) != 0
    with distributed.Client(scheduler, set_as_default=False) as client:
        left = client.run(_left_in_worker)
    assert set(left.values()) == {(0, 0, 0)}, left


# ---------------------------------------------------------- local cluster

def _profile_enabled() -> bool:
    import dask
    return dask.config.get("distributed.worker.profile.enabled")


def test_the_profiler_stays_on_when_a_dashboard_is_asked_for():
    from dpsynth.pipelines.runners.dask import cluster as dask_cluster
    assert not dask_cluster._cluster_config(None)[
        "distributed.worker.profile.enabled"]
    assert "distributed.worker.profile.enabled" not in \
        dask_cluster._cluster_config("127.0.0.1:8787")


_OTHER_CLIENT = """
import sys
import distributed
from distributed.security import Security
where, own = sys.argv[1], sys.argv[2] == "own"
try:
    distributed.Client(where, timeout=3, set_as_default=False,
                       security=Security.temporary() if own else None)
except Exception as err:
    print("refused", type(err).__name__)
else:
    print("CONNECTED")
"""


def _other_client(address: str, own_certificate: bool) -> str:
    """Another process, holding what another local account could (not the
    cluster's certificate: it lives in the launcher's memory), connecting.
    (Not run as another uid: the suite's venv lives under a 0700 HOME.)"""
    done = subprocess.run(
        [sys.executable, "-c", _OTHER_CLIENT, address,
         "own" if own_certificate else "none"], capture_output=True,
        text=True, timeout=120, cwd="/")
    return done.stdout.strip() or done.stderr.strip().splitlines()[-1]


def test_the_local_cluster_refuses_a_client_without_its_certificate():
    """The cluster dpsynth starts speaks TLS with a certificate made for it
    and held in memory: another local account (no certificate, one of its
    own, or plain TCP to the same port) cannot connect, run code in the
    workers or read the run's key; the launcher's own client can."""
    import dask
    from dpsynth.pipelines.runners.dask import cluster as dask_cluster
    try:
        cluster = dask_cluster.local_cluster(workers=1)
        address = cluster.scheduler_address
        assert address.startswith("tls://127.0.0.1:")
        for where, own in ((address, False), (address, True),
                           (address.replace("tls://", "tcp://"), False)):
            assert _other_client(where, own).startswith("refused"), where
        with dask.config.set(dask_cluster.local_security(address)):
            with distributed.Client(address, timeout=10,
                                    set_as_default=False) as client:
                assert set(client.run(lambda: 1).values()) == {1}
        assert dask_cluster.local_security("tls://127.0.0.1:1") == {}
    finally:
        dask_cluster.close_local_cluster()


def test_local_cluster_is_started_once_and_cleaned_up():
    """One LocalCluster per process, its scratch space in a temporary
    folder removed at close, its HTTP routes off port 8787."""
    from dpsynth.pipelines.runners.dask import cluster as dask_cluster
    started = dask_cluster.local_clusters_started
    try:
        cluster = dask_cluster.local_cluster(workers=1)
        assert dask_cluster.local_cluster(workers=1) is cluster
        assert dask_cluster.local_clusters_started == started + 1
        directory = dask_cluster._LOCAL.directory
        assert os.listdir(directory)  # the scratch space is in it
        assert cluster.scheduler.http_server.port != 8787
        # every runnable task sent at once (no queue: a read range is two
        # tasks, and a queue made each a round trip more)
        assert math.isinf(cluster.scheduler.WORKER_SATURATION)
        # and balanced every 100 ms (a pass ended with 2-3 tasks queued on
        # one worker while the other waited, at distributed's 1 s)
        stealing = cluster.scheduler.extensions["stealing"]
        assert stealing._callback_time == 0.1
        # no dashboard: the workers sample no profiles
        with distributed.Client(cluster) as client:
            assert set(client.run(_profile_enabled).values()) == {False}
    finally:
        dask_cluster.close_local_cluster()
    assert not os.path.exists(directory)
    dask_cluster.close_local_cluster()  # idempotent


HALF_STARTED = """
import os, signal
import distributed.nanny as nanny
from dpsynth.pipelines.runners.dask import cluster as dask_cluster

real = nanny.Nanny.start_unsafe

async def interrupted_start(self):
    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the workers start
    return await real(self)

if __name__ == "__main__":
    # Ctrl-C as in a terminal, even where the test runner was started with
    # SIGINT ignored (a background job inherits it ignored)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    nanny.Nanny.start_unsafe = interrupted_start
    try:
        dask_cluster.local_cluster(workers=2)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
"""


def test_a_local_cluster_interrupted_while_starting_is_not_closed_at_exit(
        tmp_path):
    """Ctrl-C while the local cluster starts: the half-started cluster is
    closed and taken out of Dask's registry, so Dask's exit handler does
    not fail on it (an AssertionError traceback after the job's line)."""
    script = tmp_path / "half.py"
    script.write_text(HALF_STARTED)
    run = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(tmp_path),
             "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get(
                 "PYTHONPATH", "")])},
        capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout == "interrupted\n", run.stderr
    assert "Exception ignored" not in run.stderr, run.stderr
    assert "AssertionError" not in run.stderr, run.stderr


def test_demo_on_a_local_cluster_is_quiet_and_leaves_nothing(tmp_path):
    """What a user runs: no scheduler, the adaptive plan (two pipelines).
    One cluster, no Dask log lines or dashboard on the console, no scratch
    files in the working or temporary directory, and the release is
    byte-identical to DirectRunner's."""
    work, temp = tmp_path / "cwd", tmp_path / "tmp"
    work.mkdir()
    temp.mkdir()
    _generate(tmp_path / "direct", "--noise-seed", 7)
    run = subprocess.run(
        [sys.executable, "-m", "dpsynth.pipelines.cli.generate", "--runner", "dask",
         "--output", str(tmp_path / "dask"), "--noise-seed", "7"],
        cwd=work, env={**os.environ, "TMPDIR": str(temp)},
        capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stderr.count("started a local Dask cluster") == 1, run.stderr
    assert run.stderr.count("pipeline finished") == 2  # phases 1 and 2
    for noise in ("distributed", "dashboard", "8787", "Traceback"):
        assert noise not in run.stderr, run.stderr
    assert os.listdir(work) == []
    leftovers = [n for n in os.listdir(temp) if "dask" in n or (
        n.startswith("dpsynth-") and n != "dpsynth-demo")]  # cached input
    assert leftovers == []
    # "input": the demo's rows are the same, cached under another TMPDIR.
    assert_same_release(tmp_path / "direct", tmp_path / "dask",
                         frozenset({"input"}))


def test_a_lost_scheduler_is_one_line_without_dasks_future_keys():
    """distributed's CancelledError lists every cancelled future by its
    internal key; the operator's line says what happened instead."""
    from concurrent.futures import CancelledError
    from dpsynth.pipelines.runners.dask import cluster as dask_cluster
    from dpsynth.pipelines.runners.errors import ClusterLost
    keys = ("scheduler-connection-lost\n"
            "Futures: [('dpsynth__Phase2_class_mixture-0a1b', 0)]")
    with pytest.raises(ClusterLost) as lost:
        with dask_cluster._cluster_loss_as_one_line("tls://10.0.0.2:8786"):
            raise CancelledError(keys)
    line = str(lost.value)
    assert "Futures" not in line and "\n" not in line
    assert line.startswith("the Dask cluster at tls://10.0.0.2:8786 was lost "
                           "mid-run (scheduler unreachable: the connection")
