"""`dpsynth generate`: labelled embeddings -> DP synthetic embedding release.

Run as ``dpsynth generate ...`` or ``python -m dpsynth.pipelines.cli.generate ...``; any
flag this parser does not know is passed to Beam as a pipeline option
(``--runner``, ``--project``, ``--flink_master``...).
"""

from __future__ import annotations

# First: it quiets the libraries' start-up logs before Beam is imported.
from dpsynth.pipelines import console  # noqa: I001  isort:skip

import argparse
import logging
import sys
from typing import Callable, Optional, Sequence

from dpsynth.pipelines.cli.spec_flags import add_flags, spec_values
from dpsynth.pipelines.spec import (BudgetOptions, GenerateSpec, GeneratorOptions,
                            ImageOptions, InputOptions, OutputOptions,
                            RunOptions)

log = logging.getLogger("dpsynth")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """generate's flags, in the order a user needs them: embeddings in and
    the release out first, then the privacy target, the lifetime budget,
    the generator, images (instead of --input) and operator diagnostics.
    Each flag is declared by its spec field (``dpsynth.pipelines.spec``)."""
    from dpsynth.pipelines.cli.image_flags import add_image_arguments
    data = parser.add_argument_group("input (private labelled embeddings)")
    add_flags(data, InputOptions, "path", "num_classes", "labels", "format",
              "embedding_feature", "embedding_columns", "label_feature",
              "embedding_dim", "non_finite")

    out = parser.add_argument_group("output (the release)")
    add_flags(out, OutputOptions, "path", "format", "run_id", "overwrite",
              "rows_per_shard")

    dp = parser.add_argument_group("privacy")
    add_flags(dp, GeneratorOptions, "epsilon", "delta", "allow_large_delta",
              "accountant", "budget_weights")
    dp.add_argument("--plan-only", action="store_true",
                    help="print the plan and stop: the mechanisms, their "
                    "sensitivities and sigmas, the budget split and what "
                    "--budget-store would be charged; reads no data, "
                    "writes and charges nothing")
    add_flags(dp, GeneratorOptions, "noise_seed")

    life = parser.add_argument_group(
        "lifetime budget (every release of the same private data spends again)")
    add_flags(life, BudgetOptions, "store", "dataset_id", "lifetime_epsilon",
              "lifetime_delta")

    gen = parser.add_argument_group("generator")
    add_flags(gen, GeneratorOptions, "covariance", "clusters", "clip_norm",
              "normalize", "center", "covariance_rank", "samples_per_class",
              "seed", "cluster_dim", "tree_depth", "branch_threshold",
              "lloyd_rounds", "variance_floor", "vote_filter",
              "vote_threshold", "vote_share", "vote_oversample",
              "vote_max_candidates")

    add_image_arguments(parser, images_required=False, for_release=True)

    ops = parser.add_argument_group("running (none of these changes the "
                                    "release)")
    add_flags(ops, InputOptions, "block_size", "split_bytes")
    add_flags(ops, RunOptions, "materialise_blocks", "noise_key_location",
              "verbose", "show_row_counts", "record_timings")


def spec_from_args(args: argparse.Namespace,
                   beam_argv: Sequence[str] = ()) -> GenerateSpec:
    """The command line's flags as the typed spec of the run (everything
    below the command line takes the spec, never the flags)."""
    image_options = None
    if args.images:  # generate's --label-feature is the images' too
        image_options = spec_values(args, ImageOptions)
    return GenerateSpec(
        input=spec_values(args, InputOptions, images=image_options),
        generator=spec_values(args, GeneratorOptions),
        output=spec_values(args, OutputOptions),
        budget=spec_values(args, BudgetOptions),
        run=spec_values(args, RunOptions, beam_args=tuple(beam_argv)))


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
    from dpsynth.pipelines.cli import early_checks
    listed = not (args.images or args.plan_only)  # a plan lists no file
    refusal = early_checks.problem(  # before Beam's 2-5 s of imports
        parser(), beam_argv, "generate", args.input if listed else None)
    if refusal:
        return console.fail(refusal)
    console.setup_logging(args.verbose)
    if args.plan_only:
        return _plan_only(lambda: spec_from_args(args, beam_argv),
                          args.verbose, beam_argv)
    with console.quiet_stderr(args.verbose):
        # Worker processes (--direct_num_workers > 1) are forked from a
        # server started now, so that its imports run beside the ones below
        # (it writes where Beam's workers do: the run's log).
        from dpsynth.pipelines.runners import direct_runner
        direct_runner.start_worker_server_for(beam_argv)
        # Beam and the pipeline load here, after the flags parsed (--help
        # and flag errors answer without them).
        from dpsynth.pipelines import demo
        from dpsynth.pipelines.budget import store as budget_store
        from dpsynth.pipelines.budget.record import LabelRuleConflict
        from dpsynth.pipelines.release import release, summary
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
                             LabelRuleConflict, ImageInputError,
                             ClusterLost, JobServerFailed))


