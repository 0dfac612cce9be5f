"""The `dpsynth generate` job below the command line: typed values in
(``dpsynth.pipelines.spec.GenerateSpec``), a published release out.

``run(spec)`` reads top to bottom in three parts: the plan, before any
private data is read (``job_plan``: the flags resolved and checked, the
noise calibrated, the lifetime budget reserved); the graph
(``graph``: phase 1, phase 2), run into this launch's own staging folder;
and the release room's protocol (``release/protocol.py``): staged ->
committed -> published. ``pipelines/budget/store.py`` is the lifetime
ledger's side.
"""

from __future__ import annotations

import logging
import time

from dpsynth.pipelines import graph, job_plan
from dpsynth.pipelines.budget import store as budget_store
from dpsynth.pipelines.release import protocol, release
from dpsynth.pipelines.runners import gc_freeze
from dpsynth.pipelines.runners.options import UsageError, beam_options
from dpsynth.pipelines.spec import GenerateSpec
from dpsynth.transforms import heap_pages, io

log = logging.getLogger("dpsynth")


def run(spec: GenerateSpec) -> str:
    """Runs the job; returns the published release path.

    Protocol (see pipelines/budget/store.py for the lifetime ledger's side):
    reserve the spend (or take over the run id's attempt) -> run into this
    launch's own staging folder -> staged manifest (with every file's size
    and sha256) -> record the staged folder and its manifest's digest ->
    check the staged files and their consistency -> place the files under
    --output/<version> -> write --output/_manifest.json if it is still the
    one the decision read (the commit point for readers) -> record the
    release as published. A retry of a run id whose
    staged release is recorded re-publishes exactly that folder (same noise,
    no new spend); one run id never publishes a second draw.
    """
    with gc_freeze.startup_heap_frozen():  # no full collection of imports
        return _run(spec)


def _run(spec: GenerateSpec) -> str:
    t0 = time.time()
    heap_pages.keep_heap_pages()  # the runner process moves blocks too
    # The plan: flags resolved and checked, the spend reserved; no data read.
    try:
        job = job_plan.prepare(spec)
    except (io.InputError, release.ReleaseError):
        raise
    except ValueError as err:  # flags and configuration: before any data
        raise UsageError(str(err)) from None
    if job.already_published:
        protocol.finish_published(job, spec)
        log.info("run %s is already published at %s: nothing to do, no "
                 "budget spent", job.run_id, job.output)
        return job.output
    if job.cfg.noiseless:
        log.warning("!!! --epsilon inf: running WITHOUT NOISE. The output is "
                    "NOT differentially private. Debugging only. !!!")
    job.engine.check_before_charge(  # before anything is charged
        spec, beam_options(job.engine.beam_args))
    job_plan.check_input_schema(job, spec)
    protocol.check_staged_leftovers(job, spec)
    reservation = job_plan.reserve(job, spec)
    if reservation is not None:  # earlier attempts are settled and charged
        protocol.remove_abandoned_keys(job, spec, budget_store.run_owners(
            spec.budget.store, spec.budget.dataset_id, job.run_id))
    timings = {"plan": round(time.time() - t0, 3)}
    # The graph (phase 1, phase 2) into staging, then the release room's
    # protocol: staged -> committed -> published.
    protocol.publish_attempt(
        job, spec, reservation,
        lambda lease: graph.stage(job, spec, lease, timings), timings)
    timings["total"] = round(time.time() - t0, 3)
    if spec.run.record_timings:
        log.info("wall times (s, operator only, not DP): %s", timings)
    return job.output
