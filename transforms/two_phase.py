"""The adaptive two-phase plan (``--covariance auto``, dp_ops/adaptive/)
as Beam transforms.

Phase 1 (``AdaptivePhase1``, one pass "Counts" over the raw rows): the DP
centre (``dpsynth.transforms.centre``) and each class's noisy row count. The
launcher reads these DP outputs back, the public rule
(``adaptive.choose_structure``) picks phase 2's structure from them, and
phase 2 runs as a second pipeline (fully adaptive composition: the ledger
holds phase 1 + exactly the chosen phase-2 mechanisms).

Phase 2 (``AdaptiveMixture``): one pass "Moments" computes every exact
aggregate the structure needs (per-class clipped sums and either the
global second moment or each class's d x d second moment); in the
subspace mode one more pass "ClassSubspace" computes each class's r x r
moment in the subspace of the noisy shared covariance (a side input:
public by then).

The per-class counts, sums and d x d second moments run as PipelineDP
aggregations (``dpsynth.transforms.pipelinedp``) with dpsynth's exact sums and keyed
noise. The global mechanisms, the subspace blocks (their partials need the
noisy basis, a side input) and the post-processing are the pure functions
of ``dpsynth.dp_ops.adaptive``, shared with ``reference.generate_adaptive`` (same
names, same keyed noise: the same release for a ``SeededNoise``).
"""

from __future__ import annotations

import json
from typing import Any, Sequence

import apache_beam as beam
import numpy as np
from apache_beam.pvalue import AsDict, AsSingleton

from dpsynth.dp_ops import adaptive, plan
from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.dp_ops.generator import ClassMixture
from dpsynth.dp_ops.ledger import PrivacyLedger
from dpsynth.dp_ops.noise import NoiseSource
from dpsynth.transforms.aggregate import (Blocks, GlobalSum, OnePass, PerClassSum,
                                  SecondMoment, pass_blocks, sum_present)
from dpsynth.transforms import digests
from dpsynth.transforms.centre import CentreFromTotal, block_centre_sum
from dpsynth.transforms.pipelinedp import (ClassAggregation, ClassSums,
                                   LedgerAccountant, class_count_family,
                                   class_second_moment_family,
                                   class_sum_family)

PHASE1_FILE = "phase1.json"  # in the staging folder; DP outputs only


class AdaptivePhase1(beam.PTransform):
    """Raw (x, y) blocks -> one element {"centre": [d], "noisy_counts":
    [K]} (DP outputs). Mechanisms: ``global/centre/sum`` (B) and
    ``global/centre/count`` (1) of ``CentreFromTotal``; ``class=<c>/count``, the
    class's row count, L2 sensitivity 1 under add/remove one record, as a
    PipelineDP aggregation (``dpsynth.transforms.pipelinedp``) whose budget is
    requested from ``accountant``."""

    def __init__(self, cfg: GeneratorConfig, ledger: PrivacyLedger, dim: int,
                 noise: NoiseSource, accountant: LedgerAccountant) -> None:
        super().__init__()
        self._cfg, self._ledger, self._dim = cfg, ledger, dim
        self._noise = noise
        self._counts = ClassAggregation(cfg.labels, dim, class_count_family(),
                                        ledger, noise, accountant)
        self.aggregations = [self._counts.aggregation]

    def expand(self, raw_blocks):
        cfg, ledger, noise = self._cfg, self._ledger, self._noise
        labels, d = list(cfg.labels), self._dim
        # One reader of the blocks and one global combine for both
        # aggregates: a block's [centre sum..., row count, class counts...]
        # (exact values, summed element by element as two combines would).
        # Two readers made every block a task of its own on Dask, with two
        # tasks reading it (~16 ms a task boundary there).
        total = (raw_blocks
                 | "CentreAndCounts" >> beam.Map(block_phase1, cfg, labels)
                 | "Total" >> beam.CombineGlobally(sum_present))
        centre = (total
                  | "CentreTotal" >> beam.Map(
                      lambda v: None if v is None else np.array(v[:d + 1]))
                  | "DPCentre" >> CentreFromTotal(cfg, ledger, d, noise))
        counts = (total
                  | "PerClass" >> beam.FlatMap(lambda v: [] if v is None else [
                      (k, np.array(v[d + 1 + i:d + 2 + i]))
                      for i, k in enumerate(labels)])
                  | "NoisyCounts" >> self._counts)
        return centre | "Phase1" >> beam.Map(
            lambda c, n: {"centre": [float(v) for v in c],
                          "noisy_counts": [float(n[k][0]) for k in labels]},
            AsDict(counts))


