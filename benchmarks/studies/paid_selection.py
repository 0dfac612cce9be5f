"""Paid structure selection (issue 30): can a DP choice beat the public rule?

Issue 30 asks for a covariance structure within 0.5 points of the best menu
mode on every shape, chosen by a public rule of (eps, delta, d, K, noisy
counts). The covariance sweep (covariance_sweep.md) shows no such rule
exists: shapes with the same public inputs have opposite best modes. The
one way around a public rule is to pay for the choice: spend a share f of
the budget (mu^2) measuring every mode on the private rows, pick the best,
and release the pick with the rest. This study measures that design.

Selection (what a product would run; all of it is charged):
- pilots: each menu mode released at mu sqrt((f - EVAL_SHARE) / 3) (the
  three pilots and the scoring compose to f of mu^2);
- scoring: each pilot's synthetic rows train the probe, which is scored on
  the private fitting rows; the three correct-prediction counts (add/remove
  one record changes each by at most 1: L2 sensitivity sqrt(3)) get
  Gaussian noise of std sqrt(3) / (mu sqrt(EVAL_SHARE));
- release: the mode with the highest noisy count, at mu sqrt(1 - f).
  (The phase-1 counts and centre inside each release are charged twice
  here; their share is 3 % of mu^2, a second-order cost.)

Two ways to measure it:
- ``--estimate``: from covariance_sweep.jsonl alone. Each mode's 3-seed mean
  is interpolated in log mu (extrapolated linearly below eps = 1, floored
  at chance); a pilot's score is its interpolated mean plus the mode's
  seed-to-seed spread and the count noise. Also prints the "oracle" that
  knows the best mode at the reduced budget: the price of the budget alone.
- ``--run``: the design itself on the sweep's shapes (fresh releases,
  probe on each shape's held-out rows), appending to
  benchmark-data/studies/paid_selection.jsonl (resumable); ``--report`` writes
  benchmarks/results/studies/paid_selection.md against the sweep's menu means and the rule.

    python -m benchmarks.studies.paid_selection --estimate
    nice -n 19 env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \\
        python -m benchmarks.studies.paid_selection --run --shares 0.05,0.1
    python -m benchmarks.studies.paid_selection --report
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.studies import covariance_sweep as sweep  # noqa: E402
from benchmarks.studies.study_data import (DATA, RESULTS, Split,  # noqa: E402
                                           append_record)
from dpsynth.dp_ops import adaptive  # noqa: E402
from dpsynth.dp_ops.calibration import gdp_mu  # noqa: E402

LOG = os.path.join(DATA, "paid_selection.jsonl")
REPORT = os.path.join(RESULTS, "paid_selection.md")
MODES = adaptive.MODES
EVAL_SHARE = 0.01  # of mu^2, for the three noisy correct-prediction counts
SHARES = (0.02, 0.05, 0.1, 0.25)
# Shapes whose releases take over ~3 s (d = 1280 with large classes) are
# left to --estimate.
SLOW = {"cifar10-sub", "cifar10-full", "k4-n10000-d1280-own",
        "k10-n5000-d1280-class", "k10-n5000-d1280-own"}


def epsilon_for(mu: float, delta: float = sweep.DELTA) -> float:
    """The epsilon whose GDP calibration gives ``mu`` (bisection; the plan
    then certifies it with dp_accounting, which may shave ~1e-4 off)."""
    lo, hi = 1e-4, 64.0
    for _ in range(80):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if gdp_mu(mid, delta) < mu else (lo, mid)
    return hi


# ------------------------------------------------------------ estimate

class Curves:
    """Each (shape, mode)'s 3-seed mean against log mu, from the sweep."""

    def __init__(self, records: list[dict]):
        self.acc = collections.defaultdict(dict)
        self.mu = collections.defaultdict(dict)
        self.rows = {}
        for r in records:
            if r["mode"] in MODES:
                self.acc[(r["shape"], r["mode"])].setdefault(
                    r["epsilon"], []).append(r["accuracy"])
                self.mu[r["shape"]][r["epsilon"]] = r["mu"]
                self.rows[r["shape"]] = (sum(r["noisy_counts"]),
                                         r["classes"])

    def shapes(self) -> list[str]:
        return sorted(self.mu)

    def at(self, shape: str, mode: str, mu: float) -> float:
        eps = sorted(self.acc[(shape, mode)])
        x = np.log([self.mu[shape][e] for e in eps])
        y = np.array([np.mean(self.acc[(shape, mode)][e]) for e in eps])
        t = math.log(mu)
        if t >= x[0]:
            return float(np.interp(t, x, y))
        slope = (y[1] - y[0]) / (x[1] - x[0])
        return max(float(y[0] + slope * (t - x[0])), 1.0 / self.rows[shape][1])

    def spread(self, shape: str, mode: str) -> float:
        """Seed-to-seed standard deviation, pooled over epsilons."""
        v = [np.var(a, ddof=1) for a in self.acc[(shape, mode)].values()
             if len(a) > 1]
        return math.sqrt(float(np.mean(v)))


