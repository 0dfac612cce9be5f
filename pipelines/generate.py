"""`dpsynth generate`: labelled embeddings -> DP synthetic embedding release.

Run as ``dpsynth generate ...`` or ``python -m pipelines.generate ...``; any
flag this parser does not know is passed to Beam as a pipeline option
(``--runner``, ``--project``, ``--flink_master``...).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import math
import re
import sys
import time
import uuid
from typing import Optional, Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from dp_ops import generator, plan
from dp_ops.calibration import validate_weights
from dp_ops.clipping import NORMALIZATIONS
from dp_ops.config import (COVARIANCE_MODES, GeneratorConfig, labels_from,
                            parse_weights)
from dp_ops.ledger import ACCOUNTANTS, PrivacyLedger
from pipelines import demo, release, runner_names
from transforms import io
from transforms.aggregate import PrepareBlocks, RereadBlocks
from transforms.centre import DPCentre
from transforms.dp_kmeans import DPKMeans
from transforms.mixture import DPMixture, SampleSynthetic
from transforms.write import SUMMARY_FILE, WriteRelease

log = logging.getLogger("dpsynth")
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def _epsilon(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if math.isnan(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0 or 'inf', got {text}")
    return value


def _labels(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}") from None


def _weights(text: str) -> dict:
    try:
        return parse_weights(text)
    except ValueError as err:  # argparse would hide our message
        raise argparse.ArgumentTypeError(
            str(err).replace("--budget-weights: ", "")) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pipelines.encode import add_image_arguments
    # Image flags first: generate's own --label-feature (embedding files)
    # then replaces the image reader's one.
    parser.conflict_handler = "resolve"
    add_image_arguments(parser, images_required=False)
    parser.add_argument("--embedding-dim", type=int,
                        help="with --images and a keras:/onnx: encoder: its "
                        "output dimension")
    data = parser.add_argument_group("input and output")
    data.add_argument("--input", help="glob of .npz / TFRecord / Parquet files "
                      "(local or gs://); default: the embedded digits demo")
    data.add_argument("--input-format", choices=io.FORMATS,
                      help="default: from the file extension")
    data.add_argument("--embedding-feature", default="embedding",
                      help="TFRecord feature / Parquet column of the vector")
    data.add_argument("--label-feature", default="label",
                      help="TFRecord feature / Parquet column of the label")
    data.add_argument("--non-finite", choices=io.NON_FINITE_POLICIES,
                      default="reject", help="rows with NaN/inf: fail the run "
                      "(default) or drop them (a per-record rule, DP-safe)")
    data.add_argument("--output", help="release directory (local or gs://); "
                      "default: ./dpsynth-releases/<timestamp>")
    data.add_argument("--overwrite", action="store_true",
                      help="replace an existing release at --output")
    data.add_argument("--run-id", help="names this run in the manifest "
                      "(default: random)")
    data.add_argument("--block-size", type=int, default=4096,
                      help="rows per numpy block moved between stages")
    data.add_argument("--rows-per-shard", type=int, default=50_000)
    data.add_argument("--split-bytes", type=int, default=io.SPLIT_BYTES,
                      help="TFRecord/Parquet files are read in byte ranges "
                      "of this size, spread over the workers (default 64 "
                      "MiB); .npz files are read whole")
    data.add_argument("--materialise-blocks", action="store_true",
                      help="read the input once and keep the blocks in the "
                      "runner between passes (default: every pass re-reads "
                      "the files, so memory does not grow with n)")
    data.add_argument("--record-timings", action="store_true",
                      help="put stage wall times in the manifest and log; "
                      "they grow with n, so they are NOT differentially "
                      "private (operator diagnostics only)")

    cls = parser.add_argument_group("classes (public configuration)")
    cls.add_argument("--num-classes", type=int, help="labels are 0..N-1")
    cls.add_argument("--labels", type=_labels, help="explicit label list, "
                     "e.g. 0,1,7")

    dp = parser.add_argument_group("privacy")
    dp.add_argument("--epsilon", type=_epsilon, default=4.0,
                    help="total epsilon of the release ('inf': no noise, "
                    "NOT private, for debugging)")
    dp.add_argument("--delta", type=float, default=1e-5)
    dp.add_argument("--accountant", choices=ACCOUNTANTS, default="pld")
    dp.add_argument("--budget-weights", type=_weights,
                    help="share of the budget per stage, summing to 1, e.g. "
                    "tree=0.15,lloyd=0.25,moments=0.5,vote=0.1")
    dp.add_argument("--noise-seed", type=int, help="SECRET seed for "
                    "reproducible noise (testing/audits); never recorded. "
                    "Default: secure non-reproducible noise")

    life = parser.add_argument_group(
        "lifetime budget (every release of the same private data spends again)")
    life.add_argument("--budget-store", help="directory or gs:// prefix of the "
                      "lifetime budget ledger; enables the lifetime cap")
    life.add_argument("--dataset-id", help="names the private dataset in the "
                      "budget store")
    life.add_argument("--lifetime-epsilon", type=_epsilon,
                      help="lifetime epsilon cap of --dataset-id")
    life.add_argument("--lifetime-delta", type=float,
                      help="delta at which the lifetime epsilon is measured "
                      "(default: --delta)")

    gen = parser.add_argument_group("generator")
    gen.add_argument("--clusters", type=int, default=GeneratorConfig.clusters,
                     help="k per class (DP k-means: LSH-tree coreset + Lloyd)")
    gen.add_argument("--clip-norm", type=float,
                     default=GeneratorConfig.clip_norm,
                     help="L2 clip radius R applied to every (centred) record")
    gen.add_argument("--normalize", choices=NORMALIZATIONS, default="unit",
                     help="public per-record normalisation before clipping")
    gen.add_argument("--center", action=argparse.BooleanOptionalAction,
                     default=True, help="subtract a DP mean of all rows "
                     "(stage 'centre') before clipping to --clip-norm")
    gen.add_argument("--cluster-dim", type=int, default=32, help="dimension "
                     "of the public random projection used for clustering")
    gen.add_argument("--tree-depth", type=int, default=8)
    gen.add_argument("--branch-threshold", type=float,
                     help="noisy count a tree node needs to branch "
                     "(default: 3 x its noise sigma)")
    gen.add_argument("--lloyd-rounds", type=int, default=2)
    gen.add_argument("--variance-floor", type=float, default=1e-6)
    gen.add_argument("--covariance-rank", type=int, default=128,
                     help="add rank-r covariance factors (DP second-moment "
                     "matrix, stage 'covariance'); 0: diagonal only")
    gen.add_argument("--covariance", choices=COVARIANCE_MODES,
                     default=GeneratorConfig.covariance,
                     help="factors from one 'shared' matrix of all records or "
                     "one 'per-class' matrix per class (better with large "
                     "classes: thousands of rows at epsilon >= 2)")
    gen.add_argument("--samples-per-class", type=int,
                     help="default: the noisy class count")
    gen.add_argument("--seed", type=int, default=0,
                     help="public seed: hyperplanes, projections, sampling")
    gen.add_argument("--vote-filter", action="store_true",
                     help="keep samples with a noisy nearest-neighbour vote "
                     ">= --vote-threshold")
    gen.add_argument("--vote-threshold", type=float, default=6.0)
    gen.add_argument("--vote-oversample", type=float, default=6.0,
                     help="candidates generated per wanted sample")
    gen.add_argument("--vote-max-candidates", type=int,
                     help="public cap on vote candidates per class (the "
                     "nearest-neighbour search costs n x candidates x d)")


def config_from(args: argparse.Namespace, labels: Sequence[int]) -> GeneratorConfig:
    return GeneratorConfig(
        labels=tuple(labels), epsilon=args.epsilon, delta=args.delta,
        clusters=args.clusters, clip_norm=args.clip_norm,
        normalize=args.normalize, center=args.center, cluster_dim=args.cluster_dim,
        tree_depth=args.tree_depth, branch_threshold=args.branch_threshold,
        lloyd_rounds=args.lloyd_rounds, samples_per_class=args.samples_per_class,
        variance_floor=args.variance_floor, vote_filter=args.vote_filter,
        covariance_rank=args.covariance_rank, covariance=args.covariance,
        vote_threshold=args.vote_threshold,
        vote_oversample=args.vote_oversample,
        vote_max_candidates=args.vote_max_candidates,
        budget_weights=args.budget_weights, accountant=args.accountant,
        seed=args.seed)


def beam_options(beam_argv: Sequence[str]) -> PipelineOptions:
    """Pipeline options with safe DirectRunner defaults.

    DirectRunner's ``multi_threading`` mode corrupted data in our tests, so
    it is refused; several workers default to ``multi_processing``.
    ``--runner dask`` selects ``pipelines.dask_runner`` (deploy/README.md).
    """
    argv = runner_names.resolve_dask(beam_argv)
    joined = " ".join(argv)
    if "multi_threading" in joined:
        raise ValueError("--direct_running_mode=multi_threading is not "
                         "supported (it corrupts data); use multi_processing")
    if "--runner" not in joined:
        argv.append("--runner=DirectRunner")
    options = PipelineOptions(argv)
    all_opts = options.get_all_options()
    runner = (all_opts.get("runner") or "").lower()
    if runner in ("directrunner", "direct") and "direct_running_mode" not in joined:
        workers = all_opts.get("direct_num_workers") or 1
        mode = "multi_processing" if workers > 1 else "in_memory"
        options = PipelineOptions(argv + [f"--direct_running_mode={mode}"])
    return options


@dataclasses.dataclass
class Job:
    """Everything decided before any private data is read."""

    cfg: GeneratorConfig
    ledger: PrivacyLedger
    spec: io.InputSpec
    output: str
    staging: str
    run_id: str
    already_published: bool = False


def prepare(args: argparse.Namespace) -> Job:
    """Validates flags, calibrates the noise, checks the output: no data read."""
    if args.images:
        if args.input:
            raise ValueError("pass either --input (embeddings) or --images")
        args.labels = args.labels or image_labels(args)
        args.input = args.images  # named in the manifest; not read as embeddings
    elif args.input is None:
        args.input, _ = demo.demo_files()
        if args.num_classes is None and not args.labels:
            args.labels = list(demo.DEMO_LABELS)
    labels = labels_from(args.num_classes, args.labels)
    # Cheap checks first: calibration (below) takes seconds.
    cfg = config_from(args, labels)
    if args.block_size < 1 or args.rows_per_shard < 1:
        raise ValueError("--block-size and --rows-per-shard must be >= 1")
    if args.run_id is not None and not _RUN_ID.fullmatch(args.run_id):
        raise ValueError(f"--run-id must match {_RUN_ID.pattern} (it names "
                         f"the staging directory), got {args.run_id!r}")
    output = args.output or f"dpsynth-releases/{_timestamp()}"
    _check_budget_flags(args)
    if _published_by(output, args.run_id):
        return Job(cfg, PrivacyLedger(cfg.epsilon, cfg.delta), None, output,
                   "", args.run_id,
                   already_published=True)
    release.check_output(output, args.overwrite)
    spec = io.InputSpec(args.input, args.input_format, args.embedding_feature,
                        args.label_feature, tuple(labels), args.non_finite,
                        args.block_size, args.split_bytes)
    validate_weights(cfg.weights(), cfg.stages)
    if not args.images:
        io.match_files(spec.pattern)  # lists names only: no data is read
    ledger = plan.make_ledger(cfg)  # refuses impossible targets
    run_id = args.run_id or uuid.uuid4().hex[:12]
    staging = release.staging_dir(output, run_id)
    release.check_staging(staging)
    return Job(cfg, ledger, spec, output, staging, run_id)


def _check_budget_flags(args: argparse.Namespace) -> None:
    if args.budget_store is None:
        if args.dataset_id or args.lifetime_epsilon:
            raise ValueError("--dataset-id/--lifetime-epsilon need "
                             "--budget-store")
        return
    if not args.dataset_id or args.lifetime_epsilon is None:
        raise ValueError("--budget-store needs --dataset-id and "
                         "--lifetime-epsilon")
    if args.lifetime_delta is not None and not 0 < args.lifetime_delta < 1:
        raise ValueError(f"--lifetime-delta must be in (0, 1), got "
                         f"{args.lifetime_delta}")


def _published_by(output: str, run_id: Optional[str]) -> bool:
    """True when --output already holds the release of this --run-id.

    Re-running a scheduled run (same --run-id) then spends nothing and
    writes nothing: one run id, one release.
    """
    if run_id is None or not release.release_exists(output):
        return False
    return release.read_manifest(output).get("run_id") == run_id


def _reserve(job: Job, args: argparse.Namespace):
    """Records this run's spend in the lifetime ledger (or refuses)."""
    if args.budget_store is None:
        return None
    from pipelines import budget_store
    return budget_store.reserve(
        args.budget_store, args.dataset_id, job.run_id, job.ledger.mechanisms,
        job.cfg.epsilon, job.cfg.delta, args.lifetime_epsilon,
        args.lifetime_delta or job.cfg.delta, job.cfg.accountant)


