"""Does choosing the MLP's learning rate by synthetic hold-out LOG-LOSS
(instead of accuracy) pick rates that transfer better to real rows?

    python benchmarks/studies/mlp_selection.py --datasets cifar10,20news \
        --epsilons 1,2,4,8 --seeds 0

For each release (dpsynth defaults, made in memory as run_reference does
for "ref:adaptive" in utility_study13.py), the release is split with
stratified_holdout(y, 0.2, seed); for each learning rate of TUNING_GRID the
paper's MLP is trained on the 80 % and scored on the 20 % (accuracy,
log-loss) and on the REAL validation rows of the train file (accuracy).
One JSON line per (dataset, eps, seed, lr) goes to
benchmark-data/studies/mlp_selection.jsonl. Test files are never read.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from benchmarks.studies.study_data import DATA, selection_split  # noqa: E402
from benchmarks.studies.utility_study13 import adaptive_release  # noqa: E402
from dpsynth.models.classifiers import (TUNING_GRID, MLPConfig,  # noqa: E402
                                stratified_holdout, train_mlp)

LOG = os.path.join(DATA, "mlp_selection.jsonl")


def release(split, eps: float, seed: int):
    xs, ys, _, st = adaptive_release(split, eps, seed, {})
    return np.asarray(xs, np.float64), np.asarray(ys), st.name


def run(dataset: str, split, eps: float, seed: int) -> list:
    t = time.time()
    xs, ys, structure = release(split, eps, seed)
    labels = list(range(split.classes))
    tr, va = stratified_holdout(ys, 0.2, seed)
    rows = []
    for point in TUNING_GRID:
        t0 = time.time()
        cfg = dataclasses.replace(MLPConfig(), **point)
        clf = train_mlp(xs[tr], ys[tr], labels, cfg, seed)
        rows.append({
            "dataset": dataset, "epsilon": eps, "seed": seed,
            "lr": cfg.learning_rate, "structure": structure,
            "n_release": int(len(ys)),
            "holdout_accuracy": clf.accuracy(xs[va], ys[va]),
            "holdout_log_loss": clf.log_loss(xs[va], ys[va]),
            "real_val_accuracy": clf.accuracy(split.x_val, split.y_val),
            "real_val_log_loss": clf.log_loss(split.x_val, split.y_val),
            "seconds": round(time.time() - t0, 1),
            "release_seconds": round(t0 - t, 1) if not rows else None})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", default="cifar10,20news")
    ap.add_argument("--epsilons", default="1,2,4,8")
    ap.add_argument("--seeds", default="0")
    args = ap.parse_args()
    os.makedirs(DATA, exist_ok=True)
    for dataset in args.datasets.split(","):
        split = selection_split(dataset)
        for seed in [int(s) for s in args.seeds.split(",")]:
            for eps in [float(e) for e in args.epsilons.split(",")]:
                rows = run(dataset, split, eps, seed)
                with open(LOG, "a") as fh:
                    for r in rows:
                        fh.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
