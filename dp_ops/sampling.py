"""Sampling a diagonal Gaussian mixture: post-processing of DP parameters."""

from __future__ import annotations

import numpy as np


def sample_mixture(weights: np.ndarray, means: np.ndarray, var: np.ndarray,
                   m: int, rng: np.random.Generator,
                   factors: np.ndarray | None = None) -> np.ndarray:
    """m rows from sum_j w_j N(mean_j, F F^T + diag(var_j)), in float32:
    two matrix products (the diagonal part and the factor part); the
    release stores float32 rows anyway."""
    d = means.shape[1]
    if m <= 0 or weights.sum() <= 0:
        return np.zeros((0, d), np.float32)
    comp = rng.choice(len(weights), size=m, p=weights / weights.sum())
    comp.sort()  # keeps rows of one component together; order is public
    out = rng.standard_normal((m, d), dtype=np.float32)
    sd = np.sqrt(var).astype(np.float32)
    mu = means.astype(np.float32)
    # Rows of a component are one slice (comp is sorted): scale and shift
    # each slice in place rather than gathering an m x d array per term.
    bounds = np.searchsorted(comp, np.arange(len(weights) + 1))
    for j in np.flatnonzero(np.diff(bounds)):
        rows = out[bounds[j]:bounds[j + 1]]
        rows *= sd[j]
        rows += mu[j]
    if factors is not None and factors.shape[1]:
        z = rng.standard_normal((m, factors.shape[1]), dtype=np.float32)
        out += z @ factors.astype(np.float32).T
    return out


def project_to_sphere(x: np.ndarray, radius: float) -> np.ndarray:
    """Rows scaled to norm ``radius`` (zero rows stay zero), in x's dtype."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    scale = np.asarray(radius, x.dtype) / np.where(norms > 0, norms, 1)
    return (x * scale).astype(x.dtype, copy=False)
