"""DirectRunner's worker processes forked from a server that has imported
what they need, not started fresh (Beam's FnApiRunner, 2.77).

Each pipeline starts W fresh SDK worker processes, and each imports Beam's
worker, then PipelineDP (dp_accounting, scipy) in the first stage that
unpickles its steps: ~1 s before the first stage and ~0.8 s inside the
first PipelineDP stage, on 2 cores, for each of the adaptive plan's two
pipelines. ``start_worker_server`` starts a fork server
(``dpsynth.pipelines.runners.worker_fork``) that imports those modules
while the job plans; every worker of the job is then forked from it,
ready (``_ForkingSubprocess``). Beam's own ``SubprocessSdkWorker`` still
runs each worker (its logging server, its wait and kill); only the process
start changes.

Measured on Beam 2.77, 2 cores (commit 9985d3a; default job, 1M x 384,
2 workers): 22.0 -> 18.6 s, 9.3 -> 5.2 s with no worker busy. Where
Beam's ``local_job_service`` no longer starts its workers with its module
global ``subprocess.Popen``, the patch is not installed: Beam starts its
workers itself, and one debug line (``beam_patch.kept``); a server that
fails to start or dies mid-job also leaves Beam's start in place.

``install()`` also installs the runner's two other patches
(``parallel_shutdown``, ``skip_empty_bundles``); none changes what a
stage computes (a release is byte-identical across worker counts and both
worker starts; tests/test_direct_runner.py). It is called by
``dpsynth.pipelines.runners.options.beam_options`` for the local runner, in the
submitting process (the runner side).
"""

from __future__ import annotations

import atexit
import logging
import os
import shlex
import subprocess
import sys
from typing import Any, Optional, Sequence

from dpsynth.pipelines.runners import runner_names
from dpsynth.pipelines.runners import (parallel_shutdown, skip_empty_bundles,
                                       worker_fork)
from dpsynth.pipelines.runners.beam_patch import reads, replace_once
from dpsynth.pipelines.runners.engine import Engine

_SDK_WORKER_MAIN = "apache_beam.runners.worker.sdk_worker_main"

log = logging.getLogger(__name__)


def install() -> None:
    """Patches Beam's FnApiRunner once per process (idempotent)."""
    from apache_beam.runners.portability import local_job_service
    parallel_shutdown.install()
    skip_empty_bundles.install()
    # Beam's SubprocessSdkWorker starts its process with this module's Popen
    starts_with_popen = reads("subprocess", "Popen")

    def fits(current: Any) -> bool:
        return current is subprocess and starts_with_popen(
            local_job_service.SubprocessSdkWorker.run)
    replace_once(local_job_service, "subprocess",
                 lambda _: _ForkingSubprocess(), fits=fits)


_server: Optional[worker_fork.WorkerServer] = None
_fork_workers = True


def fork_workers(enabled: bool) -> None:
    """Whether workers started from now on are forked from the server
    (default) or started as Beam starts them (a benchmark's baseline)."""
    global _fork_workers
    _fork_workers = enabled


def start_worker_server() -> None:
    """Starts the fork server (``dpsynth.pipelines.runners.worker_fork``) in the background
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


class DirectEngine(Engine):
    """Beam's local runner (run as its FnApiRunner: in memory, or worker
    processes with ``--direct_num_workers``; ``options.beam_options``)."""

    name = "direct"