def block_phase1(block, cfg: GeneratorConfig,
                 labels: Sequence[int]) -> np.ndarray:
    """Phase 1's exact aggregates of one raw block, side by side."""
    return np.concatenate([block_centre_sum(block, cfg),
                           adaptive.exact_class_counts(block[1], labels)])


PHASE1_PURPOSE = "adaptive-phase1/v1"  # its tag's key (a derived key)


class ForgedPhase1(RuntimeError):
    """Phase 1's file is missing, unreadable or not tagged under this run's
    secret: the counts and centre in it are not the DP outputs phase 1
    drew."""


def _phase1_tag(key: bytes, path: str, doc: dict) -> str:
    return digests.hmac_tag(key, {"path": path, "doc": doc})


# noise: a NoiseSource (Any: Beam's type check cannot test a Protocol, and
# a test's forcing noise is no KeyedNoise)
def write_phase1(doc: dict, path: str, noise: Any) -> None:
    """Writes phase 1's DP outputs at ``path`` (this launch's staging
    folder) under a tag of the run's secret. The key is derived here, in
    the worker, never while the graph is built: derived there it would be
    pickled into the job graph beside the noise key's reference."""
    from apache_beam.io.filesystems import FileSystems
    record = {"doc": doc, "hmac_sha256": _phase1_tag(
        noise.derived_key(PHASE1_PURPOSE), path, doc)}
    with FileSystems.create(path) as f:
        f.write(json.dumps(record).encode())


