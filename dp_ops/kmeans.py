"""k-means pieces: nearest-centre assignment and weighted k-means on a coreset.

Everything here either runs on public/noisy inputs (the coreset) or is a
per-record rule (assignment), so none of it spends privacy budget.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Callable, Optional

import numpy as np


def nearest(x: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """Index of the nearest centre for every row (one BLAS call)."""
    if len(centres) == 1:  # also when x is a one-cluster block's empty z
        return np.zeros(len(x), np.intp)
    dist = (np.einsum("ij,ij->i", centres, centres)[None, :]
            - 2.0 * (x @ centres.T))
    return np.argmin(dist, axis=1)


def kmeans_pp(points: np.ndarray, weights: np.ndarray, k: int,
              rng: np.random.Generator) -> np.ndarray:
    """Weighted k-means++ seeding (D^2 sampling times the point weight)."""
    w = np.clip(weights, 0.0, None)
    if w.sum() <= 0:
        w = np.ones_like(w)
    first = rng.choice(len(points), p=w / w.sum())
    centres = [points[first]]
    d2 = np.sum((points - centres[0]) ** 2, axis=1)
    for _ in range(1, k):
        p = w * d2
        if p.sum() <= 0:
            break
        nxt = rng.choice(len(points), p=p / p.sum())
        centres.append(points[nxt])
        d2 = np.minimum(d2, np.sum((points - points[nxt]) ** 2, axis=1))
    return np.array(centres)


def weighted_kmeans(points: np.ndarray, weights: np.ndarray, k: int,
                    rng: np.random.Generator, iters: int = 20) -> np.ndarray:
    """k centres for a weighted point set; fewer points than k are padded
    with public random directions (they then attract no mass)."""
    points = np.asarray(points, float)
    if len(points) == 0:
        return random_centres(k, points.shape[1], rng)
    centres = kmeans_pp(points, weights, min(k, len(points)), rng)
    w = np.clip(weights, 0.0, None)
    for _ in range(iters):
        assign = nearest(points, centres)
        mass = np.bincount(assign, weights=w, minlength=len(centres))
        sums = one_hot(assign, len(centres)) @ (points * w[:, None])
        keep = mass > 0
        centres[keep] = sums[keep] / mass[keep, None]
    if len(centres) < k:
        centres = np.vstack([centres, random_centres(
            k - len(centres), points.shape[1], rng,
            scale=float(np.max(np.linalg.norm(points, axis=1))))])
    return centres


def random_centres(k: int, dim: int, rng: np.random.Generator,
                   scale: float = 1.0) -> np.ndarray:
    c = rng.normal(size=(k, dim))
    return scale * c / np.linalg.norm(c, axis=1, keepdims=True)


def one_hot(assign: np.ndarray, k: int) -> np.ndarray:
    return (assign[None, :] == np.arange(k)[:, None]).astype(np.float64)


def cluster_stats(x: np.ndarray, assign: np.ndarray,
                  k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-cluster count and sum of rows (exact; must be noised before use)."""
    hot = one_hot(assign, k)
    return hot.sum(axis=1), hot @ x


def update_centres(noisy_counts: np.ndarray, noisy_sums: np.ndarray,
                   old: np.ndarray, min_count: float) -> np.ndarray:
    """Lloyd step from noisy aggregates; tiny clusters keep their centre."""
    ok = noisy_counts >= max(min_count, 1.0)
    new = old.copy()
    new[ok] = noisy_sums[ok] / noisy_counts[ok, None]
    return new


_CONTROLLER = None


def blas_threads(limit: Optional[int]):
    """Context limiting BLAS threads (None: leave as is).

    Per-block products are small (a few hundred rows); a multi-threaded BLAS
    spends longer synchronising its threads than computing them, badly so
    when the cores are shared (measured: 16x384 one-hot sums take 31 ms
    with 2 OpenBLAS threads on a loaded 2-core machine, 0.1 ms with 1).
    Workers get their parallelism from running several bundles instead.
    """
    global _CONTROLLER
    if limit is None:
        return contextlib.nullcontext()
    if _CONTROLLER is None:
        from threadpoolctl import ThreadpoolController
        _CONTROLLER = ThreadpoolController()
    return _CONTROLLER.limit(limits=limit, user_api="blas")


def one_blas_thread(fn: Callable) -> Callable:
    """``fn`` runs on one BLAS thread, whatever its caller's setting.

    For the release's bits, not speed: LAPACK's eigh and BLAS products
    round differently with different thread counts (measured: the factors
    of a d=384 per-class release differed by up to 1e-14 between 1 and 2
    OpenBLAS threads), and a worker's count depends on the runner (Dask's
    workers run one, the DirectRunner's the machine's cores, Dataflow's the
    machine type). Every step from noisy aggregates to released parameters
    and rows is pinned, so a --noise-seed run gives the same release on any
    runner and worker count (same BLAS build and CPU).
    """
    @functools.wraps(fn)
    def pinned(*args, **kwargs):
        with blas_threads(1):
            return fn(*args, **kwargs)
    return pinned