def _budget_manifest(reservation, args: argparse.Namespace) -> Optional[dict]:
    if reservation is None:
        return None
    return {"store": args.budget_store, "dataset_id": args.dataset_id,
            "lifetime_cap": {"epsilon": args.lifetime_epsilon,
                             "delta": reservation.lifetime_delta},
            "lifetime_epsilon_spent": reservation.lifetime_epsilon_spent,
            "retry_of_recorded_run": reservation.already_spent}


def _timestamp() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


class ImageSource(beam.PTransform):
    """`generate --images`: encode images in the workers, then the DP job.

    Same interface as ``io.ReadEmbeddingBlocks`` (``paths``, ``dim``, blocks
    of ``(x, y)``); the embedding dimension comes from the encoder (public).
    """

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        from models.encoders import get_encoder
        self._args = args
        encoder = get_encoder(args.encoder, weights=args.encoder_weights)
        self.dim = encoder.embedding_dim or args.embedding_dim
        if not self.dim:
            raise ValueError(f"--encoder {args.encoder}: its output dimension "
                             f"is not known before running it; pass "
                             f"--embedding-dim")
        self.paths = [args.images]

    def expand(self, pbegin):
        from pipelines.encode import encoded_blocks_from_args
        return encoded_blocks_from_args(pbegin.pipeline, self._args)


