"""`dpsynth generate`: labelled embeddings -> DP synthetic embedding release.

Run as ``dpsynth generate ...`` or ``python -m dpsynth.pipelines.cli.generate ...``; any
flag this parser does not know is passed to Beam as a pipeline option
(``--runner``, ``--project``, ``--flink_master``...).
"""

from __future__ import annotations

# First: it quiets the libraries' start-up logs before Beam is imported.
from dpsynth.pipelines import console  # noqa: I001  isort:skip

import argparse
import dataclasses
import logging
import math
import sys
from typing import Optional, Sequence

from dpsynth.dp_ops.clipping import NORMALIZATIONS
from dpsynth.dp_ops.config import (COVARIANCE_MODES, GeneratorConfig,
                                   parse_epsilon, parse_weights)
from dpsynth.dp_ops.ledger import ACCOUNTANTS
from dpsynth.pipelines.spec import (BudgetOptions, GenerateSpec, GeneratorOptions,
                            ImageOptions, InputOptions, OutputOptions,
                            RunOptions)
from dpsynth.transforms.formats import (FORMATS, NON_FINITE_POLICIES, OUTPUT_FORMATS,
                                SPLIT_BYTES)

log = logging.getLogger("dpsynth")


def _epsilon(text: str) -> float:
    try:
        return parse_epsilon(text)
    except ValueError as err:  # argparse would hide our message
        raise argparse.ArgumentTypeError(
            str(err).replace("--epsilon ", "")) from None