def _plan_only(make_spec: Callable[[], GenerateSpec], verbose: bool,
               beam_argv: Sequence[str]) -> int:
    """`generate --plan-only`: prints ``job_plan.plan_only``'s plan of the spec
    ``make_spec`` builds (inside the one-line error policy)."""
    with console.quiet_stderr(verbose):
        from dpsynth.pipelines import job_plan
        from dpsynth.pipelines.budget import store as budget_store
        from dpsynth.pipelines.runners.options import UsageError, check_beam_args

        def go() -> int:
            check_beam_args(beam_argv, parser(), "generate")
            print(render_plan(job_plan.plan_only(make_spec())))
            return 0

        return console.run_command(go, "generate", (
            ValueError, UsageError, budget_store.CapConflict))


def render_plan(plan: dict) -> str:
    """The plan as the console shows it (``job_plan.plan_only``'s document)."""
    lines = [f"plan of the release (no data read, nothing charged): epsilon "
             f"{plan['epsilon']:g}, delta {plan['delta']:g}, accountant "
             f"{plan['accountant']}, {plan['classes']} classes, covariance "
             f"{plan['covariance']}"]
    if plan["adaptive"]:
        lines.append("  adaptive: phase 1 (centre, noisy class counts) runs "
                     "first; the public rule then picks the structure from "
                     "the noisy counts. Shown: phase 1 + the costliest "
                     "structure, what the budget store is charged")
    vote = plan.get("vote_rule")
    if vote is not None:
        lines.append(
            f"  vote: {'runs' if vote['ran'] else 'skipped'} (noise sigma "
            f"{vote['sigma']:.2f} against a candidate's expected "
            f"{vote['votes_per_candidate']:.2f} votes; it runs from "
            f"{vote['min_snr']:g} sigma, or with --vote-share)")
    split = ", ".join(f"{stage} {share:.1%}" for stage, share
                      in plan["budget_split"].items())
    lines.append(f"budget split (share of one class's privacy loss): {split}")
    lines.append("mechanisms (Gaussian; sensitivity under add/remove of one "
                 "record, sigma per coordinate):")
    for row in _mechanism_rows(plan["mechanisms"]):
        lines.append("  " + row)
    lines.append(f"epsilon charged: {plan['epsilon_charged']:.4g} at delta "
                 f"{plan['delta']:g}")
    store = plan["store"]
    if store is not None:
        cap = ("no cap pinned yet and no --lifetime-epsilon"
               if store["lifetime_cap"] is None
               else f"cap {store['lifetime_cap']:g}")
        verdict = "fits" if store["fits"] else "REFUSED: over the cap"
        lines.append(f"budget store {store['store']}, dataset "
                     f"{store['dataset_id']!r}: lifetime epsilon "
                     f"{store['spent']:.4g} spent, {store['after']:.4g} after "
                     f"this run at delta {store['lifetime_delta']:g}; {cap} "
                     f"({verdict})")
    return "\n".join(lines)


def _mechanism_rows(mechanisms: list) -> list:
    """One row per mechanism, the classes' identical ones as one
    (``class=*``, with how many classes)."""
    import re
    rows: dict = {}
    for m in mechanisms:
        name = re.sub(r"^class=[^/]+/", "class=*/", m["name"])
        key = (name, m["stage"], m["sensitivity"], m["sigma"], m["count"],
               m["sampling_probability"])
        rows[key] = rows.get(key, 0) + 1
    out = []
    for (name, stage, sens, sigma, count, rate), times in rows.items():
        each = f" x {times} classes" if name.startswith("class=*") else ""
        repeat = f", applied {count} times" if count > 1 else ""
        sampled = f", sampled at {rate:g}" if rate < 1 else ""
        out.append(f"{name}{each}: stage {stage}, sensitivity {sens:.4g}, "
                   f"sigma {sigma:.4g} (sigma/sensitivity "
                   f"{sigma / sens:.4g}){repeat}{sampled}")
    return out


def _lifetime(spec: GenerateSpec):
    """(lifetime epsilon spent, pinned cap, dataset id) for the summary."""
    budget = spec.budget
    if budget.store is None:
        return None
    from dpsynth.pipelines.budget import store as budget_store
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
