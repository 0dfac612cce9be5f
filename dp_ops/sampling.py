"""Sampling a diagonal Gaussian mixture: post-processing of DP parameters."""

from __future__ import annotations

import numpy as np

TWO_PI32 = np.float32(2 * np.pi)


def standard_normal32(rng: np.random.Generator, shape: tuple[int, ...]
                      ) -> np.ndarray:
    """Independent N(0, 1) draws in float32 by the Box-Muller transform.

    Why not ``rng.standard_normal(dtype=np.float32)``: numpy's ziggurat
    costs ~10 ns a value on our 2-core reference machine and drawing the
    synthetic rows was the largest stage of a run (d + rank normals per
    row); Box-Muller from float32 uniforms with numpy's vectorised log,
    sqrt, cos and sin is ~1.8x faster. Each pair of uniforms (u, v) gives
    r cos(2 pi v) and r sin(2 pi v), r = sqrt(-2 ln(1 - u)): two
    independent standard normals (exact transform). The one approximation:
    float32 uniforms are multiples of 2^-24, so |value| <= sqrt(48 ln 2)
    ~ 5.77 (a standard normal exceeds that with probability 8e-9).
    Deterministic for a given generator state on one machine (numpy picks
    one SIMD path per CPU).
    """
    size = int(np.prod(shape))
    half = (size + 1) // 2
    r = rng.random(half, dtype=np.float32)
    angle = rng.random(half, dtype=np.float32)
    np.subtract(np.float32(1), r, out=r)  # (0, 1]: log stays finite
    np.log(r, out=r)
    r *= np.float32(-2)
    np.sqrt(r, out=r)
    angle *= TWO_PI32
    out = np.empty(2 * half, np.float32)
    np.cos(angle, out=out[:half])
    np.sin(angle, out=out[half:])
    out[:half] *= r
    out[half:] *= r
    return out[:size].reshape(shape)


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
    out = standard_normal32(rng, (m, d))
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
        z = standard_normal32(rng, (m, factors.shape[1]))
        out += z @ factors.astype(np.float32).T
    return out


def project_to_sphere(x: np.ndarray, radius: float) -> np.ndarray:
    """Rows scaled to norm ``radius`` (zero rows stay zero), in x's dtype."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    scale = np.asarray(radius, x.dtype) / np.where(norms > 0, norms, 1)
    return (x * scale).astype(x.dtype, copy=False)
