"""The Beam graph of a `dpsynth generate` run (``job.run``'s second part):
the DP generation graph (``build``), or for ``--covariance auto`` phase 1
(``run_phase1``), the public rule on its noisy counts (``choose_phase2``)
and phase 2 (``build_adaptive``); ``stage`` runs them into this launch's
staging folder and writes the staged manifest the release room's protocol
(``release/protocol.py``) then records, checks and publishes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from typing import Optional

import apache_beam as beam

from dpsynth.dp_ops import adaptive, generator
from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.pipelines import console
from dpsynth.pipelines.job_manifest import manifest
from dpsynth.pipelines.job_plan import ImageSource, Job, make_reader
from dpsynth.pipelines.release import consistency, protocol, publisher, release
from dpsynth.pipelines.runners.temp_cleanup import pipeline_run
from dpsynth.pipelines.runners.options import UsageError, beam_options, local_blas_threads
from dpsynth.pipelines.spec import GenerateSpec
from dpsynth.transforms import io
from dpsynth.transforms.two_phase import (PHASE1_FILE, PHASE1_PURPOSE,
                                         AdaptiveMixture, AdaptivePhase1,
                                         ForgedPhase1, read_phase1,
                                         write_phase1)
from dpsynth.transforms.aggregate import PrepareBlocks, RereadBlocks
from dpsynth.transforms.centre import DPCentre
from dpsynth.transforms.dp_kmeans import DPKMeans
from dpsynth.transforms.mixture import DPMixture, SampleSynthetic
from dpsynth.transforms.pipelinedp import LedgerAccountant
from dpsynth.transforms.progress import ProgressFile, ReportProgress
from dpsynth.transforms.write import SUMMARY_FILE, WriteRelease

log = logging.getLogger("dpsynth")


def store_noise_key(job: Job, spec: GenerateSpec) -> Optional[str]:
    """Moves the run's key out of the job graph (``--noise-key-location``):
    writes it for the workers, pickles only its URI; returns the URI the
    launcher deletes when the run ends."""
    location = spec.run.noise_key_location
    if location is None or spec.generator.noise_seed is not None:
        return None
    from dpsynth.transforms.keyed_noise import StoredKeyNoise, key_uri, write_key
    uri = key_uri(location, job.run_id, job.owner)
    key = job.noise.export_key()
    write_key(uri, key)
    job.noise = StoredKeyNoise(uri, key)
    return uri


def build(p: beam.Pipeline, job: Job, reader: beam.PTransform,
          spec: GenerateSpec,
          progress: Optional[ProgressFile] = None) -> None:
    """The whole DP generation graph, from the blocks to the staged files.

    Embedding files are re-read by every pass (``RereadBlocks``): worker
    memory stays at a block plus the model state whatever n is (measured in
    benchmarks/results/scaling.md). Images are encoded once and the blocks
    materialised, since re-encoding per pass would cost far more.
    """
    cfg, ledger, dim, noise = job.cfg, job.ledger, reader.dim, job.noise
    centre = None
    if isinstance(reader, ImageSource) or spec.run.materialise_blocks:
        raw = (p | "Read" >> reader
               | "ReadProgress" >> ReportProgress(progress, "Read"))
        if cfg.center:
            centre = raw | "DPCentre" >> DPCentre(cfg, ledger, dim, noise)
        blocks = (raw
                  | "Prepare" >> PrepareBlocks(cfg, dim, centre)
                  | "Materialise" >> beam.Reshuffle())
    else:
        if cfg.center:
            centre = (p | "CentreRead" >> reader
                      | "CentreProgress" >> ReportProgress(progress, "Centre")
                      | "DPCentre" >> DPCentre(cfg, ledger, dim, noise))
        blocks = RereadBlocks(p, reader, cfg, dim, centre, progress)
    centres = p | "DPKMeans" >> DPKMeans(cfg, ledger, dim, noise,
                                         blocks=blocks)
    accountant = LedgerAccountant(ledger)
    mixture = DPMixture(cfg, ledger, dim, centres, noise, accountant,
                        blocks=blocks)
    mixtures = p | "DPMixture" >> mixture
    _explain(job, accountant, mixture.aggregations)
    if centre is not None:  # means back to the input space (post-processing)
        mixtures = mixtures | "AddCentre" >> beam.Map(
            lambda kv, c: (kv[0], generator.with_centre(kv[1], c)),
            beam.pvalue.AsSingleton(centre))
    synthetic = mixtures | "Sample" >> SampleSynthetic(
        cfg, ledger, blocks, noise, local_blas_threads(p.options))
    _ = synthetic | "Write" >> WriteRelease(
        job.staging, mixtures, spec.output.rows_per_shard, spec.input.embedding_feature,
        spec.input.label_feature, output_format=spec.output.format, cfg=cfg, dim=dim,
        noise=job.noise)


def build_adaptive(p: beam.Pipeline, job: Job, reader: beam.PTransform,
                   spec: GenerateSpec, centre, noisy_counts,
                   progress: Optional[ProgressFile] = None) -> None:
    """Phase 2 of ``--covariance auto``, from the blocks to the staged
    files; ``centre`` and ``noisy_counts`` are phase 1's DP outputs and
    ``job.structure`` the rule's choice (public constants of this graph)."""
    cfg, dim = job.cfg, reader.dim
    centre_pc = p | "PublicCentre" >> beam.Create([centre])
    if spec.run.materialise_blocks:
        blocks = (p | "Read" >> reader
                  | "ReadProgress" >> ReportProgress(progress, "Read")
                  | "Prepare" >> PrepareBlocks(cfg, dim, centre_pc)
                  | "Materialise" >> beam.Reshuffle())
    else:
        blocks = RereadBlocks(p, reader, cfg, dim, centre_pc, progress)
    accountant = LedgerAccountant(job.ledger)
    mixture = AdaptiveMixture(cfg, job.ledger, dim, job.structure,
                              noisy_counts, centre, job.noise, blocks,
                              accountant)
    mixtures = p | "AdaptiveMixture" >> mixture
    _explain(job, accountant, mixture.aggregations)
    synthetic = mixtures | "Sample" >> SampleSynthetic(cfg, job.ledger,
                                                       blocks, job.noise)
    _ = synthetic | "Write" >> WriteRelease(
        job.staging, mixtures, spec.output.rows_per_shard, spec.input.embedding_feature,
        spec.input.label_feature, output_format=spec.output.format, cfg=cfg, dim=dim,
        noise=job.noise)


