"""The per-class steps of the DP mixture generator, as pure functions.

Each step takes *exact* aggregates of one class (computed by whoever holds
the data: the Beam transforms or the in-memory reference), adds the noise of
its ledger mechanisms, and returns only noisy or post-processed values. The
exact aggregates never leave these functions.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

import numpy as np

from dpsynth.dp_ops import covariance, kmeans, lsh_tree, moments, plan, sampling, vote
from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.dp_ops.ledger import PrivacyLedger
from dpsynth.dp_ops.noise import NoiseSource


def projection(dim: int, cfg: GeneratorConfig) -> np.ndarray:
    """Public orthonormal projection [p, dim] into the clustering space.

    Rows are orthonormal, so ||P x|| <= ||x|| <= R: sensitivities carry over.
    """
    if dim <= cfg.cluster_dim:
        return np.eye(dim)
    rng = np.random.default_rng([cfg.seed, 0xC1])
    q, _ = np.linalg.qr(rng.normal(size=(dim, cfg.cluster_dim)))
    return q.T


def planes(cfg: GeneratorConfig, dim: int) -> np.ndarray:
    return lsh_tree.hyperplanes(min(dim, cfg.cluster_dim), cfg.tree_depth,
                                cfg.seed)


def branch_threshold(cfg: GeneratorConfig, ledger: PrivacyLedger,
                     label: int) -> float:
    """Public: from the config or 3 sigma of the level counts."""
    if cfg.branch_threshold is not None:
        return cfg.branch_threshold
    sigma = ledger.get(plan.name(label, "tree", "level-1", "count")).sigma
    return max(3.0 * sigma, 2.0)


def aggregate_grid(sensitivity: float) -> float:
    """The grid every exact aggregate with this L2 sensitivity lies on:
    counts are integers, sums of rows clipped to B are on ``grid(B)``
    (moments.quantize) and the second moment's grid(R, 12)^2 is a multiple
    of grid(R^2). Noise on a lattice no coarser than it adds exactly."""
    return moments.grid(sensitivity)


def add_noise(ledger: PrivacyLedger, noise: NoiseSource, name: str,
           exact: np.ndarray) -> np.ndarray:
    """exact + the draw of mechanism ``name``, exactly."""
    mech = ledger.get(name)
    return noise.add(exact, mech.sigma, name,
                     aggregate_grid(mech.sensitivity))


def grow_tree(exact_levels: list[dict[int, int]], label: int,
              cfg: GeneratorConfig, ledger: PrivacyLedger,
              noise: NoiseSource) -> lsh_tree.Tree:
    def release(level: int, values: np.ndarray) -> np.ndarray:
        name = plan.name(label, "tree", f"level-{level}", "count")
        return add_noise(ledger, noise, name, values)
    return lsh_tree.build_tree(exact_levels, cfg.tree_depth,
                               branch_threshold(cfg, ledger, label),
                               release=release)


def coreset_centres(tree: lsh_tree.Tree, exact_leaf_sums: np.ndarray,
                    label: int, cfg: GeneratorConfig, ledger: PrivacyLedger,
                    noise: NoiseSource) -> np.ndarray:
    """k initial centres: weighted k-means on noisy leaf means."""
    name = plan.name(label, "tree", "leaf-sum")
    sums = add_noise(ledger, noise, name, exact_leaf_sums)
    counts = tree.leaf_counts()
    floor = max(branch_threshold(cfg, ledger, label) / 2, 1.0)
    keep = counts >= floor
    points = sums[keep] / counts[keep, None]
    norms = np.linalg.norm(points, axis=1, keepdims=True)
    points *= np.minimum(1.0, cfg.clip_norm / np.maximum(norms, 1e-300))
    rng = np.random.default_rng([cfg.seed, label, 2])
    dim = exact_leaf_sums.shape[1]
    if points.shape[0] == 0:
        return kmeans.random_centres(cfg.clusters, dim, rng, cfg.clip_norm / 2)
    return kmeans.weighted_kmeans(points, counts[keep], cfg.clusters, rng)


def lloyd_update(exact_counts: np.ndarray, exact_sums: np.ndarray,
                 centres: np.ndarray, rnd: int, label: int,
                 cfg: GeneratorConfig, ledger: PrivacyLedger,
                 noise: NoiseSource) -> np.ndarray:
    base = plan.name(label, "lloyd", f"round-{rnd}")
    counts = add_noise(ledger, noise, base + "/count", exact_counts)
    sums = add_noise(ledger, noise, base + "/sum", exact_sums)
    min_count = 3.0 * ledger.get(base + "/count").sigma
    return kmeans.update_centres(counts, sums, centres, min_count)


def add_moment_noise(exact: moments.Moments, label: int,
                     ledger: PrivacyLedger,
                     noise: NoiseSource) -> moments.Moments:
    """Noise on the fields the plan has (no ``sumsq`` with covariance)."""
    def noisy(field: str) -> Optional[np.ndarray]:
        name = plan.name(label, "moments", field)
        if name not in ledger:
            return None
        return add_noise(ledger, noise, name, getattr(exact, field))
    return moments.Moments(noisy("count"), noisy("sum"), noisy("sumsq"))


@dataclasses.dataclass
class ClassMixture:
    """The DP mixture of one class (all fields are DP outputs)."""

    label: int
    weights: np.ndarray
    means: np.ndarray
    variances: np.ndarray
    noisy_count: float
    factors: Optional[np.ndarray] = None  # [d, r], see covariance.py
    centre: Optional[np.ndarray] = None  # [d] the DP centre (see centre.py)


def mixture(noisy: moments.Moments, label: int,
            cfg: GeneratorConfig) -> ClassMixture:
    w, mu, var = moments.mixture_from_moments(noisy, cfg.clip_norm,
                                              cfg.variance_floor)
    return ClassMixture(label, w, mu, var, float(np.clip(noisy.count, 0, None).sum()))


def noisy_second_moment(exact: np.ndarray, ledger: PrivacyLedger,
                        noise: NoiseSource,
                        name: str = plan.COVARIANCE) -> np.ndarray:
    """A second-moment mechanism (global, or one class's), sensitivity R^2
    for its isometric upper triangle (see covariance.py): noise of sigma on
    each diagonal entry and sigma / sqrt(2) on each off-diagonal entry, the
    same mechanism as sigma on the isometric vector (entries scaled by
    sqrt(2) off the diagonal) but on the matrix's own grid, so exact."""
    mech = ledger.get(name)
    sigma, grid = mech.sigma, aggregate_grid(mech.sensitivity)
    d = exact.shape[0]
    rows, cols = np.triu_indices(d, 1)
    out = np.zeros((d, d))
    out[np.diag_indices(d)] = noise.add(np.diag(exact), sigma,
                                        name + "#diagonal", grid)
    off = noise.add(exact[rows, cols], sigma / math.sqrt(2),
                    name + "#off-diagonal", grid)
    out[rows, cols] = off
    out[cols, rows] = off
    return out


@kmeans.one_blas_thread
def add_factors(mixes: Sequence[ClassMixture], noisy_m: np.ndarray,
                cfg: GeneratorConfig) -> list[ClassMixture]:
    """Post-processing: low-rank factors + diagonal residual of the
    within-cluster covariance of ``noisy_m`` (the matrix of exactly these
    classes: all of them for "shared", one for "per-class")."""
    d = noisy_m.shape[0]
    floor = cfg.variance_floor * cfg.clip_norm ** 2 / d
    factors, residual = covariance.factors_and_residual(
        noisy_m, [m.weights for m in mixes], [m.means for m in mixes],
        cfg.covariance_rank, floor)
    return [dataclasses.replace(
        m, factors=factors,
        variances=(m.variances if residual is None
                   else np.broadcast_to(residual, m.variances.shape).copy()))
        for m in mixes]


def with_centre(mix: ClassMixture,
                centre: Optional[np.ndarray]) -> ClassMixture:
    """Post-processing: means from the centred space back to the input's."""
    if centre is None:
        return mix
    return dataclasses.replace(mix, means=mix.means + centre[None, :],
                               centre=centre)


def centred(rows: np.ndarray, mix: ClassMixture) -> np.ndarray:
    """Synthetic rows in the space of the clipped (centred) records."""
    return rows if mix.centre is None else rows - mix.centre[None, :]


def single_cluster_centres(cfg: GeneratorConfig, dim: int) -> np.ndarray:
    """With --clusters 1 there is nothing to cluster: one public centre."""
    return np.zeros((1, min(dim, cfg.cluster_dim)))


def num_samples(mix: ClassMixture, cfg: GeneratorConfig) -> int:
    """Rows to sample: --samples-per-class, or the noisy class count; none
    when no component kept any mass (every noisy component count < 1)."""
    if mix.weights.sum() <= 0:
        return 0
    if cfg.samples_per_class is not None:
        return cfg.samples_per_class
    return int(round(mix.noisy_count))


# Rows per random stream: the synthetic rows of a class are the same
# whatever the shard size or the worker that draws them.
SAMPLE_CHUNK = 1024


def _sample_chunk(mix: ClassMixture, cfg: GeneratorConfig, chunk: int,
                  size: int) -> np.ndarray:
    rng = np.random.default_rng([cfg.seed, mix.label, 1, chunk])
    out = sampling.sample_mixture(mix.weights, mix.means, mix.variances,
                                  size, rng, mix.factors)
    if cfg.normalize == "unit":
        out = sampling.project_to_sphere(out, cfg.sample_radius)
    return out


@kmeans.one_blas_thread
def sample_rows(mix: ClassMixture, cfg: GeneratorConfig, total: int,
                start: int, stop: int) -> np.ndarray:
    """Rows [start, stop) of the class's ``total`` synthetic rows (float32):
    drawn chunk by chunk, one public random stream per chunk, so a writer
    can draw just its shard."""
    d = mix.means.shape[1]
    if total <= 0 or mix.weights.sum() <= 0 or stop <= start:
        return np.zeros((0, d), np.float32)
    first, last = start // SAMPLE_CHUNK, (stop - 1) // SAMPLE_CHUNK
    parts = [_sample_chunk(mix, cfg, c, min(SAMPLE_CHUNK,
                                            total - c * SAMPLE_CHUNK))
             for c in range(first, last + 1)]
    rows = np.concatenate(parts) if len(parts) > 1 else parts[0]
    offset = start - first * SAMPLE_CHUNK
    return rows[offset:offset + stop - start]


def sample(mix: ClassMixture, cfg: GeneratorConfig,
           oversample: float = 1.0) -> np.ndarray:
    m = int(round(num_samples(mix, cfg) * oversample))
    return sample_rows(mix, cfg, m, 0, m)


def candidates(mix: ClassMixture, cfg: GeneratorConfig) -> np.ndarray:
    """The candidate samples of one class mixture (all, if no vote filter):
    ``vote_oversample`` per wanted sample, capped at
    ``vote_max_candidates`` (see ``vote.candidate_oversample``)."""
    return sample(mix, cfg, vote.candidate_oversample(num_samples(mix, cfg),
                                                      cfg))


def noisy_centre(exact_sum: np.ndarray, exact_count: float,
                 cfg: GeneratorConfig, ledger: PrivacyLedger,
                 noise: NoiseSource) -> np.ndarray:
    """The DP centre: noisy sum / noisy count, kept in the B-ball."""
    total = add_noise(ledger, noise, plan.CENTRE_SUM, exact_sum)
    count = np.asarray(exact_count, np.float64).reshape(1)
    count = add_noise(ledger, noise, plan.CENTRE_COUNT, count)
    return centre_from(total, float(count[0]), cfg)


def centre_from(noisy_sum: np.ndarray, noisy_count: float,
                cfg: GeneratorConfig) -> np.ndarray:
    centre = noisy_sum / max(float(noisy_count), 1.0)
    norm = np.linalg.norm(centre)
    return centre * min(1.0, cfg.centre_bound / max(norm, 1e-300))


def noisy_votes(exact_votes: np.ndarray, label: int, ledger: PrivacyLedger,
                noise: NoiseSource) -> np.ndarray:
    """The class's vote histogram (L2 sensitivity 1 under add/remove one
    record: the record votes once, for one candidate; the histogram is
    dense over the public candidates) plus its ledger mechanism's noise."""
    name = plan.name(label, "vote", "histogram")
    return add_noise(ledger, noise, name, exact_votes)


# The public random stream of the vote's selection draw (after 1: samples,
# 2: coreset k-means).
SELECTION_STREAM = 3


def vote_copies(exact_votes: np.ndarray, label: int, rows: int,
                cfg: GeneratorConfig, ledger: PrivacyLedger,
                noise: NoiseSource) -> np.ndarray:
    """How many times each candidate of ``label`` is written: ``rows``
    (the class's DP sample count) drawn in proportion to the clipped noisy
    votes, or, with ``--vote-threshold``, the legacy filter (once each
    candidate at or above it). Post-processing of the noisy histogram, the
    public row count and the public seed."""
    noisy = noisy_votes(exact_votes, label, ledger, noise)
    if cfg.vote_threshold is not None:
        return vote.keep_mask(noisy, cfg.vote_threshold).astype(np.int64)
    rng = np.random.default_rng([cfg.seed, label, SELECTION_STREAM])
    return vote.resample_copies(noisy, rows, rng)


def filter_by_votes(cands: np.ndarray, exact_votes: np.ndarray, label: int,
                    cfg: GeneratorConfig, ledger: PrivacyLedger,
                    noise: NoiseSource, rows: Optional[int] = None
                    ) -> np.ndarray:
    """The voted release of one class: each candidate repeated by
    ``vote_copies``. ``rows``: the class's DP sample count (None: the
    candidates' count over the oversampling, for callers without a
    mixture)."""
    if rows is None:
        rows = int(round(len(cands) / max(cfg.vote_oversample, 1.0)))
    copies = vote_copies(exact_votes, label, rows, cfg, ledger, noise)
    return np.repeat(cands, copies, axis=0)
