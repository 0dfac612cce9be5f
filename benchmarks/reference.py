"""In-memory reference of the whole generator (numpy only, no Beam).

Same steps, same public seeds and, with a ``SeededNoise``, the same noise
draws as the Beam pipeline: the speed yardstick and the statistical
cross-check for ``dpsynth.pipelines.cli.generate``.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterable, Iterator, Optional, Sequence

import numpy as np

from dpsynth.dp_ops import (adaptive, clipping, covariance, generator, kmeans,
                    lsh_tree, moments, plan, vote)
from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.dp_ops.ledger import PrivacyLedger
from dpsynth.dp_ops.noise import NoiseSource

# Study post-processings of DP outputs (benchmarks/studies/
# class_deviations.py), hooks of ``generate_adaptive``: the per-class
# mode's raw class within covariances, their noisy counts (>= 1) and the
# ledger's sigmas -> the matrices to factor; a subspace block, the shared
# model, the class's noisy count and its mechanism's sigma -> the block.
ClassPost = Callable[[list, np.ndarray, Sequence[float]], list]
BlockPost = Callable[[np.ndarray, "adaptive.SharedModel", float, float],
                     np.ndarray]


@contextlib.contextmanager
def _timed(timings: Optional[dict], stage: str) -> Iterator[None]:
    """Adds the block's wall time to ``timings[stage]`` (if given)."""
    t0 = time.perf_counter()
    yield
    if timings is not None:
        timings[stage] = timings.get(stage, 0.0) + time.perf_counter() - t0


def fit_class(x: np.ndarray, label: int, cfg: GeneratorConfig,
              ledger: PrivacyLedger, noise: NoiseSource,
              timings: Optional[dict] = None) -> generator.ClassMixture:
    """x: the clipped rows of one class. Returns its (diagonal) mixture."""
    with _timed(timings, "project"):
        proj = generator.projection(x.shape[1], cfg)
        z = x @ proj.T
    if cfg.clusters == 1:
        centres = generator.single_cluster_centres(cfg, x.shape[1])
    else:
        centres = _cluster(x, z, label, cfg, ledger, noise, timings)
    with _timed(timings, "moments"):
        exact = moments.block_moments(x, kmeans.nearest(z, centres),
                                      cfg.clusters, cfg.clip_norm,
                                      sumsq=not cfg.covariance_rank)
        return generator.mixture(
            generator.add_moment_noise(exact, label, ledger, noise), label,
            cfg)


def _cluster(x: np.ndarray, z: np.ndarray, label: int, cfg: GeneratorConfig,
             ledger: PrivacyLedger, noise: NoiseSource,
             timings: Optional[dict]) -> np.ndarray:
    """DP k-means centres in the clustering space: tree coreset + Lloyd."""
    with _timed(timings, "project"):
        codes = lsh_tree.leaf_codes(z, generator.planes(cfg, x.shape[1]))
    with _timed(timings, "tree"):
        tree = generator.grow_tree(lsh_tree.level_counts(codes, cfg.tree_depth),
                                   label, cfg, ledger, noise)
        leaf = tree.leaf_index(codes)
        _, leaf_sums = moments.block_sums(z, leaf, len(tree.leaves),
                                          cfg.clip_norm)
        centres = generator.coreset_centres(tree, leaf_sums, label, cfg,
                                            ledger, noise)
    with _timed(timings, "lloyd"):
        for rnd in range(1, cfg.lloyd_rounds + 1):
            counts, sums = moments.block_sums(z, kmeans.nearest(z, centres),
                                              cfg.clusters, cfg.clip_norm)
            centres = generator.lloyd_update(counts, sums, centres, rnd,
                                             label, cfg, ledger, noise)
    return centres


def sample_class(mix: generator.ClassMixture, x: np.ndarray,
                 cfg: GeneratorConfig, ledger: PrivacyLedger,
                 noise: NoiseSource, timings: Optional[dict] = None
                 ) -> np.ndarray:
    """Synthetic rows of one class (vote-filtered against x if enabled)."""
    with _timed(timings, "sample"):
        cands = generator.candidates(mix, cfg)
    if cfg.vote_filter:
        with _timed(timings, "vote"):
            votes = vote.block_votes(x, generator.centred(cands, mix))
            cands = generator.filter_by_votes(
                cands, votes, mix.label, cfg, ledger, noise,
                rows=generator.num_samples(mix, cfg))
    return cands


def generate_class(x: np.ndarray, label: int, cfg: GeneratorConfig,
                   ledger: PrivacyLedger, noise: NoiseSource,
                   timings: Optional[dict] = None
                   ) -> tuple[generator.ClassMixture, np.ndarray]:
    """One class alone (no shared covariance): its mixture and samples."""
    mix = fit_class(x, label, cfg, ledger, noise, timings)
    return mix, sample_class(mix, x, cfg, ledger, noise, timings)