def image_labels(args: argparse.Namespace) -> Optional[list[int]]:
    """Labels of a folder-per-class image layout: one per class folder."""
    if args.num_classes is not None or args.labels:
        return None
    from transforms.images import list_classes
    names = args.classes.split(",") if args.classes else list_classes(args.images)
    return list(range(len(names)))


def build(p: beam.Pipeline, job: Job, reader: beam.PTransform,
          noise_seed: Optional[int], args: argparse.Namespace) -> None:
    """The whole DP generation graph, from the blocks to the staged files.

    Embedding files are re-read by every pass (``RereadBlocks``): worker
    memory stays at a block plus the model state whatever n is (measured in
    benchmarks/results/scaling.md). Images are encoded once and the blocks
    materialised, since re-encoding per pass would cost far more.
    """
    cfg, ledger, dim = job.cfg, job.ledger, reader.dim
    centre = None
    if isinstance(reader, ImageSource) or args.materialise_blocks:
        raw = p | "Read" >> reader
        if cfg.center:
            centre = raw | "DPCentre" >> DPCentre(cfg, ledger, dim, noise_seed)
        blocks = (raw
                  | "Prepare" >> PrepareBlocks(cfg, dim, centre)
                  | "Materialise" >> beam.Reshuffle())
    else:
        if cfg.center:
            centre = (p | "CentreRead" >> reader
                      | "DPCentre" >> DPCentre(cfg, ledger, dim, noise_seed))
        blocks = RereadBlocks(p, reader, cfg, dim, centre)
    centres = p | "DPKMeans" >> DPKMeans(cfg, ledger, dim, noise_seed,
                                         blocks=blocks)
    mixtures = p | "DPMixture" >> DPMixture(cfg, ledger, dim, centres,
                                            noise_seed, blocks=blocks)
    if centre is not None:  # means back to the input space (post-processing)
        mixtures = mixtures | "AddCentre" >> beam.Map(
            lambda kv, c: (kv[0], generator.with_centre(kv[1], c)),
            beam.pvalue.AsSingleton(centre))
    synthetic = mixtures | "Sample" >> SampleSynthetic(cfg, ledger, blocks,
                                                       noise_seed)
    _ = synthetic | "Write" >> WriteRelease(
        job.staging, mixtures, args.rows_per_shard, args.embedding_feature,
        args.label_feature)


