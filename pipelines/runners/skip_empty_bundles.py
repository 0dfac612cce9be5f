"""DirectRunner's stages run only the bundles that hold input.

Beam's FnApiRunner (2.77, ``ParallelBundleManager.process_bundle``) cuts
every stage into W bundles, one per worker, even a stage fed one element
(an Impulse, a global combine's result): W - 1 process-bundle round trips
through the runner that do nothing, for each of the job's ~35 stages.
``process_bundle`` below runs only the parts that hold input (always the
first, which also takes the timers), so a small stage costs one round trip
and a large one still runs on every worker. How a stage's input is cut
into bundles is the runner's choice: a release is byte-identical.

Measured on Beam 2.77 (commit 56145ea, with ``parallel_shutdown``;
benchmarks/results/scaling-workers.md "16 cores"). Where
``process_bundle`` has other parameters than Beam 2.77's, or
``BundleManager`` is built from other attributes, the patch is not
installed: every part runs, and one debug line (``beam_patch.kept``).
"""

from __future__ import annotations

import itertools
from typing import Any

from dpsynth.pipelines.runners.beam_patch import (all_of, reads, replace_once,
                                                  takes)

PARAMETERS = ("self", "inputs", "expected_outputs", "fired_timers",
              "expected_output_timers", "dry_run")


def install() -> None:
    """Replaces ``ParallelBundleManager.process_bundle`` (idempotent)."""
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    manager_fits = reads("bundle_context_manager", "_progress_frequency",
                         "_cache_token_generator")
    replace_once(fn_runner.ParallelBundleManager, "process_bundle",
                 lambda _: process_bundle,
                 fits=all_of(takes(*PARAMETERS), reads("_num_workers"),
                             lambda _: manager_fits(
                                 fn_runner.BundleManager.__init__)))


def has_input(part: dict) -> bool:
    """Whether one bundle's inputs (name -> encoded chunks) hold any data."""
    return any(any(len(chunk) for chunk in chunks) for chunks in part.values())


def process_bundle(self, inputs, expected_outputs, fired_timers,
                   expected_output_timers, dry_run=False) -> Any:
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
