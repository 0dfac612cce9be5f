"""Per-cluster clipped moments and the diagonal Gaussian mixture they define.

Sums are taken over values truncated (towards zero) onto a fixed grid of
2^-24 of their bound (rounded up to a power of two). Truncation never increases a magnitude, so the
sensitivities stay R (sum of x) and R^2 (sum of x*x); and float64 addition of
grid values is exact up to 2^29 rows per cluster, so the sums are identical
whatever the bundle order or worker count (byte-identical releases).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np

from dpsynth.dp_ops.kmeans import one_hot

GRID_BITS = 24


def grid(bound: float, bits: int = GRID_BITS) -> float:
    """The public grid step 2^(e - bits), 2^e the power of two >= bound."""
    return 2.0 ** (math.ceil(math.log2(bound)) - bits)


def quantize(x: np.ndarray, bound: float, bits: int = GRID_BITS,
             out: Optional[np.ndarray] = None) -> np.ndarray:
    """Truncates onto ``grid(bound, bits)`` (a power-of-two step keeps every
    grid value and sum exact in float64, and lets the noise be added
    exactly, see dp_ops/noise.py). ``out``: a float64 array to write into
    (x itself, when the caller no longer needs x)."""
    q = grid(bound, bits)
    # q is a power of two: x * (1/q) is exactly x / q, and a multiply is
    # several times cheaper than a divide; in place after the first copy.
    out = np.multiply(x, 1.0 / q, out=out, dtype=np.float64)
    np.trunc(out, out=out)
    out *= q
    return out


@dataclasses.dataclass
class Moments:
    """count [k], sum [k, d], sumsq [k, d] (exact until noised).

    ``sumsq`` is None when covariance factors give the variances instead.
    """

    count: np.ndarray
    sum: np.ndarray
    sumsq: Optional[np.ndarray] = None

    def __add__(self, other: "Moments") -> "Moments":
        sumsq = (None if self.sumsq is None or other.sumsq is None
                 else self.sumsq + other.sumsq)
        return Moments(self.count + other.count, self.sum + other.sum, sumsq)

    @classmethod
    def zeros(cls, k: int, d: int, sumsq: bool = True) -> "Moments":
        return cls(np.zeros(k), np.zeros((k, d)),
                   np.zeros((k, d)) if sumsq else None)


def block_moments(x: np.ndarray, assign: np.ndarray, k: int,
                  clip_norm: float, sumsq: bool = True) -> Moments:
    hot = one_hot(assign, k)
    return Moments(hot.sum(axis=1), hot @ quantize(x, clip_norm),
                   hot @ quantize(x * x, clip_norm ** 2) if sumsq else None)


def block_sums(x: np.ndarray, assign: np.ndarray, k: int,
               bound: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-cluster exact count and grid-quantised sum of x."""
    hot = one_hot(assign, k)
    return hot.sum(axis=1), hot @ quantize(x, bound)


def mixture_from_moments(noisy: Moments, clip_norm: float,
                         variance_floor: float) -> tuple[np.ndarray, ...]:
    """Mixture weights, means and diagonal variances from noisy moments.

    Components whose noisy count is below 1 get weight 0. Means are projected
    back into the clip ball; variances are floored at
    ``variance_floor * clip_norm^2 / d`` (a public constant) because noise can
    drive E[x^2] - E[x]^2 negative.
    """
    d = noisy.sum.shape[1]
    n = np.maximum(noisy.count, 1.0)
    means = noisy.sum / n[:, None]
    norms = np.linalg.norm(means, axis=1, keepdims=True)
    means = means * np.minimum(1.0, clip_norm / np.maximum(norms, 1e-300))
    floor = variance_floor * clip_norm ** 2 / d
    weights = np.where(noisy.count >= 1.0, noisy.count, 0.0)
    if noisy.sumsq is None:  # set later from the covariance factors
        return weights, means, np.full_like(means, floor)
    var = np.maximum(noisy.sumsq / n[:, None] - means ** 2, floor)
    return weights, means, var
