"""How far can a Gaussian generator go? Non-private ceilings (issues 8, 13).

Fits class-conditional Gaussian models to the EXACT statistics of the
fitting part of a shared train set, samples as many rows per class as the
fitting part has, and scores the shared README's logistic probe on the
validation split (benchmarks/studies/study_data.py). No privacy here: this bounds
what any DP generator of that model family can reach, so it tells whether
noise or the family is the limit.

As in the generator, rows are unit-normalised, centred (here: exact mean)
and clipped to R (the default 0.7); samples get the centre back and are
projected onto the unit sphere. "no clip" rows skip centring and clipping.

    python benchmarks/studies/gaussian_ceiling.py --dataset cifar10
    python benchmarks/studies/gaussian_ceiling.py --dataset 20news
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from benchmarks.studies.study_data import probe, save_rows, selection_split  # noqa: E402
from dpsynth.dp_ops.clipping import clip_rows, normalize_rows  # noqa: E402

CLIP = 0.7


def low_rank_plus_diagonal(cov: np.ndarray, rank: int) -> np.ndarray:
    vals, vecs = np.linalg.eigh(cov)
    factors = vecs[:, -rank:] * np.sqrt(np.maximum(vals[-rank:], 0))
    residual = np.maximum(np.diag(cov) - (factors ** 2).sum(axis=1), 1e-8)
    return factors @ factors.T + np.diag(residual)


def subspace_model(covs: list, pooled: np.ndarray, rank: int) -> list:
    """Per-class covariance inside the top-``rank`` subspace of the pooled
    matrix, the pooled covariance outside it (DP-PCA-style family)."""
    _, vecs = np.linalg.eigh(pooled)
    p = vecs[:, -rank:]
    outside = pooled - p @ (p.T @ pooled @ p) @ p.T
    return [p @ (p.T @ c @ p) @ p.T + outside for c in covs]


def sample_gaussians(comps: list, rng) -> tuple[np.ndarray, np.ndarray]:
    """comps: (label, count, mean, cov) -> rows and labels."""
    xs, ys = [], []
    for label, n, mu, cov in comps:
        if n < 1:
            continue
        chol = np.linalg.cholesky(cov + 1e-9 * np.eye(len(mu)))
        xs.append(mu + rng.standard_normal((n, len(mu))) @ chol.T)
        ys.append(np.full(n, label))
    return np.vstack(xs), np.concatenate(ys)


def kmeans_components(xc: np.ndarray, y: np.ndarray, k: int,
                      per_class_cov: bool) -> list:
    from sklearn.cluster import KMeans
    comps, resid = [], []
    for c in np.unique(y):
        rows = xc[y == c]
        km = KMeans(k, n_init=2, random_state=0).fit(rows)
        r = rows - km.cluster_centers_[km.labels_]
        cov_c = r.T @ r / len(r)
        resid.append(r)
        comps += [[c, int((km.labels_ == j).sum()), km.cluster_centers_[j],
                   cov_c] for j in range(k)]
    if not per_class_cov:
        r = np.vstack(resid)
        shared = r.T @ r / len(r)
        for comp in comps:
            comp[3] = shared
    return comps


def families(xc: np.ndarray, y: np.ndarray, rank: int) -> dict:
    labels = np.unique(y)
    counts = [int((y == c).sum()) for c in labels]
    means = [xc[y == c].mean(axis=0) for c in labels]
    covs = [np.cov(xc[y == c].T, bias=True) for c in labels]
    pooled = sum(n * c for n, c in zip(counts, covs)) / sum(counts)
    one = lambda cs: [(c, n, m, s) for c, n, m, s in
                      zip(labels, counts, means, cs)]
    out = {
        "diagonal per class": lambda: one([np.diag(np.diag(c)) for c in covs]),
        "shared full": lambda: one([pooled] * len(labels)),
        f"shared rank-{rank} + diagonal": lambda: one(
            [low_rank_plus_diagonal(pooled, rank)] * len(labels)),
        "per-class full": lambda: one(covs),
        f"per-class rank-{rank} + diagonal": lambda: one(
            [low_rank_plus_diagonal(c, rank) for c in covs]),
        "per-class, rank-32 shared subspace": lambda: one(
            subspace_model(covs, pooled, 32)),
        f"per-class, rank-{rank} shared subspace": lambda: one(
            subspace_model(covs, pooled, rank)),
        "k=4 per class, shared covariance": lambda: kmeans_components(
            xc, y, 4, False),
        "k=4 per class, per-class covariance": lambda: kmeans_components(
            xc, y, 4, True),
    }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="cifar10")
    ap.add_argument("--rank", type=int, default=128)
    ap.add_argument("--only", default=None, help="';'-separated family names")
    args = ap.parse_args()
    split = selection_split(args.dataset)
    x, y = split.x_fit, split.y_fit
    rows = []

    def score(name, xs, ys):
        t = time.time()
        acc = probe(xs, ys, split)
        rows.append({"dataset": args.dataset, "generator": name,
                     "validation_accuracy": acc,
                     "seconds": round(time.time() - t, 1)})
        print(json.dumps(rows[-1]), flush=True)

    only = set(args.only.split(";")) if args.only else None
    if not only or "real rows" in only:
        score("real rows (the probe's ceiling)", x, y)
    centre = x.mean(axis=0)
    xc, _ = clip_rows(x - centre, CLIP)
    if not only or "real rows, centred + clipped" in only:
        score(f"real rows, centred + clipped to {CLIP}",
              normalize_rows(xc + centre, "unit"), y)
    for name, build in families(xc, y, args.rank).items():
        if only and name not in only:
            continue
        xs, ys = sample_gaussians(build(), np.random.default_rng(1))
        score(name, normalize_rows(xs + centre, "unit"), ys)
    if not only:
        xs, ys = sample_gaussians(families(x, y, args.rank)["shared full"](),
                                  np.random.default_rng(1))
        score("shared full, no centre/clip", normalize_rows(xs, "unit"), ys)
    save_rows(f"gaussian_ceiling-{args.dataset}.json", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
