"""Per-cluster DP moments -> DP Gaussian mixture, sampling and vote filter."""

from __future__ import annotations

import hashlib
import threading
from typing import Optional

import apache_beam as beam
import numpy as np
from apache_beam.pvalue import AsDict

from dpsynth.dp_ops import generator, kmeans, moments, plan, vote
from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.dp_ops.ledger import PrivacyLedger
from dpsynth.dp_ops.noise import NoiseSource
from dpsynth.transforms.aggregate import (Block, Blocks, GlobalSum, OnePass,
                                  PerClassSum, SecondMoment, pass_blocks)
from dpsynth.transforms.pipelinedp import (ClassAggregation, ClassSums,
                                   LedgerAccountant,
                                   class_second_moment_family,
                                   released_family)
from dpsynth.transforms.write import DrawRows, KeptRows


def _moments(k: int, bound: float, sumsq: bool):
    def fn(label: int, block: Block, centres: dict) -> moments.Moments:
        return moments.block_moments(
            block.x, kmeans.nearest(block.z, centres[label]), k, bound, sumsq)
    return fn


class DPMixture(beam.PTransform):
    """Prepared blocks + centres -> (label, ClassMixture).

    Mechanisms (per class, add/remove one record, which is in one cluster):
    count vector (L2 sensitivity 1), sum of clipped x (R), sum of x*x (R^2;
    only without covariance factors), then the second-moment matrix (R^2,
    global: ``_SharedCovariance``, or per class: ``_ClassCovariance``).
    Their noise is the run's keyed discrete Gaussian (``dp_ops/noise.py``);
    the per-class ones are PipelineDP aggregations (``dpsynth.transforms.pipelinedp``)
    whose budgets are requested from ``accountant``.
    """

    def __init__(self, cfg: GeneratorConfig, ledger: PrivacyLedger, dim: int,
                 centres, noise: NoiseSource, accountant: LedgerAccountant,
                 blocks: Optional[Blocks] = None) -> None:
        super().__init__()
        self._cfg, self._ledger, self._dim = cfg, ledger, dim
        self._centres, self._noise = centres, noise
        self._blocks = blocks
        self._accountant = accountant
        # One PipelineDP aggregation for the moment fields, a custom
        # combiner (mechanism family class=<c>/moments/<field>) each, fed
        # the exact per-class values side by side.
        k, labels = cfg.clusters, list(cfg.labels)
        shapes = {"count": (k,), "sum": (k, dim), "sumsq": (k, dim)}
        self._moments = ClassAggregation(
            labels, dim, [released_family(f"moments/{f}", shapes[f])
                          for f in plan.moment_fields(cfg)],
            ledger, noise, accountant)
        self.aggregations = [self._moments.aggregation]
        if cfg.covariance_rank and cfg.covariance != "shared":
            self._class_covariance = ClassSums(
                labels, dim, class_second_moment_family(cfg.clip_norm),
                ledger, noise, accountant)
            self.aggregations.append(self._class_covariance.aggregation)

    def expand(self, pcoll):
        blocks = self._blocks if self._blocks is not None else pcoll
        cfg, k, d = self._cfg, self._cfg.clusters, self._dim
        labels = list(cfg.labels)
        fields = plan.moment_fields(cfg)
        with_sumsq = "sumsq" in fields
        # The second moment needs no noisy result, so it shares this read
        # (one pass fewer) and its ParDo (aggregate.OnePass).
        blocks = pass_blocks(blocks, "Moments")
        sums = {"Moments": PerClassSum(
            labels, _moments(k, cfg.clip_norm, with_sumsq),
            [AsDict(self._centres)])}
        if cfg.covariance_rank:
            sums["SecondMoment"] = (
                GlobalSum(SecondMoment(cfg.clip_norm))
                if cfg.covariance == "shared" else self._class_covariance)
        sums = blocks | "Moments" >> OnePass(sums)
        exact = (sums["Moments"]
                 | "ZeroEmpty" >> beam.MapTuple(
                     lambda l, m: (l, m or moments.Moments.zeros(
                         k, d, with_sumsq))))
        def side_by_side(label, m):
            return label, np.concatenate([
                np.asarray(getattr(m, f), np.float64).ravel() for f in fields])

        def to_mixture(label, released):
            values = dict(zip(fields, released))
            return label, generator.mixture(moments.Moments(**values), label,
                                            cfg)

        mixtures = (exact
                    | "SideBySide" >> beam.MapTuple(side_by_side)
                    | "NoiseMoments" >> self._moments
                    | "Mixture" >> beam.MapTuple(to_mixture))
        if not cfg.covariance_rank:
            return mixtures
        if cfg.covariance == "shared":
            return mixtures | "Covariance" >> _SharedCovariance(
                cfg, self._ledger, d, sums["SecondMoment"], self._noise)
        return mixtures | "Covariance" >> _ClassCovariance(
            cfg, sums["SecondMoment"])