def _add_factors(xc: np.ndarray, rows: dict, mixes: dict,
                 cfg: GeneratorConfig, ledger: PrivacyLedger,
                 noise: NoiseSource) -> dict:
    """Covariance factors from the global or the per-class second moments."""
    if cfg.covariance == "shared":
        noisy_m = generator.noisy_second_moment(
            covariance.block_second_moment(xc, cfg.clip_norm), ledger, noise)
        return dict(zip(mixes, generator.add_factors(
            list(mixes.values()), noisy_m, cfg)))
    out = {}
    for label, mix in mixes.items():
        noisy_m = generator.noisy_second_moment(
            covariance.block_second_moment(rows[label], cfg.clip_norm),
            ledger, noise, plan.class_covariance(label))
        out[label] = generator.add_factors([mix], noisy_m, cfg)[0]
    return out


def generate(x: np.ndarray, y: np.ndarray, cfg: GeneratorConfig,
             ledger: PrivacyLedger, noise: NoiseSource,
             timings: Optional[dict] = None
             ) -> tuple[dict[int, generator.ClassMixture], np.ndarray, np.ndarray]:
    """Whole dataset -> (mixtures per label, synthetic x, synthetic y).

    Rows whose label is outside ``cfg.labels`` are an error (the label set is
    public configuration). ``timings``, if given, receives the seconds spent
    per stage, summed over classes.
    """
    unknown = np.setdiff1d(np.unique(y), np.array(cfg.labels))
    if unknown.size:
        raise ValueError(f"labels {unknown.tolist()} are not in --labels")
    with _timed(timings, "clip"):  # normalise once for both passes
        xn = clipping.normalize_rows(np.asarray(x, np.float64), cfg.normalize)
    centre = None
    if cfg.center:
        with _timed(timings, "centre"):
            total, count = clipping.centre_sum(xn, "none", cfg.centre_bound)
            centre = generator.noisy_centre(total, count, cfg, ledger, noise)
    with _timed(timings, "clip"):
        xc, _ = clipping.preprocess(xn, "none", cfg.clip_norm, centre)
    rows = {label: xc[y == label] for label in cfg.labels}
    with kmeans.blas_threads(1):  # small products: see blas_threads
        mixes = {label: fit_class(rows[label], label, cfg, ledger, noise,
                                  timings)
                 for label in cfg.labels}
    if cfg.covariance_rank:
        with _timed(timings, "covariance"):
            mixes = _add_factors(xc, rows, mixes, cfg, ledger, noise)
    mixes = {label: generator.with_centre(m, centre)
             for label, m in mixes.items()}
    xs, ys = [], []
    for label in cfg.labels:
        synth = sample_class(mixes[label], rows[label], cfg, ledger, noise,
                             timings)
        xs.append(synth)
        ys.append(np.full(len(synth), label, dtype=np.int64))
    return mixes, np.vstack(xs), np.concatenate(ys)


# ------------------------------------------------- adaptive plan

def generate_adaptive(x: np.ndarray, y: np.ndarray, cfg: GeneratorConfig,
                      noise: NoiseSource,
                      constants: Optional[adaptive.RuleConstants] = None,
                      timings: Optional[dict] = None,
                      class_post: Optional[ClassPost] = None,
                      block_post: Optional[BlockPost] = None):
    """The adaptive two-phase generator (dpsynth.dp_ops.adaptive), in memory: the
    same exact aggregates, mechanism names and keyed noise as the Beam job
    (``dpsynth.transforms.two_phase``), so a ``SeededNoise`` gives the same release.

    Returns (mixtures per label, synthetic x, synthetic y, ledger,
    structure). Uses cfg's labels, epsilon, delta, clip_norm, normalize,
    accountant, seed, variance_floor and samples_per_class; the rest of
    the structure comes from the rule (``constants`` default:
    ``adaptive.constants_for(cfg)``). The ledger is built in two phases and
    ends up holding exactly the mechanisms that ran.

    ``class_post`` / ``block_post``: study post-processings the product
    does not ship (benchmarks/studies/class_deviations.py), of DP outputs
    only, so the mechanisms, the ledger and the noise draws are the
    product's (``per_class_mixtures``; ``block_post`` on each subspace
    block, in the subspace mode).
    """
    unknown = np.setdiff1d(np.unique(y), np.array(cfg.labels))
    if unknown.size:
        raise ValueError(f"labels {unknown.tolist()} are not in --labels")
    labels = list(cfg.labels)
    constants = constants or adaptive.constants_for(cfg)
    with _timed(timings, "clip"):
        xn = clipping.normalize_rows(np.asarray(x, np.float64), cfg.normalize)
        d = xn.shape[1]
    mu = adaptive.calibrate_mu(cfg, d, constants)
    ledger = adaptive.phase1_ledger(cfg, mu)
    with _timed(timings, "phase1"):  # pass 1: centre + class counts
        total, count = clipping.centre_sum(xn, "none", cfg.centre_bound)
        centre = generator.noisy_centre(total, count, cfg, ledger, noise)
        noisy_n = adaptive.noisy_counts(
            adaptive.exact_class_counts(y, labels), labels, ledger, noise)
    structure = adaptive.choose_structure(
        cfg.epsilon, cfg.delta, d, noisy_n, constants, mu,
        "subspace" if cfg.covariance == "subspace" else None)
    adaptive.add_phase2(ledger, cfg, structure, mu)
    with _timed(timings, "phase2"):  # pass 2: sums + second moment(s)
        xc, _ = clipping.preprocess(xn, "none", cfg.clip_norm, centre)
        rows = [xc[y == c] for c in labels]
        sums = np.stack([adaptive.block_class_sum(r, cfg.clip_norm)
                         for r in rows])
        if structure.mode == "per-class":
            exact_m = np.stack([covariance.block_second_moment(
                r, cfg.clip_norm) for r in rows])
        else:
            exact_m = covariance.block_second_moment(xc, cfg.clip_norm)
    with _timed(timings, "covariance"):
        mixes = _adaptive_mixtures(rows, sums, exact_m, noisy_n, centre,
                                   structure, cfg, ledger, noise,
                                   class_post, block_post)
    xs, ys = [], []
    for i, c in enumerate(labels):
        synth = sample_class(mixes[c], rows[i], cfg, ledger, noise, timings)
        xs.append(synth)
        ys.append(np.full(len(synth), c, dtype=np.int64))
    return mixes, np.vstack(xs), np.concatenate(ys), ledger, structure