def read_phase1(path: str, key: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(centre, noisy counts) as the phase-1 pipeline wrote them at
    ``path``, after checking the tag under ``key``
    (``noise.derived_key(PHASE1_PURPOSE)``): someone writing beside
    --output could replace the file between its write and this read, and
    their counts and centre would steer phase 2 and be published as DP
    outputs. ``ForgedPhase1`` otherwise."""
    doc = digests.tagged_payload(path, "doc", key, ("path", path))
    try:
        if doc is not None:
            return (np.array(doc["centre"], np.float64),
                    np.array(doc["noisy_counts"], np.float64))
    except (ValueError, KeyError, TypeError):
        pass
    raise ForgedPhase1(f"{path}: phase 1's counts and centre are missing or "
                       "were not written by this run's phase 1 (their tag "
                       "does not verify)")


def _exact(parts: dict, labels: Sequence[int], size: int) -> np.ndarray:
    return np.stack([np.zeros(size) if parts.get(c) is None else parts[c]
                     for c in labels])


class _Phase2:
    """The noise and post-processing steps of phase 2 (picklable: DP
    outputs and public configuration only)."""

    def __init__(self, cfg: GeneratorConfig, ledger: PrivacyLedger, dim: int,
                 structure: adaptive.Structure, noisy_counts: np.ndarray,
                 centre: np.ndarray, noise: NoiseSource) -> None:
        self.cfg, self.ledger, self.dim = cfg, ledger, dim
        self.structure, self.noise = structure, noise
        self.counts = np.asarray(noisy_counts, np.float64)
        self.centre = np.asarray(centre, np.float64)

    def moments(self, _, released: dict, second) -> dict:
        """Shared and subspace modes: the released class sums of pass
        "Moments" -> the mixtures, unless the subspace pass is still to
        come. ``second``: the exact global second moment (None: no rows),
        noised here."""
        cfg, d, s = self.cfg, self.dim, self.structure
        ledger, noise, labels = self.ledger, self.noise, list(cfg.labels)
        n, means = adaptive.class_means(
            np.stack([released[c][0] for c in labels]), self.counts,
            cfg.clip_norm)
        shared = adaptive.shared_stage(
            np.zeros((d, d)) if second is None else second, n, means, s, cfg,
            ledger, noise)
        out = {"n": n, "means": means, "shared": shared}
        if s.mode == "shared":
            out["mixtures"] = adaptive.shared_mixtures(
                self.counts, n, means, shared, None, self.centre, cfg)
        return out

    def class_mixture(self, kv) -> tuple[int, ClassMixture]:
        """Per-class mode: one class's mixture from its released (sum,
        second moment), on the worker that released them."""
        label, (total, second) = kv
        i = list(self.cfg.labels).index(label)
        n, means = adaptive.class_means(total[None, :],
                                        self.counts[i:i + 1],
                                        self.cfg.clip_norm)
        sigma = self.ledger.get(plan.class_covariance(label)).sigma
        return label, adaptive.per_class_mixture(
            label, second, self.counts[i], (n[0], means[0]), self.centre,
            self.structure, self.cfg, sigma)

    def subspace(self, _, projected: dict, st: dict) -> dict:
        """Noise on the pass-"ClassSubspace" moments; the mixtures."""
        labels, r = list(self.cfg.labels), self.structure.class_rank
        exact = _exact({c: None if v is None else v.ravel()
                        for c, v in projected.items()}, labels, r * r)
        blocks = [adaptive.noisy_class_block(
            exact[i].reshape(r, r), c, st["n"][i], st["means"][i],
            st["shared"], self.ledger, self.noise)
            for i, c in enumerate(labels)]
        return {"mixtures": adaptive.shared_mixtures(
            self.counts, st["n"], st["means"], st["shared"], blocks,
            self.centre, self.cfg)}


def _projected(clip_norm: float):
    def fn(_label: int, block, st: dict) -> np.ndarray:
        return adaptive.projected_block_moment(block.x, st["shared"].basis,
                                               clip_norm)
    return fn


class AdaptiveMixture(beam.PTransform):
    """PBegin -> (label, ClassMixture) of the chosen ``structure``, given
    the phase-1 outputs (``centre``, ``noisy_counts``: public constants by
    now). Mechanisms (``dpsynth.dp_ops.adaptive``, add/remove one record):
    ``class=<c>/moments/sum`` (R); ``global/covariance/second-moment``
    (R^2, shared and subspace modes); ``class=<c>/covariance/subspace``
    (R^2, subspace mode); ``class=<c>/covariance/second-moment`` (R^2,
    per-class mode)."""

    def __init__(self, cfg: GeneratorConfig, ledger: PrivacyLedger, dim: int,
                 structure: adaptive.Structure, noisy_counts: np.ndarray,
                 centre: np.ndarray, noise: NoiseSource, blocks: Blocks,
                 accountant: LedgerAccountant) -> None:
        super().__init__()
        self._cfg, self._blocks = cfg, blocks
        self._steps = _Phase2(cfg, ledger, dim, structure, noisy_counts,
                              centre, noise)
        # Per-class mode: the sums and the d x d second moments in one
        # aggregation (one read of the blocks feeds both families; two
        # readers would make Dask keep every block for the second).
        families = [class_sum_family(cfg.clip_norm)]
        if structure.mode == "per-class":
            families.append(class_second_moment_family(cfg.clip_norm))
        self._sums = ClassSums(list(cfg.labels), dim, families, ledger, noise,
                               accountant)
        self.aggregations = [self._sums.aggregation]

    def expand(self, pbegin):
        cfg, steps = self._cfg, self._steps
        mode = steps.structure.mode
        blocks = pass_blocks(self._blocks, "Moments")  # one read
        # (label, (sum, [second moment])): released values
        if mode == "per-class":
            # One task a class, not one for all: K eigendecompositions of
            # d x d matrices (0.2 s at d = 384, K = 10) spread over the
            # workers instead of running while the others wait.
            return (blocks | "ClassSums" >> self._sums
                    | "ClassMixture" >> beam.Map(steps.class_mixture))
        # with the global second moment, from the same ParDo
        both = blocks | "Moments" >> OnePass({
            "ClassSums": self._sums,
            "SecondMoment": GlobalSum(SecondMoment(cfg.clip_norm))})
        sums, second = both["ClassSums"], AsSingleton(both["SecondMoment"])
        stats = (pbegin | "Once" >> beam.Create([None])
                 | "Phase2Noise" >> beam.Map(steps.moments, AsDict(sums),
                                             second))
        if mode == "subspace":
            proj = (pass_blocks(self._blocks, "ClassSubspace")
                    | "ClassSubspace" >> PerClassSum(
                        list(cfg.labels), _projected(cfg.clip_norm),
                        [AsSingleton(stats)], every_label=False))
            stats = (pbegin | "OnceSubspace" >> beam.Create([None])
                     | "SubspaceNoise" >> beam.Map(
                         steps.subspace, AsDict(proj), AsSingleton(stats)))
        return stats | "PerClass" >> beam.FlatMap(
            lambda st: sorted(st["mixtures"].items()))
