"""Utility study, issue 13: which DP generator design matches DP-SGD on both
shared datasets? Selection on validation splits of the TRAIN files only.

    python benchmarks/studies/utility_study13.py --dataset 20news --recipes A,B \
        --epsilons 1,2,4,8 --seeds 0,1,2

Every run appends one JSON line to
benchmark-data/studies/utility_study-issue13.jsonl (dataset, recipe, epsilon, seed, validation accuracy).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from benchmarks.studies.study13_engine import Engine, Recipe  # noqa: E402
from benchmarks.studies.study_data import DATA, selection_split  # noqa: E402

COV = 0.5968
RECIPES = {
    "defaults": Recipe(),
    "shared full": Recipe(form="full"),
    "shared full ridge1": Recipe(form="full", ridge=1.0),
    "per-class lowrank": Recipe(cov_global=0.0, cov_class=COV,
                                shared_from="pooled", per_class="raw"),
    "per-class full": Recipe(cov_global=0.0, cov_class=COV,
                             shared_from="pooled", per_class="raw", form="full"),
    "pooled js lowrank": Recipe(cov_global=0.0, cov_class=COV,
                                shared_from="pooled", per_class="js"),
    "pooled js full": Recipe(cov_global=0.0, cov_class=COV,
                             shared_from="pooled", per_class="js", form="full"),
    "hier js lowrank": Recipe(cov_global=COV / 2, cov_class=COV / 2,
                              shared_from="combined", per_class="js"),
    "hier js full": Recipe(cov_global=COV / 2, cov_class=COV / 2,
                           shared_from="combined", per_class="js", form="full"),
}
LOG = os.path.join(DATA, "utility_study-issue13.jsonl")
INF = float("inf")
FIXED_SUM = {"sum_min": 0.398, "sum_max": 0.398, "sum_levels": 1}
# Runs of the dp_ops implementation itself (benchmarks.reference):
# "ref:" = generate_adaptive with these RuleConstants overrides,
# "old:" = the issue-8 generator (reference.generate) with these
# GeneratorConfig overrides.
REF = {
    "ref:adaptive": {},
    "ref:adaptive, no class subspace": {"subspace_min_signal": INF},
    "ref:adaptive, fixed sum share": dict(FIXED_SUM),
    "ref:adaptive, fixed sum share, no class subspace": dict(
        FIXED_SUM, subspace_min_signal=INF),
    "ref:adaptive, spectral deviation": {"deviation": "spectral"},
    "ref:adaptive, class subspace always": {"subspace_min_signal": 0.0},
    "ref:adaptive, no per-class mode": {"per_class_min_signal": INF},
    "ref:adaptive, class modes for 2 classes": {"class_modes_min_classes": 2},
    "ref:adaptive, shared forced": {"per_class_min_signal": INF,
                                    "subspace_min_signal": INF},
    # shared at every epsilon, eps=inf included (where the signal is inf
    # and "shared forced" still picks per-class)
    "ref:adaptive, shared always": {"class_modes_min_classes": 10 ** 9},
    # per-class mode: each class's d x d covariance shrunk towards the
    # pooled one by its noise edge; subspace mode: the same for the blocks
    "ref:adaptive, spectral class deviation": {"class_deviation": "spectral",
                                               "deviation": "spectral"},
    "old:issue-8 defaults": {},
    "old:issue-8 per-class": {"covariance": "per-class"},
    # more components a class (DP k-means: LSH prefix tree + Lloyd rounds,
    # all in the ledger), one shared within-cluster covariance
    "old:issue-8 defaults, k=2": {"clusters": 2},
    "old:issue-8 defaults, k=4": {"clusters": 4},
    "old:issue-8 defaults, k=8": {"clusters": 8},
}


def adaptive_release(split, eps: float, seed: int, overrides: dict):
    """(rows, labels, ledger, structure) of the adaptive plan on the fit
    part, RuleConstants(**overrides), noise SeededNoise(1000 + seed)."""
    from benchmarks.studies import class_deviations
    from dpsynth.dp_ops.config import GeneratorConfig
    from dpsynth.dp_ops.noise import SeededNoise
    cfg = GeneratorConfig(labels=tuple(range(split.classes)), epsilon=eps,
                          seed=seed)
    # overrides may name a study deviation (class_deviations.split)
    _, xs, ys, ledger, st = class_deviations.generate(
        split.x_fit, split.y_fit, cfg, SeededNoise(1000 + seed), overrides)
    return xs, ys, ledger, st


def run_reference(name: str, eps: float, seed: int, split,
                  overrides: dict, mlp: bool = False) -> dict:
    """One run of the dp_ops reference on the fit part, probed on val."""
    import time
    import numpy as np
    from benchmarks.studies.study_data import probe
    from dpsynth.dp_ops import plan
    from benchmarks import reference
    from dpsynth.dp_ops.config import GeneratorConfig
    from dpsynth.dp_ops.noise import SeededNoise
    t = time.time()
    labels = tuple(range(split.classes))
    noise = SeededNoise(1000 + seed)
    info = {}
    if name.startswith("ref:"):
        xs, ys, ledger, st = adaptive_release(split, eps, seed, overrides)
        info = {"structure": st.name, "sum_share": round(st.sum_share, 4),
                "class_share": round(st.class_share, 4)}
    else:
        cfg = GeneratorConfig(labels=labels, epsilon=eps, seed=seed,
                              **overrides)
        ledger = plan.make_ledger(cfg)
        _, xs, ys = reference.generate(split.x_fit, split.y_fit, cfg, ledger,
                                       noise)
    info["spent_epsilon"] = ledger.spent_epsilon()
    acc = probe(np.asarray(xs), np.asarray(ys), split)
    out = {"accuracy": acc, "seconds": round(time.time() - t, 1),
           "info": info}
    if mlp:  # the paper's MLP trained on the release, same validation rows
        from dpsynth.models.classifiers import MLPConfig, train_mlp
        clf = train_mlp(np.asarray(xs), np.asarray(ys), list(labels),
                        MLPConfig(), seed)
        out["mlp_accuracy"] = clf.accuracy(split.x_val, split.y_val)
        out["mlp_synthetic_holdout"] = synthetic_holdout(
            np.asarray(xs), np.asarray(ys), list(labels), seed)
        # the same hold-out for the linear probe: if it is near 1 too, the
        # synthetic classes are separable linearly (by their means)
        out["probe_synthetic_holdout"] = synthetic_holdout(
            np.asarray(xs), np.asarray(ys), list(labels), seed, linear=True)
        out["seconds_with_mlp"] = round(time.time() - t, 1)
    return out


def synthetic_holdout(xs, ys, labels, seed: int, fraction: float = 0.2,
                      linear: bool = False) -> float:
    """The MLP's (``linear``: the logistic probe's) accuracy on a
    stratified ``fraction`` of the synthetic rows, trained on the rest
    (near 1 while real validation accuracy is far lower: the synthetic
    classes are separable by something real data lacks)."""
    import numpy as np
    from dpsynth.models.classifiers import MLPConfig, train_mlp
    rng = np.random.default_rng(seed)
    held = np.zeros(len(ys), bool)
    for c in labels:
        idx = np.flatnonzero(ys == c)
        held[rng.permutation(idx)[:int(round(len(idx) * fraction))]] = True
    if linear:
        from benchmarks.studies.study_data import Split, probe
        part = Split("synthetic-holdout", xs[~held], ys[~held], xs[held],
                     ys[held], len(labels))
        return probe(xs[~held], ys[~held], part)
    clf = train_mlp(xs[~held], ys[~held], labels, MLPConfig(), seed)
    return clf.accuracy(xs[held], ys[held])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="20news")
    ap.add_argument("--recipes", default=",".join(RECIPES))
    ap.add_argument("--epsilons", default="1,2,4,8")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--tag", default="")
    ap.add_argument("--mlp", action="store_true",
                    help="also train the paper's MLP on ref:/old: releases")
    ap.add_argument("--set", action="append", default=[],
                    help="NAME:field=value,... defines a recipe from defaults")
    args = ap.parse_args()
    recipes = dict(RECIPES)
    for spec in args.set:
        name, _, fields = spec.partition(":")
        kw = {}
        for item in fields.split(","):
            f, _, v = item.partition("=")
            kw[f] = v if f in ("shared_from", "per_class", "form", "exact", "mean_denoise", "dev_shrink") else float(v)
            if f in ("rank", "subspace", "pe_rounds", "pe_candidates"):
                kw[f] = int(float(v))
        recipes[name] = Recipe(**kw)
    names = [n.strip() for n in args.recipes.split(
        ";" if ";" in args.recipes else ",") if n.strip()]
    split = selection_split(args.dataset)
    engine = Engine(split)
    os.makedirs(DATA, exist_ok=True)
    for seed in [int(s) for s in args.seeds.split(",")]:
        for eps in [float(e) for e in args.epsilons.split(",")]:
            for name in names:
                if name in REF:
                    out = run_reference(name, eps, seed, split, REF[name],
                                        args.mlp)
                    config = REF[name]
                else:
                    r = recipes[name]
                    out = engine.run(eps, seed, r)
                    config = dataclasses.asdict(r)
                rec = {"dataset": args.dataset, "recipe": name, "epsilon": eps,
                       "seed": seed, "tag": args.tag, **out,
                       "config": config}
                print(json.dumps({k: v for k, v in rec.items() if k != "config"}),
                      flush=True)
                with open(LOG, "a") as fh:
                    fh.write(json.dumps(rec) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