def _lifetime_epsilon(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value > 0):  # a cap of inf is no cap
        raise argparse.ArgumentTypeError(
            f"must be a finite number > 0, got {text}")
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
    """generate's flags, in the order a user needs them: embeddings in and
    the release out first, then the privacy target, the lifetime budget,
    the generator, images (instead of --input) and operator diagnostics."""
    from dpsynth.pipelines.cli.image_flags import add_image_arguments
    data = parser.add_argument_group("input (private labelled embeddings)")
    data.add_argument("--input", help="glob of .npz / TFRecord / Parquet / CSV files "
                      "(local or gs://); default: the embedded digits demo")
    data.add_argument("--num-classes", type=int, help="labels are 0..N-1 "
                      "(public); REQUIRED with --input unless --labels")
    data.add_argument("--labels", type=_labels, help="explicit public label "
                      "list, e.g. 0,1,7 (instead of --num-classes)")
    data.add_argument("--input-format", choices=FORMATS,
                      help="default: from the file extension")
    data.add_argument("--embedding-feature", default="embedding",
                      help="TFRecord feature / Parquet column of the vector "
                      "(CSV: a list column, or columns <name>_0, <name>_1, ...)")
    data.add_argument("--label-feature", default="label",
                      help="TFRecord feature / Parquet or CSV column of the label "
                      "(with --images: the image TFRecords' label feature)")
    data.add_argument("--embedding-dim", type=int,
                      help="the embedding dimension (public). Every row must "
                      "have it, and an input with no rows is still released "
                      "(default: the .npz header or a fixed-size Parquet "
                      "list; REQUIRED for TFRecord and variable-length "
                      "Parquet lists, whose schema does not say it). "
                      "--images with a "
                      "keras:/onnx: encoder: its output dimension")
    data.add_argument("--non-finite", choices=NON_FINITE_POLICIES,
                      default="reject", help="rows with NaN/inf: fail the run "
                      "(default) or drop them (a per-record rule, DP-safe)")

    out = parser.add_argument_group("output (the release)")
    out.add_argument("--output", help="release directory (local or gs://); "
                     "default: ./dpsynth-releases/<run id>")
    out.add_argument("--output-format", choices=OUTPUT_FORMATS,
                     default="tfrecord", help="data shards: TFRecord of "
                     "tf.train.Example (default) or Parquet; _schema.json "
                     "describes either")
    out.add_argument("--run-id", help="names this run in the manifest and "
                     "the budget store; re-running a run id re-publishes "
                     "its staged release or does nothing if published "
                     "(default: random)")
    out.add_argument("--overwrite", action="store_true",
                     help="replace a release of another run id at --output")
    out.add_argument("--rows-per-shard", type=int, default=50_000,
                     help="at most this many synthetic rows per data file (a "
                     "class's rows are split evenly over as few files as "
                     "that allows)")

    dp = parser.add_argument_group("privacy")
    dp.add_argument("--epsilon", type=_epsilon, default=4.0,
                    help="total epsilon of the release ('inf': no noise, "
                    "NOT private, for debugging)")
    dp.add_argument("--delta", type=float, default=1e-5,
                    help="delta of the release; values above 1e-4 are "
                    "refused unless --allow-large-delta (delta must be far "
                    "below 1/n, and n is private)")
    dp.add_argument("--allow-large-delta", action="store_true",
                    help="accept a delta above 1e-4 (testing only)")
    dp.add_argument("--accountant", choices=ACCOUNTANTS, default="pld",
                    help="how the mechanisms are composed: privacy loss "
                    "distributions (tight) or Renyi DP")
    dp.add_argument("--budget-weights", type=_weights,
                    help="share of the budget per stage, naming exactly the "
                    "enabled stages and summing to 1; the default stages are "
                    "centre, moments, covariance, e.g. centre=0.02,moments=0.38,"
                    "covariance=0.6 (+tree, lloyd with --clusters > 1, +vote "
                    "with --vote-filter; defaults: centre 0.01, tree 0.1, "
                    "lloyd 0.15, moments 0.3, covariance 0.45, vote 0.1, "
                    "renormalised over the enabled stages)")
    dp.add_argument("--noise-seed", type=int, help="SECRET seed for "
                    "reproducible noise (tests and audits): the release is "
                    "marked NOT private; refused with --budget-store. "
                    "Default: secure non-reproducible noise")

    life = parser.add_argument_group(
        "lifetime budget (every release of the same private data spends again)")
    life.add_argument("--budget-store", help="directory or gs:// prefix of the "
                      "lifetime budget ledger; enables the lifetime cap")
    life.add_argument("--dataset-id", help="names the private dataset in the "
                      "budget store")
    life.add_argument("--lifetime-epsilon", type=_lifetime_epsilon,
                      help="lifetime epsilon cap of --dataset-id: needed the "
                      "first time, then pinned in the store (a larger value "
                      "is refused; `python -m dpsynth.pipelines.release.budget_store set-cap` "
                      "changes it)")
    life.add_argument("--lifetime-delta", type=float,
                      help="delta at which the lifetime epsilon is measured, "
                      "pinned with the cap (default: --delta)")

    gen = parser.add_argument_group("generator")
    gen.add_argument("--covariance", choices=COVARIANCE_MODES, default="auto",
                     help="'auto' (default): a small budget on noisy class "
                     "counts, then a public rule picks shared, shared + "
                     "class subspace or per-class matrices and the mean / "
                     "covariance split (docs/method.md: Covariance defaults; "
                     "needs --clusters 1, --center, no --budget-weights, "
                     "embedding input, else it is "
                     "'shared'); 'shared': one matrix of all records; "
                     "'per-class': one matrix per class")
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
    gen.add_argument("--covariance-rank", type=int, default=128,
                     help="add rank-r covariance factors (DP second-moment "
                     "matrix, stage 'covariance'); 0: diagonal only")
    gen.add_argument("--samples-per-class", type=int,
                     help="default: the noisy class count")
    gen.add_argument("--seed", type=int, default=0,
                     help="public seed: hyperplanes, projections, sampling")
    gen.add_argument("--cluster-dim", type=int, default=32, help="dimension "
                     "of the public random projection used for clustering")
    gen.add_argument("--tree-depth", type=int, default=8,
                     help="levels of the LSH prefix tree of DP k-means")
    gen.add_argument("--branch-threshold", type=float,
                     help="noisy count a tree node needs to branch "
                     "(default: 3 x its noise sigma)")
    gen.add_argument("--lloyd-rounds", type=int, default=2,
                     help="DP Lloyd rounds after the tree's centres")
    gen.add_argument("--variance-floor", type=float, default=1e-6,
                     help="smallest variance of a mixture component, as a "
                     "fraction of clip-norm^2 / d")
    gen.add_argument("--vote-filter", action="store_true",
                     help="DP nearest-neighbour vote: each record votes for "
                     "its nearest candidate; the release draws its rows "
                     "(as many as without the vote) from the candidates in "
                     "proportion to the noisy votes")
    gen.add_argument("--vote-threshold", type=float, default=None,
                     help="legacy rule instead: keep each candidate with at "
                     "least this many noisy votes, once (the release "
                     "shrinks as epsilon grows)")
    gen.add_argument("--vote-share", type=float, default=None,
                     help="share of the budget (of mu^2) for the vote in "
                     "the adaptive plan (default: a public rule of epsilon)")
    gen.add_argument("--vote-oversample", type=float, default=6.0,
                     help="candidates generated per wanted sample")
    gen.add_argument("--vote-max-candidates", type=int,
                     help="public cap on vote candidates per class (the "
                     "nearest-neighbour search costs n x candidates x d)")

    add_image_arguments(parser, images_required=False, for_release=True)

    ops = parser.add_argument_group("running (none of these changes the "
                                    "release)")
    ops.add_argument("--block-size", type=int, default=4096,
                     help="rows per numpy block moved between stages")
    ops.add_argument("--split-bytes", type=int, default=SPLIT_BYTES,
                     help="input files are read in byte ranges of this "
                     "size, spread over the workers (default 64 MiB); a "
                     "compressed .npz is read whole")
    ops.add_argument("--materialise-blocks", action="store_true",
                     help="read the input once and keep the blocks in the "
                     "runner between passes (default: every pass re-reads "
                     "the files, so memory does not grow with n)")
    ops.add_argument("--noise-key-location",
                     help="a prefix (gs://...) readable only by the job's "
                     "service account: the launcher writes the run's secret "
                     "noise key there for the workers and deletes it after "
                     "the run, so the key is not in the job graph the "
                     "service stores. Required with DataflowRunner")
    ops.add_argument("--verbose", action="store_true",
                     help="also show Beam's and other libraries' logs, and "
                     "the matched input file names")
    ops.add_argument("--show-row-counts", action="store_true",
                     help="progress lines show the exact rows each pass has "
                     "read (operator diagnostics: exact counts are private "
                     "and NOT differentially private; off by default because "
                     "schedulers forward the console to shared logs)")
    ops.add_argument("--record-timings", action="store_true",
                     help="print the wall times of the run's steps on the "
                     "console (operator diagnostics: they grow with n, so "
                     "they are NOT differentially private and never go "
                     "into the release)")


