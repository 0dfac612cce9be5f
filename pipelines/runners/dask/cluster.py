"""The clusters dpsynth's Dask runner runs on: the local cluster it starts
(TLS with a certificate made for it, loopback, scratch in a temporary
folder), connecting to a given one (TLS mistakes and an unreachable
scheduler in one line), and what every worker must match (the launcher's
dpsynth, Beam, distributed and Python), checked before the run and again by
each step's first task in every worker process (``check_this_worker``)."""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import multiprocessing
import shutil
import tempfile
import threading
from concurrent.futures import CancelledError
from typing import Any, Optional

from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.dask import dask_runner as beam_dask

from dpsynth.pipelines.runners import locality, source_digest
from dpsynth.pipelines.runners.errors import ClusterLost, ClusterMismatch
from dpsynth.pipelines.runners.cores import usable_cores

log = logging.getLogger("dpsynth")

class LocalDaskOptions(PipelineOptions):
    """dpsynth's option for the local cluster it starts (``--dask_*`` like
    Beam's, so ``--runner dask`` is needed with it)."""

    @classmethod
    def _add_argparse_args(cls, parser) -> None:
        parser.add_argument(
            "--dask_dashboard", default=None, metavar="ADDRESS",
            help="serve the Dask dashboard of the local cluster dpsynth "
            "starts (no --dask_client_address) at ADDRESS, e.g. "
            "127.0.0.1:8787; by default there is none")


# The local cluster's scheduler sends every runnable task at once (no
# queue); work stealing balances the workers. A read range is a fused task
# plus an alias task, so with a queue (1.0) each range paid two round trips
# through the scheduler: ~5.5 ms more a range. At 2M x 384 the default job
# ran 5-17 % faster without it, same releases and memory
# (benchmarks/results/scaling-workers.md, "2 cores, session 23").
# Work stealing every 100 ms, not every 1 s (distributed 2026.8's default):
# with every task sent at once, a worker that ran a little slower (beside
# the scheduler's own CPU) ended a pass with 2-3 tasks still queued while
# the other waited. Default job, 2M x 384, W = 2, five alternating pairs:
# one worker busy 0.95-1.81 s (median 1.40) -> 0.99-1.19 s (1.14), job
# 13.23-13.97 -> 13.32-13.51 s (benchmarks/results/scaling-workers.md,
# "2 cores, session 25").
CLUSTER_CONFIG = {"distributed.scheduler.worker-saturation": "inf",
                  "distributed.scheduler.work-stealing-interval": "100ms"}
# Without a dashboard nobody sees the workers' profiles: their sampler
# thread (each worker's stacks every 10 ms) is off. Measured (2 workers on
# 2 cores, 1M x 384, default job): 12.9 -> 12.6 s (3 runs each).
NO_DASHBOARD_CONFIG = {"distributed.worker.profile.enabled": False}


def _cluster_config(dashboard: Optional[str]) -> dict:
    """Dask settings the local cluster's scheduler and workers start with."""
    return {**CLUSTER_CONFIG, **({} if dashboard else NO_DASHBOARD_CONFIG)}


def tls_config(security) -> dict:
    """Dask settings under which a Client that this process opens (Beam's
    DaskRunner opens its own from the address alone) presents the local
    cluster's certificate and refuses a connection without TLS."""
    return {"distributed.comm.require-encryption": True,
            "distributed.comm.tls.ca-file": security.tls_ca_file,
            "distributed.comm.tls.client.cert": security.tls_client_cert,
            "distributed.comm.tls.client.key": security.tls_client_key}


