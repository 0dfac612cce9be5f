"""dpsynth on a Dask cluster: Beam's DaskRunner plus what it lacks.

Selected by ``--runner dask`` (or ``DaskRunner``, or Beam's class path
``apache_beam.runners.dask.dask_runner.DaskRunner``: ``runner_names``
rewrites all of them to ``pipelines.dask_runner.DaskRunner``). Needs the
``dask`` extra (``pip install 'dpsynth[dask]'``) here and on every worker.

* ``--dask_client_address tcp://HOST:PORT`` (Beam's option) points at an
  existing scheduler. Without it (and without ``--dask_scheduler_file``)
  this runner starts a ``distributed.LocalCluster`` for the run: one
  single-threaded worker process per CPU core, listening on loopback only,
  no dashboard; it is closed when the job ends. That is for trying the
  runner; a real deployment runs ``dask scheduler`` / ``dask worker``.
* Upstream bug workaround (Beam 2.77, see deploy/README.md "Dask"): Beam's
  Dask ``ParDo`` keeps one receiver list per step, filled by every bundle
  and never emptied, so a step executed twice in one worker process returns
  its earlier outputs again; a singleton side input then fails with
  "PCollection of size 2 with more than one element accessed as a singleton
  view". ``install_workaround`` points Beam's Dask translation at
  ``apply_dofn_to_bundle`` below, which empties the list before each bundle.
  It is installed only when this runner runs, in the submitting process;
  the workers get it with the task graph, which names this module's
  function (they import this module to unpickle it).
* Side inputs are computed once (``_persisting``), not once per task that
  reads them; each created element (e.g. a read range) is its own Dask
  partition unless ``--dask_npartitions`` / ``--dask_partition_size`` say
  otherwise, so the reads spread over the workers.
* ``metrics()`` returns empty results instead of raising
  ``NotImplementedError``: Beam's DaskRunner collects no counters, so the
  operator counters (rows_read, rows_clipped, ...) are not available there.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import Any, Optional, Sequence

from apache_beam.metrics.metric import MetricResults
from apache_beam.runners.dask import dask_runner as beam_dask
from apache_beam.runners.dask import transform_evaluator
from apache_beam.runners.runner import PipelineResult, PipelineState

log = logging.getLogger("dpsynth")

# One lock per receiver object: bundles that share a step's receivers (same
# worker process) run one at a time, so emptying the list is safe under
# threads_per_worker > 1 too. Keyed by id(); entries go with the object.
_LOCKS: dict[int, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def _lock_for(receivers: Any) -> threading.Lock:
    key = id(receivers)
    with _LOCKS_GUARD:
        lock = _LOCKS.get(key)
        if lock is None:
            lock = _LOCKS[key] = threading.Lock()
            weakref.finalize(receivers, _LOCKS.pop, key, None)
    return lock


def _beam_apply_dofn_to_bundle():
    """Beam's own function (also where this process installed the patch)."""
    fn = transform_evaluator.apply_dofn_to_bundle
    return getattr(fn, "beam_original", fn)


def apply_dofn_to_bundle(items, invoker_args, invoker_kwargs, receivers):
    """Beam's ``apply_dofn_to_bundle``, starting from an empty output list.

    ``receivers`` (Beam's ``OneReceiver``) belongs to the step, not to the
    bundle: without the reset a second run of the step in this process
    returns the first run's outputs too.
    """
    with _lock_for(receivers):
        del receivers.values[:]
        return _beam_apply_dofn_to_bundle()(items, invoker_args,
                                            invoker_kwargs, receivers)


def install_workaround() -> None:
    """Routes Beam's Dask ParDo translation through ``apply_dofn_to_bundle``.

    Idempotent. Only Beam's Dask runner module is touched (it reads the
    module global when it builds a ParDo's task), so other runners are
    unaffected. Drop it once Beam empties the list itself (deploy/README.md).
    """
    current = getattr(transform_evaluator, "apply_dofn_to_bundle", None)
    if current is apply_dofn_to_bundle:
        return
    if current is None or not hasattr(transform_evaluator.OneReceiver(),
                                      "values"):
        raise RuntimeError("this Beam's DaskRunner has changed (no "
                           "apply_dofn_to_bundle or OneReceiver.values): "
                           "re-check the workaround in "
                           "pipelines/dask_runner.py")
    apply_dofn_to_bundle.beam_original = current
    transform_evaluator.apply_dofn_to_bundle = apply_dofn_to_bundle


def start_local_cluster(workers: Optional[int] = None):
    """A LocalCluster on loopback: ``workers`` single-threaded processes."""
    from distributed import LocalCluster
    workers = workers or os.cpu_count() or 1
    return LocalCluster(n_workers=workers, threads_per_worker=1,
                        processes=True, host="127.0.0.1",
                        dashboard_address=None)


class _NoMetrics(MetricResults):
    """What ``metrics()`` returns on Dask: Beam's DaskRunner has none."""

    def query(self, filter=None):
        return {kind: [] for kind in (
            self.COUNTERS, self.DISTRIBUTIONS, self.GAUGES, self.STRINGSETS,
            self.BOUNDED_TRIES, self.HISTOGRAMS)}


class DaskRunResult(PipelineResult):
    """Beam's Dask result, closing the client (and a local cluster) after."""

    def __init__(self, inner: beam_dask.DaskRunnerResult, cluster=None,
                 persisted: Sequence = ()) -> None:
        super().__init__(PipelineState.RUNNING)
        self._inner, self._cluster = inner, cluster
        self._persisted = list(persisted)  # side inputs held in the cluster

    def wait_until_finish(self, duration=None):
        try:
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
        self._persisted = []
        self._inner.client.close()
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None


class DaskRunner(beam_dask.DaskRunner):
    """Beam's DaskRunner with the receiver workaround, side inputs computed
    once, one Dask partition per created element by default, and a local
    cluster when no scheduler is given."""

    def run_pipeline(self, pipeline, options):
        install_workaround()
        dask_options = options.view_as(beam_dask.DaskOptions)
        if not dask_options.npartitions and not dask_options.partition_size:
            # Beam's default puts up to 128 created elements in one
            # partition: every read range would then run in one task.
            dask_options.partition_size = 1
        cluster = None
        if not dask_options.address and not dask_options.scheduler_file:
            cluster = start_local_cluster()
            dask_options.address = cluster.scheduler_address
            log.info("no --dask_client_address: started a local Dask cluster "
                     "(%d worker processes on %s) for this run; for a real "
                     "cluster start `dask scheduler` and `dask worker "
                     "tcp://HOST:8786` and pass --dask_client_address",
                     len(cluster.workers), cluster.scheduler_address)
        persisted: list = []
        try:
            beam_dask.DaskBagWindowedIterator = _persisting(persisted)
            inner = super().run_pipeline(pipeline, options)
        except BaseException:
            if cluster is not None:
                cluster.close()
            raise
        finally:
            beam_dask.DaskBagWindowedIterator = \
                transform_evaluator.DaskBagWindowedIterator
        return DaskRunResult(inner, cluster, persisted)


def _persisting(persisted: list):
    """Side-input views that compute their collection once.

    Beam's DaskRunner hands a ParDo its side inputs as Dask bags that each
    task computes again when it first reads them: a side input's whole
    branch (here: passes over the data) runs once per reading task, and
    side inputs of side inputs multiply that. Persisting the bag when the
    graph is built computes it once on the cluster; ``persisted`` keeps the
    results alive until the job ends.
    """
    def view(bag, window_fn):
        bag = bag.persist()
        persisted.append(bag)
        return transform_evaluator.DaskBagWindowedIterator(bag, window_fn)
    return view