def estimate(curves: Curves, share: float, draws: int = 4000,
             seed: int = 0) -> list[dict]:
    """Per (shape, eps): the best mode's mean at full mu, the expected
    accuracy of the paid selection, and the oracle at mu sqrt(1 - share)."""
    rng = np.random.default_rng(seed)
    out = []
    for shape in curves.shapes():
        n, _ = curves.rows[shape]
        for eps, mu in sorted(curves.mu[shape].items()):
            best = max(curves.at(shape, m, mu) for m in MODES)
            pilot_mu = mu * math.sqrt((share - EVAL_SHARE) / 3)
            pilot = np.array([curves.at(shape, m, pilot_mu) for m in MODES])
            count_sd = math.sqrt(3) / (mu * math.sqrt(EVAL_SHARE)) / n
            sd = np.array([math.hypot(curves.spread(shape, m), count_sd)
                           for m in MODES])
            pick = (pilot + rng.normal(size=(draws, 3)) * sd).argmax(axis=1)
            final = np.array([curves.at(shape, m, mu * math.sqrt(1 - share))
                              for m in MODES])
            out.append({"shape": shape, "eps": eps, "best": best,
                        "paid": float(final[pick].mean()),
                        "oracle": float(final.max())})
    return out


def estimate_table(curves: Curves) -> str:
    lines = ["| share f | cells > 0.5 points below the best | the oracle's "
             "| largest gap (points) | summed gap (points) |",
             "|---|---|---|---|---|"]
    for share in SHARES:
        rows = estimate(curves, share)
        gap = np.array([r["best"] - r["paid"] for r in rows])
        oracle = np.array([r["best"] - r["oracle"] for r in rows])
        lines.append(
            f"| {share:g} | {int((gap > sweep.TOLERANCE).sum())} of "
            f"{len(rows)} | {int((oracle > sweep.TOLERANCE).sum())} | "
            f"{gap.max() * 100:.2f} | {gap.sum() * 100:.1f} |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------ runs

def release(split: Split, mode: str, mu: float, seed: int
            ) -> tuple[np.ndarray, np.ndarray, float]:
    """Synthetic (x, y) of ``mode`` at the given mu, and the mu it ran at."""
    from benchmarks import reference
    from dpsynth.dp_ops.config import GeneratorConfig
    from dpsynth.dp_ops.noise import SeededNoise
    cfg = GeneratorConfig(labels=tuple(range(split.classes)),
                          epsilon=epsilon_for(mu), delta=sweep.DELTA,
                          seed=seed)
    _, xs, ys, _, st = reference.generate_adaptive(
        split.x_fit, split.y_fit, cfg, SeededNoise(seed),
        adaptive.RuleConstants(force_mode=mode))
    return xs, ys, dict(st.inputs)["mu"]


def select_and_release(split: Split, mu: float, share: float, seed: int
                       ) -> dict:
    """The paid design on one shape (see the module docstring)."""
    from benchmarks.studies import fast_probe
    rng = np.random.default_rng([seed, 31])
    pilot_mu = mu * math.sqrt((share - EVAL_SHARE) / 3)
    scores = {}
    for i, mode in enumerate(MODES):
        xs, ys, _ = release(split, mode, pilot_mu, 5000 + 10 * seed + i)
        correct = len(split.y_fit) * fast_probe.accuracy(
            xs, ys, split.x_fit, split.y_fit, split.classes)
        scores[mode] = correct + rng.normal() * math.sqrt(3) / (
            mu * math.sqrt(EVAL_SHARE))
    pick = max(MODES, key=scores.get)
    xs, ys, final_mu = release(split, pick, mu * math.sqrt(1 - share),
                               1000 + seed)
    acc = fast_probe.accuracy(xs, ys, split.x_val, split.y_val,
                              split.classes)
    return {"pick": pick, "accuracy": acc, "final_mu": final_mu,
            "pilot_scores": {m: round(s / len(split.y_fit), 4)
                             for m, s in scores.items()}}


def run(names: list[str], shares: list[float], curves: Curves) -> None:
    done = {(r["shape"], r["epsilon"], r["seed"], r["share"])
            for r in load_log()}
    for name in names:
        split = sweep.load_shape(name)
        for share in shares:
            for eps, mu in sorted(curves.mu[name].items()):
                for seed in sweep.SEEDS:
                    if (name, eps, seed, share) in done:
                        continue
                    t = time.time()
                    rec = {"shape": name, "epsilon": eps, "seed": seed,
                           "share": share, "mu": mu,
                           **select_and_release(split, mu, share, seed),
                           "seconds": round(time.time() - t, 1)}
                    append_record(LOG, rec)


def load_log() -> list[dict]:
    return sweep.load_log(LOG)


TITLE = "# Paid structure selection (issue 30)"
NOTES = """\
Generated by `python -m benchmarks.studies.paid_selection --report` (see the
module docstring for the design). Best menu mode and rule: the covariance
sweep's 3-seed means at the full budget (covariance_sweep.jsonl); paid: the
3-seed mean of the design's final release; a cell is one (shape, eps).

## Reading

- **Ruled out.** Paying for the choice is far worse than the public rule:
  at f = 0.05 the paid design is more than 0.5 points below the best mode
  on 59 of 104 cells, the rule on 10; at f = 0.1 on 64. It beats the rule
  on 23 cells, by up to 4.5 points (k2-n300-d64-class eps 1,
  k6-n1500-d1280-own eps 2), and loses up to 11.6 (k30-n300-d128-t eps 2).
- **Why.** The budget alone costs more than the issue's 0.5 points: an
  oracle that knows the best mode at the reduced budget mu sqrt(1 - f)
  already misses 9 cells at f = 0.05, 33 at f = 0.1, 76 at f = 0.25
  (estimate). And the pilots, at mu sqrt((f - 0.01) / 3) (0.12 mu at
  f = 0.05), rank the modes as a much smaller epsilon would: there the
  shared mode wins almost everywhere, so the pilots rarely see what a
  class matrix would gain at the full budget (20 Newsgroups at eps 8:
  shared picked on all 3 seeds, the subspace is best by 0.75), and their
  seed-to-seed noise picks a poor mode on shapes where the modes differ
  by many points.
- The estimate (from the sweep's curves alone) and the runs agree: 61 of
  124 cells estimated at f = 0.05 against 59 of 104 measured; 69 / 124
  against 64 / 104 at f = 0.1.
"""


def report(curves: Curves) -> str:
    """Per shape, eps and share: the 3-seed mean of the paid design against
    the sweep's best menu mode and the public rule (covariance_sweep)."""
    rule = {(r[0], r[1]): r[4] for r in sweep.table(sweep.load_log())}
    runs = collections.defaultdict(list)
    picks = collections.defaultdict(collections.Counter)
    for r in load_log():
        runs[(r["shape"], r["epsilon"], r["share"])].append(r["accuracy"])
        picks[(r["shape"], r["epsilon"], r["share"])][r["pick"]] += 1
    lines = ["| shape | eps | share f | best menu mode | rule | paid | "
             "paid's picks | paid - best | rule - best |",
             "|---|---|---|---|---|---|---|---|---|"]
    summary = collections.defaultdict(lambda: [0, 0, 0, 0])
    for (shape, eps, share), accs in sorted(runs.items()):
        if len(accs) < len(sweep.SEEDS):
            continue
        mu = curves.mu[shape][eps]
        best = max(curves.at(shape, m, mu) for m in MODES)
        paid, ruled = float(np.mean(accs)), rule[(shape, eps)]
        s = summary[share]
        s[0] += 1
        s[1] += best - paid > sweep.TOLERANCE
        s[2] += best - ruled > sweep.TOLERANCE
        s[3] += paid > ruled
        names = ", ".join(f"{m} {c}" for m, c in
                          sorted(picks[(shape, eps, share)].items()))
        lines.append(f"| {shape} | {eps:g} | {share:g} | {best * 100:.2f} | "
                     f"{ruled * 100:.2f} | {paid * 100:.2f} | {names} | "
                     f"{(paid - best) * 100:+.2f} | "
                     f"{(ruled - best) * 100:+.2f} |")
    head = [TITLE, "", NOTES, "## Estimate from the sweep's log (--estimate)",
            "", estimate_table(curves), "## Runs (--run)", "",
            "| share f | cells | paid > 0.5 below best | rule > 0.5 below "
            "best | paid above rule |", "|---|---|---|---|---|"]
    head += [f"| {share:g} | {s[0]} | {s[1]} | {s[2]} | {s[3]} |"
             for share, s in sorted(summary.items())]
    return "\n".join(head + [""] + lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--estimate", action="store_true")
    ap.add_argument("--run", action="store_true")
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--shapes", default="fast",
                    help="comma-separated sweep shapes, or 'fast' (all but "
                         "the slow d = 1280 ones)")
    ap.add_argument("--shares", default="0.05,0.1")
    args = ap.parse_args()
    curves = Curves(sweep.load_log())
    if args.estimate:
        print(estimate_table(curves))
    if args.run:
        names = ([s for s in curves.shapes() if s not in SLOW]
                 if args.shapes == "fast" else args.shapes.split(","))
        run(names, [float(s) for s in args.shares.split(",")], curves)
    if args.report:
        text = report(curves)
        with open(REPORT, "w") as f:
            f.write(text)
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