class _LocalCluster:
    """The LocalCluster of this process and its scratch folder.

    Its scheduler and workers speak TLS with a certificate and key made
    for this cluster (``Security.temporary``: held in memory by this
    process and the cluster's own processes, never written where another
    account can read it), and require it of every connection: on loopback
    any local account could otherwise connect, run code in the workers and
    read the run's key (a 0700 --noise-key-location included)."""

    def __init__(self, workers: int, dashboard: Optional[str],
                 by_run: bool) -> None:
        import dask
        from distributed import LocalCluster
        from distributed.security import Security
        # started by a job's pipeline (the job closes it) or by the caller
        self.by_run = by_run
        self.security = Security.temporary()
        self.directory = tempfile.mkdtemp(prefix="dpsynth-dask-")
        known = _clusters(), set(multiprocessing.active_children())
        try:
            with dask.config.set(_cluster_config(dashboard)):  # read at start
                self.cluster = LocalCluster(
                    n_workers=workers, threads_per_worker=1, processes=True,
                    host="127.0.0.1", protocol="tls://",
                    security=self.security, dashboard_address=dashboard,
                    local_directory=self.directory,
                    scheduler_kwargs=_scheduler_kwargs(self.directory,
                                                       dashboard),
                    preload=["dpsynth.pipelines.runners.dask.preload"])
        except BaseException:
            _close_half_started(known)
            shutil.rmtree(self.directory, ignore_errors=True)
            raise

    def running(self) -> bool:
        from distributed.core import Status
        return self.cluster.status == Status.running

    def close(self) -> None:
        try:
            self.cluster.close()
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)


def _clusters() -> set:
    """Dask's registry of this process's clusters (closed at exit by Dask's
    own exit handler)."""
    from distributed.deploy.spec import SpecCluster
    return set(SpecCluster._instances)


def _close_half_started(known: tuple[set, set]) -> None:
    """A LocalCluster whose start failed or was interrupted (Ctrl-C while
    its workers start) stays in Dask's registry: Dask's exit handler then
    failed to close it (an AssertionError traceback after the job's one
    line). Closes what of it started, quietly, takes it out of the
    registry and ends the worker processes it started."""
    from distributed.deploy.spec import SpecCluster
    clusters, processes = known
    for cluster in _clusters() - clusters:
        SpecCluster._instances.discard(cluster)
        with contextlib.suppress(Exception):
            cluster.close(timeout=5)
    for process in set(multiprocessing.active_children()) - processes:
        process.terminate()
        process.join(5)
        if process.is_alive():
            process.kill()
            process.join()


def _scheduler_kwargs(directory: str, dashboard: Optional[str]) -> dict:
    """The scheduler's scratch space in ``directory`` too (by default it
    makes ``dask-scratch-space`` in the temporary directory); without a
    dashboard it still serves its HTTP routes, on 8787 by default (a
    warning when taken): any free loopback port instead."""
    kwargs: dict[str, Any] = {"local_directory": directory}
    if not dashboard:
        kwargs["dashboard_address"] = "127.0.0.1:0"
    return kwargs


_LOCAL: Optional[_LocalCluster] = None
_LOCAL_GUARD = threading.Lock()
# LocalClusters this process started (tests check the adaptive plan's two
# pipelines share one).
local_clusters_started = 0


def local_cluster(workers: Optional[int] = None,
                  dashboard: Optional[str] = None, by_run: bool = False):
    """This process's LocalCluster on loopback (``workers`` single-threaded
    processes, default one per core), started on first use and closed by
    ``close_local_cluster`` (at the latest at exit). ``by_run``: started
    for a job's pipeline, so ``close_run_cluster`` closes it at the job's
    end; a cluster the caller started stays for the caller's next job."""
    global _LOCAL, local_clusters_started
    with _LOCAL_GUARD:
        if _LOCAL is not None and not _LOCAL.running():
            _LOCAL.close()  # died (e.g. its workers were killed)
            _LOCAL = None
        if _LOCAL is None:
            _quiet_dask_logs()
            _LOCAL = _LocalCluster(workers or usable_cores(), dashboard,
                                   by_run)
            local_clusters_started += 1
            if local_clusters_started == 1:
                atexit.register(close_local_cluster)
            cluster = _LOCAL.cluster
            log.info("no --dask_client_address: started a local Dask cluster "
                     "(%d worker processes on %s%s) for this run; for a real "
                     "cluster start `dask scheduler` and `dask worker "
                     "tcp://HOST:8786` and pass --dask_client_address",
                     len(cluster.workers), cluster.scheduler_address,
                     f", dashboard {cluster.dashboard_link}" if dashboard
                     else "")
        return _LOCAL.cluster


def local_security(address: Optional[str]) -> dict:
    """``tls_config`` of this process's local cluster when ``address`` is
    its scheduler's; nothing for any other cluster."""
    with _LOCAL_GUARD:
        local = _LOCAL
    if local is None or address != local.cluster.scheduler_address:
        return {}
    return tls_config(local.security)


