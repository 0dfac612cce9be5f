"""DirectRunner with several worker processes: three costs of Beam's
FnApiRunner (2.77) that grow with ``--direct_num_workers`` or with the
pipelines a job runs, cut.

Measured on a 16-core machine (2M x 384, the default job, 16 workers;
benchmarks/results/scaling-workers.md "16 cores"): 30 of the job's 37.6 s
ran no dpsynth work, against 12 of 69.7 s with one worker.

* Shutdown. At the end of every pipeline run Beam closes its worker
  handlers one after another, each waiting for its worker process to exit
  (interpreter teardown, ~0.4 s): W x 0.4 s per pipeline, and the adaptive
  plan runs two. ``close_all`` below closes them all at once.
* Empty bundles. Every stage is cut into W bundles, one per worker, even a
  stage fed one element (an Impulse, a global combine's result): W - 1
  process-bundle round trips through the runner that do nothing, for each
  of the job's ~35 stages. ``process_bundle`` below runs only the parts
  that hold input (always the first, which also takes the timers), so a
  small stage costs one round trip and a large one still runs on every
  worker.
* Worker start. Each pipeline starts W fresh SDK worker processes, and
  each imports Beam's worker, then PipelineDP (dp_accounting, scipy) in the
  first stage that unpickles its steps: ~1 s before the first stage and
  ~0.8 s inside the first PipelineDP stage, on 2 cores, for each of the
  adaptive plan's two pipelines. ``start_worker_server`` starts a fork
  server (``dpsynth.pipelines.worker_fork``) that imports those modules while the
  job plans; every worker of the job is then forked from it, ready
  (``_ForkingSubprocess``). Beam's own ``SubprocessSdkWorker`` still runs
  each worker (its logging server, its wait and kill); only the process
  start changes. Measured on 2 cores (default job, 1M x 384, 2 workers):
  22.0 -> 18.6 s, 9.3 -> 5.2 s with no worker busy.

None changes what a stage computes: how a stage's input is cut into
bundles is the runner's choice, and a release is byte-identical across
worker counts and both worker starts (tests/test_direct_runner.py checks
the patches). ``install()`` is called by ``dpsynth.pipelines.options.beam_options``
for the local runner, in the submitting process (the runner side).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import itertools
import logging
import os
import shlex
import subprocess
import sys
from typing import Any, Optional, Sequence

from dpsynth.pipelines import runner_names, worker_fork

_SDK_WORKER_MAIN = "apache_beam.runners.worker.sdk_worker_main"

log = logging.getLogger(__name__)

_installed = False


def install() -> None:
    """Patches Beam's FnApiRunner once per process (idempotent)."""
    global _installed
    if _installed:
        return
    from apache_beam.runners.portability.fn_api_runner import (
        fn_runner, worker_handlers)
    from apache_beam.runners.portability import local_job_service
    worker_handlers.WorkerHandlerManager.close_all = close_all
    fn_runner.ParallelBundleManager.process_bundle = process_bundle
    # Beam's SubprocessSdkWorker starts its process with this module's Popen
    local_job_service.subprocess = _ForkingSubprocess()
    _installed = True


def close_all(self) -> None:
    """``WorkerHandlerManager.close_all``, closing the handlers (and so
    waiting for their worker processes to exit) concurrently."""
    handlers = {h for hs in self._cached_handlers.values() for h in hs}
    if handlers:
        with concurrent.futures.ThreadPoolExecutor(len(handlers)) as pool:
            for handler, error in zip(handlers, pool.map(_close, handlers)):
                if error is not None:
                    log.error("Error closing worker_handler %s", handler,
                              exc_info=error)
    self._cached_handlers.clear()
    self._workers_by_id = {}
    if self._grpc_server is not None:
        self._grpc_server.close()
        self._grpc_server = None


def _close(handler: Any) -> BaseException | None:
    try:
        handler.close()
    except Exception as err:  # logged by the caller, as Beam does
        return err
    return None


def has_input(part: dict) -> bool:
    """Whether one bundle's inputs (name -> encoded chunks) hold any data."""
    return any(any(len(chunk) for chunk in chunks) for chunks in part.values())


