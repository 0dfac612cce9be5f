"""Issue 74: the vote stage against epsilon (default, legacy filter, resample).

Makes releases with the in-memory reference (``dp_ops.reference``, the
numpy twin of the Beam job, secure noise) and scores each with the probe of
the issue: StandardScaler + LogisticRegression(C=0.001) trained on the
release, scored on real rows (unit-normalised, as the manifest says).

Variants (``--variants``):
  default   ``dpsynth generate``'s default: the adaptive plan, no vote
  legacy    the old ``--vote-filter``: fixed "shared" plan, vote 0.1 of the
            weights, keep candidates with >= 6 noisy votes
  resample  the resampling vote, forced (``--vote-filter --vote-share
            0.05``): the adaptive plan with the vote's share; rows drawn in
            proportion to the clipped noisy votes
  asked     what ``--vote-filter`` runs: the signal rule
            (``adaptive.resolve_vote``) first, then resample or the plain
            release
  resample:share=0.05,over=2  the same with overrides (tuning)
  mixture   the adaptive plan + a mixture per class (issue 74 item 2,
            benchmarks/studies/components.py); overrides as
            mixture:share=0.25,c=4,kmax=8,scale=1,sub=1,proj=0,pool=0

``--split val`` (tuning): the release is made from 80% of the train file and
scored on the other 20% (a stratified split, public seed); ``--split test``
(the final table): made from the whole train file, scored on the test file.
``--train-rows N``: a stratified subset of the train rows (documented in
the results). One JSON line per run goes to ``--out`` (appended; reruns of
a done cell are skipped), and ``--table`` writes the markdown summary.

    python -m benchmarks.studies.vote_resample --dataset 20news-minilm \
        --split test --seeds 0 1 2 --epsilons 1 2 4 8 \
        --variants default legacy resample --out results.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from dpsynth.dp_ops import adaptive, clipping, plan
from benchmarks import reference
from benchmarks.studies import components
from benchmarks.studies.study_data import SHARED as DATA
from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.dp_ops.noise import make_noise_source
from dpsynth.models import classifiers

DELTA = 1e-5
LEGACY_THRESHOLD = 6.0
COMPONENTS: dict = {}  # variant -> its last release's k per class


def load(dataset: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    with np.load(os.path.join(DATA, dataset, f"{split}.npz")) as z:
        return (z["embeddings"].astype(np.float64),
                z["labels"].astype(np.int64))


def stratified(y: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """A stratified boolean selection of ``fraction`` of the rows."""
    rng = np.random.default_rng([seed, 0x74])
    pick = np.zeros(len(y), bool)
    for label in np.unique(y):
        idx = np.flatnonzero(y == label)
        pick[rng.choice(idx, int(round(fraction * len(idx))),
                        replace=False)] = True
    return pick


def data(args) -> tuple:
    """(x_private, y_private, x_eval, y_eval)."""
    x, y = load(args.dataset, "train")
    if args.train_rows and args.train_rows < len(y):
        keep = stratified(y, args.train_rows / len(y), 1)
        x, y = x[keep], y[keep]
    if args.split == "val":
        fit = stratified(y, 0.8, 0)
        return x[fit], y[fit], x[~fit], y[~fit]
    xt, yt = load(args.dataset, "test")
    return x, y, xt, yt


def parse_variant(text: str) -> tuple[str, dict]:
    name, _, rest = text.partition(":")
    keys = {"share": "vote_share", "over": "vote_oversample"}
    extra = {}
    for item in filter(None, rest.split(",")):
        k, v = item.split("=")
        if name == "mixture":
            extra[k] = float(v)
        else:
            extra[keys[k]] = float(v)
    return name, extra


def release(variant: str, x, y, labels, epsilon: float, seed: int,
            paired: bool = False):
    """(synthetic x, y, ledger) of one variant. ``paired``: every variant
    of a seed draws its noise from the same seeded stream (a study-only
    key, 1000 + seed), so identical algorithms give identical releases
    and the seeds' spread cancels in the differences; else secure noise."""
    name, extra = parse_variant(variant)
    base = dict(labels=tuple(labels), epsilon=epsilon, delta=DELTA,
                seed=seed)
    noise = make_noise_source(1000 + seed if paired else None)
    if name == "legacy":
        cfg = GeneratorConfig(**base, covariance="shared", vote_filter=True,
                              vote_threshold=LEGACY_THRESHOLD)
        ledger = plan.make_ledger(cfg)
        _, xs, ys = reference.generate(x, y, cfg, ledger, noise)
        return xs, ys, ledger
    if name == "mixture":
        keys = {"share": "share", "c": "c", "kmax": "kmax",
                "scale": "scale", "sub": "subtract", "proj": "proj",
                "pool": "pool"}
        kw = {keys[k]: v for k, v in extra.items()}
        for key in ("kmax", "proj"):
            if key in kw:
                kw[key] = int(kw[key])
        for key in ("subtract", "pool"):
            if key in kw:
                kw[key] = bool(kw[key])
        cfg = GeneratorConfig(**base, covariance="auto")
        *_, xs, ys, ledger, _, ks = components.generate(
            x, y, cfg, noise, components.ComponentConstants(**kw))
        COMPONENTS[variant] = ks
        return xs, ys, ledger
    cfg = GeneratorConfig(**base, covariance="auto",
                          vote_filter=(name in ("resample", "asked")),
                          **extra)
    if name == "asked":  # what `--vote-filter` runs: the signal rule first
        cfg, _ = adaptive.resolve_vote(cfg, x.shape[1],
                                       adaptive.constants_for(cfg))
    _, xs, ys, ledger, _ = reference.generate_adaptive(x, y, cfg, noise)
    return xs, ys, ledger