def spec_from_args(args: argparse.Namespace,
                   beam_argv: Sequence[str] = ()) -> GenerateSpec:
    """The command line's flags as the typed spec of the run (everything
    below the command line takes the spec, never the flags)."""
    image_options = None
    if args.images:
        from dpsynth.pipelines.cli.encode import class_names
        classes = class_names(args.classes)
        image_options = ImageOptions(
            path=args.images, encoder=args.encoder,
            encoder_weights=args.encoder_weights, image_size=args.image_size,
            pixel_scale=args.pixel_scale, resize_mode=args.resize_mode,
            encoder_output_key=args.encoder_output_key,
            encoder_threads=args.encoder_threads, batch_size=args.batch_size,
            l2_normalize=args.l2_normalize,
            bad_images_report=args.bad_images_report,
            classes=tuple(classes) if classes else None,
            layout=args.image_layout, image_feature=args.image_feature,
            label_feature=args.label_feature)
    return GenerateSpec(
        input=InputOptions(
            path=args.input, format=args.input_format,
            embedding_feature=args.embedding_feature,
            label_feature=args.label_feature, non_finite=args.non_finite,
            block_size=args.block_size, split_bytes=args.split_bytes,
            embedding_dim=args.embedding_dim, num_classes=args.num_classes,
            labels=tuple(args.labels) if args.labels else None,
            images=image_options),
        generator=GeneratorOptions(**{
            f.name: getattr(args, f.name)
            for f in dataclasses.fields(GeneratorOptions)}),
        output=OutputOptions(
            path=args.output, overwrite=args.overwrite, run_id=args.run_id,
            rows_per_shard=args.rows_per_shard, format=args.output_format),
        budget=BudgetOptions(
            store=args.budget_store, dataset_id=args.dataset_id,
            lifetime_epsilon=args.lifetime_epsilon,
            lifetime_delta=args.lifetime_delta),
        run=RunOptions(
            beam_args=tuple(beam_argv),
            materialise_blocks=args.materialise_blocks, verbose=args.verbose,
            show_row_counts=args.show_row_counts,
            record_timings=args.record_timings,
            noise_key_location=args.noise_key_location))



