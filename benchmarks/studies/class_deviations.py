"""Study-only post-processings of the adaptive plan's class matrices,
measured and not adopted (docs/method.md, "The rule's constants"), out of
the product since issue 73. The product ships the per-class mode's "raw"
and "spiked" class matrices (``adaptive.per_class_mixture``: one class at
a time, on the worker that released it); these need every class at once
or change the subspace blocks:

- "spectral" class matrices (issue 13): pooled + spike_shrink(C_c -
  pooled) at each class's noise edge (``shrink_class_deviations``);
- "shrunk" class matrices (issue 61): lambda_c pooled + (1 - lambda_c) C_c
  with a James-Stein weight from the released matrices, the noisy counts
  and the ledger's sigma (``shrinkage_weights``, ``shrink_towards_pooled``);
- "spectral" subspace blocks (issue 13, ``deviation``): each class's r x r
  block as the shared block + its spectrally shrunk deviation
  (``shrink_deviation``).

Each reads DP outputs only (released matrices, noisy counts, the ledger's
sigmas), so it is post-processing: the mechanisms, the ledger and the
noise draws are the product's. They run through the numpy reference
(``benchmarks.reference.generate_adaptive``'s ``class_post`` /
``block_post`` hooks; ``generate`` here takes the studies' override dicts,
where "deviation" and "class_deviation" may name them).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from benchmarks import reference
from dpsynth.dp_ops import adaptive, kmeans

CLASS_DEVIATIONS = ("spectral", "shrunk")  # per-class mode, all classes
DEVIATIONS = ("raw", "spectral")           # subspace mode's blocks


def shrink_deviation(block: np.ndarray, shared_block: np.ndarray,
                     edge: float) -> np.ndarray:
    """shared + spectrally shrunk (block - shared) (the "spectral" option)."""
    dv, du = np.linalg.eigh((block - shared_block + (block - shared_block).T)
                            / 2)
    return shared_block + (du * adaptive.spike_shrink(dv, edge)) @ du.T


def pooled_within(withins: Sequence[np.ndarray], n: np.ndarray
                  ) -> np.ndarray:
    """sum_c n_c C_c / sum_c n_c (symmetrised): the pooled within
    covariance of the released class matrices (post-processing)."""
    w = np.asarray(n, np.float64)
    pooled = sum(wi * ci for wi, ci in zip(w, withins)) / w.sum()
    return (pooled + pooled.T) / 2


def shrink_class_deviations(withins: Sequence[np.ndarray], n: np.ndarray,
                            edges: Sequence[float]) -> list[np.ndarray]:
    """The "spectral" class deviation (post-processing of DP outputs
    only): pooled = sum_c n_c C_c / sum_c n_c of the noisy class
    covariances C_c (n_c the noisy counts); each C_c becomes pooled +
    spike_shrink(C_c - pooled) at ``edges[c]``, the spectrum edge of its
    own second-moment mechanism's noise divided by n_c (``noise_edge``).
    With zero noise (edges 0) every C_c is returned unchanged."""
    pooled = pooled_within(withins, n)
    return [shrink_deviation(c, pooled, e) for c, e in zip(withins, edges)]


def noise_energy(sigma: float, n_c: float, d: int) -> float:
    """E ||E_c / n_c||_F^2 for the noise E_c of a class's second moment
    (isometric upper triangle: d (d + 1) / 2 entries of std sigma, so the
    Frobenius norm's square has that many sigma^2 terms), divided by the
    class's noisy count n_c (>= 1): the noise energy of its within
    covariance. Public: sigma is the ledger's, n_c a DP count."""
    return sigma * sigma * d * (d + 1) / 2.0 / (n_c * n_c)


def shrinkage_weights(withins: Sequence[np.ndarray], n: np.ndarray,
                      sigmas: Sequence[float]) -> np.ndarray:
    """The "shrunk" class deviation's weights lambda_c in [0, 1]
    (post-processing: released matrices, DP counts, the ledger's sigmas).

    C~_c = C_c + N_c (N_c = E_c / n_c, energy v_c = ``noise_energy``,
    independent across classes, zero mean); pooled P~ = sum_j w_j C~_j,
    w_j = n_j / N. With weight lambda the estimate's error is
    lambda P~ + (1 - lambda) C~_c - C_c = N_c - lambda D~_c, D~_c =
    C~_c - P~, whose noise part is (1 - w_c) N_c - sum_{j != c} w_j N_j.
    So E ||error||^2 = lambda^2 E||D~_c||^2 - 2 lambda (1 - w_c) v_c + v_c,
    minimal at lambda* = (1 - w_c) v_c / E||D~_c||^2; E||D~_c||^2 is
    estimated by the observed ||D~_c||_F^2 (James-Stein plug-in), and
    lambda_c = clip((1 - w_c) v_c / ||D~_c||^2, 0, 1). Where the classes
    share a covariance, E||D~_c||^2 = (1 - 2 w_c) v_c + sum_j w_j^2 v_j,
    which is (1 - w_c) v_c for equal classes: lambda -> 1; where they
    differ by far more than the noise, lambda -> 0; with no noise
    (sigma 0) lambda = 0 (the raw matrices). (The class mean's noise
    also enters C~_c; its energy is ~ 4 |mu_c|^2 sigma_sum^2 / (d sigma^2)
    of v_c, small at d >> 1, and is left out.)"""
    w_n = np.asarray(n, np.float64)
    w = w_n / w_n.sum()
    d = withins[0].shape[0]
    pooled = pooled_within(withins, w_n)
    out = np.zeros(len(withins))
    for i, c in enumerate(withins):
        v = noise_energy(float(sigmas[i]), float(w_n[i]), d)
        part = (1.0 - w[i]) * v
        dist = float(np.sum((c - pooled) ** 2))
        if part <= 0.0:
            out[i] = 0.0
        elif dist <= 0.0:
            out[i] = 1.0
        else:
            out[i] = min(max(part / dist, 0.0), 1.0)
    return out


def shrink_towards_pooled(withins: Sequence[np.ndarray], n: np.ndarray,
                          sigmas: Sequence[float]) -> list[np.ndarray]:
    """The "shrunk" class deviation: lambda_c pooled + (1 - lambda_c) C_c
    with ``shrinkage_weights``; a convex mix of symmetric matrices (the
    factors keep its positive eigenpairs: the PSD repair of every mode)."""
    lam = shrinkage_weights(withins, n, sigmas)
    pooled = pooled_within(withins, n)
    return [lam[i] * pooled + (1.0 - lam[i]) * c
            for i, c in enumerate(withins)]


# ------------------------------------------- hooks of the reference

def class_post(deviation: str) -> reference.ClassPost:
    """``reference.generate_adaptive``'s ``class_post`` for "spectral" or
    "shrunk" (module globals looked up at each call, so a study may spy
    on ``shrinkage_weights``)."""
    if deviation not in CLASS_DEVIATIONS:
        raise ValueError(f"unknown study class deviation {deviation!r}")

    @kmeans.one_blas_thread
    def post(withins: list, n: np.ndarray, sigmas: Sequence[float]) -> list:
        if deviation == "shrunk":
            return shrink_towards_pooled(withins, n, sigmas)
        d = withins[0].shape[0]
        return shrink_class_deviations(
            withins, n, [adaptive.noise_edge(s, n[i], d)
                         for i, s in enumerate(sigmas)])
    return post


@kmeans.one_blas_thread
def spectral_block(block: np.ndarray, shared: adaptive.SharedModel,
                   n_c: float, sigma: float) -> np.ndarray:
    """``reference.generate_adaptive``'s ``block_post`` for the subspace
    blocks' "spectral" deviation: the block's deviation from the shared
    block, spectrally shrunk at its mechanism's noise edge."""
    r = shared.rank_in
    return shrink_deviation(block, np.diag(shared.vals[:r]),
                            adaptive.noise_edge(sigma, n_c, r))


def split(overrides: Optional[dict] = None
          ) -> tuple[adaptive.RuleConstants, dict]:
    """A study's ``RuleConstants`` overrides, where "deviation" (the
    subspace blocks: "raw" or "spectral") and "class_deviation" (also
    "spectral" or "shrunk") may name a study post-processing -> (the
    product's constants, the ``generate_adaptive`` hooks). A study class
    deviation starts from the raw class matrices."""
    overrides = dict(overrides or {})
    deviation = overrides.pop("deviation", "raw")
    if deviation not in DEVIATIONS:
        raise ValueError(f"deviation must be one of {DEVIATIONS}, "
                         f"got {deviation!r}")
    hooks = {}
    if deviation == "spectral":
        hooks["block_post"] = spectral_block
    if overrides.get("class_deviation") in CLASS_DEVIATIONS:
        hooks["class_post"] = class_post(overrides["class_deviation"])
        overrides["class_deviation"] = "raw"
    return adaptive.RuleConstants(**overrides), hooks


def generate(x: np.ndarray, y: np.ndarray, cfg, noise,
             overrides: Optional[dict] = None,
             timings: Optional[dict] = None):
    """``reference.generate_adaptive`` with a study's overrides
    (``split``); the same return value. The structure's class_deviation
    is "raw" under a study class deviation (the one it starts from)."""
    constants, hooks = split(overrides)
    return reference.generate_adaptive(x, y, cfg, noise, constants, timings,
                                       **hooks)


__all__ = ["CLASS_DEVIATIONS", "DEVIATIONS", "class_post", "generate",
           "noise_energy", "pooled_within", "shrink_class_deviations",
           "shrink_deviation", "shrink_towards_pooled", "shrinkage_weights",
           "spectral_block", "split"]
