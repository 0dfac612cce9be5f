"""Sampling a diagonal Gaussian mixture: post-processing of DP parameters."""

from __future__ import annotations

import numpy as np


def sample_mixture(weights: np.ndarray, means: np.ndarray, var: np.ndarray,
                   m: int, rng: np.random.Generator,
                   factors: np.ndarray | None = None) -> np.ndarray:
    """m rows from sum_j w_j N(mean_j, F F^T + diag(var_j)), vectorised."""
    if m <= 0 or weights.sum() <= 0:
        return np.zeros((0, means.shape[1]))
    comp = rng.choice(len(weights), size=m, p=weights / weights.sum())
    comp.sort()  # keeps rows of one component together; order is public
    noise = rng.standard_normal((m, means.shape[1]))
    out = means[comp] + np.sqrt(var[comp]) * noise
    if factors is not None and factors.shape[1]:
        out += rng.standard_normal((m, factors.shape[1])) @ factors.T
    return out


def project_to_sphere(x: np.ndarray, radius: float) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return radius * x / np.where(norms > 0, norms, 1.0)
