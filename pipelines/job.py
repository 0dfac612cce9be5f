"""The `dpsynth generate` job below the command line: typed values in
(``dpsynth.pipelines.spec.GenerateSpec``), a published release out.

``run(spec)`` plans the run before any private data is read
(calibration, the output check, the lifetime reservation), builds and runs
the Beam graph into this launch's own staging folder, checks the staged
release and publishes it atomically; see ``run`` for the protocol and
``pipelines/budget/store.py`` for the lifetime ledger's side.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import logging
import math
import os
import re
import sys
import tempfile
import time
import uuid
from typing import Optional

import apache_beam as beam

from dpsynth.dp_ops import adaptive, generator, plan
from dpsynth.dp_ops.calibration import validate_weights
from dpsynth.dp_ops.config import GeneratorConfig, check_delta, labels_from
from dpsynth.dp_ops.ledger import PrivacyLedger
from dpsynth.dp_ops.noise import NoiseSource, make_noise_source
from dpsynth.pipelines import console, demo
from dpsynth.pipelines.runners import collector, engine, locality, select
from dpsynth.pipelines.release import consistency, release
from dpsynth.pipelines.runners.beam_temp import pipeline_run
from dpsynth.pipelines.runners.options import UsageError, beam_options, local_blas_threads
from dpsynth.pipelines.spec import GenerateSpec, ImageOptions
from dpsynth.transforms import allocator, io
from dpsynth.transforms.adaptive import (PHASE1_FILE, PHASE1_PURPOSE,
                                         AdaptiveMixture, AdaptivePhase1,
                                         ForgedPhase1, read_phase1,
                                         write_phase1)
from dpsynth.transforms.aggregate import PrepareBlocks, RereadBlocks
from dpsynth.transforms.centre import DPCentre
from dpsynth.transforms.dp_kmeans import DPKMeans
from dpsynth.transforms.mixture import DPMixture, SampleSynthetic
from dpsynth.transforms.pipelinedp import LedgerAccountant
from dpsynth.transforms.progress import ProgressFile, ReportProgress
from dpsynth.transforms.write import SUMMARY_FILE, WriteRelease, describe_outputs

log = logging.getLogger("dpsynth")
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@dataclasses.dataclass
class Job:
    """Everything decided before any private data is read."""

    cfg: GeneratorConfig
    ledger: PrivacyLedger
    spec: Optional[io.InputSpec]
    output: str
    staging: str
    run_id: str
    owner: str = ""  # this launch's random token (names its staging)
    version: str = ""  # the release's folder under --output (random)
    created_utc: str = ""  # taken before any data is read
    noise: Optional[NoiseSource] = None
    already_published: bool = False
    # --covariance auto: the per-class GDP mu of the adaptive plan, the
    # lifetime reservation (data-independent) and, after phase 1, the
    # rule's structure; None for the fixed plans.
    adaptive_mu: Optional[float] = None
    reserved: Optional[list] = None
    structure: Optional[adaptive.Structure] = None
    lifetime_cap: Optional[dict] = None  # the store's, when there is one
    # PipelineDP's explain-computation text of each aggregation that ran
    # (public configuration and sigmas only), for the manifest and report.
    pipelinedp_explain: list = dataclasses.field(default_factory=list)
    # The engine the flags chose (``runners.engine``), resolved once.
    engine: Optional[engine.Engine] = None


def prepare(spec: GenerateSpec) -> Job:
    """Validates the spec, calibrates the noise, checks the output: no data
    is read."""
    chosen = select.resolve(spec.run.beam_args)  # the operator's flags
    _check_cluster_boundary(spec, chosen)  # before the demo's files or input
    pattern, labels = _input_and_labels(spec)
    check_delta(spec.generator.delta, spec.generator.allow_large_delta)
    # Cheap checks first: calibration (below) takes seconds.
    cfg = resolve_config(spec, labels)
    inp, out = spec.input, spec.output
    if inp.block_size < 1 or out.rows_per_shard < 1:
        raise ValueError("--block-size and --rows-per-shard must be >= 1")
    if inp.embedding_dim is not None and inp.embedding_dim < 1:
        raise ValueError(f"--embedding-dim must be >= 1, got {inp.embedding_dim}")
    if out.run_id is not None and not _RUN_ID.fullmatch(out.run_id):
        raise ValueError(f"--run-id must match {_RUN_ID.pattern} (it names "
                         f"the staging directory), got {out.run_id!r}")
    run_id = out.run_id or uuid.uuid4().hex[:12]
    output = out.path or f"dpsynth-releases/{run_id}"
    release.check_apart(output, {
        "--budget-store": spec.budget.store,
        "--noise-key-location": spec.run.noise_key_location})
    _check_budget_flags(spec)
    owner = os.urandom(8).hex()
    staging = release.staging_dir(output, run_id, owner)
    published = _published_by(output, run_id, spec)
    if published == "published":
        return Job(cfg, PrivacyLedger(cfg.epsilon, cfg.delta), None, output,
                   staging, run_id, owner, already_published=True,
                   engine=chosen)
    if published is None:  # "recorded": the store's staged release goes there
        release.check_output(output, out.overwrite)
    input_spec = io.InputSpec(pattern, inp.format, inp.embedding_feature,
                              inp.label_feature, tuple(labels), inp.non_finite,
                              inp.block_size, inp.split_bytes,
                              _column_names(inp.embedding_columns))
    if not adaptive.two_phase(cfg):
        validate_weights(cfg.weights(), cfg.stages)
    if not inp.images:
        io.match_files(input_spec.pattern)  # lists names only: no data read
    job = Job(cfg, PrivacyLedger(cfg.epsilon, cfg.delta), input_spec, output,
              staging, run_id, owner,
              version=f"{release.VERSION_PREFIX}{uuid.uuid4().hex[:12]}",
              created_utc=_timestamp(),
              noise=make_noise_source(spec.generator.noise_seed),
              engine=chosen)
    job.adaptive_mu, job.ledger, job.reserved = calibrate(
        cfg, inp.embedding_dim, spec.budget.store is not None)
    return job


def calibrate(cfg: GeneratorConfig, embedding_dim: Optional[int],
              charged: bool) -> tuple[Optional[float], PrivacyLedger,
                                      Optional[list]]:
    """(the adaptive plan's per-class mu, the ledger of what runs first,
    what the budget store is charged when ``charged`` and it differs from
    the ledger's list); refuses impossible targets. No data is read."""
    if not adaptive.two_phase(cfg):
        return None, plan.make_ledger(cfg), None
    # Phase 1 now, phase 2 after the rule.
    constants = adaptive.constants_for(cfg)
    mu = adaptive.calibrate_mu(cfg, embedding_dim or 1, constants)
    reserved = (adaptive.reserved_mechanisms(cfg, mu, constants)
                if charged else None)  # dp_accounting: seconds
    return mu, adaptive.phase1_ledger(cfg, mu), reserved


def plan_only(spec: GenerateSpec) -> dict:
    """`generate --plan-only`: the checked flags' plan (mechanisms, sigmas,
    sensitivities, budget split, the store's charge) before any data:
    no input file is listed or read, nothing is written or charged; the
    budget store, if named, is only read."""
    _, labels = _input_and_labels(spec)
    check_delta(spec.generator.delta, spec.generator.allow_large_delta)
    cfg = resolve_config(spec, labels)
    if spec.input.embedding_dim is not None and spec.input.embedding_dim < 1:
        raise ValueError(f"--embedding-dim must be >= 1, got "
                         f"{spec.input.embedding_dim}")
    _check_budget_flags(spec)
    if not adaptive.two_phase(cfg):
        validate_weights(cfg.weights(), cfg.stages)
    mu, ledger, _ = calibrate(cfg, spec.input.embedding_dim, False)
    charged = (ledger.mechanisms if mu is None else
               adaptive.reserved_mechanisms(cfg, mu,
                                            adaptive.constants_for(cfg)))
    return {"covariance": cfg.covariance, "epsilon": cfg.epsilon,
            "delta": cfg.delta, "accountant": cfg.accountant,
            "classes": len(cfg.labels),
            "adaptive": mu is not None,
            "mechanisms": [m.to_dict() for m in charged],
            "budget_split": budget_split(charged),
            "epsilon_charged": _charged_epsilon(charged, cfg),
            "store": _store_plan(spec, cfg, charged)}


def budget_split(mechanisms: list) -> dict:
    """Each stage's share of one class's privacy loss (with the global
    mechanisms): its part of sum count x (sensitivity / sigma)^2, the
    Gaussian mechanisms' composed mu^2."""
    first = next((m.partition for m in mechanisms
                  if m.partition.startswith("class=")), None)
    loss: dict = {}
    for m in mechanisms:
        if m.sigma > 0 and m.partition in (first, "global"):
            loss[m.stage] = loss.get(m.stage, 0.0) + m.count / m.noise_multiplier ** 2
    total = sum(loss.values())
    return {k: v / total for k, v in loss.items()} if total else {}


def _charged_epsilon(mechanisms: list, cfg: GeneratorConfig) -> float:
    if cfg.noiseless:
        return math.inf
    ledger = PrivacyLedger(cfg.epsilon, cfg.delta, cfg.accountant)
    for m in mechanisms:
        ledger.register(m)
    return ledger.spent_epsilon()


def _store_plan(spec: GenerateSpec, cfg: GeneratorConfig,
                charged: list) -> Optional[dict]:
    """The lifetime budget before and after this run (a read of the store)."""
    budget = spec.budget
    if budget.store is None:
        return None
    from dpsynth.pipelines.budget import store as budget_store
    cap = budget_store.pinned_cap(budget.store, budget.dataset_id)
    cap_epsilon = cap["epsilon"] if cap else budget.lifetime_epsilon
    delta = budget.lifetime_delta or (cap or {}).get("delta") or cfg.delta
    now, after = budget_store.spend_after(budget.store, budget.dataset_id,
                                          charged, delta, cfg.accountant)
    return {"store": budget.store, "dataset_id": budget.dataset_id,
            "lifetime_cap": cap_epsilon, "lifetime_delta": delta,
            "spent": now, "after": after,
            "fits": cap_epsilon is not None and after <= cap_epsilon * (1 + 1e-9)}


def _input_and_labels(spec: GenerateSpec) -> tuple[str, tuple[int, ...]]:
    """The input pattern named in the manifest and the public label set
    (images: from --classes or --num-classes/--labels; no --input: the
    embedded demo and its labels)."""
    inp = spec.input
    if inp.images is not None:
        if inp.path:
            raise ValueError("pass either --input (embeddings) or --images")
        return inp.images.path, tuple(image_labels(inp.images,
                                                   inp.num_classes,
                                                   inp.labels))
    if inp.path is None:
        pattern, _ = demo.demo_files()
        labels = inp.labels
        if inp.num_classes is None and not labels:
            labels = tuple(demo.DEMO_LABELS)
        return pattern, tuple(labels_from(inp.num_classes, labels))
    return inp.path, tuple(labels_from(inp.num_classes, inp.labels))


def resolve_config(spec: GenerateSpec,
                   labels: tuple[int, ...]) -> GeneratorConfig:
    """The run's generator configuration: ``--covariance auto`` outside
    the adaptive plan's scope (a public function of the flags,
    ``adaptive.applies``; images: phase 1 would encode them twice) is the
    fixed "shared" plan."""
    cfg = spec.generator.config(labels)
    if not adaptive.two_phase(cfg) or (adaptive.applies(cfg)
                                       and spec.input.images is None):
        return cfg
    if cfg.covariance == "subspace":  # no one-phase plan has it
        raise ValueError("--covariance subspace needs the two-phase plan: "
                         "--clusters 1, --center, --covariance-rank > 0, no "
                         "--vote-filter / --budget-weights, embedding input")
    log.info("--covariance auto: the adaptive plan needs --clusters 1, "
             "--center, no --vote-filter / --budget-weights and embedding "
             "input; running the fixed 'shared' plan")
    return dataclasses.replace(cfg, covariance="shared")


def _check_budget_flags(spec: GenerateSpec) -> None:
    if spec.budget.store is None:
        if (spec.budget.dataset_id or spec.budget.lifetime_epsilon
                or spec.budget.lifetime_delta is not None):
            raise ValueError("--dataset-id/--lifetime-epsilon/--lifetime-delta "
                             "need --budget-store")
        return
    if not spec.budget.dataset_id:
        raise ValueError("--budget-store needs --dataset-id (and "
                         "--lifetime-epsilon the first time: the store pins "
                         "the dataset's cap)")
    if spec.generator.noise_seed is not None:
        raise ValueError("--noise-seed cannot be used with --budget-store: "
                         "seeded noise is reproducible, so two releases with "
                         "one seed on neighbouring data cancel each other's "
                         "noise; such releases are not private and must not "
                         "be charged as if they were")
    if spec.budget.lifetime_delta is not None and not 0 < spec.budget.lifetime_delta < 1:
        raise ValueError(f"--lifetime-delta must be in (0, 1), got "
                         f"{spec.budget.lifetime_delta}")


def _check_cluster_boundary(spec: GenerateSpec,
                            chosen: Optional[engine.Engine] = None) -> None:
    """On a cluster elsewhere (``locality``): the noise key out of the job
    graph, and no local path; from the flags alone, no engine contacted."""
    opts = beam_options(spec.run.beam_args).get_all_options()
    _check_noise_key_location(
        spec, opts, chosen or select.resolve(spec.run.beam_args))
    locality.check_paths(spec, opts)
    if spec.run.noise_key_location is not None:
        from dpsynth.transforms.noise import check_key_folder
        check_key_folder(spec.run.noise_key_location)  # 0700, yours


def _check_noise_key_location(spec: GenerateSpec, opts: dict,
                              chosen: engine.Engine) -> None:
    secure = (spec.generator.noise_seed is None
              and not math.isinf(spec.generator.epsilon))
    if not secure or spec.run.noise_key_location is not None:
        return
    if chosen.keeps_job_graph:
        raise ValueError(chosen.job_graph_refusal())
    refusal = locality.noise_key_refusal(opts)  # any cluster elsewhere
    if refusal is not None:
        raise ValueError(refusal)


def store_noise_key(job: Job, spec: GenerateSpec) -> Optional[str]:
    """Moves the run's key out of the job graph (``--noise-key-location``):
    writes it for the workers, pickles only its URI; returns the URI the
    launcher deletes when the run ends."""
    location = spec.run.noise_key_location
    if location is None or spec.generator.noise_seed is not None:
        return None
    from dpsynth.transforms.noise import StoredKeyNoise, key_uri, write_key
    uri = key_uri(location, job.run_id, job.owner)
    key = job.noise.export_key()
    write_key(uri, key)
    job.noise = StoredKeyNoise(uri, key)
    return uri


def _remove_abandoned_keys(job: Job, spec: GenerateSpec, owners) -> None:
    """Deletes the noise keys that earlier attempts of this run id left in
    --noise-key-location (a SIGKILLed launch cannot delete its own): their
    attempts are over, and a key left there lets its readers remove that
    attempt's noise. A failed delete is reported by ``delete_key``."""
    location = spec.run.noise_key_location
    if location is None:
        return
    from dpsynth.transforms.noise import delete_key, key_uri
    for owner in sorted(set(owners) - {job.owner}):
        delete_key(key_uri(location, job.run_id, owner))


def _published_by(output: str, run_id: Optional[str],
                  spec: GenerateSpec) -> Optional[str]:
    """"published" when --output already holds the release of this
    --run-id *as the budget store recorded it* (its manifest's digest) with
    its files in place; "recorded" when the manifest there is the recorded
    one but its files are not (a copy of the staged manifest: this launch
    re-publishes the recorded staged release); None when no manifest there
    names this run id.

    Never read from the folder alone: whoever writes beside --output can
    plant a manifest naming the coming run id (and real rows with
    ``"private": true``); a "nothing to do" then vouched for it. Without a
    store nothing this launch holds can prove an earlier launch made it
    (each launch's key is new), so such a manifest is refused in one line.
    """
    if run_id is None or not release.release_exists(output):
        return None
    digest = release.manifest_digest(output)
    if release.read_manifest(output, digest).get("run_id") != run_id:
        return None
    store, dataset_id = spec.budget.store, spec.budget.dataset_id
    if store is None:
        raise release.ReleaseError(
            f"--output {output} holds a manifest naming run {run_id!r}, and "
            "without --budget-store nothing proves this run made it (anyone "
            "who writes beside --output can plant one): not vouching for it "
            "and not drawing a second release of one run id; remove it or "
            "use a new --run-id")
    from dpsynth.pipelines.budget import store as budget_store
    if budget_store.recorded_manifest(store, dataset_id, run_id) != digest:
        raise release.ReleaseError(
            f"--output {output} holds a manifest naming run {run_id!r} that "
            f"budget store {store} (dataset {dataset_id!r}) never recorded "
            "for it (planted or rewritten): nothing published, nothing "
            "charged; remove it or use a new --run-id")
    manifest = release.read_manifest(output, digest)
    try:  # every listed file, its bytes (an operator's extra files may stay)
        release.verify_files(release.release_root(output, manifest), manifest,
                             names=list(manifest.get("files") or {}))
    except release.ReleaseChanged:
        return "recorded"  # its files were never placed: publish them
    return "published"


def _reserve(job: Job, spec: GenerateSpec):
    """Records this attempt's spend in the lifetime ledger (or refuses), or
    takes over the run id's reserved or staged attempt at no new cost."""
    if spec.budget.store is None:
        return None
    from dpsynth.pipelines.budget import store as budget_store
    reservation = budget_store.reserve(
        spec.budget.store, spec.budget.dataset_id, job.run_id,
        job.reserved or job.ledger.mechanisms,
        job.cfg.epsilon, job.cfg.delta, spec.budget.lifetime_epsilon,
        spec.budget.lifetime_delta, job.cfg.accountant, owner=job.owner,
        created_utc=job.created_utc, label_rule=label_rule(spec, job.cfg))
    job.created_utc = reservation.created_utc or job.created_utc
    job.lifetime_cap = reservation.lifetime_cap
    return reservation


def label_rule(spec: GenerateSpec, cfg: GeneratorConfig) -> dict:
    """What makes a record's class (public configuration), pinned per
    dataset id by the budget store: the label feature (images in folders:
    the class folders in label order) and the label set."""
    images = spec.input.images
    if images is not None and images.classes:
        rule = {"class_folders": list(images.classes)}
    elif images is not None:
        rule = {"label_feature": images.label_feature or "label"}
    else:
        rule = {"label_feature": spec.input.label_feature}
    return dict(rule, labels=sorted(int(v) for v in cfg.labels))


def _budget_manifest(job: Job, spec: GenerateSpec) -> Optional[dict]:
    """Public configuration of the lifetime budget: the store, the dataset
    id and the cap this run was checked against. (What earlier runs and
    attempts spent is not released: how many attempts a run needed may
    depend on the data, e.g. one that ran out of memory.)"""
    if spec.budget.store is None:
        return None
    return {"store": spec.budget.store, "dataset_id": spec.budget.dataset_id,
            "lifetime_cap": job.lifetime_cap}


def _column_names(columns) -> Optional[tuple[str, ...]]:
    """--embedding-columns as a tuple (the API may pass "f*" or a list)."""
    if columns is None:
        return None
    return tuple(columns.split(",")) if isinstance(columns, str) else tuple(columns)


def _timestamp() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


class ImageSource(beam.PTransform):
    """`generate --images`: encode images in the workers, then the DP job.

    Same interface as ``io.ReadEmbeddingBlocks`` (``paths``, ``dim``, blocks
    of ``(x, y)``); the embedding dimension comes from the encoder (public).
    """

    def __init__(self, images: ImageOptions,
                 embedding_dim: Optional[int] = None) -> None:
        super().__init__()
        from dpsynth.models.encoders import get_encoder
        self._images = images
        encoder = get_encoder(images.encoder, weights=images.encoder_weights)
        self.dim = encoder.embedding_dim or embedding_dim
        if not self.dim:
            raise ValueError(f"--encoder {images.encoder}: its output "
                             "dimension is not known before running it; pass "
                             "--embedding-dim")
        self.paths = [images.path]

    def expand(self, pbegin):
        from dpsynth.pipelines.encode_job import encoded_image_blocks
        return encoded_image_blocks(pbegin.pipeline, self._images)


def image_labels(images: ImageOptions, num_classes: Optional[int],
                 labels: Optional[tuple[int, ...]]) -> list[int]:
    """The label set of ``--images``, from public configuration only.

    A folder-per-class layout needs ``--classes`` (folder names in label
    order: label i is the i-th name); folders are never listed to find the
    classes, since a class folder that holds no image would then change the
    label set and the numbering of every other class. A missing or empty
    class folder is an empty class, which still gets its noisy outputs.
    TFRecord/npz layouts store integer labels: the set comes from
    ``--classes``, ``--num-classes`` or ``--labels``.
    """
    from dpsynth.transforms.images import ImageInputError, detect_layout
    names = list(images.classes or ())
    if len(set(names)) != len(names):
        raise ImageInputError(f"--classes has duplicates: {','.join(names)}")
    layout = detect_layout(images.path, images.layout)
    if names:
        if num_classes is not None or labels:
            raise ValueError("--images: pass the label set once: --classes, "
                             "or --num-classes/--labels")
        return list(range(len(names)))
    if layout == "folder":
        raise ValueError("--images with a folder-per-class layout needs "
                         "--classes NAME,NAME,... (the class folders in label "
                         "order): the label set is public configuration, so "
                         "the private folders are not listed to find it")
    return list(labels_from(num_classes, labels))


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


def adaptive_pass_names(structure: adaptive.Structure,
                        spec: GenerateSpec) -> list[str]:
    """Phase 2's passes over the private rows (progress lines)."""
    if spec.run.materialise_blocks:
        return ["Read"]
    return ["Moments"] + (["ClassSubspace"] if structure.mode == "subspace"
                          else [])


def pipelinedp_document(job: Job) -> Optional[dict]:
    """Which aggregations ran through PipelineDP, with its own explanation
    (public configuration and the ledger's sigmas)."""
    if not job.pipelinedp_explain:
        return None
    import pipeline_dp
    return {"version": pipeline_dp.__version__,
            "explain_computation": job.pipelinedp_explain}


SEEDED_WARNING = (
    "NOT PRIVATE: the noise came from the secret --noise-seed, for tests and "
    "audits. Anyone holding releases made with the same seed on neighbouring "
    "data can cancel the noise. Never share this release.")

NOISE_DESCRIPTION = (
    "{kind}: exact discrete Gaussian on each aggregate's fixed-point lattice "
    "(Canonne-Kamath-Steinke), drawn from an AES-256-CTR keystream under "
    "{key} (never recorded), so re-executed steps redraw nothing")


def manifest(job: Job, spec: GenerateSpec, dim: int,
             summary: list) -> dict:
    """The release's manifest: public configuration and DP outputs only.

    Not in it: the matched input file names (one file per person would
    reveal membership; they go to the operator's console with --verbose),
    wall times (they grow with n), how many attempts the run took.
    ``created_utc`` is taken before any data is read.
    """
    cfg = job.cfg
    warnings = []
    if cfg.noiseless:
        warnings.append("NOT PRIVATE: epsilon=inf: NO NOISE WAS ADDED. This "
                        "release is NOT differentially private. Never share "
                        "it.")
    elif spec.generator.noise_seed is not None:
        warnings.append(SEEDED_WARNING)
    if not cfg.noiseless:
        warnings += weak_setting_warnings(cfg, summary, job.ledger)
    config = config_document(cfg)
    plan_doc = None if job.structure is None else job.structure.to_manifest()
    noise = (NOISE_DESCRIPTION.format(kind="seeded",
                                      key="a key from the secret --noise-seed")
             if spec.generator.noise_seed is not None else
             NOISE_DESCRIPTION.format(kind="secure",
                                      key="a per-run key from os.urandom"))
    return {
        "format": "dpsynth-release/3",
        "run_id": job.run_id,
        "root": job.version,
        "created_utc": job.created_utc,
        "privacy": job.ledger.to_manifest(),
        "pipelinedp": pipelinedp_document(job),
        "adaptive_plan": plan_doc,
        "noise": "none (epsilon=inf)" if cfg.noiseless else noise,
        # False: no noise, or noise from a secret seed (reusing it on
        # neighbouring data cancels the noise): not differentially private.
        "private": not cfg.noiseless and spec.generator.noise_seed is None,
        "config": config,
        "input": {"pattern": job.spec.pattern, "format": job.spec.fmt,
                  "non_finite": job.spec.non_finite},
        "embedding_dim": dim,
        "classes": summary,
        "samples_total": sum(c["samples"] for c in summary),
        "outputs": describe_outputs(cfg, dim, summary,
                                    job.spec.embedding_feature,
                                    job.spec.label_feature,
                                    plan_doc and plan_doc["mode"]),
        "lifetime_budget": _budget_manifest(job, spec),
        "versions": release.versions(),
        "warnings": warnings,
    }


# A class whose noisy count is below this many rows (or 3 noise sigmas)
# tells the user little; above this share of a typical class, the count
# noise dominates the release.
FEW_ROWS = 10
NOISY_SHARE = 0.1  # "a tenth" in the warning's words


def weak_setting_warnings(cfg: GeneratorConfig, summary: list,
                          ledger: PrivacyLedger) -> list[str]:
    """Warnings about weak or risky settings, from DP outputs (the noisy
    class counts) and public configuration (the calibrated sigmas) only,
    so they may go into the manifest and the console."""
    out = []
    counts = [c["noisy_count"] for c in summary]
    names = [plan.class_count_name(ledger, c["label"]) for c in summary]
    sigmas = [ledger.get(n).sigma if n in ledger else None for n in names]
    for c, s in zip(summary, sigmas):
        floor = max(FEW_ROWS, 3 * s) if s else FEW_ROWS
        if c["noisy_count"] < floor:
            why = (f"within three noise sigmas ({s:.1f}) of zero" if s and
                   3 * s > FEW_ROWS else f"below {FEW_ROWS} rows")
            out.append(
                f"class {c['label']}: noisy count {c['noisy_count']:.1f} is "
                f"{why}: its {c['samples']} synthetic rows carry little or no "
                "signal (merge rare classes, or raise --epsilon)")
    known = [s for s in sigmas if s]
    if counts and known:
        typical = float(sorted(counts)[len(counts) // 2])
        noise = float(sorted(known)[len(known) // 2])
        # A typical noisy count at or below zero: noise is all there is.
        if noise > NOISY_SHARE * max(typical, 0.0):
            out.append(
                f"epsilon={cfg.epsilon:g} is low for these class sizes: the "
                f"noise on a class count (sigma {noise:.1f}) is over "
                f"a tenth of a typical noisy class size "
                f"({typical:.0f}), and the means and covariances are noisier "
                "still; expect a release close to noise (raise --epsilon or "
                "use fewer classes)")
    noisy_n = sum(max(c, 0.0) for c in counts)
    if noisy_n > 0 and cfg.delta > 1.0 / noisy_n:
        suggest = 10 ** math.floor(math.log10(0.1 / noisy_n))
        out.append(f"delta={cfg.delta:g} is not far below 1/n for the noisy "
                   f"record count n~{noisy_n:.0f}: a release may then expose "
                   f"a few records outright with probability ~delta*n; pass "
                   f"--delta {suggest:g} or smaller")
    return out


def _checkpoint(step: str) -> None:
    """A named point of the stage -> commit -> publish protocol (tests
    inject crashes here)."""


def _check_input_schema(job: Job, spec: GenerateSpec) -> None:
    """The input's files and embedding dimension (what ``make_reader``
    checks), before the budget is reserved: a refusal there charged the
    run's epsilon for a run that read no row."""
    if spec.input.images:
        return
    try:
        make_reader(job, spec)
    except (io.InputError, release.ReleaseError):
        raise
    except ValueError as err:
        raise UsageError(str(err)) from None


def make_reader(job: Job, spec: GenerateSpec) -> beam.PTransform:
    if spec.input.images:
        return ImageSource(spec.input.images, spec.input.embedding_dim)
    # A charged release (a budget store) takes no dimension from a row:
    # whether it exists must not depend on n (an empty input would fail).
    return io.ReadEmbeddingBlocks(job.spec, dim=spec.input.embedding_dim,
                                  dim_from_rows=spec.budget.store is None)


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


def _stage(job: Job, spec: GenerateSpec, lease, timings: dict) -> str:
    """Runs the pipeline into staging and writes the staged manifest;
    returns the sha256 of the manifest bytes written. Stops
    (``AttemptLost``) at a pass boundary once another launch took the
    attempt over (``lease``: ``budget_store.Lease``)."""
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
            from dpsynth.transforms.noise import delete_key
            delete_key(key_object)
    timings["pipeline"] = round(time.time() - t1, 3)
    lease.verify()  # a zombie resumed after a takeover stages nothing
    _checkpoint("pipeline-done")
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
    return release.write_manifest(job.staging, doc)


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
    release.discard(job.staging)  # a crashed attempt's partial files
    if lease.reservation is not None:
        from dpsynth.pipelines.budget import store as budget_store
        budget_store.mark_running(lease.reservation)
    _checkpoint("running")
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
                                 adaptive_pass_names(structure, spec),
                                 show_rows=spec.run.show_row_counts,
                                 done=1,  # phase 1's pass
                                 on_pass=lease.verify):
        with pipeline_run(options) as p:
            build_adaptive(p, job, reader, spec, centre, counts, progress)


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
    with collector.startup_heap_frozen():  # no full collection of imports
        return _run(spec)


def _run(spec: GenerateSpec) -> str:
    t0 = time.time()
    allocator.keep_heap_pages()  # the runner process moves blocks too
    try:
        job = prepare(spec)
    except (io.InputError, release.ReleaseError):
        raise
    except ValueError as err:  # flags and configuration: before any data
        raise UsageError(str(err)) from None
    if job.already_published:
        _finish_published(job, spec)
        log.info("run %s is already published at %s: nothing to do, no "
                 "budget spent", job.run_id, job.output)
        return job.output
    if job.cfg.noiseless:
        log.warning("!!! --epsilon inf: running WITHOUT NOISE. The output is "
                    "NOT differentially private. Debugging only. !!!")
    job.engine.check_before_charge(  # before anything is charged
        spec, beam_options(job.engine.beam_args))
    _check_input_schema(job, spec)
    from dpsynth.pipelines.budget import store as budget_store
    _check_staged_leftovers(job, spec)
    staged = None  # the recorded staged release a retry re-publishes
    reservation = _reserve(job, spec)
    if reservation is not None:  # earlier attempts are settled and charged
        _remove_abandoned_keys(job, spec, budget_store.run_owners(
            spec.budget.store, spec.budget.dataset_id, job.run_id))
    timings = {"plan": round(time.time() - t0, 3)}
    recorded = False  # this launch's staged folder is recorded in the store
    published = False
    with budget_store.Lease(reservation) as lease:
        try:
            if reservation is not None and reservation.staged is not None:
                staged = _recorded_staged(job, reservation)
            _checkpoint("reserved")
            if staged is None:
                digest = _stage(job, spec, lease, timings)
            else:
                digest = reservation.staged["manifest_sha256"]
                log.info("run %s: re-publishing its staged release (no new "
                         "noise, no new spend)", job.run_id)
            _checkpoint("staged")
            # One digest from here on: the one written (or recorded) is the
            # one published.
            if reservation is not None:
                lease.check()
                budget_store.commit_staged(reservation, job.staging, digest)
                recorded = True
            _checkpoint("committed")
            console.stop_if_ctrl_c()  # one a library swallowed: no release
            t_publish = time.time()
            _publish(job, spec, digest)
            timings["publish"] = round(time.time() - t_publish, 3)
            published = True
            _checkpoint("published")
            if reservation is not None:
                budget_store.commit(reservation, job.output)
            _checkpoint("recorded")
        except BaseException as err:
            rejected = isinstance(err, release.ReleaseChanged)
            _stop_attempt(job, spec, reservation, recorded,
                          str(err) if rejected else None)
            if published and isinstance(err, KeyboardInterrupt):
                raise console.InterruptedAfterPublishing(job.output) from err
            if lease.lost is not None and not published:
                # A pass boundary found the attempt taken over (and may
                # have interrupted the pipeline to stop it): one line.
                raise lease.lost from None
            if rejected:
                retry = ("the attempt stays charged: a retry of run "
                         f"{job.run_id!r} is a new, charged attempt"
                         if reservation is not None else
                         f"a retry of run {job.run_id!r} draws again")
                raise release.ReleaseChanged(
                    f"{err}; not published, the staged files are removed; "
                    f"{retry}") from None
            raise
    leftovers = release.staging_folders(job.output, job.run_id)
    _remove_abandoned_keys(job, spec, leftovers)  # named by their tokens
    for folder in leftovers.values():
        release.discard(folder)  # this one and crashed attempts' leftovers
    timings["total"] = round(time.time() - t0, 3)
    if spec.run.record_timings:
        log.info("wall times (s, operator only, not DP): %s", timings)
    return job.output


def _publish(job: Job, spec: GenerateSpec, digest: str) -> None:
    """Publishes the staged release after checking every file against its
    manifest and the parts against each other (``consistency``), on every
    publication: also when a retry re-publishes an earlier launch's staged
    files, which may have changed since."""
    try:
        release.publish(job.staging, job.output, spec.output.overwrite,
                        check=consistency.check_manifest,
                        manifest_sha256=digest)
    except consistency.InconsistentRelease as err:
        raise release.ReleaseChanged(str(err)) from None


def _stop_attempt(job: Job, spec: GenerateSpec, reservation,
                  recorded: bool, rejected: Optional[str] = None) -> None:
    """After a failure: give the attempt back and keep the staged release
    only where a retry may publish it (recorded in the store). A staged
    release that failed its checks (``rejected``: why) is removed and its
    attempt marked failed: a retry draws again and is charged again."""
    if reservation is not None:
        from dpsynth.pipelines.budget import store as budget_store
        try:
            if rejected:
                budget_store.reject_staged(reservation, rejected)
            budget_store.release_failed(reservation)
        except Exception as err:  # must not hide the original error
            log.warning("could not record the failed attempt of run %s in "
                        "the budget store (%s); its lease expires by itself",
                        job.run_id, err)
    # Without a store nothing trusted recorded the staged manifest, so a
    # retry never re-publishes it (``_check_staged_leftovers``): not kept.
    keep = (not rejected and recorded
            and release.staged_manifest(job.staging) is not None)
    if not keep:
        release.discard_staged(job.staging, job.output)
        return
    log.warning("the staged release of run %s is kept at %s: re-run with "
                "--run-id %s to publish it (no new spend)", job.run_id,
                job.staging, job.run_id)


def _check_staged_leftovers(job: Job, spec: GenerateSpec) -> None:
    """Complete staged releases of this run id left by earlier launches.

    With a budget store, only the folder of an attempt the store charged
    (named by the attempt's owner token) may be re-published, and only the
    one the store recorded, against the manifest digest it recorded; any
    other (planted under the predictable run id, or staged without this
    store) is set aside: logged, never obeyed, removed with this run's
    leftovers. Without a store nothing recorded what was staged: a staged
    folder (files and manifest alike) may have been rewritten since, so it
    is never re-published; it is removed and the retry draws again.
    """
    complete = {token: folder for token, folder
                in release.staging_folders(job.output, job.run_id).items()
                if release.staged_manifest(folder) is not None}
    if spec.budget.store is None:
        for folder in sorted(complete.values()):
            log.warning("run %s: removing the staged release at %s: without "
                        "--budget-store nothing trusted recorded it, so it is "
                        "not re-published; this launch draws again",
                        job.run_id, folder)
            release.discard_staged(folder, job.output)
        return
    from dpsynth.pipelines.budget import store as budget_store
    charged = budget_store.run_owners(spec.budget.store, spec.budget.dataset_id,
                                      job.run_id)
    for folder in sorted(f for t, f in complete.items() if t not in charged):
        # Planted (its name is predictable from the run id) or staged
        # without this store: set aside, never obeyed. Only the folder the
        # store recorded is ever re-published; this run's cleanup removes
        # the others.
        log.warning("run %s: ignoring the staged release at %s: budget store "
                    "%s (dataset %r) never charged it, so it is never "
                    "published", job.run_id, folder, spec.budget.store,
                    spec.budget.dataset_id)


def config_document(cfg: GeneratorConfig) -> dict:
    """The manifest's ``config``: the generator configuration as JSON."""
    config = dataclasses.asdict(cfg)
    config["labels"] = list(cfg.labels)
    return config


def _recorded_staged(job: Job, reservation) -> dict:
    """The staged release the budget store recorded for this run id, after
    checking that its manifest is the one recorded."""
    folder = reservation.staged["folder"]
    staged = release.staged_manifest(folder)
    if staged is None or release.manifest_digest(folder) != \
            reservation.staged["manifest_sha256"]:
        job.staging = folder  # removed with the attempt's rejection
        raise release.ReleaseChanged(
            f"run {job.run_id!r}: the staged release the budget store "
            f"recorded at {folder} is missing or changed (its manifest is not "
            "the one recorded)")
    job.staging = folder
    return staged


def _finish_published(job: Job, spec: GenerateSpec) -> None:
    """A retry after the manifest was written: record the publication (if
    the crash came before that) and clean up; nothing is recomputed."""
    if spec.budget.store is not None:
        from dpsynth.pipelines.budget import store as budget_store
        budget_store.mark_published(spec.budget.store, spec.budget.dataset_id,
                                    job.run_id, job.output,
                                    release.manifest_digest(job.output))
    for folder in release.staging_folders(job.output, job.run_id).values():
        release.discard(folder)


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

