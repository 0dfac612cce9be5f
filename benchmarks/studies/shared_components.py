"""Issue 30, item 2: components shared across classes, noiseless ceiling.

The candidate: one clustering of all rows into M components; each class a
mixture over them with its own weights, so that a component's statistics
come from all its rows (a fraction of the per-class noise under DP). Before
building the DP mechanisms, this measures what each variant reaches with
*exact* statistics (no noise: an upper bound of its DP version), against
the one-Gaussian-a-class family dpsynth releases (shared covariance):

* ``shared``: class c ~ sum_j w_cj N(mu_j, S_w): component means and the
  within-component covariance from all rows, the class only in its weights;
* ``offset``: class c ~ sum_j w_cj N(m_c + delta_j, S): the class mean plus
  component j's mean offset from its rows' class means (delta_j from all
  rows of j, whatever their class);
* ``cells``: class c ~ sum_j w_cj N(mu_cj, S): one mean per (class,
  component) cell, i.e. several components a class (the family of
  ``--clusters k``, whose DP version issue 13's study measured).

Validation split of the train file (``study_data.selection_split``), the
rows centred and clipped as in ``gaussian_ceiling.py``, the same sampler and
logistic probe; k-means from scikit-learn (seed 0).

    python -m benchmarks.studies.shared_components --dataset 20news
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from benchmarks.studies.gaussian_ceiling import CLIP, sample_gaussians
from benchmarks.studies.study_data import probe, save_rows, selection_split
from dpsynth.dp_ops.clipping import clip_rows, normalize_rows

Component = tuple  # (label, rows, mean, covariance), as sample_gaussians


def within(res: np.ndarray) -> np.ndarray:
    return res.T @ res / len(res)


def one_per_class(xc: np.ndarray, y: np.ndarray) -> list[Component]:
    labels = np.unique(y)
    means = np.array([xc[y == c].mean(0) for c in labels])
    cov = within(xc - means[np.searchsorted(labels, y)])
    return [(c, int((y == c).sum()), m, cov) for c, m in zip(labels, means)]


def shared_components(xc: np.ndarray, y: np.ndarray, assign: np.ndarray,
                      centres: np.ndarray) -> list[Component]:
    cov = within(xc - centres[assign])
    return [(c, int(n), centres[j], cov) for c in np.unique(y)
            for j, n in enumerate(np.bincount(assign[y == c],
                                              minlength=len(centres)))
            if n]


def class_offsets(xc: np.ndarray, y: np.ndarray, assign: np.ndarray,
                  m: int) -> list[Component]:
    labels = np.unique(y)
    means = np.array([xc[y == c].mean(0) for c in labels])
    resid = xc - means[np.searchsorted(labels, y)]
    delta = np.array([resid[assign == j].mean(0) if np.any(assign == j)
                      else np.zeros(xc.shape[1]) for j in range(m)])
    cov = within(resid - delta[assign])
    return [(c, int(n), means[i] + delta[j], cov)
            for i, c in enumerate(labels)
            for j, n in enumerate(np.bincount(assign[y == c], minlength=m))
            if n]


def cells(xc: np.ndarray, y: np.ndarray, assign: np.ndarray,
          m: int) -> list[Component]:
    comps, res = [], []
    for c in np.unique(y):
        for j in range(m):
            rows = xc[(y == c) & (assign == j)]
            if len(rows):
                comps.append((c, len(rows), rows.mean(0)))
                res.append(rows - rows.mean(0))
    cov = within(np.vstack(res))
    return [(c, n, mean, cov) for c, n, mean in comps]


def purity(y: np.ndarray, assign: np.ndarray) -> float:
    """Share of rows in their component's majority class."""
    return sum(np.bincount(y[assign == j]).max()
               for j in np.unique(assign)) / len(y)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="20news")
    ap.add_argument("--components", default="10,20,40,80")
    args = ap.parse_args(argv)
    from sklearn.cluster import KMeans
    split = selection_split(args.dataset)
    centre = split.x_fit.mean(axis=0)
    xc, _ = clip_rows(split.x_fit - centre, CLIP)
    y = split.y_fit
    rows = []

    def score(family: str, m: int, comps: list, **extra) -> None:
        xs, ys = sample_gaussians(comps, np.random.default_rng(1))
        acc = probe(normalize_rows(xs + centre, "unit"), ys, split)
        rows.append({"dataset": args.dataset, "family": family,
                     "components": m, "validation_accuracy": acc, **extra})
        print(json.dumps(rows[-1]), flush=True)

    score("one Gaussian a class", 0, one_per_class(xc, y))
    for m in map(int, args.components.split(",")):
        km = KMeans(m, n_init=1, random_state=0).fit(xc)
        assign, p = km.labels_, round(purity(y, km.labels_), 3)
        score("shared", m, shared_components(xc, y, assign,
                                             km.cluster_centers_), purity=p)
        score("offset", m, class_offsets(xc, y, assign, m), purity=p)
        score("cells", m, cells(xc, y, assign, m), purity=p)
    save_rows(f"shared_components-{args.dataset}.json", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
