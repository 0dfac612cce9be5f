"""The plan of a `dpsynth generate` run: everything decided before any
private data is read (``job.run``'s first part).

``prepare`` resolves the flags into a ``Job`` (the engine, the label set,
the generator configuration, the calibrated noise) and checks them (the
cluster boundary, the output, an earlier publication of the run id);
``check_input_schema`` lists the input and its dimension; ``reserve``
charges the lifetime budget store. ``plan_only`` is `generate
--plan-only`: the same plan, printed, with nothing written or charged.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import math
import os
import re
import uuid
from typing import Optional

import apache_beam as beam

from dpsynth.dp_ops import adaptive, plan
from dpsynth.dp_ops.calibration import validate_weights
from dpsynth.dp_ops.config import GeneratorConfig, check_delta, labels_from
from dpsynth.dp_ops.ledger import PrivacyLedger
from dpsynth.dp_ops.noise import NoiseSource, make_noise_source
from dpsynth.pipelines import demo
from dpsynth.pipelines.release import publisher, release
from dpsynth.pipelines.runners import engine, locality, select
from dpsynth.pipelines.runners.options import UsageError, beam_options
from dpsynth.pipelines.spec import GenerateSpec, ImageOptions
from dpsynth.transforms import io

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
    # --vote-filter under the signal rule (``adaptive.resolve_vote``):
    # whether it ran and why, for the manifest; None where it does not apply.
    vote_note: Optional[dict] = None
    # The input's files and dimension, checked once before the charge
    # (``check_input_schema``); every reader of the run is built from it.
    input_schema: Optional[io.InputSchema] = None


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
        publisher.check_output(output, out.overwrite)
    input_spec = io.InputSpec(pattern, inp.format, inp.embedding_feature,
                              inp.label_feature, tuple(labels), inp.non_finite,
                              inp.block_size, inp.split_bytes,
                              _column_names(inp.embedding_columns))
    if not adaptive.two_phase(cfg):
        validate_weights(cfg.weights(), cfg.stages)
    if not inp.images:
        io.match_files(input_spec.pattern)  # lists names only: no data read
    cfg, vote_note = resolve_vote(cfg, inp.embedding_dim)
    job = Job(cfg, PrivacyLedger(cfg.epsilon, cfg.delta), input_spec, output,
              staging, run_id, owner,
              version=f"{release.VERSION_PREFIX}{uuid.uuid4().hex[:12]}",
              created_utc=_timestamp(),
              noise=make_noise_source(spec.generator.noise_seed),
              engine=chosen, vote_note=vote_note)
    job.adaptive_mu, job.ledger, job.reserved = calibrate(
        cfg, inp.embedding_dim, spec.budget.store is not None)
    return job


def resolve_vote(cfg: GeneratorConfig, embedding_dim: Optional[int]
                 ) -> tuple[GeneratorConfig, Optional[dict]]:
    """``--vote-filter`` after the signal rule (public: epsilon, delta, d,
    the candidates per row); says so in the log when the vote is skipped."""
    cfg, note = adaptive.resolve_vote(cfg, embedding_dim or 1,
                                      adaptive.constants_for(cfg))
    if note is not None and not note["ran"]:
        log.warning(
            "--vote-filter: skipped. At epsilon %g its histogram's noise "
            "(sigma %.2f) drowns a candidate's expected %.2f votes, so the "
            "vote's share stays with the mixture and the release is the "
            "plain one; pass --vote-share to spend it on the vote anyway",
            cfg.epsilon, note["sigma"], note["votes_per_candidate"])
    return cfg, note


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
    cfg, vote_note = resolve_vote(cfg, spec.input.embedding_dim)
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
            "vote_rule": vote_note,
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
             "--center, no --budget-weights and embedding "
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
        from dpsynth.transforms.keyed_noise import check_key_folder
        check_key_folder(spec.run.noise_key_location)  # 0700, yours


def _check_noise_key_location(spec: GenerateSpec, opts: dict,
                              chosen: engine.Engine) -> None:
    if not spec.secure_noise or spec.run.noise_key_location is not None:
        return
    if chosen.keeps_job_graph:
        raise ValueError(chosen.job_graph_refusal())
    refusal = locality.noise_key_refusal(opts)  # any cluster elsewhere
    if refusal is not None:
        raise ValueError(refusal)


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


def reserve(job: Job, spec: GenerateSpec):
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


def check_input_schema(job: Job, spec: GenerateSpec) -> None:
    """The input's files and embedding dimension, before the budget is
    reserved (a refusal after it charged the run's epsilon for a run that
    read no row), once per run: the result rides on the job
    (``job.input_schema``) and ``make_reader`` builds every reader of the
    run (phase 1 and phase 2) from it."""
    if spec.input.images:
        return
    try:
        # A charged release (a budget store) takes no dimension from a
        # row: whether it exists must not depend on n (an empty input
        # would fail).
        job.input_schema = io.check_schema(
            job.spec, dim=spec.input.embedding_dim,
            dim_from_rows=spec.budget.store is None)
    except (io.InputError, release.ReleaseError):
        raise
    except ValueError as err:
        raise UsageError(str(err)) from None


def make_reader(job: Job, spec: GenerateSpec) -> beam.PTransform:
    """The run's reader, from the schema checked before the charge (a
    caller that built the job without that check, as graph tests do,
    checks it here, once)."""
    if spec.input.images:
        return ImageSource(spec.input.images, spec.input.embedding_dim)
    if job.input_schema is None:
        check_input_schema(job, spec)
    return io.ReadEmbeddingBlocks(job.spec, schema=job.input_schema)
