"""dpsynth on a Dask cluster: Beam's DaskRunner plus what it lacks.

Selected by ``--runner dask`` (or ``DaskRunner``, or Beam's class path
``apache_beam.runners.dask.dask_runner.DaskRunner``: ``runner_names``
rewrites all of them to ``dpsynth.pipelines.runners.dask.runner.DaskRunner``). Needs the
``dask`` extra (``pip install 'dpsynth[dask]'``) here and on every worker.

* ``--dask_client_address tcp://HOST:PORT`` (Beam's option) points at an
  existing scheduler. Without it (and without ``--dask_scheduler_file``)
  the first pipeline of the process starts a ``distributed.LocalCluster``:
  one single-threaded worker process per CPU core, listening on loopback
  only, no dashboard (unless ``--dask_dashboard ADDRESS``), its scratch
  space in a temporary folder. Later pipelines of the process (the
  adaptive plan's phase 2) reuse it; the job closes it at its end
  (``close_run_cluster``) and removes the folder. A cluster the caller
  started with ``cluster.local_cluster()`` (a benchmark, a notebook running
  several jobs) is the caller's: jobs use it and leave it running until
  ``close_local_cluster()`` (also run at exit). That is for trying the
  runner; a real deployment runs ``dask scheduler`` / ``dask worker``.
* Before a pipeline on a given cluster (``--dask_client_address`` /
  ``--dask_scheduler_file``) is submitted, every worker reports its
  dpsynth (version and source digest, ``pipelines/runners/source_digest.py``):
  one that differs from the launcher's stops the run in one line
  (``check_cluster``; the launcher runs it too, before the run is
  charged, with the run's local paths, which a worker elsewhere refuses).
* The local cluster's workers import the modules dpsynth's tasks unpickle
  as they start (``pipelines/runners/dask/preload.py``, distributed's ``preload``),
  not inside the job's first task on every worker at once.
* Dask's loggers follow Beam's (``distributed`` sets its own to INFO when
  it is imported): quiet unless ``dpsynth generate --verbose``.
* Upstream bug workaround (Beam 2.77, see deploy/README.md "Dask"): Beam's
  Dask ``ParDo`` keeps one output list per step, filled by every bundle and
  never emptied, so a step executed twice in one worker process returns its
  earlier outputs again (a singleton side input then fails with
  "PCollection of size 2 with more than one element accessed as a singleton
  view"); and it reads that list before ``finish_bundle``, dropping what
  ``finish_bundle`` emits. ``install_workaround`` points Beam's Dask
  translation at ``apply_dofn_to_bundle`` below, which fixes both. It is
  installed only when this runner runs, in the submitting process; the
  workers get it with the task graph, which names this module's function
  (they import this module to unpickle it).
* Combines are lifted (``_LiftCombinePerKey``: partial results per bundle,
  then a GroupByKey), as on Beam's DirectRunner; Beam's Dask translation
  would shuffle and hold every per-block partial aggregate.
* A step's tasks carry its DoFn and arguments pickled once for the step,
  and a worker process unpickles them once for all its tasks of the step
  (``_ParDo``, ``_StepArgs``): the scheduler pickled them again for every
  task it sent and the worker unpickled them for every task it got, all of
  a pass's tasks before the first ran.
* A GroupByKey shuffles over at most one partition per worker thread
  (``_GroupByKey``): Beam's translation keeps its input's partitions, one
  per read range, and Dask's task shuffle of n partitions is ~n² tasks,
  almost all of them moving a few per-class partials (a ``--clusters 16``
  job at 200k rows: 2,600 of its 3,067 tasks).
* Every side input is computed once, when the graph is built, and kept on
  the cluster (``_Readers``, ``_Stored``): Beam's translation recomputes
  it per reading task, redrawing secure noise and holding the readers'
  inputs meanwhile. A worker process fetches it once for all its tasks
  (``_side_values``). A collection read by several transforms is computed
  once without being kept whole where its readers allow (``_Pending``).
* Every output is computed: Beam's runner computes only the ancestors of
  the last transform, so a second sink silently did not run.
* Created elements go up to ``CREATE_PARTITION_SIZE`` to a Dask partition
  (unless ``--dask_npartitions`` / ``--dask_partition_size`` say
  otherwise): what dpsynth creates is small (the labels, a file pattern,
  one element), and the work that grows with the data spreads through a
  ``Reshuffle`` (read ranges, shards, image files; below).
* ``Reshuffle`` redistributes (Beam's translation is a no-op, so the
  release's shards, which come from one element in the default plan or
  one per class, were drawn and written by one task per class or one in
  all). Its input is computed at that point and, when small,
  created again with one element per partition and no dependencies (Dask
  runs a task where its inputs are, so pieces of one task's output would
  all run on that worker); see ``_spread``.
* With ``DPSYNTH_STAGE_TRACE=<file>`` in the workers' environment every
  ParDo task appends its step name, process id and start/end time to the
  file (``dpsynth.transforms.progress``; benchmarks/scaling.py --workers and
  tests/test_scaleout.py read it).
* ``metrics()`` returns empty results instead of raising
  ``NotImplementedError``: Beam's DaskRunner collects no counters, so the
  operator counters (rows_read, rows_clipped, ...) are not available there.

Measured on Beam 2.77 with distributed 2026.8 (each figure above, from
benchmarks/results/scaling-workers.md and the commits of this file;
``git log -- pipelines/dask_runner.py pipelines/runners/dask/runner.py``).
The two module-level swaps (``install_workaround``,
``install_translations``) check what they replace: where Beam's function
or translation is not the one measured, Beam's own stays, with one debug
line (``beam_patch.kept``).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import threading
import time
import uuid
from typing import Any, Callable, Optional

import apache_beam as beam
from apache_beam.metrics.metric import MetricResults
from apache_beam.pipeline import PipelineVisitor, PTransformOverride
from apache_beam.runners.dask import dask_runner as beam_dask
from apache_beam.runners.dask import transform_evaluator
from apache_beam.runners.dask.overrides import _GroupByKeyOnly, _Reshuffle
from apache_beam.runners.common import DoFnInvoker
from apache_beam.runners.runner import PipelineResult, PipelineState
from apache_beam.transforms.combiners import LiftedCombinePerKey

from dpsynth.pipelines.runners.cores import usable_cores
from dpsynth.pipelines.runners.beam_patch import kept, replace_once, takes
from dpsynth.pipelines.runners.dask import cluster, compat
from dpsynth.transforms.progress import trace, trace_path

log = logging.getLogger("dpsynth")

def apply_dofn_to_bundle(items, invoker_args, invoker_kwargs, receivers):
    """Runs one bundle (a Dask partition) through a DoFn, as Beam's function
    of that name does, with two fixes: the step's output list (Beam's
    ``OneReceiver``, which belongs to the step, not to the bundle) is
    emptied first, and read after ``finish_bundle``, whose outputs Beam's
    version drops (and then returns with the next bundle). No other bundle
    uses these arguments meanwhile: ``_StepCall`` gives each running bundle
    its own (``_StepArgs.take``)."""
    start = time.time()
    del receivers.values[:]
    invoker = DoFnInvoker.create_invoker(*invoker_args, **invoker_kwargs)
    invoker.invoke_setup()
    invoker.invoke_start_bundle()
    for item in items:
        invoker.invoke_process(item)
    invoker.invoke_finish_bundle()
    invoker.invoke_teardown()
    results = [v.value for v in receivers.values]
    del receivers.values[:]
    if trace_path():  # benchmarks/tests: which worker ran each step
        trace(f"step:{_step_name(invoker_args)}", start, time.time())
    return results


def _step_name(invoker_args) -> str:
    """The DoFn's name, or the function's of a Map/FlatMap (Beam's
    DoFnContext, which holds the transform's label, does not pickle it)."""
    named = _step_fn(invoker_args)
    name = getattr(named, "__qualname__", None) or type(named).__name__
    code = getattr(named, "__code__", None)
    if name.endswith("<lambda>") and code is not None:
        # every Map(lambda) would share one name: say which one (by module:
        # a function pickled by value may carry no file name)
        module = getattr(named, "__module__", None) or os.path.basename(
            code.co_filename)
        name += f"@{module}:{code.co_firstlineno}"
    return name.replace(".<locals>", "")


def _step_fn(invoker_args):
    """A step's DoFn, or the function of its Map / FlatMap."""
    fn = getattr(invoker_args[0], "do_fn", None)
    inner = getattr(fn, "_fn", None)  # CallableWrapperDoFn
    return _user_fn(inner) if inner is not None else fn


def _ours(invoker_args) -> bool:
    """Whether a step's DoFn or function is dpsynth's (one purpose each)."""
    named = _step_fn(invoker_args)
    module = getattr(named, "__module__", None) or type(named).__module__
    return module.split(".")[:2] in _PACKAGES


_PACKAGES = [["dpsynth", name]
             for name in ("pipelines", "transforms", "dp_ops", "models")]


def _user_fn(fn):
    """The function given to Beam's Map / FlatMap (they wrap it in a lambda
    of their own, which would name every Map step "Map.<lambda>")."""
    if not getattr(fn, "__module__", "").startswith("apache_beam"):
        return fn
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if callable(value):
            return value
    return fn


def install_workaround() -> None:
    """Routes Beam's Dask ParDo translation through ``apply_dofn_to_bundle``.

    Idempotent. Only Beam's Dask runner module is touched (it reads the
    module global when it builds a ParDo's task), so other runners are
    unaffected. Where Beam's function has other parameters or its
    ``OneReceiver`` keeps no ``values`` list, Beam's own stays (one debug
    line). Drop it once Beam empties the list per bundle and keeps
    ``finish_bundle`` outputs itself (deploy/README.md "Dask").
    """
    receiver_fits = hasattr(transform_evaluator.OneReceiver(), "values")
    beams = replace_once(
        transform_evaluator, "apply_dofn_to_bundle",
        lambda _: apply_dofn_to_bundle,
        fits=lambda fn: receiver_fits and takes(
            "items", "do_fn_invoker_args", "do_fn_invoker_kwargs",
            "tagged_receivers")(fn))
    if beams is not None:
        apply_dofn_to_bundle.beam_original = beams


class _GroupByKey(transform_evaluator.GroupByKey):
    """Beam's Dask GroupByKey on at most one partition per worker thread.

    Dask's task shuffle splits every input partition once per output
    partition, and Beam's translation keeps the input's count (one per
    read range: 30 at 1M rows in 10 files), so each GroupByKey was ~n²
    tiny tasks, each sent, run and answered one by one, and every step
    after it ran n mostly empty tasks. The input is first joined into
    contiguous runs of partitions (no shuffle); the groups still spread
    over every worker."""

    def apply(self, input_bag, side_inputs=None):
        import dask
        ways = min(input_bag.npartitions, _cluster_threads())
        if ways < input_bag.npartitions:
            input_bag = input_bag.repartition(npartitions=ways)
        # A bag shuffles by tasks anyway; naming it spares Dask's default
        # lookup, which imports dask.dataframe (0.27 s of the first job).
        with dask.config.set({"dataframe.shuffle.method": "tasks"}):
            return super().apply(input_bag, side_inputs)


class _ParDo(transform_evaluator.ParDo):
    """Beam's Dask ParDo whose tasks carry the step's arguments (its DoFn,
    output handler and output list) pickled once for the step
    (``_StepArgs``), not pickled again for every task. Each task carried
    them as objects (~12 KB pickled): the scheduler pickled them for every
    task it sent (1.6 ms) and the worker unpickled them for every task it
    got (0.6-0.9 ms), all of a pass's tasks before the first of them ran.
    A worker now unpickles a step's arguments once and its tasks reuse
    them, as a Beam worker's bundles reuse a DoFn (``apply_dofn_to_bundle``
    empties the output list first); tasks running at the same time get a
    copy each (``_StepArgs.take``).
    """

    def apply(self, input_bag, side_inputs=None):
        return super().apply(_OnceArgs(input_bag, self.applied.full_label),
                             side_inputs)


class _OnceArgs:
    """The bag Beam's ParDo translation maps (``bag.map(...)
    .map_partitions(fn, *args)``), with the arguments of its
    ``map_partitions`` wrapped as one ``_StepArgs`` (one object graph: the
    output handler fills the output list it was built with)."""

    def __init__(self, bag, label: str = "") -> None:
        self._bag, self._label = bag, label

    def __getattr__(self, name: str):
        # anything else a later Beam asks of the bag: the bag's own
        if name == "_bag":  # not set (a copy made without __init__)
            raise AttributeError(name)
        return getattr(self._bag, name)

    def map(self, *args, **kwargs) -> "_OnceArgs":
        return _OnceArgs(self._bag.map(*args, **kwargs), self._label)

    def map_partitions(self, fn, *args):
        import distributed
        token = f"{distributed.default_client().id}/{uuid.uuid4().hex}"
        return self._bag.map_partitions(_StepCall(args, self._label), fn,
                                        _StepArgs(args, token))


class _StepCall:
    """Runs a step's bundle (``fn(items, *arguments)``) under the step's
    name. Dask names a task's key, and learns how long a task takes, by its
    function's name: under one name for every step (Beam's
    ``apply_dofn_to_bundle``) a 0.4 s shard write was expected to take as
    long as the average step (a few ms), so the scheduler seldom moved the
    last shards of a busy worker to an idle one (up to 1.3 s with one
    worker of two busy at the end of the writers). A chain of steps that
    Dask fuses into one task is named after one of them (Dask's pick).

    Another library's function (PipelineDP's ``map_values`` lambda, Beam's
    ``_KeyWithNone``, ...) serves many steps, mostly trivial ones: its name
    also carries a digest of the step's Beam label (``label``). Otherwise
    PipelineDP's noise step (0.1-0.16 s a partition) and the writers'
    chain (which Dask named after its ``_KeyWithNone`` step, as it names
    the ToList steps) were expected to last as long as those."""

    def __init__(self, args: tuple, label: str = "") -> None:
        step = _step_name(args[0])  # Beam's (invoker args, kwargs, outputs)
        name = "dpsynth_" + re.sub(r"\W+", "_", step)[:40]
        if label and not _ours(args[0]):
            name += "_" + hashlib.sha1(label.encode()).hexdigest()[:6]
        self.__name__ = name
        self.identity = cluster.launcher_identity()

    def __dask_tokenize__(self):
        return self.__name__

    def __call__(self, items, fn, shared: "_StepArgs"):
        cluster.check_this_worker(self.identity)  # a worker that joined late too
        args = shared.take()
        try:
            return fn(items, *args)
        finally:
            shared.give(args)


class _StepArgs:
    """A step's arguments, pickled once (the first time a task holding them
    is pickled) and unpickled once per process: every later copy in a
    process is the object already there (``_step_args``). Not a task
    dependency of its own: that would stop Dask fusing the step with the
    steps before and after it (each step's output would be a task of its
    own, sent between workers; measured: 28 % more worker CPU).

    A bundle ``take``s the arguments and ``give``s them back: one worker
    thread's bundles reuse one copy, and bundles running at the same time
    (a worker with several threads) each get a copy of their own, unpickled
    from the bytes, so none waits for another's output list."""

    def __init__(self, args: tuple, token: str,
                 blob: Optional[bytes] = None) -> None:
        self.args, self.token, self._blob = args, token, blob
        self._idle, self._lock = [args], threading.Lock()

    def _bytes(self) -> bytes:
        if self._blob is None:
            from distributed.protocol import pickle as dask_pickle
            self._blob = dask_pickle.dumps(self.args)
        return self._blob

    def __reduce__(self):
        return _step_args, (self.token, self._bytes())

    def __dask_tokenize__(self):
        return self.token

    def take(self) -> tuple:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        from distributed.protocol import pickle as dask_pickle
        return dask_pickle.loads(self._bytes())

    def give(self, args: tuple) -> None:
        with self._lock:
            self._idle.append(args)


# The step arguments this process has unpickled, by token; only the newest
# pipeline run's are kept (tokens start with its client's id, as the side
# inputs' dataset names do).
_STEP_ARGS: dict[str, _StepArgs] = {}
_STEP_LOCK = threading.Lock()


def _step_args(token: str, blob: bytes) -> _StepArgs:
    def load() -> _StepArgs:
        from distributed.protocol import pickle as dask_pickle
        return _StepArgs(dask_pickle.loads(blob), token, blob)
    return _newest_run_entry(_STEP_ARGS, _STEP_LOCK, token, load)


def install_translations() -> None:
    """Routes Beam's Dask GroupByKey and ParDo translations through
    ``_GroupByKey`` and ``_ParDo`` (idempotent; Beam's Dask runner looks
    translations up in this dict when it builds each step, so other
    runners are unaffected). A translation that is not Beam 2.77's class
    is left as it is (one debug line)."""
    translations = transform_evaluator.TRANSLATIONS
    for key, beams, ours in ((_GroupByKeyOnly, transform_evaluator.GroupByKey,
                              _GroupByKey),
                             (beam.ParDo, transform_evaluator.ParDo, _ParDo)):
        if translations.get(key) is beams:
            translations[key] = ours
        elif translations.get(key) is not ours:
            kept(transform_evaluator, f"TRANSLATIONS[{key.__name__}]")


class _LiftCombinePerKey(PTransformOverride):
    """CombinePerKey as a per-bundle pre-combine, a GroupByKey and a merge
    (Beam's ``LiftedCombinePerKey``, which its DirectRunner also uses).
    Beam's DaskRunner expands CombinePerKey into GroupByKey + CombineValues,
    so every partial aggregate (e.g. a d x d second moment per block and
    class) would be shuffled and held until the merge."""

    def matches(self, applied_ptransform) -> bool:
        return (isinstance(applied_ptransform.transform, beam.CombinePerKey)
                and applied_ptransform.inputs[0].windowing.is_default())

    def get_replacement_transform_for_applied_ptransform(self, applied):
        t = applied.transform
        return LiftedCombinePerKey(t.fn, t.args, t.kwargs)


class _NoMetrics(MetricResults):
    """What ``metrics()`` returns on Dask: Beam's DaskRunner has none."""

    def query(self, filter=None):
        return {kind: [] for kind in (
            self.COUNTERS, self.DISTRIBUTIONS, self.GAUGES, self.STRINGSETS,
            self.BOUNDED_TRIES, self.HISTOGRAMS)}


class DaskRunResult(PipelineResult):
    """Beam's Dask result; when the job ends it drops the shared
    collections it stored on the cluster and closes the client (a local
    cluster stays for the next pipeline: see ``close_local_cluster``)."""

    def __init__(self, inner: beam_dask.DaskRunnerResult,
                 stored: "_Stored") -> None:
        super().__init__(PipelineState.RUNNING)
        self._inner, self._stored = inner, stored

    def wait_until_finish(self, duration=None):
        try:
            with cluster._cluster_loss_as_one_line(self._inner.client):
                self._state = self._inner.wait_until_finish(duration)
        except BaseException:
            self._state = PipelineState.FAILED
            raise
        finally:
            self.close()
        return self._state

    def cancel(self):
        try:
            self._state = self._inner.cancel()
        finally:
            self.close()
        return self._state

    def metrics(self) -> MetricResults:
        return _NoMetrics()

    def close(self) -> None:
        self._stored.drop(self._inner.client)
        forget_on_workers(self._inner.client)
        self._inner.client.close()


def forget_on_workers(client) -> None:
    """``forget_run`` on every worker of ``client``'s cluster (the end of
    a pipeline, a failed one too). A worker that cannot be reached keeps
    nothing of a later run either: quietly skipped."""
    with contextlib.suppress(Exception):
        client.run(forget_run)


def forget_run() -> int:
    """Drops what a pipeline left in this worker process: the step
    arguments (DoFns holding the run's noise, its key once read from
    --noise-key-location) and the side inputs it fetched, then collects
    them. Long-lived workers kept them "until the next run": a client
    connecting later read the key back. Returns the noise objects still
    alive in the process (tests)."""
    import gc
    with _STEP_LOCK:
        _STEP_ARGS.clear()
    with _SIDE_LOCK:
        _SIDE_VALUES.clear()
        _SIDE_FETCH_LOCKS.clear()
    gc.collect()
    from dpsynth.dp_ops.noise import KeyedNoise
    return sum(isinstance(o, KeyedNoise) for o in gc.get_objects())


class DaskRunner(beam_dask.DaskRunner):
    """Beam's DaskRunner with the bundle fixes, lifted combines, shared
    collections computed once, every output computed, Reshuffle as a real
    redistribution, and a local cluster when no scheduler is given."""

    def run_pipeline(self, pipeline, options):
        install_workaround()
        install_translations()
        pipeline.replace_all([_LiftCombinePerKey()])
        dask_options = options.view_as(beam_dask.DaskOptions)
        if not dask_options.npartitions and not dask_options.partition_size:
            # Beam's own default, set to spare its warning on every Create
            dask_options.partition_size = CREATE_PARTITION_SIZE
        cluster._quiet_dask_logs()
        local = not dask_options.address and not dask_options.scheduler_file
        given = dask_options.address
        dashboard = options.view_as(cluster.LocalDaskOptions).dask_dashboard
        if local:
            # Set for Beam's Client only: the caller's options (shared by
            # the adaptive plan's phases) keep saying "local cluster".
            dask_options.address = cluster.local_cluster(
                dashboard=dashboard, by_run=True).scheduler_address
        else:
            cluster.check_cluster(options)
        if not local and dashboard:
            log.warning("--dask_dashboard is for the local cluster dpsynth "
                        "starts; the cluster at --dask_client_address / "
                        "--dask_scheduler_file serves its own")
        self._pipeline, self._stored = pipeline, _Stored()
        import dask
        try:
            beam_dask.DaskBagWindowedIterator = self._stored.side_input
            with cluster._cluster_loss_as_one_line(dask_options.address), \
                    dask.config.set(cluster.local_security(dask_options.address)):
                inner = super().run_pipeline(pipeline, options)
        except BaseException:
            self._stored.drop()
            _forget_on_default_client()
            _close_default_client()
            raise
        finally:
            beam_dask.DaskBagWindowedIterator = \
                transform_evaluator.DaskBagWindowedIterator
            if local:
                dask_options.address = given
        return DaskRunResult(inner, self._stored)

    def to_dask_bag_visitor(self, bag_kwargs=None, lazy_side_inputs=False):
        """Beam's visitor, computing each shared collection once and, at
        the end, every output of the graph (see _Readers, _Pending).
        ``lazy_side_inputs`` (Beam 2.78's ``--dask_lazy_side_inputs``) has
        nothing to change here: every side input is computed once and
        stored (``_Stored``), never recomputed per reading task."""
        base = compat.beam_visitor(bag_kwargs, lazy_side_inputs)
        readers = _Readers(self._pipeline)
        pending = _Pending(readers, self._stored)

        class Visitor(type(base)):
            def visit_transform(self, node):
                super().visit_transform(node)
                if isinstance(node.transform, _Reshuffle):
                    self.bags[node] = _spread(
                        node, self.bags[node],
                        pending.needs_pending(self.bags[node], self.bags))
                pending.visited(node)
                if readers.side(node):
                    for n, bag in pending.store_with(node, self.bags).items():
                        self.bags[n] = bag
                elif readers.shared(node):
                    pending.defer(node)

            def leave_composite_transform(self, node):
                if node.parent is None:  # the end: Beam computes the last
                    self.bags[_ALL_OUTPUTS] = _all_of(
                        [self.bags[n] for n in self.bags
                         if readers.unread(n)])
        return Visitor()


_ALL_OUTPUTS = "dpsynth: every output of the graph"


def _cluster_threads() -> int:
    """Worker threads of the cluster the job runs on (at least 1)."""
    import distributed
    try:
        return max(1, sum(distributed.default_client().nthreads().values()))
    except ValueError:  # no client (cannot happen inside run_pipeline)
        return usable_cores()


# Elements of a Create per Dask partition (Beam's default). One partition
# per element, dpsynth's choice before Reshuffle spread the reads, only
# made tasks: with 128, a default job (1M x 384, 2 workers) ran ~20 % fewer
# scheduler transitions (3,050 -> 2,460) and took 13.1-13.2 s instead of
# 13.6-13.8 s (2 runs each).
CREATE_PARTITION_SIZE = 128

# A Reshuffle input up to this size (the shard list, read ranges: a few
# KB) is brought to the client and created again as root tasks, one
# element per partition up to this many partitions.
SMALL_RESHUFFLE_BYTES = 16 * 2 ** 20
MAX_SPREAD_PARTITIONS = 1024


def _spread(node, bag, needs_pending: bool):
    """Beam's Reshuffle as a real redistribution (Beam's Dask translation
    makes it a no-op, so e.g. every shard of the release, which came from
    one element, was drawn and written by one task).

    The input is computed now (a Reshuffle is a barrier anyway) and, when
    small, created again with one element per partition (up to
    ``MAX_SPREAD_PARTITIONS``) and no dependencies: Dask balances such
    root tasks over the workers as they free up, whereas a task goes
    where its inputs are, so partitions cut from one task's output would
    all run on that worker; and one read range per task keeps a task's
    blocks to one range's. A large input (or one that needs a shared
    collection not computed yet) is dealt round-robin over one partition
    per worker thread in the graph (``deal_partitions``)."""
    ways = _cluster_threads()
    if needs_pending:
        return deal_partitions(bag, ways)
    import math

    import dask.bag as db
    import distributed
    client = distributed.default_client()
    (persisted,) = client.persist([bag])
    futures = distributed.futures_of(persisted)
    distributed.wait(futures)
    for future in futures:
        if future.status == "error":
            future.result()  # raises the worker's exception
    size = sum(client.nbytes(keys=[f.key for f in futures],
                             summary=False).values())
    if size > SMALL_RESHUFFLE_BYTES:
        return deal_partitions(persisted, ways)
    items = [item for part in client.gather(futures) for item in part]
    if not items:
        return db.from_sequence([], npartitions=1)
    return db.from_sequence(items, partition_size=math.ceil(
        len(items) / MAX_SPREAD_PARTITIONS))


def deal_partitions(bag, ways: int):
    """``bag`` in ``ways`` partitions: element e of input partition i goes
    to output (i + e) % ways (the offset spreads one-element partitions
    too). n_in x ways small ``getitem`` tasks, each output fetching only
    its own piece of every input partition."""
    import operator

    import dask.bag as db
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph
    token = tokenize(bag.name, ways)
    deal, piece = f"dpsynth-deal-{token}", f"dpsynth-piece-{token}"
    out = f"dpsynth-spread-{token}"
    layer: dict = {}
    for i in range(bag.npartitions):
        layer[(deal, i)] = (_deal, (bag.name, i), i, ways)
        for j in range(ways):
            layer[(piece, i, j)] = (operator.getitem, (deal, i), j)
    for j in range(ways):
        layer[(out, j)] = (_concat, [(piece, i, j)
                                     for i in range(bag.npartitions)])
    graph = HighLevelGraph.from_collections(out, layer, dependencies=[bag])
    return db.Bag(graph, out, ways)


def _deal(partition, index: int, ways: int) -> list:
    pieces: list = [[] for _ in range(ways)]
    for e, item in enumerate(partition):
        pieces[(index + e) % ways].append(item)
    return pieces


def _concat(pieces) -> list:
    return [item for piece in pieces for item in piece]


class _Readers:
    """Who reads each PCollection, as Beam's DaskRunner needs to know.

    Shared (read as a side input or by several transforms): Beam's Dask
    translation computes a side input again in every task that reads it,
    and a collection once per reader: a pass's model (and every pass behind
    it) ran once per reading task, secure noise was redrawn, and tasks
    waiting for a side input held their whole input meanwhile. dpsynth
    computes them once, when the graph is built (``_Stored``).
    Unread: Beam computes only the last transform's ancestors, so a
    transform nothing reads (a second sink) would silently not run.
    """

    def __init__(self, pipeline) -> None:
        self._count: dict = {}
        self._side: set = set()
        count, side = self._count, self._side

        class Count(PipelineVisitor):
            def visit_transform(self, node):
                for pcoll in node.inputs:
                    count[pcoll] = count.get(pcoll, 0) + 1
                side.update(si.pvalue for si in node.side_inputs)
        pipeline.visit(Count())

    def shared(self, node) -> bool:
        return any(out in self._side or self._count.get(out, 0) > 1
                   for out in node.outputs.values())

    def side(self, node) -> bool:
        return any(out in self._side for out in node.outputs.values())

    def readers(self, pcoll) -> int:
        return self._count.get(pcoll, 0)

    def unread(self, node) -> bool:
        return not isinstance(node, str) and all(
            out not in self._side and not self._count.get(out, 0)
            for out in node.outputs.values())


class _Pending:
    """Collections read by several transforms (not as a side input), kept
    in the graph instead of stored: the final graph computes each key once,
    and a block dropped once its readers ran never waits for the whole
    dataset (storing phase 1's raw blocks held them all on the workers:
    1.5 GB of stored partitions per worker at 1M x 384).

    Only a stored side input can split their readers over two computations.
    So a side input is computed together with every collection that still
    needs a pending one (it has readers to come, or is an output nobody
    reads): one graph, each pending key computed once; a pending collection
    whose own readers are not all built yet is stored with them.
    """

    def __init__(self, readers: _Readers, stored: "_Stored") -> None:
        self._readers, self._stored = readers, stored
        self._seen: dict = {}  # PCollection -> readers built so far
        self._pending: list = []  # shared nodes not stored
        self._done: set = set()  # nodes stored (or their readers stored)

    def visited(self, node) -> None:
        for pcoll in node.inputs:
            self._seen[pcoll] = self._seen.get(pcoll, 0) + 1

    def defer(self, node) -> None:
        self._pending.append(node)

    def needs_pending(self, bag, bags: dict) -> bool:
        """Whether ``bag`` computes a shared collection not stored yet
        (computing it now would compute that collection twice)."""
        return any(_depends(bag, bags[x]) for x in self._pending)

    def _open(self, node) -> bool:
        """Read by transforms not built yet, or by none (a sink)."""
        return self._readers.unread(node) or any(
            self._seen.get(out, 0) < self._readers.readers(out)
            for out in node.outputs.values())

    def store_with(self, side_node, bags: dict) -> dict:
        """Stores ``side_node``'s bag with what shares a pending key with
        it; returns node -> stored bag."""
        group = {side_node: bags[side_node]}
        needed = [x for x in self._pending
                  if _depends(bags[side_node], bags[x])]
        for node, bag in bags.items():
            if (node in group or node in self._done or isinstance(node, str)
                    or not self._open(node)):
                continue
            if any(_depends(bag, bags[x]) for x in needed):
                group[node] = bag
        self._pending = [x for x in self._pending if x not in needed]
        self._done.update(group)
        stored = self._stored.compute_all(list(group.values()))
        return dict(zip(group, stored))


def _depends(bag, on) -> bool:
    """Whether ``bag``'s graph holds ``on``'s tasks."""
    return on is not None and bag is not None and (
        bag.name == on.name or on.name in bag.dask.layers)


class _Stored:
    """Shared collections computed on the cluster while the graph is built,
    kept there as published Dask datasets until the job ends.

    A later step reads them as stored results (its graph names their keys),
    and a task reads a side input with ``Client.get_dataset`` and
    ``Future.result``. Beam's side-input view instead computes the bag
    inside the reading task with ``Client.get``, which secedes from the
    worker's thread pool: while one task waits the worker starts the next,
    and every such task holds its whole input (all read ranges at once).
    """

    def __init__(self) -> None:
        self._names: set = set()

    def compute_all(self, bags: list) -> list:
        """The bags computed now in one graph (keys they share are computed
        once) and stored; a failure is raised here."""
        import distributed
        client = distributed.default_client()
        new = list({b.name: b for b in bags
                    if _dataset_name(b) not in self._names}.values())
        persisted = dict(zip((b.name for b in new), client.persist(new)))
        futures = distributed.futures_of(list(persisted.values()))
        distributed.wait(futures)
        for future in futures:
            if future.status == "error":
                future.result()  # raises the worker's exception
        for bag in persisted.values():
            name = _dataset_name(bag)
            if name not in self._names:
                client.publish_dataset(bag, name=name)
                self._names.add(name)
        return [persisted.get(b.name, b) for b in bags]

    def side_input(self, bag, window_fn, *beam_args):
        """Replaces Beam's DaskBagWindowedIterator for stored bags (Beam
        2.78 passes a third argument, ``lazy_side_inputs``: a stored bag is
        read once per worker process either way)."""
        name = _dataset_name(bag)
        if name not in self._names:  # cannot happen: side inputs are shared
            return transform_evaluator.DaskBagWindowedIterator(
                bag, window_fn, *beam_args)
        return _StoredSideInput(name, window_fn)

    def drop(self, client=None) -> None:
        """Frees the cluster's copies (datasets outlive the client)."""
        import distributed
        try:
            client = client or distributed.default_client()
        except ValueError:  # no client was opened
            return
        names, self._names = sorted(self._names), set()
        try:  # one round trip for all (newer distributed takes a list)
            client.unpublish_dataset(names)
        except TypeError:  # an older one: a name a call, ~10 ms each
            for name in names:
                with contextlib.suppress(Exception):  # scheduler gone
                    client.unpublish_dataset(name)
        except Exception:  # a scheduler already gone
            pass


def _dataset_name(bag) -> str:
    import distributed
    # "/" parts the client (one per pipeline run) from the bag: neither
    # has one, and _job_of splits on it
    return f"dpsynth-{distributed.default_client().id}/{bag.name}"


class _StoredSideInput:
    """A side input read from its published dataset (Future objects cannot
    travel in a task: the scheduler unpickles the graph outside any
    client), once per worker process (``_side_values``)."""

    def __init__(self, name: str, window_fn) -> None:
        self._name, self._window_fn = name, window_fn

    def __iter__(self):
        for item in _side_values(self._name):
            yield transform_evaluator.get_windowed_value(
                item, self._window_fn)


# Side-input values this worker process has fetched, by dataset name. Every
# task that reads a side input used to fetch it again (two scheduler round
# trips and the data: the ten class mixtures, about 4 MB at d = 384, for
# each of the 45 shards a 2M-row job writes). A stored side input never
# changes while its job runs, so one fetch serves every task of the
# process. Only the newest pipeline run's entries are kept (names start
# with its client's id, see _dataset_name): a worker that serves run after
# run holds one run's side inputs at most.
_SIDE_VALUES: dict[str, list] = {}
_SIDE_LOCK = threading.Lock()
_SIDE_FETCH_LOCKS: dict = {}


def _side_values(name: str) -> list:
    """The items of the published dataset ``name``, fetched once per
    process (and again only after another run's have replaced them)."""
    import distributed

    def fetch() -> list:
        stored = distributed.get_client().get_dataset(name)
        return [item for future in distributed.futures_of(stored)
                for item in future.result()]
    cached = _SIDE_VALUES.get(name)
    if cached is not None:
        return cached
    # One lock per side input, not the cache's: a side input recomputed
    # after a host was lost can need tasks that read another side input in
    # this process (the mixture waits for the moments pass, whose tasks
    # read the plan).
    lock = _newest_run_entry(_SIDE_FETCH_LOCKS, _SIDE_LOCK, name,
                             threading.Lock)
    with _outside_thread_pool(), lock:
        return _newest_run_entry(_SIDE_VALUES, _SIDE_LOCK, name,
                                 _unlocked(fetch))


def _unlocked(load: Callable[[], Any]) -> Callable[[], Any]:
    """``load`` run with the cache's lock released (``_newest_run_entry``
    holds it): fetching waits for the cluster."""
    def run() -> Any:
        _SIDE_LOCK.release()
        try:
            return load()
        finally:
            _SIDE_LOCK.acquire()
    return run


@contextlib.contextmanager
def _outside_thread_pool():
    """Waits outside the worker's thread pool (else a lost worker can
    deadlock the job): when the worker
    holding a stored side input dies, the scheduler recomputes it on a
    live worker, whose every thread may be a task waiting for that side
    input, or for the lock of the one fetching it (one thread per worker:
    all of them). Waiting inside the pool deadlocked the job
    (tests/test_hosts.py); a seceded thread frees its slot. Costs one
    message to the scheduler per side input and reading task that finds
    it not fetched yet."""
    import distributed
    try:
        distributed.secede()
    except (KeyError, ValueError, AttributeError):  # not in a Dask task
        yield
        return
    try:
        yield
    finally:
        distributed.rejoin()


def _newest_run_entry(cache: dict, lock: threading.Lock, name: str,
                      load: Callable[[], Any]) -> Any:
    """``cache[name]``, loaded once per process (under ``lock``); loading
    one of a new pipeline run drops the other runs' entries (names start
    with their client's id, see ``_job_of``)."""
    with lock:
        value = cache.get(name)
        if value is None:
            value = load()
            for other in [n for n in cache if _job_of(n) != _job_of(name)]:
                del cache[other]
            cache[name] = value
        return value


def _job_of(name: str) -> str:
    """The client part of a dataset name made by _dataset_name."""
    return name.split("/", 1)[0]


def _all_of(bags: list):
    """One bag that computes every bag given and holds nothing."""
    import dask.bag as db
    return db.concat([b.map_partitions(_nothing) for b in bags
                      if b is not None])


def _nothing(partition) -> list:
    return []


def _forget_on_default_client() -> None:
    import distributed
    with contextlib.suppress(ValueError):  # no client was opened
        forget_on_workers(distributed.default_client())


def _close_default_client() -> None:
    """Closes the client Beam's run_pipeline opened, if it got that far."""
    import distributed
    try:
        distributed.default_client().close()
    except ValueError:  # no client
        pass