def probe(xs, ys, x_eval, y_eval, labels, seed: int) -> float:
    clf = classifiers.train_logreg(xs, ys, labels,
                                   classifiers.LogRegConfig(C=0.001), seed)
    return clf.accuracy(clipping.normalize_rows(x_eval, "unit"), y_eval)


def run(args) -> None:
    x, y, x_eval, y_eval = data(args)
    labels = sorted(np.unique(y).tolist())
    done = set()
    if os.path.exists(args.out):
        with open(args.out) as f:
            done = {(r["variant"], r["epsilon"], r["seed"])
                    for r in map(json.loads, f)}
    for epsilon in args.epsilons:
        for seed in args.seeds:
            for variant in args.variants:
                if (variant, epsilon, seed) in done:
                    continue
                t = time.time()
                xs, ys, ledger = release(variant, x, y, labels, epsilon,
                                         seed, args.paired)
                made = time.time() - t
                acc = probe(xs, ys, x_eval, y_eval, labels, seed)
                vote = [m for m in ledger.mechanisms if "/vote/" in m.name]
                rec = {"dataset": args.dataset, "split": args.split,
                       "paired": args.paired,
                       "train_rows": int(len(y)), "variant": variant,
                       "epsilon": epsilon, "seed": seed,
                       "rows": int(len(ys)), "probe": round(100 * acc, 2),
                       "spent_epsilon": round(ledger.spent_epsilon(), 4)
                       if hasattr(ledger, "spent_epsilon") else None,
                       "vote_sigma": vote[0].sigma if vote else None,
                       "components": COMPONENTS.pop(variant, None),
                       "release_s": round(made, 1),
                       "total_s": round(time.time() - t, 1)}
                print(json.dumps(rec), flush=True)
                with open(args.out, "a") as f:
                    f.write(json.dumps(rec) + "\n")


def table(paths: list[str]) -> str:
    recs = [json.loads(line) for p in paths for line in open(p)]
    out = []
    for ds in sorted({r["dataset"] for r in recs}):
        sub = [r for r in recs if r["dataset"] == ds]
        variants = list(dict.fromkeys(r["variant"] for r in sub))
        eps = sorted({r["epsilon"] for r in sub})
        n = sub[0]["train_rows"]
        out += [f"### {ds} ({sub[0]['split']} split, {n} private rows)", "",
                "| epsilon | " + " | ".join(
                    f"{v} (rows, probe %)" for v in variants) + " |",
                "|---" * (len(variants) + 1) + "|"]
        for e in eps:
            cells = []
            for v in variants:
                rs = [r for r in sub if r["variant"] == v
                      and r["epsilon"] == e]
                if not rs:
                    cells.append("")
                    continue
                p = [r["probe"] for r in rs]
                rows = np.mean([r["rows"] for r in rs])
                cells.append(f"{rows:,.0f}, {np.mean(p):.2f} "
                             f"({min(p):.1f}-{max(p):.1f}, n={len(p)})")
            out.append(f"| {e:g} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", default="20news-minilm")
    p.add_argument("--split", choices=("val", "test"), default="val")
    p.add_argument("--train-rows", type=int)
    p.add_argument("--epsilons", type=float, nargs="+",
                   default=[1.0, 2.0, 4.0, 8.0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--variants", nargs="+",
                   default=["default", "legacy", "resample"])
    p.add_argument("--out", default="vote_resample.jsonl")
    p.add_argument("--paired", action="store_true",
                   help="seeded noise shared by the variants of a seed")
    p.add_argument("--table", nargs="*",
                   help="print the markdown table of these JSONL files")
    args = p.parse_args(argv)
    if args.table:
        print(table(args.table))
        return
    run(args)


if __name__ == "__main__":
    main()