def close_local_cluster() -> None:
    """Closes the LocalCluster ``local_cluster`` started, if any, and
    removes its scratch folder. Idempotent; also registered with atexit."""
    global _LOCAL
    with _LOCAL_GUARD:
        local, _LOCAL = _LOCAL, None
    if local is not None:
        local.close()


def close_run_cluster() -> None:
    """Closes the LocalCluster a job's pipeline started (the job's end);
    one the caller started with ``local_cluster()`` stays open."""
    with _LOCAL_GUARD:
        by_run = _LOCAL is not None and _LOCAL.by_run
    if by_run:
        close_local_cluster()


def _quiet_dask_logs() -> None:
    """Dask's loggers at Beam's level (ERROR, or INFO with --verbose):
    importing ``distributed`` sets its logger to INFO, which put ~80 lines
    per run on the console. Loggers Dask set higher (e.g.
    ``distributed.client``: WARNING) keep their level."""
    level = logging.getLogger("apache_beam").getEffectiveLevel()
    for name in ("distributed", "dask"):
        logging.getLogger(name).setLevel(level)
    manager = logging.Logger.manager
    for name, logger in list(manager.loggerDict.items()):
        if (name.startswith(("distributed.", "dask."))
                and isinstance(logger, logging.Logger)
                and logger.level != logging.NOTSET):
            logger.setLevel(max(logger.level, level))


@contextlib.contextmanager
def _cluster_loss_as_one_line(where):
    """The scheduler lost mid-run (its host gone, killed): ``ClusterLost``,
    one line for the operator, instead of distributed's traceback."""
    from distributed.comm.core import CommClosedError
    try:
        yield
    except (CommClosedError, OSError, CancelledError) as err:
        text = str(err)
        if not isinstance(err, CommClosedError) and not (
                "scheduler-connection-lost" in text or "connect to" in text):
            raise
        address = getattr(where, "scheduler", None)
        address = getattr(address, "address", where)
        raise ClusterLost(
            f"the Dask cluster at {address} was lost mid-run (scheduler "
            f"unreachable: {_why_lost(err)}); the attempt stays charged: "
            "start the scheduler and workers again and rerun with the same "
            "--run-id") from None


def _why_lost(err: BaseException) -> str:
    """The cause in a few words. distributed's CancelledError lists every
    future it cancelled (internal task keys): nothing an operator can use."""
    text = str(err).strip()
    if isinstance(err, CancelledError) or text.startswith("Futures:"):
        return "the connection to it broke and the job's tasks were cancelled"
    return (text.splitlines() or [type(err).__name__])[-1].strip()[:200]


def check_workers(client, local_paths=(), secure: bool = False,
                  key_location: Optional[str] = None) -> None:
    """Before any work is submitted: every worker runs this launcher's
    dpsynth, Beam, distributed and Python (``worker_identity``); when the
    job uses local paths (``local_paths``: (flag, path or None) pairs), every
    worker is on this machine (a scheduler here may have workers
    elsewhere); a ``secure`` run (unseeded noise) with any worker or the
    scheduler off this machine, whatever its address looks like, has its
    key out of the job graph (``key_location``) and TLS.
    ``ClusterMismatch`` (one line) otherwise."""
    ours = worker_identity()
    try:
        theirs = client.run(worker_identity)
    except Exception as err:  # e.g. a worker without this module
        raise ClusterMismatch(
            f"the Dask workers could not report their dpsynth version "
            f"({type(err).__name__}: {str(err)[:200]}): install "
            f"{source_digest.describe(ours)} (this launcher's) on every "
            "worker") from None
    for worker, ident in sorted(theirs.items()):
        if ident != ours:
            raise ClusterMismatch(
                f"Dask worker {worker} runs {describe_identity(ident)}, "
                f"this launcher {describe_identity(ours)}: install the "
                "launcher's dpsynth and versions on every worker (or launch "
                "from theirs)")
    off = [w for w in sorted(theirs)
           if not locality.on_this_machine(locality.address_host(w))]
    if off and local_paths:
        flag, path = local_paths[0]
        raise ClusterMismatch(locality.local_path_refusal(
            flag, path, f"Dask worker {off[0]} is not on this machine"))
    scheduler = str(getattr(getattr(client, "scheduler", None), "address",
                            "") or "")
    if scheduler and not locality.on_this_machine(
            locality.address_host(scheduler)):
        off.insert(0, scheduler)
    if not (secure and off):
        return
    clause = f"Dask worker {off[0]} is not on this machine"
    if key_location is None:
        raise ClusterMismatch(locality.noise_key_message(clause))
    if not scheduler.startswith("tls://"):
        raise ClusterMismatch(locality.cleartext_refusal(clause, scheduler))


