"""Exact discrete Gaussian sampling from a stream of uniform 64-bit words.

Why our own sampler: the noise of a dpsynth mechanism must be a deterministic
function of a per-run secret key and the mechanism's name, so that a runner
that re-executes a step (bundle retries, recomputed side-input branches)
reproduces the same draw instead of releasing the same statistic twice with
independent noise. The secure samplers we know of (PyDP, which PipelineDP
uses; OpenDP) read the operating system's random source and cannot be keyed,
and diffprivlib's samplers take a non-cryptographic generator and loop in
Python per value (too slow for the 10^6-10^7 coordinates of a covariance).

Algorithm: Canonne, Kamath, Steinke, "The Discrete Gaussian for Differential
Privacy" (NeurIPS 2020), Algorithms 1-3: a discrete Laplace proposal
(uniform part + geometric part) accepted with probability
exp(-(|y| - s^2/t)^2 / (2 s^2)), t = floor(s) + 1. Every random decision is a
Bernoulli(exp(-gamma)) trial with an exactly known gamma (a rational number),
decided by comparing a uniform number, revealed 53 bits at a time, with
exp(-gamma):

* fast path (vectorised): exp(-gamma) is computed in float64; the trial is
  decided when the uniform's interval lies clearly on one side of
  exp(-gamma) * (1 +- FLOAT_MARGIN). FLOAT_MARGIN = 2^-30 is far above the
  float64 error of gamma and exp (about 2^-40 for |y| <= 60 s), so a fast
  decision is the exact decision.
* slow path (rare: probability about 2^-29 per trial): exp(-gamma) is
  computed with 100-digit decimal arithmetic (``decimal``'s exp is correctly
  rounded) and further 64-bit words refine the uniform until the trial is
  decided; after ``MAX_EXTRA_WORDS`` refinements (probability < 2^-240) the
  trial is rejected.

So the output distribution is the discrete Gaussian N_Z(0, s^2) up to a total
variation of 2^-240 per trial. No floating-point value of the private input
is involved: the caller adds ``q * K`` to an aggregate that already lies on
the lattice q Z (see ``dpsynth.dp_ops.noise``), so the result's low-order bits carry
no information (the floating-point attack of Mironov 2012 does not apply).
"""

from __future__ import annotations

import math
from decimal import Context, Decimal
from fractions import Fraction
from typing import Callable

import numpy as np

Words = Callable[[int], np.ndarray]  # n -> n uniform uint64 words
ExactGamma = Callable[[int], Fraction]  # index -> exact gamma of that trial

FLOAT_MARGIN = 2.0 ** -30
MAX_EXTRA_WORDS = 3
_TWO_M53 = 2.0 ** -53
_DECIMAL = Context(prec=100)
_DECIMAL_MARGIN = Fraction(1, 10 ** 95)


def bernoulli_exp(gamma: np.ndarray, exact_gamma: ExactGamma, words: Words,
                  margin: float = FLOAT_MARGIN) -> np.ndarray:
    """Bernoulli(exp(-gamma_i)) for each i (gamma_i >= 0), exactly.

    ``gamma`` is the float64 value used by the fast path; ``exact_gamma(i)``
    returns the exact rational value for the rare undecided trials.
    """
    gamma = np.asarray(gamma, np.float64)
    u53 = (words(gamma.size) >> np.uint64(11)).astype(np.float64)
    p = np.exp(-gamma)
    lo = p * (1.0 - margin)
    hi = np.maximum(p * (1.0 + margin), np.finfo(np.float64).smallest_subnormal)
    accept = (u53 + 1.0) * _TWO_M53 <= lo
    reject = u53 * _TWO_M53 >= hi
    out = accept
    for i in np.flatnonzero(~(accept | reject)).tolist():
        out[i] = _exact_trial(int(u53[i]), exact_gamma(i), words)
    return out


def _exact_trial(u53: int, gamma: Fraction, words: Words) -> bool:
    """Decides U < exp(-gamma) for U in [u53, u53 + 1) * 2^-53, revealing
    64 more bits of U per step."""
    g = _DECIMAL.divide(Decimal(gamma.numerator), Decimal(gamma.denominator))
    p = Fraction(_DECIMAL.exp(-g))
    p_lo, p_hi = p * (1 - _DECIMAL_MARGIN), p * (1 + _DECIMAL_MARGIN)
    numerator, bits = u53, 53
    for _ in range(MAX_EXTRA_WORDS + 1):
        lo = Fraction(numerator, 1 << bits)
        hi = Fraction(numerator + 1, 1 << bits)
        if hi <= p_lo:
            return True
        if lo >= p_hi:
            return False
        numerator = (numerator << 64) | int(words(1)[0])
        bits += 64
    return False


def uniform_below(n: int, t: int, words: Words) -> np.ndarray:
    """n exact uniform integers in [0, t), 1 <= t < 2^62 (rejection sampling,
    no modulo bias)."""
    limit = np.uint64((2 ** 64 // t) * t - 1)
    out = np.empty(n, np.int64)
    todo = np.arange(n)
    while todo.size:
        w = words(todo.size)
        ok = w <= limit
        out[todo[ok]] = (w[ok] % np.uint64(t)).astype(np.int64)
        todo = todo[~ok]
    return out


def geometric_e1(n: int, words: Words) -> np.ndarray:
    """Number of successes of Bernoulli(exp(-1)) before the first failure."""
    out = np.zeros(n, np.int64)
    active = np.arange(n)
    while active.size:
        hit = bernoulli_exp(np.ones(active.size), lambda i: Fraction(1), words)
        active = active[hit]
        out[active] += 1
    return out


def discrete_laplace(n: int, t: int, words: Words) -> np.ndarray:
    """n draws with P(y) proportional to exp(-|y| / t), t >= 1 an integer
    (CKS Algorithm 2 with s = 1)."""
    out = np.empty(n, np.int64)
    todo = np.arange(n)
    while todo.size:
        u = uniform_below(todo.size, t, words)
        keep = bernoulli_exp(u / t, lambda i: Fraction(int(u[i]), t), words)
        idx = np.flatnonzero(keep)
        x = u[idx] + t * geometric_e1(idx.size, words)
        negative = (words(idx.size) & np.uint64(1)) == 1
        valid = ~(negative & (x == 0))  # -0 would count zero twice
        out[todo[idx[valid]]] = np.where(negative, -x, x)[valid]
        done = np.zeros(todo.size, bool)
        done[idx[valid]] = True
        todo = todo[~done]
    return out


def discrete_gaussian(n: int, s: float, words: Words) -> np.ndarray:
    """n exact draws from N_Z(0, s^2): P(k) proportional to
    exp(-k^2 / (2 s^2)) on the integers (CKS Algorithm 3), s > 0."""
    if not (s > 0 and math.isfinite(s)):
        raise ValueError(f"discrete Gaussian scale must be finite and > 0, got {s}")
    if s >= 2.0 ** 47:
        raise ValueError(f"discrete Gaussian scale {s} is too large for int64 draws")
    t = math.floor(s) + 1
    s_exact = Fraction(s)
    centre_exact = s_exact * s_exact / t
    centre = float(centre_exact)
    out = np.empty(n, np.int64)
    todo = np.arange(n)
    while todo.size:
        y = discrete_laplace(todo.size, t, words)
        a = (np.abs(y).astype(np.float64) - centre) / s
        accept = bernoulli_exp(
            0.5 * a * a,
            lambda i: (abs(int(y[i])) - centre_exact) ** 2 / (2 * s_exact * s_exact),
            words)
        out[todo[accept]] = y[accept]
        todo = todo[~accept]
    return out