def manifest(job: Job, reader: beam.PTransform, summary: list,
             timings: dict, noise_seed: Optional[int],
             record_timings: bool = False) -> dict:
    cfg = job.cfg
    noisy_n = sum(max(c["noisy_count"], 0.0) for c in summary)
    warnings = []
    if cfg.noiseless:
        warnings.append("epsilon=inf: NO NOISE WAS ADDED. This release is NOT "
                        "differentially private. Never share it.")
    elif noisy_n > 0 and cfg.delta > 1.0 / noisy_n:
        warnings.append(f"delta={cfg.delta:g} is larger than 1/n for the noisy "
                        f"record count n~{noisy_n:.0f}; choose delta << 1/n")
    config = dataclasses.asdict(cfg)
    config["labels"] = list(cfg.labels)
    return {
        "format": "dpsynth-release/1",
        "run_id": job.run_id,
        "created_utc": _timestamp(),
        "privacy": job.ledger.to_manifest(),
        "noise": ("none (epsilon=inf)" if cfg.noiseless else
                  "seeded (secret seed, not recorded)" if noise_seed is not None
                  else "secure (PyDP Gaussian; PipelineDP for moments)"),
        "config": config,
        "input": {"pattern": job.spec.pattern, "files": reader.paths,
                  "format": job.spec.fmt, "non_finite": job.spec.non_finite},
        "embedding_dim": reader.dim,
        "classes": summary,
        "samples_total": sum(c["samples"] for c in summary),
        "outputs": {"data": "data/", "gmm": "gmm.npz"},
        "versions": release.versions(),
        "timings_s": timings if record_timings else
        "not recorded (wall times grow with n; --record-timings)",
        "warnings": warnings,
    }