def process_bundle(self, inputs, expected_outputs, fired_timers,
                   expected_output_timers, dry_run=False):
    """``ParallelBundleManager.process_bundle`` that skips the parts with no
    input (Beam's cuts the input into W parts and runs every one)."""
    from apache_beam.metrics import monitoring_infos
    from apache_beam.portability.api import beam_fn_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.utils import thread_pool_executor

    parts: list[dict] = [{} for _ in range(self._num_workers)]
    for name, buffer in inputs.items():
        for ix, chunks in enumerate(buffer.partition(self._num_workers)):
            parts[ix][name] = chunks
    run = [0] + [ix for ix in range(1, len(parts)) if has_input(parts[ix])]

    def execute(ix: int):
        manager = fn_runner.BundleManager(
            self.bundle_context_manager, self._progress_frequency,
            cache_token_generator=self._cache_token_generator)
        return manager.process_bundle(
            parts[ix], expected_outputs, fired_timers if ix == 0 else {},
            expected_output_timers, dry_run)

    merged, splits = None, []
    with thread_pool_executor.shared_unbounded_instance() as pool:
        for result, split in pool.map(execute, run):
            splits += split
            if merged is None:
                merged = result
                continue
            merged = beam_fn_api_pb2.InstructionResponse(
                process_bundle=beam_fn_api_pb2.ProcessBundleResponse(
                    monitoring_infos=monitoring_infos.consolidate(
                        itertools.chain(
                            result.process_bundle.monitoring_infos,
                            merged.process_bundle.monitoring_infos))),
                error=result.error or merged.error)
    return merged, splits


_server: Optional[worker_fork.WorkerServer] = None
_fork_workers = True


def fork_workers(enabled: bool) -> None:
    """Whether workers started from now on are forked from the server
    (default) or started as Beam starts them (a benchmark's baseline)."""
    global _fork_workers
    _fork_workers = enabled


def start_worker_server() -> None:
    """Starts the fork server (``dpsynth.pipelines.worker_fork``) in the background
    (idempotent; not on a system without process file descriptors). It
    lives as long as this process: an idle process whose pages the
    workers forked from it share."""
    global _server
    if _server is None and _fork_workers and worker_fork.supported():
        try:
            _server = worker_fork.WorkerServer()
        except OSError as err:  # Beam starts the workers itself
            log.debug("no worker fork server: %s", err)
            return
        # ended with this process, not just after it (a scheduler that
        # waits for the task's processes sees none left)
        atexit.register(_server.close)


def start_worker_server_for(beam_argv: Sequence[str]) -> None:
    """Starts the fork server now if these Beam flags run the local
    runner's worker processes. ``dpsynth generate`` calls it as soon as
    its flags parse, before it imports Beam and the pipeline (~2 s): the
    server's imports (~2.3 s of one core) then run beside the command's
    instead of delaying the first stage."""
    if runner_names.wants_worker_processes(beam_argv):
        start_worker_server()


def is_sdk_worker_command(command: str) -> bool:
    """Whether ``command`` starts Beam's Python SDK worker with this
    interpreter (what the FnApiRunner runs for ``multi_processing``)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return False
    return words == [sys.executable, "-m", _SDK_WORKER_MAIN]


class _ForkingSubprocess:
    """The ``subprocess`` module as Beam's ``local_job_service`` sees it:
    ``Popen`` of the SDK worker command forks the worker from the fork
    server when one runs; anything else is ``subprocess`` itself."""

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)

    def Popen(self, args: Any, *rest: Any, **kwargs: Any) -> Any:
        server = _server
        if (server is None or not _fork_workers or not server.alive or rest
                or not isinstance(args, str)
                or set(kwargs) != {"shell", "env"}
                or not is_sdk_worker_command(args)):
            return subprocess.Popen(args, *rest, **kwargs)
        try:
            return server.fork(dict(kwargs["env"]), os.getcwd())
        except (OSError, RuntimeError) as err:  # the server is gone
            log.warning("worker fork server unavailable (%s): starting the "
                        "worker as Beam does", err)
            return subprocess.Popen(args, **kwargs)