def _explain(job: Job, accountant: LedgerAccountant,
             aggregations: list) -> None:
    """Reconciles the budgets PipelineDP requested with the ledger (it
    refuses any request the ledger does not hold) and keeps PipelineDP's
    explain-computation text for the manifest."""
    accountant.compute_budgets()
    job.pipelinedp_explain += [a.explain() for a in aggregations]


def run_phase1(job: Job, reader: beam.PTransform, options,
               progress: Optional[ProgressFile] = None):
    """Phase 1 of ``--covariance auto`` as its own pipeline run: one pass
    ("Counts"); returns its DP outputs (centre, noisy class counts)."""
    path = io.join(job.staging, PHASE1_FILE)
    with pipeline_run(options) as p:
        accountant = LedgerAccountant(job.ledger)
        phase1 = AdaptivePhase1(job.cfg, job.ledger, reader.dim, job.noise,
                                accountant)
        _ = (p | "CountsRead" >> reader
             | "CountsProgress" >> ReportProgress(progress, "Counts")
             | "Phase1" >> phase1
             | "WritePhase1" >> beam.Map(write_phase1, path, job.noise))
        _explain(job, accountant, phase1.aggregations)
    from apache_beam.io.filesystems import FileSystems
    try:  # only what phase 1 wrote: the file lies beside --output
        centre, counts = read_phase1(
            path, job.noise.derived_key(PHASE1_PURPOSE))
    except ForgedPhase1 as err:
        raise release.ReleaseChanged(str(err)) from None
    FileSystems.delete([path])
    return centre, counts