def _adaptive_mixtures(rows: list, exact_sums: np.ndarray,
                       exact_m: np.ndarray, noisy_n: np.ndarray,
                       centre: np.ndarray, structure, cfg: GeneratorConfig,
                       ledger: PrivacyLedger, noise: NoiseSource,
                       class_post: Optional[ClassPost] = None,
                       block_post: Optional[BlockPost] = None) -> dict:
    """Phase-2 mechanisms on the exact aggregates (and, in the subspace
    mode, pass 3 over the rows), then one Gaussian per class."""
    noisy_sums = adaptive.noisy_class_sums(exact_sums, cfg.labels, ledger,
                                           noise)
    n, means = adaptive.class_means(noisy_sums, noisy_n, cfg.clip_norm)
    if structure.mode == "per-class":
        released = adaptive.noisy_class_second_moments(exact_m, cfg.labels,
                                                       ledger, noise)
        return per_class_mixtures(released, noisy_n, n, means, centre,
                                  structure, cfg, ledger, class_post)
    shared = adaptive.shared_stage(exact_m, n, means, structure, cfg, ledger,
                                   noise)
    blocks = None
    if structure.mode == "subspace":  # pass 3: the class subspace moments
        blocks = [adaptive.noisy_class_block(
            adaptive.projected_block_moment(r, shared.basis, cfg.clip_norm),
            c, n[i], means[i], shared, ledger, noise)
            for i, (c, r) in enumerate(zip(cfg.labels, rows))]
        if block_post is not None:
            blocks = [block_post(b, shared, n[i], ledger.get(
                adaptive.class_matrix_name(c)).sigma)
                for i, (c, b) in enumerate(zip(cfg.labels, blocks))]
    return adaptive.shared_mixtures(noisy_n, n, means, shared, blocks, centre,
                                    cfg)


def per_class_mixtures(noisy_m: Iterable[np.ndarray], noisy_n: np.ndarray,
                       n: np.ndarray, means: np.ndarray, centre: np.ndarray,
                       structure: adaptive.Structure, cfg: GeneratorConfig,
                       ledger: PrivacyLedger,
                       class_post: Optional[ClassPost] = None) -> dict:
    """The per-class mode's mixtures from the released class second
    moments ``noisy_m`` (label order), as the Beam job forms them: one
    class at a time (``adaptive.per_class_mixture`` with the structure's
    class deviation). With ``class_post`` (a study's all-class
    post-processing; the structure's deviation must then be "raw"), the
    classes' raw within covariances (``adaptive.class_within``) go
    through ``class_post(withins, n, sigmas)`` (sigmas: the ledger's, of
    each class's second-moment mechanism) before ``adaptive.within_mixture``."""
    labels = list(cfg.labels)
    sigmas = [ledger.get(plan.class_covariance(c)).sigma for c in labels]
    if class_post is None:
        return {c: adaptive.per_class_mixture(
            c, m, noisy_n[i], (n[i], means[i]), centre, structure, cfg,
            sigmas[i]) for (i, c), m in zip(enumerate(labels), noisy_m)}
    if structure.class_deviation != "raw":
        raise ValueError("a study's class post-processing starts from the "
                         "raw class matrices (class_deviation='raw')")
    withins = [adaptive.class_within(m, n[i], means[i])
               for i, m in enumerate(noisy_m)]
    withins = class_post(withins, n, sigmas)
    return {c: adaptive.within_mixture(c, withins[i], noisy_n[i], means[i],
                                       centre, structure, cfg)
            for i, c in enumerate(labels)}
