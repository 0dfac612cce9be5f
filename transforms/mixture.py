"""Per-cluster DP moments -> DP Gaussian mixture, sampling and vote filter."""

from __future__ import annotations

from typing import Optional

import apache_beam as beam
import numpy as np
from apache_beam.pvalue import AsDict

from dp_ops import generator, kmeans, moments, plan, vote
from dp_ops.config import GeneratorConfig
from dp_ops.ledger import PrivacyLedger
from dp_ops.noise import make_noise_source
from transforms.aggregate import Block, Blocks, PerClassSum, pass_blocks
from transforms.noise import AddNoise


def _moments(k: int, bound: float):
    def fn(label: int, block: Block, centres: dict) -> moments.Moments:
        return moments.block_moments(
            block.x, kmeans.nearest(block.z, centres[label]), k, bound)
    return fn


class DPMixture(beam.PTransform):
    """Prepared blocks + centres -> (label, ClassMixture).

    Mechanisms (per class, add/remove one record, which is in one cluster):
    count vector (L2 sensitivity 1), sum of clipped x (R), sum of x*x (R^2).
    Their noise goes through PipelineDP (or seeded noise, see noise.py).
    """

    def __init__(self, cfg: GeneratorConfig, ledger: PrivacyLedger, dim: int,
                 centres, noise_seed: Optional[int],
                 blocks: Optional[Blocks] = None) -> None:
        super().__init__()
        self._cfg, self._ledger, self._dim = cfg, ledger, dim
        self._centres, self._noise_seed = centres, noise_seed
        self._blocks = blocks

    def expand(self, pcoll):
        blocks = self._blocks if self._blocks is not None else pcoll
        cfg, k, d = self._cfg, self._cfg.clusters, self._dim
        labels = list(cfg.labels)
        exact = (pass_blocks(blocks, "Moments")
                 | "Moments" >> PerClassSum(labels, _moments(k, cfg.clip_norm),
                                            [AsDict(self._centres)])
                 | "ZeroEmpty" >> beam.MapTuple(
                     lambda l, m: (l, m or moments.Moments.zeros(k, d))))
        noisy = {}
        for field in ("count", "sum", "sumsq"):
            noisy[field] = (
                exact
                | f"Take{field}" >> beam.MapTuple(
                    lambda l, m, f=field: (l, getattr(m, f)))
                | f"Noise{field}" >> AddNoise(
                    self._ledger,
                    lambda l, f=field: plan.name(l, "moments", f),
                    labels, self._noise_seed))

        def to_mixture(kv):
            label, parts = kv
            (count,), (total,), (sumsq,) = (parts["count"], parts["sum"],
                                            parts["sumsq"])
            return label, generator.mixture(
                moments.Moments(count, total, sumsq), label, cfg)

        return (noisy | "JoinMoments" >> beam.CoGroupByKey()
                | "Mixture" >> beam.Map(to_mixture))


def _votes(label: int, block: Block, index: dict) -> np.ndarray:
    return vote.block_votes(block.x, index[label])


class SampleSynthetic(beam.PTransform):
    """(label, ClassMixture) -> (label, synthetic rows), vote-filtered if on.

    The vote histogram is dense over all candidates of a class (L2
    sensitivity 1 under add/remove one record: one record casts one vote).
    ``blocks``: the prepared blocks (PCollection) or a ``RereadBlocks``.
    """

    def __init__(self, cfg: GeneratorConfig, ledger: PrivacyLedger,
                 blocks: Blocks, noise_seed: Optional[int]) -> None:
        super().__init__()
        self._cfg, self._ledger = cfg, ledger
        self._blocks, self._noise_seed = blocks, noise_seed

    def expand(self, mixtures):
        cfg, ledger, seed = self._cfg, self._ledger, self._noise_seed
        cands = mixtures | "Candidates" >> beam.MapTuple(
            lambda l, mix: (l, vote.candidates(mix, cfg)))
        if not cfg.vote_filter:
            return cands

        def keep(kv, cands):
            label, votes = kv
            c = cands[label]
            if votes is None:
                votes = np.zeros(len(c))
            return label, generator.filter_by_votes(
                c, votes, label, cfg, ledger, make_noise_source(seed))

        # Candidates as a search index (float32 copy, squared norms), built
        # once per class rather than once per block.
        index = cands | "VoteIndex" >> beam.MapTuple(
            lambda l, c: (l, vote.CandidateIndex(c)))
        return (pass_blocks(self._blocks, "Votes")
                | "Votes" >> PerClassSum(list(cfg.labels), _votes,
                                         [AsDict(index)])
                | "KeepVoted" >> beam.Map(keep, AsDict(cands)))