def choose_phase2(job: Job, dim: int, noisy_counts) -> adaptive.Structure:
    """The public rule on phase 1's noisy counts; registers the chosen
    phase-2 mechanisms in the run's ledger."""
    cfg = job.cfg
    job.structure = adaptive.choose_structure(
        cfg.epsilon, cfg.delta, dim, noisy_counts,
        adaptive.constants_for(cfg), job.adaptive_mu,
        "subspace" if cfg.covariance == "subspace" else None)
    adaptive.add_phase2(job.ledger, cfg, job.structure, job.adaptive_mu)
    log.info("covariance rule: %s, sums %.2f of mu^2 (signal %.1f from the "
             "noisy counts)", job.structure.name, job.structure.sum_share,
             dict(job.structure.inputs)["signal"])
    return job.structure


def adaptive_pass_names(structure: adaptive.Structure, cfg: GeneratorConfig,
                        spec: GenerateSpec) -> list[str]:
    """Phase 2's passes over the private rows (progress lines); ``cfg``:
    the run's, after the vote's signal rule."""
    if spec.run.materialise_blocks:
        return ["Read"]
    return (["Moments"]
            + (["ClassSubspace"] if structure.mode == "subspace" else [])
            + (["Votes"] if cfg.vote_filter else []))


def pass_names(cfg: GeneratorConfig, spec: GenerateSpec) -> list[str]:
    """The passes over the private rows, in order (progress lines)."""
    if spec.input.images or spec.run.materialise_blocks:
        return ["Read"]
    if adaptive.two_phase(cfg):  # phase 1; phase 2: adaptive_pass_names
        return ["Counts"]
    names = ["Centre"] if cfg.center else []
    if cfg.clusters > 1:
        names += ["TreeCounts", "LeafSums"]
        names += [f"Lloyd{r}" for r in range(1, cfg.lloyd_rounds + 1)]
    names.append("Moments")  # with the second moment, if any
    if cfg.vote_filter:
        names.append("Votes")
    return names


def _progress_file(options, job: Job) -> ProgressFile:
    """A local progress file when the workers run on this machine."""
    from dpsynth.pipelines.runners.options import is_local
    if not is_local(options):
        return ProgressFile(None)
    fd, path = tempfile.mkstemp(prefix=f"dpsynth-progress-{job.run_id}-")
    os.close(fd)
    return ProgressFile(path)


def stage(job: Job, spec: GenerateSpec, lease, timings: dict) -> str:
    """Runs the pipeline into staging and writes the staged manifest;
    returns the sha256 of the manifest bytes written. Stops
    (``AttemptLost``) at a pass boundary once another launch took the
    attempt over (``lease``: ``budget.lease.Lease``)."""
    options = beam_options(job.engine.beam_args)
    try:
        reader = make_reader(job, spec)
    except (io.InputError, release.ReleaseError):
        raise
    except ValueError as err:
        raise UsageError(str(err)) from None
    log.info("plan: %d mechanisms%s, target (eps=%g, delta=%g), accountant "
             "%s; dim %d", len(job.ledger.mechanisms),
             "" if job.adaptive_mu is None else " in phase 1 (phase 2: "
             "chosen from its noisy counts)", job.cfg.epsilon,
             job.cfg.delta, job.cfg.accountant, reader.dim)
    log.debug("input files: %s", ", ".join(reader.paths))
    key_object = store_noise_key(job, spec)  # before any data is read
    try:
        t1 = _run_pipelines(job, spec, options, reader, lease, timings)
    finally:
        if key_object is not None:
            from dpsynth.transforms.keyed_noise import delete_key
            delete_key(key_object)
    timings["pipeline"] = round(time.time() - t1, 3)
    lease.verify()  # a zombie resumed after a takeover stages nothing
    protocol.checkpoint("pipeline-done")
    try:
        # Every file's size and sha256 as its writer hashed the bytes it
        # wrote (transforms/digests.py), never read back from staging.
        files = _written_digests(job)
        summary = _read_summary(job.staging, files)
        consistency.check_staged(job.staging, job.cfg, summary, reader.dim,
                                 spec.input.embedding_feature,
                                 spec.input.label_feature, spec.output.format)
    except FileNotFoundError as err:  # another launch cleaned it up
        raise release.ReleaseError(
            f"run {job.run_id!r}: this launch's staging folder {job.staging} "
            f"lost its files while it ran ({err.filename or err}); another "
            "launch of this run id has finished and cleaned up. Nothing is "
            "published by this one") from None
    doc = manifest(job, spec, reader.dim, summary)
    doc["files"] = files  # each publication and reader checks them
    # The digest the store records is of the bytes written here, not of
    # what a read-back finds in the staging folder.
    return publisher.write_manifest(job.staging, doc)