class _SharedCovariance(beam.PTransform):
    """Diagonal mixtures -> mixtures with shared low-rank factors.

    One global mechanism: the noisy second-moment matrix of all clipped
    records (L2 sensitivity R^2, add/remove one record); the factors are
    post-processing of it and of the noisy per-cluster moments.
    """

    def __init__(self, cfg: GeneratorConfig, ledger: PrivacyLedger, dim: int,
                 exact, noise: NoiseSource) -> None:
        super().__init__()
        self._cfg, self._ledger, self._dim = cfg, ledger, dim
        self._exact, self._noise = exact, noise  # exact: GlobalSum's total

    def expand(self, mixtures):
        cfg, d = self._cfg, self._dim
        ledger, noise = self._ledger, self._noise
        noisy = (self._exact
                 | "NoiseSecondMoment" >> beam.Map(
                     lambda m: generator.noisy_second_moment(
                         m if m is not None else np.zeros((d, d)), ledger,
                         noise, plan.COVARIANCE)))
        factors = (mixtures
                   | "MixtureList" >> beam.combiners.ToList()
                   | "Factors" >> beam.Map(
                       lambda mixes, m: generator.add_factors(
                           sorted((mx for _, mx in mixes),
                                  key=lambda mx: mx.label), m, cfg),
                       beam.pvalue.AsSingleton(noisy))
                   | "PerClass" >> beam.FlatMap(
                       lambda mixes: [(mx.label, mx) for mx in mixes]))
        return factors


class _ClassCovariance(beam.PTransform):
    """Diagonal mixtures -> mixtures with their own class's factors.

    One mechanism per class, ``class=<c>/covariance/second-moment``: the
    noisy second-moment matrix of the class's clipped records (L2
    sensitivity R^2, add/remove one record, which is in one class: classes
    compose in parallel), a PipelineDP aggregation (``sums``); each class's
    factors are post-processing of it and of that class's noisy moments.
    """

    def __init__(self, cfg: GeneratorConfig, noisy) -> None:
        super().__init__()
        self._cfg, self._noisy = cfg, noisy  # ClassSums' released matrices

    def expand(self, mixtures):
        cfg, noisy = self._cfg, self._noisy

        def with_factors(kv):
            label, parts = kv
            (mix,), (matrix,) = parts["mixture"], parts["matrix"]
            return label, generator.add_factors([mix], matrix, cfg)[0]

        return ({"mixture": mixtures, "matrix": noisy}
                | "JoinCovariance" >> beam.CoGroupByKey()
                | "Factors" >> beam.Map(with_factors))


# Candidate indexes built in this process, shared by every copy of
# ``_Votes``: Beam's Dask runner unpickles the DoFn for every task (one a
# read range), so an index kept on the instance was rebuilt for every class
# in every task and lived as long as the task (the vote pass at 1M x 384:
# ~100 MB a range, 3.2 GB of one worker). One index per label (the latest
# mixture's), as before.
_INDEXES: dict = {}
_INDEXES_LOCK = threading.Lock()


