"""The adaptive plan's post-processing (free): what turns the released
noisy counts, sums and second moments into class means, covariances and
each class's Gaussian (factors + a diagonal). Reads DP outputs, the
public structure and the ledger's sigmas only."""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

import numpy as np

from dpsynth.dp_ops import covariance, generator, kmeans
from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.dp_ops.adaptive.rule import Structure


def class_means(noisy_sums: np.ndarray, noisy_counts: np.ndarray,
                clip_norm: float) -> tuple[np.ndarray, np.ndarray]:
    """(counts >= 1, means in the clip ball) from the DP sums and counts."""
    n = np.maximum(np.asarray(noisy_counts, float), 1.0)
    means = noisy_sums / n[:, None]
    norms = np.linalg.norm(means, axis=1, keepdims=True)
    return n, means * np.minimum(1.0, clip_norm / np.maximum(norms, 1e-300))


def shared_within(noisy_m: np.ndarray, n: np.ndarray,
                  means: np.ndarray) -> np.ndarray:
    """Pooled within-class covariance (M - sum_c n_c mu_c mu_c^T) / N."""
    between = (means * n[:, None]).T @ means
    w = (noisy_m - between) / n.sum()
    return (w + w.T) / 2


def eigen(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenpairs, largest first."""
    vals, vecs = np.linalg.eigh((matrix + matrix.T) / 2)
    order = np.argsort(vals)[::-1]
    return vals[order], vecs[:, order]


@dataclasses.dataclass
class SharedModel:
    """W's top eigenvalues, its top ``rank_in`` eigenvectors (the class
    subspace) and its parts outside the class subspace."""

    vals: np.ndarray
    vecs: np.ndarray  # [d, rank_in]
    outside_factors: np.ndarray  # [d, r_out]
    residual: np.ndarray         # [d] diagonal
    rank_in: int

    @property
    def basis(self) -> np.ndarray:
        return self.vecs[:, :self.rank_in]


def shared_model(w: np.ndarray, rank_in: int, shared_rank: int,
                 floor: float) -> SharedModel:
    """W = (top rank_in block) + (components rank_in..shared_rank as
    factors) + diagonal residual max(diag(W) - diag(factors), floor)."""
    vals, vecs = eigen(w)
    idx = np.arange(rank_in, max(shared_rank, rank_in))
    idx = idx[vals[idx] > 0]
    f_out = vecs[:, idx] * np.sqrt(vals[idx])
    inside = (vecs[:, :rank_in] ** 2) @ np.maximum(vals[:rank_in], 0)
    resid = np.maximum(np.diag(w) - inside - (f_out ** 2).sum(1), floor)
    # keep only what sampling needs: it travels as a side input
    keep = max(rank_in, shared_rank)
    return SharedModel(vals[:keep], vecs[:, :rank_in].copy(), f_out, resid,
                       rank_in)


def class_factors(shared: SharedModel, class_block: Optional[np.ndarray]
                  ) -> np.ndarray:
    """Factors [d, rank_in + r_out] of one class: inside the subspace the
    class's block (the shared block if None), PSD-repaired by clipping
    negative eigenvalues; outside, the shared factors."""
    r = shared.rank_in
    if r == 0:
        return shared.outside_factors
    block = (np.diag(shared.vals[:r]) if class_block is None
             else (class_block + class_block.T) / 2)
    bv, bu = np.linalg.eigh(block)
    f_in = shared.basis @ (bu * np.sqrt(np.maximum(bv, 0.0)))
    return np.hstack([f_in, shared.outside_factors])


def spike_shrink(vals: np.ndarray, edge: float) -> np.ndarray:
    """Eigenvalues of (signal + symmetric Gaussian noise with spectrum
    edge ``edge``): an outlier lambda > edge comes from a spike theta =
    (lambda + sqrt(lambda^2 - edge^2)) / 2 (rank-one perturbation of a
    Wigner matrix); bulk eigenvalues carry no detectable signal: 0."""
    a = np.abs(vals)
    theta = np.where(a > edge,
                     (a + np.sqrt(np.maximum(a * a - edge * edge, 0))) / 2, 0)
    return np.sign(vals) * theta


def noise_edge(sigma: float, n: float, dim: int) -> float:
    """Spectrum edge of (isometric-upper Gaussian noise of std sigma) / n
    on a dim x dim matrix: off-diagonal std sigma / sqrt(2) / n, edge
    2 sqrt(dim) times that."""
    return math.sqrt(2.0 * dim) * sigma / max(n, 1.0)


def class_block(noisy_projected: np.ndarray, n_c: float,
                mean_c: np.ndarray, basis: np.ndarray) -> np.ndarray:
    """The class's own covariance inside the subspace: P^T M_c P / n_c -
    (P^T mu_c)(P^T mu_c)^T (a raw, noisy estimate; the noise is kept: it
    was measured to regularise the downstream classifier, see
    benchmarks/results/studies/utility_study-issue13.md)."""
    m = basis.T @ mean_c
    return noisy_projected / n_c - np.outer(m, m)


def variance_floor(cfg: GeneratorConfig, d: int) -> float:
    return cfg.variance_floor * cfg.clip_norm ** 2 / d


def _mixture(label: int, count: float, mean: np.ndarray,
             residual: np.ndarray, factors: np.ndarray,
             centre: np.ndarray) -> generator.ClassMixture:
    mix = generator.ClassMixture(
        label=label, weights=np.array([max(count, 0.0)]),
        means=mean[None, :], variances=residual[None, :].copy(),
        noisy_count=float(max(count, 0.0)), factors=factors)
    return generator.with_centre(mix, centre)


@kmeans.one_blas_thread
def shared_mixtures(noisy_n: np.ndarray, n: np.ndarray, means: np.ndarray,
                    shared: SharedModel, blocks: Optional[Sequence],
                    centre: np.ndarray, cfg: GeneratorConfig) -> dict:
    """Shared and subspace modes: one Gaussian per class (factors +
    diagonal), the class's own block inside the subspace if given."""
    return {c: _mixture(c, noisy_n[i], means[i], shared.residual,
                        class_factors(shared, None if blocks is None
                                      else blocks[i]), centre)
            for i, c in enumerate(cfg.labels)}


