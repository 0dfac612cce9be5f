"""`dpsynth evaluate`: utility of a synthetic release, scored on real data.

Protocol (Zhou et al. 2025, arXiv 2506.16661): train the paper's two-layer
MLP and a logistic-regression probe on the synthetic rows (cut to the real
train size), score them on the real test set, over N seeds (mean +- sample
std). Next to them: the non-private ceiling (the same models trained on the
real train set) and per-class distribution metrics between real train and
synthetic rows (Fréchet distance, k-NN precision/recall, distance to the
closest record against a real holdout).

--protocol quick (the default) trains each model once (1 seed): minutes on
CIFAR-10-size data, about 10 s of CPU on the demo. --protocol full is the paper's:
3 seeds, mean and std. Progress goes to stderr, one line per trained model
and seed (TensorFlow's start-up lines go to a log file; --verbose shows them).

The demo: a release made by `dpsynth generate` without --input is scored on
the embedded demo's split with no --real-* flags (or pass --demo): the
digits bundled with scikit-learn (1,797 8x8 images, 64 pixels / 16); a fixed
permutation (seed 0) puts 1,437 rows (80 %) in the train file the release is
made from and 360 (20 %) in the held-out test file, written once to your
cache folder (~/.cache/dpsynth-demo/digits-train.npz and digits-test.npz,
or under $XDG_CACHE_HOME). There the logistic probe uses generate's utility-line
settings (C=1, all synthetic rows), so both commands print the same numbers.

Real rows get the release's public per-record transform (``normalize``
then, for an uncentred release, clipping to ``clip_norm``; from the
manifest's config) before anything else.

PRIVACY: the ceiling and the distribution metrics read the real training
data and are NOT differentially private. The report is for the data owner;
do not publish it with the release.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Optional, Sequence

from dpsynth.models import classifiers
from dpsynth.pipelines import console, evaluation
from dpsynth.pipelines.cli.spec_flags import add_flags, spec_values
from dpsynth.pipelines.help_format import DefaultsHelpFormatter
from dpsynth.pipelines.spec import EvaluateSpec, MLPOptions


# ------------------------------------------------------------- arguments

def add_arguments(p: argparse.ArgumentParser) -> None:
    """evaluate's flags, as ``EvaluateSpec``'s and ``MLPOptions``' fields
    declare them (``dpsynth.pipelines.spec``)."""
    data = p.add_argument_group("data")
    add_flags(data, EvaluateSpec, "synthetic", "real_train", "real_test",
              "demo", "real_holdout", "input_format", "embedding_feature",
              "label_feature", "normalize", "labels")

    proto = p.add_argument_group("protocol")
    add_flags(proto, EvaluateSpec, "protocol", "seeds", "models",
              "size_policy", "ceiling", "distribution", "metrics_max_rows",
              "knn_k")

    mlp = p.add_argument_group("MLP (paper App. C.3 defaults)")
    add_flags(mlp, MLPOptions, "hidden", "epochs", "batch_size",
              "learning_rate", "momentum", "dropout", "label_smoothing",
              "weight_decay", "batch_norm", "cosine_decay")
    add_flags(p, EvaluateSpec, "logreg_c", "verbose", "output", "overwrite")


def spec_from_args(args: argparse.Namespace) -> EvaluateSpec:
    """The command line's flags as the typed spec of the run (everything
    below the command line takes the spec, never the flags). Raises
    ValueError for a bad --models or --labels."""
    spec = spec_values(args, EvaluateSpec, models=None,
                       mlp=spec_values(args, MLPOptions))
    # --models is read by the evaluation, which knows the trainers.
    return dataclasses.replace(spec, models=(
        None if args.models is None
        else tuple(evaluation.parse_models(args.models))))


class Progress:
    """One line per step on stderr, with the time since the command started."""

    def __init__(self, stream=None) -> None:
        self.start = time.time()
        self.stream = stream

    def __call__(self, message: str) -> None:
        elapsed = int(time.time() - self.start)
        print(f"dpsynth evaluate: {message} [{elapsed // 60}:{elapsed % 60:02d} "
              f"elapsed]", file=self.stream or sys.stderr, flush=True)


# ---------------------------------------------------------------- output

def _f(value: Optional[float], digits: int = 4) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def format_table(report: dict) -> str:
    """The console summary: the accuracy table, then one line per model and
    per metric saying what it is and how to read it."""
    syn = report["synthetic_trained"]
    ceil = report.get("real_trained_ceiling", {})
    proto = report["protocol"]
    seeds = len(proto["seeds"])
    what = (f"mean ± std over {seeds} seeds" if seeds > 1 else
            "1 seed; --protocol full for mean ± std over 3")

    def cell(res: dict) -> str:
        if seeds == 1:
            return f"{res['mean']:.4f}"
        return f"{res['mean']:.4f} ± {res['std']:.4f}"
    lines = [f"{'model':<8} {'trained on synthetic':>24} {'real-data ceiling':>20}"
             f"   (accuracy on the {proto['rows']['real_test']} real test "
             f"rows, {what})"]
    for model, res in syn.items():
        left = ("error: " + res["error"]) if "error" in res else cell(res)
        right = cell(ceil[model]) if model in ceil else "-"
        lines.append(f"{model:<8} {left:>24} {right:>20}")
    lines += [f"  {line}" for line in model_notes(report)]
    dist = report.get("distribution")
    if dist:
        lines.append("distribution of synthetic vs real train rows, mean over "
                     "classes [real test rows vs real train, for scale]:")
        lines += [f"  {line}" for line in metric_notes(dist)]
    lines.append("note: " + evaluation.PRIVACY_NOTE)
    return "\n".join(lines)


def model_notes(report: dict) -> list[str]:
    """One line per model: its settings, in words."""
    proto = report["protocol"]
    notes = []
    if "mlp" in proto["models"]:
        mlp = proto["mlp"]
        used = proto.get("mlp_learning_rate_used", {})
        rate = used.get("real_train", mlp["learning_rate"])
        steps = evaluation.sgd_steps(proto["rows"]["real_train"],
                                     classifiers.MLPConfig(**mlp))
        why = ("" if rate == mlp["learning_rate"] else
               f" (the paper's {mlp['learning_rate']:g} raised for this "
               f"small set's {steps}"
               f" SGD steps; see --mlp-lr)")
        notes.append(f"mlp: the paper's two-layer MLP ({mlp['hidden']} hidden "
                     f"units), {mlp['epochs']} epochs, batch "
                     f"{mlp['batch_size']}, learning rate {rate:.3g}{why}")
    if "logreg" in proto["models"]:
        c = proto["logreg"]["C"]
        demo = (" (the demo: generate's utility-line settings, so the two "
                "commands print the same numbers)"
                if report.get("real", {}).get("demo")
                and c == evaluation.DEMO_LOGREG_C
                else "")
        notes.append(f"logreg: standardised features + logistic regression, "
                     f"C={c:g} (--logreg-c){demo}")
    return notes


def metric_notes(dist: dict) -> list[str]:
    """One line per distribution metric: value, reference, meaning."""
    m, ref = dist["mean"], dist.get("real_test_reference", {})
    k = dist.get("k", 3)

    def pair(key: str) -> str:
        return f"{_f(m[key])} [{_f(ref.get(key))}]"
    lines = [
        f"Fréchet distance {pair('frechet')}: between Gaussian fits (mean, "
        f"covariance) of the two sets; 0 = same, lower is better",
        f"k-NN precision {pair('precision')}: share of synthetic rows inside "
        f"the real rows' neighbourhoods (radius: distance to the {k}rd "
        f"nearest real row): do they look real?",
        f"k-NN recall {pair('recall')}: share of real rows inside the "
        f"synthetic rows' neighbourhoods: do they cover the real variety?"]
    if (m["precision"] is not None and m["recall"] is not None
            and ref.get("precision") and m["precision"] < 0.5 * ref["precision"]
            and m["recall"] >= 0.5 * (ref.get("recall") or 0)):
        lines.append("  low precision, fair recall: the synthetic rows are "
                     "spread wider than the real ones (DP noise in each "
                     "class's covariance blurs it; the rows still cover the "
                     "class); classifiers can still learn from them")
    if m.get("dcr_share_below_holdout_p05") is not None:
        lines.append(
            f"DCR (distance to the closest real train row; a memorisation "
            f"check): {_f(m['dcr_share_below_holdout_p05'], 3)} of synthetic "
            f"rows are closer than the closest 5 % of real test rows "
            f"(~0.05 without copying, 1 = copies); "
            f"{_f(m['dcr_share_closer_to_train'], 3)} nearer to train than "
            f"to test (~0.5); exact copies {m['dcr_exact_copies']}")
    return lines


def handle(args: argparse.Namespace) -> int:
    """CLI entry: returns the exit status. TensorFlow's C++ start-up lines
    go to a log file (kept only on failure) unless --verbose."""
    with console.quiet_stderr(getattr(args, "verbose", False)):
        from dpsynth.pipelines.release import release
        from dpsynth.transforms.io import InputError
        progress = Progress()
        try:
            spec = spec_from_args(args)
            report = evaluation.run(spec, progress)
        except (ValueError, InputError, release.ReleaseError) as err:
            print(f"dpsynth: error: {err}", file=sys.stderr)
            return 2
        print(format_table(report))
        print(f"report written to {evaluation.output_path(spec)}")
        return 0


def _description() -> str:
    """The module docstring's first paragraphs: what it does, the
    protocols, the demo's split."""
    return "\n\n".join(__doc__.split("\n\n")[:4])


def register(subparsers) -> argparse.ArgumentParser:
    """Adds `evaluate` to the `dpsynth` sub-commands."""
    p = subparsers.add_parser(
        "evaluate", help="score a synthetic release on real held-out data",
        description=_description(), formatter_class=DefaultsHelpFormatter)
    add_arguments(p)
    p.set_defaults(handler=handle)
    return p


def parser() -> argparse.ArgumentParser:
    p = console.Parser(prog="dpsynth evaluate", description=_description(),
                       formatter_class=DefaultsHelpFormatter)
    add_arguments(p)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    return handle(parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