DESCRIPTION = ("Generate a differentially private synthetic embedding "
               "release (no flags: the embedded demo). Flags this command "
               "does not define must be Beam pipeline options (--runner, "
               "--direct_num_workers, --project, ...); anything else is "
               "refused before any data is read.")


USAGE = ("dpsynth generate [--input GLOB --num-classes N] [--epsilon E] "
         "[--output DIR] [options] [Beam options]")


def parser() -> argparse.ArgumentParser:
    p = console.Parser(prog="dpsynth generate", description=DESCRIPTION,
                       usage=USAGE)
    add_arguments(p)
    return p


def register(subparsers) -> argparse.ArgumentParser:
    """Adds the `generate` sub-command to the `dpsynth` parser."""
    p = subparsers.add_parser(
        "generate", help="private embeddings -> DP synthetic release "
        "(no flags: embedded demo)", description=DESCRIPTION, usage=USAGE)
    add_arguments(p)
    p.set_defaults(handler=handle, command="generate")
    return p


def handle(args: argparse.Namespace, beam_argv: Sequence[str]) -> int:
    """`dpsynth generate`: runs the job with dpsynth's error policy."""
    console.setup_logging(args.verbose)
    with console.quiet_stderr(args.verbose):
        # Worker processes (--direct_num_workers > 1) are forked from a
        # server started now, so that its imports run beside the ones below
        # (it writes where Beam's workers do: the run's log).
        from dpsynth.pipelines.runners import direct_runner
        direct_runner.start_worker_server_for(beam_argv)
        # Beam and the pipeline load here, after the flags parsed (--help
        # and flag errors answer without them).
        from dpsynth.pipelines import demo
        from dpsynth.pipelines.release import budget_store, release, summary
        from dpsynth.pipelines.runners.options import (ClusterLost, UsageError,
                                                       check_beam_args)
        from dpsynth.pipelines.runners.runner_names import JobServerFailed
        from dpsynth.transforms import io
        from dpsynth.transforms.formats import ImageInputError

        def go() -> int:
            from dpsynth.pipelines import job
            check_beam_args(beam_argv, parser(), "generate")
            spec = spec_from_args(args, beam_argv)
            demo_run = spec.input.path is None and spec.input.images is None
            output = job.run(spec)
            try:
                print(summary.render(output, release.read_manifest(output),
                                     _lifetime(spec)))
                if demo_run:
                    train, test = demo.demo_files()
                    print(demo.utility_line(output, test, train))
            except KeyboardInterrupt:
                raise console.InterruptedAfterPublishing(output) from None
            return 0

        return console.run_command(
            go, "generate", (UsageError, io.InputError, release.ReleaseError,
                             budget_store.BudgetExceeded,
                             budget_store.RunConflict,
                             budget_store.CapConflict,
                             budget_store.LabelRuleConflict, ImageInputError,
                             ClusterLost, JobServerFailed))


def _lifetime(spec: GenerateSpec):
    """(lifetime epsilon spent, pinned cap, dataset id) for the summary."""
    budget = spec.budget
    if budget.store is None:
        return None
    from dpsynth.pipelines.release import budget_store
    cap = budget_store.pinned_cap(budget.store, budget.dataset_id)
    if cap is None:  # the ledger vanished while the run published
        from dpsynth.pipelines.release.release import ReleaseError
        raise ReleaseError(
            f"the release is published, but budget store {budget.store} no "
            f"longer holds the ledger of dataset {budget.dataset_id!r}: "
            "restore it before any other run of this dataset")
    spent = budget_store.lifetime_spent(budget.store, budget.dataset_id,
                                        cap["delta"], spec.generator.accountant)
    return spent, cap["epsilon"], budget.dataset_id


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`generate` alone (``deploy/launch.py``: Airflow, Flex Templates)."""
    def run() -> int:
        args, beam_argv = parser().parse_known_args(argv)
        return handle(args, beam_argv)
    return console.run_stoppable(run, "generate")


if __name__ == "__main__":
    sys.exit(main())
