"""DP-SGD bars on the selection split (issue 13): tuned linear softmax and
tuned MLP (unaccounted tuning on the validation split, as the papers do),
plus the fixed library-default hyperparameters and the privately tuned
DP-SGD (benchmarks.baselines.dpsgd), on the SAME fit/validation split as the
generator study (benchmarks/studies/study_data.py).

    python benchmarks/studies/dpsgd_bars.py --dataset 20news --epsilons 1,2,4,8

Stage 1 (grid, seed 0) picks per epsilon the best grid point on the
validation split; stage 2 reruns it with seeds 0..S-1. JSON lines go to
benchmark-data/studies/dpsgd_bars-issue13.jsonl.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from benchmarks.studies.study_data import (DATA,  # noqa: E402
                                           append_record, selection_split)

LOG = os.path.join(DATA, "dpsgd_bars-issue13.jsonl")
# (batch, epochs) x learning rate; input scale fixed per model (the
# module's tuned values: 4 linear, 8 MLP)
SCHEDULES = [(512, 5), (2048, 5), (512, 20), (2048, 20)]
LRS = {"linear": [1.0, 4.0, 16.0], "mlp": [0.5, 2.0, 8.0]}


def run(model: str, eps: float, seed: int, split, variant: str = "tuned",
        **hp) -> dict:
    from benchmarks.baselines import make_method
    t = time.time()
    name = {"tuned": "dpsgd", "default": "dpsgd-default",
            "private": "dpsgd-private-tuning"}[variant]
    if model == "linear":
        name = name.replace("dpsgd", "dpsgd-linear", 1)
    m = make_method(name, **hp)
    out = m.fit(split.x_fit, split.y_fit, list(range(split.classes)), eps,
                1e-5, seed=seed, noise_seed=10_000 + seed)
    acc = out.classifier.accuracy(split.x_val, split.y_val)
    return {"accuracy": acc, "seconds": round(time.time() - t, 1),
            "spent_epsilon": out.spent_epsilon,
            "chosen": out.info.get("chosen"), "trials": out.info.get("trials")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="20news")
    ap.add_argument("--models", default="linear,mlp")
    ap.add_argument("--epsilons", default="1,2,4,8")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--schedules", default=None,
                    help="batch:epochs,... (default: the module's grid)")
    ap.add_argument("--lrs", default=None,
                    help="model=lr/lr/...;... e.g. linear=2/4/8;mlp=1/2/4")
    ap.add_argument("--variants", default="tuned",
                    help="tuned (grid on validation, unaccounted), default "
                    "(library defaults), private (Papernot-Steinke)")
    args = ap.parse_args()
    schedules = SCHEDULES
    if args.schedules:
        schedules = [tuple(int(float(v)) for v in s.split(":"))
                     for s in args.schedules.split(",")]
    lrs = dict(LRS)
    if args.lrs:
        for item in args.lrs.split(";"):
            m, _, vals = item.partition("=")
            lrs[m] = [float(v) for v in vals.split("/")]
    split = selection_split(args.dataset)
    variants = args.variants.split(",")
    for variant in [v for v in variants if v != "tuned"]:
        for model in args.models.split(","):
            for eps in [float(e) for e in args.epsilons.split(",")]:
                for seed in range(args.seeds):
                    r = run(model, eps, seed, split, variant)
                    rec = {"dataset": args.dataset, "stage": variant,
                           "model": model, "epsilon": eps, "seed": seed, **r}
                    append_record(LOG, rec)
    if "tuned" not in variants:
        return 0
    for model in args.models.split(","):
        for eps in [float(e) for e in args.epsilons.split(",")]:
            grid = []
            for (batch, epochs), lr in itertools.product(schedules, lrs[model]):
                hp = {"batch_size": batch, "epochs": epochs,
                      "learning_rate": lr}
                r = run(model, eps, 0, split, **hp)
                grid.append((r["accuracy"], hp))
                rec = {"dataset": args.dataset, "stage": "grid",
                       "model": model, "epsilon": eps, "seed": 0, **hp, **r}
                append_record(LOG, rec)
            best = max(grid, key=lambda g: g[0])[1]
            for seed in range(args.seeds):
                r = run(model, eps, seed, split, **best)
                rec = {"dataset": args.dataset, "stage": "best",
                       "model": model, "epsilon": eps, "seed": seed,
                       **best, **r}
                append_record(LOG, rec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
