"""How far can a Gaussian generator go? Non-private ceilings (issue 8).

Fits class-conditional Gaussians to the exact (non-private) statistics of
the fitting part of the CIFAR-10 train set, samples 4,500 rows a class, and
scores the shared README's logistic probe on the validation split used by
utility_study.py. No privacy here: this bounds what any DP Gaussian
generator with that covariance model can reach.

    python benchmarks/gaussian_ceiling.py
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.utility_study import RESULTS, load, probe_accuracy  # noqa: E402
from dp_ops.clipping import normalize_rows  # noqa: E402

PER_CLASS = 4500


def low_rank_plus_diagonal(cov: np.ndarray, rank: int) -> np.ndarray:
    vals, vecs = np.linalg.eigh(cov)
    factors = vecs[:, -rank:] * np.sqrt(np.maximum(vals[-rank:], 0))
    residual = np.maximum(np.diag(cov) - (factors ** 2).sum(axis=1), 1e-8)
    return factors @ factors.T + np.diag(residual)


def sample(means, covs, rng) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for label, (mu, cov) in enumerate(zip(means, covs)):
        chol = np.linalg.cholesky(cov + 1e-9 * np.eye(len(mu)))
        xs.append(mu + rng.standard_normal((PER_CLASS, len(mu))) @ chol.T)
        ys.append(np.full(PER_CLASS, label))
    return np.vstack(xs), np.concatenate(ys)


def main() -> int:
    x, y, _, _ = load()
    x = normalize_rows(x, "unit")
    order = np.random.default_rng(0).permutation(len(y))
    val, fit = order[: len(y) // 10], order[len(y) // 10:]
    xf, yf = x[fit], y[fit]
    labels = sorted(set(yf.tolist()))
    means = [xf[yf == c].mean(axis=0) for c in labels]
    covs = [np.cov(xf[yf == c].T) for c in labels]
    pooled = sum(covs) / len(covs)
    models = {
        "real rows (the probe's ceiling)": None,
        "shared full covariance": [pooled] * len(labels),
        "shared rank-128 + diagonal": [low_rank_plus_diagonal(pooled, 128)]
        * len(labels),
        "per-class full covariance": covs,
        "per-class rank-128 + diagonal": [low_rank_plus_diagonal(c, 128)
                                          for c in covs],
    }
    rows = []
    for name, model in models.items():
        rng = np.random.default_rng(1)
        xs, ys = (xf, yf) if model is None else sample(means, model, rng)
        acc = probe_accuracy(xs, ys, x[val], y[val])
        rows.append({"generator": name, "validation_accuracy": acc})
        print(json.dumps(rows[-1]), flush=True)
    os.makedirs(RESULTS, exist_ok=True)
    lines = ["# Non-private Gaussian ceilings (issue 8)", "",
             "Command: `python benchmarks/gaussian_ceiling.py`. Exact class "
             "means and covariances of the fitting split, 4,500 samples a "
             "class, logistic probe scored on the validation split of "
             "utility_study.py. Not private: an upper bound per covariance "
             "model.", "", "| generator | validation accuracy % |", "|---|---|"]
    lines += [f"| {r['generator']} | {r['validation_accuracy'] * 100:.1f} |"
              for r in rows]
    with open(os.path.join(RESULTS, "gaussian_ceiling.md"), "w") as fh:
        fh.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