def spiked_within(within: np.ndarray, edge: float) -> np.ndarray:
    """The "spiked" class deviation (post-processing of one class's noisy
    within covariance C_c; no other class needed): eigenvalues above the
    noise edge ``edge`` (``noise_edge`` of its mechanism) are signal
    spikes, debiased by ``spike_shrink``; the rest (the bulk, where the
    noise hides any signal) are replaced by their mean, kept >= 0. The
    noise matrix has zero trace in expectation, so the bulk's mean keeps
    the class's variance outside the spikes, spread evenly instead of
    along noise directions. With no noise (edge 0) C_c is unchanged."""
    if edge <= 0:
        return within
    vals, vecs = np.linalg.eigh((within + within.T) / 2)
    bulk = vals <= edge
    out = spike_shrink(vals, edge)
    if bulk.any():
        out[bulk] = max(float(vals[bulk].mean()), 0.0)
    return (vecs * out) @ vecs.T


@kmeans.one_blas_thread
def per_class_mixture(label: int, noisy_m: np.ndarray, noisy_count: float,
                      n_and_mean: tuple[float, np.ndarray],
                      centre: np.ndarray, structure: Structure,
                      cfg: GeneratorConfig, sigma: float = 0.0
                      ) -> generator.ClassMixture:
    """Per-class mode, post-processing of one class's released second
    moment ``noisy_m`` (``noisy_class_second_moments`` or the Beam job's
    PipelineDP aggregation): its within covariance C_c (``class_within``),
    "spiked" at its mechanism's noise edge (``spiked_within``) when the
    structure's class_deviation says so, else as released ("raw"); then
    factors (top ``shared_rank`` eigenpairs) and the diagonal residual
    (``within_mixture``). No other class is needed, so the classes'
    mixtures are formed where their released moments are.
    ``n_and_mean``: the class's (n >= 1, mean) of ``class_means``;
    ``sigma``: the ledger's sigma of the class's second-moment mechanism
    (the spiked deviation's noise edge)."""
    n_c, mean = n_and_mean
    w = class_within(noisy_m, n_c, mean)
    if structure.class_deviation == "spiked":
        w = spiked_within(w, noise_edge(sigma, n_c, mean.shape[0]))
    return within_mixture(label, w, noisy_count, mean, centre, structure,
                          cfg)


def class_within(noisy_m: np.ndarray, n_c: float, mean: np.ndarray
                 ) -> np.ndarray:
    """One class's within covariance from its released second moment,
    M_c / n_c - mu_c mu_c^T (n_c >= 1, so it always exists)."""
    return covariance.within_covariance(noisy_m, [np.array([n_c])],
                                        [mean[None, :]])


@kmeans.one_blas_thread
def within_mixture(label: int, within: np.ndarray, count: float,
                   mean: np.ndarray, centre: np.ndarray,
                   structure: Structure, cfg: GeneratorConfig
                   ) -> generator.ClassMixture:
    """The class's Gaussian from a (post-processed) within covariance:
    factors (its top ``shared_rank`` positive eigenpairs) and the diagonal
    residual, floored (``variance_floor``). The per-class mode's last
    step, public so that a study can hand it class matrices post-processed
    its own way (benchmarks/studies/class_deviations.py); it reads nothing
    but its arguments, so given DP outputs its result is one too."""
    floor = variance_floor(cfg, mean.shape[0])
    factors, residual = covariance.factors_from_within(
        within, structure.shared_rank, floor)
    if residual is None:
        residual = np.full(mean.shape[0], floor)
    return _mixture(label, count, mean, residual, factors, centre)
