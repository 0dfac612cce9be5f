"""In-memory reference of the whole generator (numpy only, no Beam).

Same steps, same public seeds and, with a ``SeededNoise``, the same noise
draws as the Beam pipeline: the speed yardstick and the statistical
cross-check for ``pipelines.generate``.
"""

from __future__ import annotations

import numpy as np

from dp_ops import clipping, generator, kmeans, lsh_tree, moments
from dp_ops.config import GeneratorConfig
from dp_ops.ledger import PrivacyLedger
from dp_ops.noise import NoiseSource


def generate_class(x: np.ndarray, label: int, cfg: GeneratorConfig,
                   ledger: PrivacyLedger, noise: NoiseSource
                   ) -> tuple[generator.ClassMixture, np.ndarray]:
    """x: the clipped rows of one class. Returns its mixture and samples."""
    proj = generator.projection(x.shape[1], cfg)
    z = x @ proj.T
    codes = lsh_tree.leaf_codes(z, generator.planes(cfg, x.shape[1]))
    tree = generator.grow_tree(lsh_tree.level_counts(codes, cfg.tree_depth),
                               label, cfg, ledger, noise)
    leaf = tree.leaf_index(codes)
    _, leaf_sums = moments.block_sums(z, leaf, len(tree.leaves), cfg.clip_norm)
    centres = generator.coreset_centres(tree, leaf_sums, label, cfg, ledger,
                                        noise)
    for rnd in range(1, cfg.lloyd_rounds + 1):
        counts, sums = moments.block_sums(z, kmeans.nearest(z, centres),
                                          cfg.clusters, cfg.clip_norm)
        centres = generator.lloyd_update(counts, sums, centres, rnd, label,
                                         cfg, ledger, noise)
    exact = moments.block_moments(x, kmeans.nearest(z, centres), cfg.clusters,
                                  cfg.clip_norm)
    mix = generator.mixture(
        generator.add_moment_noise(exact, label, ledger, noise), label, cfg)
    cands = generator.candidates(mix, cfg)
    if cfg.vote_filter:
        from dp_ops import vote
        cands = generator.filter_by_votes(cands, vote.block_votes(x, cands),
                                          label, cfg, ledger, noise)
    return mix, cands


def generate(x: np.ndarray, y: np.ndarray, cfg: GeneratorConfig,
             ledger: PrivacyLedger, noise: NoiseSource
             ) -> tuple[dict[int, generator.ClassMixture], np.ndarray, np.ndarray]:
    """Whole dataset -> (mixtures per label, synthetic x, synthetic y).

    Rows whose label is outside ``cfg.labels`` are an error (the label set is
    public configuration).
    """
    unknown = np.setdiff1d(np.unique(y), np.array(cfg.labels))
    if unknown.size:
        raise ValueError(f"labels {unknown.tolist()} are not in --labels")
    xc, _ = clipping.preprocess(x, cfg.normalize, cfg.clip_norm)
    mixes, xs, ys = {}, [], []
    for label in cfg.labels:
        mix, synth = generate_class(xc[y == label], label, cfg, ledger, noise)
        mixes[label] = mix
        xs.append(synth)
        ys.append(np.full(len(synth), label, dtype=np.int64))
    return mixes, np.vstack(xs), np.concatenate(ys)