def candidate_index(mix: generator.ClassMixture,
                    cfg: GeneratorConfig) -> vote.CandidateIndex:
    """The search index of ``mix``'s candidates (public post-processing of
    the mixture and the public seed), built once per process."""
    key = (mix.label, _fingerprint(mix), cfg)
    with _INDEXES_LOCK:
        found = _INDEXES.get(key)
    if found is None:
        found = vote.CandidateIndex(generator.centred(
            generator.candidates(mix, cfg), mix))
        with _INDEXES_LOCK:
            # one per label, and only the latest job's: a worker that
            # outlives a job (a standing Dask cluster) keeps no stale ones
            for old in [k for k in _INDEXES
                        if k[0] == mix.label or k[2] != cfg]:
                del _INDEXES[old]
            _INDEXES[key] = found
    return found


class _Votes:
    """Per-block votes of one class against that class's candidates.

    The candidates are public post-processing of the class mixture (public
    seed), so each worker regenerates them from the small mixture side
    input, once per class and process (``candidate_index``), instead of the
    pipeline shipping m x d candidate rows per class to every reader. The
    cached search index is the only per-class state: m x d float32
    (m <= --vote-max-candidates).
    """

    def __init__(self, cfg: GeneratorConfig) -> None:
        self._cfg = cfg

    def __call__(self, label: int, block: Block, mixtures: dict) -> np.ndarray:
        return vote.block_votes(block.x,
                                candidate_index(mixtures[label], self._cfg))


def _fingerprint(mix: generator.ClassMixture) -> str:
    h = hashlib.blake2b(digest_size=16)
    for part in (mix.weights, mix.means, mix.variances,
                 getattr(mix, "factors", None), getattr(mix, "centre", None)):
        if part is not None:
            h.update(np.ascontiguousarray(part).tobytes())
    return h.hexdigest()


def _candidate_count(mix: generator.ClassMixture,
                     cfg: GeneratorConfig) -> int:
    """Rows of ``generator.candidates(mix, cfg)``, without drawing them."""
    if mix.weights.sum() <= 0:
        return 0
    wanted = generator.num_samples(mix, cfg)
    return int(round(wanted * vote.candidate_oversample(wanted, cfg)))


def _copies(votes: np.ndarray, label: int, mix: generator.ClassMixture,
            cfg: GeneratorConfig, ledger: PrivacyLedger,
            noise: NoiseSource) -> np.ndarray:
    """``generator.filter_by_votes``'s copies per candidate (the same
    mechanism, noise and selection draw): the writers draw the candidates
    and write each that many times."""
    return generator.vote_copies(votes, label,
                                 generator.num_samples(mix, cfg), cfg,
                                 ledger, noise)


class SampleSynthetic(beam.PTransform):
    """(label, ClassMixture) -> (label, what to write): ``DrawRows`` (the
    writers draw the rows shard by shard) or, with the vote, ``KeptRows``
    (how many times to write each candidate; the writers draw them).

    The vote histogram is dense over all candidates of a class (L2
    sensitivity 1 under add/remove one record: one record casts one vote).
    ``blocks``: the prepared blocks (PCollection) or a ``RereadBlocks``.
    Candidates are drawn where they are used (the vote pass, the filter)
    from the mixture and the public seed; only mixtures move.
    """

    def __init__(self, cfg: GeneratorConfig, ledger: PrivacyLedger,
                 blocks: Blocks, noise: NoiseSource,
                 search_threads: Optional[int] = None) -> None:
        super().__init__()
        self._cfg, self._ledger = cfg, ledger
        self._blocks, self._noise = blocks, noise
        self._threads = search_threads  # BLAS threads of the vote search

    def expand(self, mixtures):
        cfg, ledger, noise = self._cfg, self._ledger, self._noise
        if not cfg.vote_filter:
            return mixtures | "RowsToDraw" >> beam.MapTuple(
                lambda l, mix: (l, DrawRows(generator.num_samples(mix, cfg))))

        def keep(kv, mixes):
            label, votes = kv
            total = _candidate_count(mixes[label], cfg)
            if votes is None:
                votes = np.zeros(total)
            return label, KeptRows(total, _copies(votes, label, mixes[label],
                                                  cfg, ledger, noise))

        return (pass_blocks(self._blocks, "Votes")
                | "Votes" >> PerClassSum(list(cfg.labels), _Votes(cfg),
                                         [AsDict(mixtures)],
                                         threads=self._threads)
                | "KeepVoted" >> beam.Map(keep, AsDict(mixtures)))