def run(args: argparse.Namespace, beam_argv: Sequence[str]) -> str:
    """Runs the job; returns the published release path."""
    t0 = time.time()
    job = prepare(args)
    if job.already_published:
        log.info("run %s is already published at %s: nothing to do, no "
                 "budget spent", job.run_id, job.output)
        return job.output
    options = beam_options(beam_argv)
    if job.cfg.noiseless:
        log.warning("!!! --epsilon inf: running WITHOUT NOISE. The output is "
                    "NOT differentially private. Debugging only. !!!")
    reader = (ImageSource(args) if args.images
              else io.ReadEmbeddingBlocks(job.spec))
    log.info("plan: %d mechanisms, target (eps=%g, delta=%g), accountant %s; "
             "input %d file(s), dim %d", len(job.ledger.mechanisms),
             job.cfg.epsilon, job.cfg.delta, job.cfg.accountant,
             len(reader.paths), reader.dim)
    reservation = _reserve(job, args)  # refuses before any data is read
    timings = {"plan": round(time.time() - t0, 3)}
    try:
        t1 = time.time()
        p = beam.Pipeline(options=options)
        build(p, job, reader, args.noise_seed, args)
        p.run().wait_until_finish()
        timings["pipeline"] = round(time.time() - t1, 3)
        if args.record_timings:
            log.info("pipeline finished in %.1f s", timings["pipeline"])
        summary = _read_summary(job.staging)
        timings["total"] = round(time.time() - t0, 3)
        doc = manifest(job, reader, summary, timings, args.noise_seed,
                       args.record_timings)
        doc["lifetime_budget"] = _budget_manifest(reservation, args)
        release.write_manifest(job.staging, doc)
        release.publish(job.staging, job.output, args.overwrite)
    except BaseException:
        release.discard(job.staging)
        if reservation is not None:
            from pipelines import budget_store
            budget_store.release_failed(reservation)
        raise
    if reservation is not None:
        from pipelines import budget_store
        budget_store.commit(reservation, job.output)
    for warning in doc["warnings"]:
        log.warning(warning)
    log.info("release: %d synthetic rows, epsilon spent %.4g (target %g), "
             "delta %g", doc["samples_total"], doc["privacy"]["spent"]["epsilon"],
             job.cfg.epsilon, job.cfg.delta)
    return job.output


def _read_summary(staging: str) -> list:
    from apache_beam.io.filesystems import FileSystems
    with FileSystems.open(io.join(staging, SUMMARY_FILE)) as f:
        return json.loads(f.read().decode())


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dpsynth generate",
        description="Generate a differentially private synthetic embedding "
                    "release. Unknown flags are Beam pipeline options.")
    add_arguments(p)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    from pipelines.cli import run_generate
    args, beam_argv = parser().parse_known_args(argv)
    return run_generate(args, beam_argv)


if __name__ == "__main__":
    sys.exit(main())