def _written_digests(job: Job) -> dict:
    """The writers' authenticated record of the staged files (removed from
    the staging folder once read: it is not part of the release)."""
    from dpsynth.transforms import digests
    try:
        files = digests.read_record(
            job.staging, job.noise.derived_key(digests.PURPOSE))
    except digests.ForgedRecord as err:
        raise release.ReleaseChanged(str(err)) from None
    digests.discard_record(job.staging)
    return files


def _run_pipelines(job: Job, spec: GenerateSpec, options,
                   reader: beam.PTransform, lease,
                   timings: dict) -> float:
    """Marks the attempt running and runs the job's pipeline(s) into
    staging; returns when the reading began."""
    console.stop_if_ctrl_c()  # pressed while Beam was imported: read nothing
    publisher.discard(job.staging)  # a crashed attempt's partial files
    if lease.reservation is not None:
        from dpsynth.pipelines.budget import store as budget_store
        budget_store.mark_running(lease.reservation)
    protocol.checkpoint("running")
    t1 = time.time()
    progress = _progress_file(options, job)
    try:
        with console.quiet_stderr(spec.run.verbose):
            try:
                if job.adaptive_mu is None:
                    with console.ProgressPrinter(
                            progress.path, pass_names(job.cfg, spec),
                            show_rows=spec.run.show_row_counts,
                            on_pass=lease.verify):
                        with pipeline_run(options) as p:
                            build(p, job, reader, spec, progress)
                else:
                    _run_adaptive(job, spec, options, reader, progress,
                                  timings, lease)
            finally:  # its shutdown output stays in the captured log
                job.engine.close()
    finally:
        if progress.path:
            os.unlink(progress.path)
    return t1


def _run_adaptive(job: Job, spec: GenerateSpec, options,
                  reader: beam.PTransform, progress: ProgressFile,
                  timings: dict, lease) -> None:
    """Phase 1 run -> the rule -> phase 2 run (adaptive composition)."""
    t0 = time.time()
    with console.ProgressPrinter(progress.path, ["Counts"],
                                 show_rows=spec.run.show_row_counts,
                                 more_to_come=True, on_pass=lease.verify):
        centre, counts = run_phase1(job, reader, options, progress)
    timings["phase1"] = round(time.time() - t0, 3)
    lease.verify()
    structure = choose_phase2(job, reader.dim, counts)
    progress.reset()
    reader = make_reader(job, spec)  # a transform belongs to one pipeline
    with console.ProgressPrinter(progress.path,
                                 adaptive_pass_names(structure, job.cfg, spec),
                                 show_rows=spec.run.show_row_counts,
                                 done=1,  # phase 1's pass
                                 on_pass=lease.verify):
        with pipeline_run(options) as p:
            build_adaptive(p, job, reader, spec, centre, counts, progress)


def _read_summary(staging: str, files: dict) -> list:
    """_summary.json, whose bytes must be those its writer recorded."""
    from apache_beam.io.filesystems import FileSystems
    with FileSystems.open(io.join(staging, SUMMARY_FILE)) as f:
        data = f.read()
    if hashlib.sha256(data).hexdigest() != files.get(SUMMARY_FILE, {}).get(
            "sha256"):
        raise release.ReleaseChanged(
            f"{io.join(staging, SUMMARY_FILE)} differs (sha256) from what "
            "its writer wrote; not publishing")
    return json.loads(data.decode())