def worker_identity() -> dict:
    """What must match between the launcher and every worker: dpsynth
    (version and source digest) and the versions of Beam, distributed and
    Python that unpickle and run its tasks."""
    import platform
    import distributed
    from apache_beam.version import __version__ as beam_version
    return {**source_digest.identity(), "beam": beam_version,
            "distributed": distributed.__version__,
            "python": platform.python_version()}


@functools.lru_cache(maxsize=1)
def launcher_identity() -> dict:
    """``worker_identity`` of the launcher, carried by every step's tasks."""
    return worker_identity()


_CHECKED: dict = {}  # identities this worker process was checked against


def check_this_worker(expected: dict) -> None:
    """In a worker, before a step's task touches a row: this process runs
    what the launcher runs (``worker_identity``), else ``ClusterMismatch``.
    The launcher checks the workers it sees before the run; a worker that
    joins later (or restarts on other code) is checked by its first task.
    Once per process and launcher identity."""
    key = tuple(sorted(expected.items()))
    ok = _CHECKED.get(key)
    if ok is None:
        ok = _CHECKED[key] = worker_identity() == expected
    if not ok:
        raise ClusterMismatch(
            f"a Dask worker runs {describe_identity(worker_identity())}, "
            f"the launcher {describe_identity(expected)}: refused before "
            "reading a row; install the launcher's dpsynth and versions on "
            "every worker")


def describe_identity(ident: dict) -> str:
    return (f"{source_digest.describe(ident)}, Beam {ident.get('beam')}, "
            f"distributed {ident.get('distributed')}, Python "
            f"{ident.get('python')}")


def check_cluster(options: PipelineOptions, local_paths=(),
                  secure: bool = False,
                  key_location: Optional[str] = None) -> None:
    """``check_workers`` on the cluster ``--dask_client_address`` /
    ``--dask_scheduler_file`` name (nothing for the local cluster dpsynth
    starts: its workers run this interpreter's dpsynth). The launcher runs
    it before the run is charged; ``DaskRunner`` before each pipeline."""
    dask_options = options.view_as(beam_dask.DaskOptions)
    if not dask_options.address and not dask_options.scheduler_file:
        return
    from distributed import Client
    # --dask_connection_timeout, as Beam's Client takes it
    timeout = dask_options.timeout if isinstance(dask_options.timeout,
                                                 int) else {}
    where = dask_options.address or dask_options.scheduler_file
    try:
        client = Client(address=dask_options.address,
                        scheduler_file=dask_options.scheduler_file,
                        set_as_default=False,
                        **({"timeout": timeout} if timeout else {}))
    except (OSError, TypeError, ValueError) as err:
        raise _connect_refusal(where, err) from None
    try:
        check_workers(client, local_paths, secure, key_location)
    finally:
        client.close()


# What distributed says for a TLS mistake, and what the operator should do.
_TLS_HINT = ("check Dask's TLS settings (distributed.comm.tls.ca-file and "
             "client.cert / client.key, or DASK_DISTRIBUTED__COMM__TLS__...: "
             "deploy/README.md \"Dask on several hosts\")")


def _connect_refusal(where: str, err: BaseException) -> Exception:
    """One line for a scheduler the launcher cannot connect to: a TLS
    mistake (no certificate configured for a tls:// address, a file that
    is not there, another CA) says so; anything else is unreachable."""
    text = " ".join(str(err).split())[:200] or type(err).__name__
    tls = (isinstance(err, (TypeError, ValueError)) or "TLS" in text
           or "SSL" in text or "certificate" in text.lower()
           or isinstance(err, FileNotFoundError))
    if tls:
        return ClusterMismatch(
            f"cannot connect to the Dask scheduler at {where}: a TLS "
            f"setting is wrong ({text}); {_TLS_HINT}; nothing was submitted")
    return ClusterLost(f"cannot reach the Dask scheduler at {where} ({text}); "
                       "nothing was submitted")
