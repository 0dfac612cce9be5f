"""DirectRunner's worker processes closed at once, not one after another.

At the end of every pipeline run Beam's FnApiRunner (2.77,
``WorkerHandlerManager.close_all``) closes its worker handlers one after
another, each waiting for its worker process to exit (interpreter
teardown, ~0.4 s): W x 0.4 s per pipeline with ``--direct_num_workers W``,
and the adaptive plan runs two. ``close_all`` below closes them all at
once.

Measured on Beam 2.77 (commit 56145ea, with ``skip_empty_bundles``;
benchmarks/results/scaling-workers.md "16 cores": 30 of the default job's
37.6 s ran no dpsynth work with 16 workers before these patches). Where
``close_all`` has other parameters than ``(self)`` or no longer keeps its
handlers in ``_cached_handlers`` / ``_workers_by_id`` / ``_grpc_server``,
the patch is not installed: Beam's sequential close, and one debug line
(``beam_patch.kept``).
"""

from __future__ import annotations

import concurrent.futures
import logging
from typing import Any

from dpsynth.pipelines.runners.beam_patch import (all_of, reads, replace_once,
                                                  takes)

log = logging.getLogger(__name__)


def install() -> None:
    """Replaces ``WorkerHandlerManager.close_all`` (idempotent)."""
    from apache_beam.runners.portability.fn_api_runner import worker_handlers
    replace_once(worker_handlers.WorkerHandlerManager, "close_all",
                 lambda _: close_all,
                 fits=all_of(takes("self"),
                             reads("_cached_handlers", "_workers_by_id",
                                   "_grpc_server")))


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
