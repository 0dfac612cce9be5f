"""The adaptive plan's post-processing (free): what turns the released
noisy counts, sums and second moments into class means, covariances and
each class's Gaussian (factors + a diagonal). Reads DP outputs, the
public structure and the ledger's sigmas only."""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Optional, Sequence

import numpy as np

from dpsynth.dp_ops import covariance, generator, kmeans, plan
from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.dp_ops.ledger import PrivacyLedger
from dpsynth.dp_ops.adaptive.rule import CLASS_DEVIATIONS, Structure


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
def per_class_mixtures(noisy_m: Iterable[np.ndarray], noisy_n: np.ndarray,
                       n: np.ndarray, means: np.ndarray, centre: np.ndarray,
                       structure: Structure, cfg: GeneratorConfig,
                       ledger: PrivacyLedger,
                       class_deviation: str = "raw") -> dict:
    """Per-class mode, post-processing of the released class second
    moments ``noisy_m`` (label order; ``noisy_class_second_moments`` or the
    Beam job's PipelineDP aggregation): each class's within covariance C_c
    (optionally, by ``class_deviation`` at the noise edge of the ledger's
    sigma: "spectral", shrunk towards the pooled one,
    ``shrink_class_deviations``; "spiked", ``spiked_within``; "shrunk",
    mixed with the pooled one by ``shrinkage_weights``), then factors (top
    ``shared_rank`` eigenpairs) and the diagonal residual."""
    if class_deviation not in CLASS_DEVIATIONS:
        raise ValueError(f"unknown class deviation {class_deviation!r}")
    d = means.shape[1]
    floor = variance_floor(cfg, d)
    labelled = list(zip(enumerate(cfg.labels), noisy_m))

    def sigma(c: int) -> float:
        return ledger.get(plan.class_covariance(c)).sigma

    # "raw" and "spiked" form one class's d x d within matrix at a time;
    # "spectral" and "shrunk" need them all (pooled).
    if class_deviation == "spectral":
        withins = shrink_class_deviations(
            [_class_within(m, n[i], means[i], "raw", 0.0)
             for (i, _), m in labelled], n,
            [noise_edge(sigma(c), n[i], d) for (i, c), _ in labelled])
    elif class_deviation == "shrunk":
        withins = shrink_towards_pooled(
            [_class_within(m, n[i], means[i], "raw", 0.0)
             for (i, _), m in labelled], n,
            [sigma(c) for c in cfg.labels])
    else:
        withins = (_class_within(m, n[i], means[i], class_deviation,
                                 sigma(c)) for (i, c), m in labelled)
    return {c: _within_mixture(c, w, noisy_n[i], means[i], centre,
                               structure, floor)
            for (i, c), w in zip(enumerate(cfg.labels), withins)}


@kmeans.one_blas_thread
def per_class_mixture(label: int, noisy_m: np.ndarray, noisy_count: float,
                      n_and_mean: tuple[float, np.ndarray],
                      centre: np.ndarray, structure: Structure,
                      cfg: GeneratorConfig, sigma: float = 0.0
                      ) -> generator.ClassMixture:
    """One class of ``per_class_mixtures`` with the structure's "raw" or
    "spiked" deviation: neither needs another class, so the classes'
    mixtures are formed where their released moments are
    (post-processing). ``n_and_mean``: the class's (n >= 1, mean) of
    ``class_means``; ``sigma``: the ledger's sigma of the class's
    second-moment mechanism (for the spiked deviation's noise edge)."""
    n_c, mean = n_and_mean
    if structure.class_deviation not in ("raw", "spiked"):
        raise ValueError(f"class deviation {structure.class_deviation!r} "
                         "needs every class (per_class_mixtures)")
    w = _class_within(noisy_m, n_c, mean, structure.class_deviation, sigma)
    return _within_mixture(label, w, noisy_count, mean, centre, structure,
                           variance_floor(cfg, mean.shape[0]))


def _class_within(noisy_m: np.ndarray, n_c: float, mean: np.ndarray,
                  deviation: str, sigma: float) -> np.ndarray:
    """One class's within covariance from its released second moment
    (n_c >= 1, so it always exists), "spiked" at its mechanism's noise
    edge (``sigma``: the ledger's) or "raw"."""
    w = covariance.within_covariance(noisy_m, [np.array([n_c])],
                                     [mean[None, :]])
    if deviation == "spiked":
        return spiked_within(w, noise_edge(sigma, n_c, mean.shape[0]))
    return w


def _within_mixture(label: int, within: np.ndarray, count: float,
                    mean: np.ndarray, centre: np.ndarray,
                    structure: Structure,
                    floor: float) -> generator.ClassMixture:
    factors, residual = covariance.factors_from_within(
        within, structure.shared_rank, floor)
    if residual is None:
        residual = np.full(mean.shape[0], floor)
    return _mixture(label, count, mean, residual, factors, centre)


# ------------------------------------------------------ study options
# Opt-in class-matrix post-processings no CLI flag reaches ("spectral",
# "shrunk"; RuleConstants.deviation / class_deviation): measured and not
# adopted (docs/method.md, "The rule's constants"). They stay beside the
# product's because the in-memory reference and the Beam job dispatch on
# the structure's class_deviation.

def shrink_deviation(block: np.ndarray, shared_block: np.ndarray,
                     edge: float) -> np.ndarray:
    """shared + spectrally shrunk (block - shared) (the "spectral" option)."""
    dv, du = np.linalg.eigh((block - shared_block + (block - shared_block).T)
                            / 2)
    return shared_block + (du * spike_shrink(dv, edge)) @ du.T


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


def pooled_within(withins: Sequence[np.ndarray], n: np.ndarray
                  ) -> np.ndarray:
    """sum_c n_c C_c / sum_c n_c (symmetrised): the pooled within
    covariance of the released class matrices (post-processing)."""
    w = np.asarray(n, np.float64)
    pooled = sum(wi * ci for wi, ci in zip(w, withins)) / w.sum()
    return (pooled + pooled.T) / 2


def shrink_towards_pooled(withins: Sequence[np.ndarray], n: np.ndarray,
                          sigmas: Sequence[float]) -> list[np.ndarray]:
    """The "shrunk" class deviation: lambda_c pooled + (1 - lambda_c) C_c
    with ``shrinkage_weights``; a convex mix of symmetric matrices (the
    factors keep its positive eigenpairs: the PSD repair of every mode)."""
    lam = shrinkage_weights(withins, n, sigmas)
    pooled = pooled_within(withins, n)
    return [lam[i] * pooled + (1.0 - lam[i]) * c
            for i, c in enumerate(withins)]
