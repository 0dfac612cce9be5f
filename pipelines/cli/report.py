"""`dpsynth report RELEASE`: the flags and the console of the release
report; the page itself is built by ``dpsynth.pipelines.report_page``."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

from dpsynth.pipelines import report_page

DESCRIPTION = ("Draws a release on one self-contained HTML page (plus its "
               "PNGs), from the release's own files: privacy budget, noisy "
               "class sizes, a 2-D projection, how to read it, its "
               "configuration, and, only with --evaluation, the "
               "`dpsynth evaluate` table (computed on real data: not DP).")


# ------------------------------------------------------------- arguments

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("release", help="release directory (local or gs://)")
    p.add_argument("--output", help="report directory (local; default: "
                   "<release>-report next to a local release, "
                   "./<name>-report for gs://)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing non-empty --output directory")
    p.add_argument("--evaluation", metavar="FILE",
                   help="JSON written by `dpsynth evaluate` for this release, "
                   "to embed its table. Its numbers are computed on the real "
                   "(private) data and are NOT differentially private: the "
                   "page is then marked not to be published. Never looked "
                   "for: without this flag no real-data number appears")
    p.add_argument("--max-points", type=int, default=report_page.MAX_POINTS,
                   help=f"synthetic rows drawn in the 2-D projection "
                   f"(uniform subsample; default {report_page.MAX_POINTS})")
    p.add_argument("--seed", type=int, default=0,
                   help="public seed of the subsample (default 0)")


def register(subparsers) -> argparse.ArgumentParser:
    """Adds `report` to the `dpsynth` sub-commands."""
    p = subparsers.add_parser(
        "report", help="HTML page (and PNGs) describing a release",
        description=DESCRIPTION)
    add_arguments(p)
    p.set_defaults(handler=handle)
    return p


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dpsynth report",
                                description=DESCRIPTION)
    add_arguments(p)
    return p


def handle(args: argparse.Namespace) -> int:
    """`dpsynth report`: returns the exit status."""
    from dpsynth.pipelines.release import release
    from dpsynth.transforms.io import InputError
    output = args.output or report_page.default_output(args.release)
    try:
        if args.max_points < 1:
            raise report_page.ReportError("--max-points must be >= 1")
        report_page.check_output(output, args.overwrite)
        rel = report_page.read_release(args.release)
        evaluation = report_page.find_evaluation(rel, args.evaluation)
        files = report_page.build_report(rel, evaluation, args.max_points,
                                         args.seed)
        # nobody wrote there meanwhile
        report_page.check_output(output, args.overwrite)
        report_page.write_atomically(output, files)
    except (report_page.ReportError, InputError, release.ReleaseError,
            OSError) as err:
        print(f"dpsynth: error: {err}", file=sys.stderr)
        return 2
    print(f"report written to {os.path.join(output, report_page.PAGE)}")
    if evaluation is not None:
        print(f"dpsynth: warning: the page embeds the numbers of "
              f"{evaluation[0]}, {report_page.NOT_DP_EVALUATION}",
              file=sys.stderr)
    reason = report_page.not_private_reason(rel.manifest)
    if reason:
        print(f"dpsynth: warning: this release is NOT differentially "
              f"private: {reason}", file=sys.stderr)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    return handle(parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
