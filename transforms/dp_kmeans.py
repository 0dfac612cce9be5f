"""DP k-means in linear time, per class: LSH-tree coreset + DP Lloyd rounds.

Each pass over the data is one exact per-class aggregation followed by the
noise of its ledger mechanisms (see ``dpsynth.dp_ops.generator``); only noisy values
and post-processing reach the next pass, as side inputs. Lloyd rounds are
unrolled in the graph.
"""

from __future__ import annotations

from typing import Optional

import apache_beam as beam
import numpy as np
from apache_beam.pvalue import AsDict

from dpsynth.dp_ops import generator, kmeans, lsh_tree, moments
from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.dp_ops.ledger import PrivacyLedger
from dpsynth.dp_ops.noise import NoiseSource
from dpsynth.transforms.aggregate import Block, Blocks, PerClassSum, pass_blocks


def _level_counts(depth: int):
    def fn(label: int, block: Block) -> list[dict[int, int]]:
        return lsh_tree.level_counts(block.codes, depth)
    return fn


def _leaf_sums(bound: float):
    def fn(label: int, block: Block, trees: dict) -> np.ndarray:
        tree = trees[label]
        _, sums = moments.block_sums(block.z, tree.leaf_index(block.codes),
                                     len(tree.leaves), bound)
        return sums
    return fn


def _cluster_sums(k: int, bound: float):
    def fn(label: int, block: Block, centres: dict):
        counts, sums = moments.block_sums(
            block.z, kmeans.nearest(block.z, centres[label]), k, bound)
        return np.hstack([counts[:, None], sums])
    return fn


class DPKMeans(beam.PTransform):
    """Prepared blocks -> (label, centres [k, p]) in the clustering space.

    Applied to the PCollection of prepared blocks, or to the pipeline with
    ``blocks=RereadBlocks(...)`` (each pass then reads the files again).
    """

    def __init__(self, cfg: GeneratorConfig, ledger: PrivacyLedger, dim: int,
                 noise: NoiseSource,
                 blocks: Optional[Blocks] = None) -> None:
        super().__init__()
        self._cfg, self._ledger = cfg, ledger
        self._p = min(dim, cfg.cluster_dim)
        self._noise = noise
        self._blocks = blocks

    def expand(self, pcoll):
        blocks = self._blocks if self._blocks is not None else pcoll
        cfg, ledger, noise, p = self._cfg, self._ledger, self._noise, self._p
        labels = list(cfg.labels)
        depth = cfg.tree_depth
        if cfg.clusters == 1:
            centre = generator.single_cluster_centres(cfg, p)
            return pcoll.pipeline | "OneCluster" >> beam.Create(
                [(l, centre) for l in labels])

        def grow(kv):
            label, exact = kv
            exact = exact or [{} for _ in range(depth)]
            return label, generator.grow_tree(exact, label, cfg, ledger,
                                              noise)

        trees = (pass_blocks(blocks, "TreeCounts", rows=False)
                 | "TreeCounts" >> PerClassSum(
                     labels, _level_counts(depth),
                     add=lsh_tree.merge_level_counts_into)
                 | "GrowTree" >> beam.Map(grow))

        def coreset(kv, trees):
            label, sums = kv
            tree = trees[label]
            if sums is None:
                sums = np.zeros((len(tree.leaves), p))
            return label, generator.coreset_centres(
                tree, sums, label, cfg, ledger, noise)

        centres = (pass_blocks(blocks, "LeafSums", rows=False)
                   | "LeafSums" >> PerClassSum(labels, _leaf_sums(cfg.clip_norm),
                                               [AsDict(trees)])
                   | "Coreset" >> beam.Map(coreset, AsDict(trees)))

        for rnd in range(1, cfg.lloyd_rounds + 1):
            def update(kv, old, rnd=rnd):
                label, agg = kv
                if agg is None:
                    agg = np.zeros((cfg.clusters, p + 1))
                return label, generator.lloyd_update(
                    agg[:, 0], agg[:, 1:], old[label], rnd, label, cfg,
                    ledger, noise)

            centres = (pass_blocks(blocks, f"Lloyd{rnd}", rows=False)
                       | f"Lloyd{rnd}Sums" >> PerClassSum(
                           labels, _cluster_sums(cfg.clusters, cfg.clip_norm),
                           [AsDict(centres)])
                       | f"Lloyd{rnd}Update" >> beam.Map(update, AsDict(centres)))
        return centres
