"""dpgmm: our generator (per class DP k-means + DP diagonal GMM), in memory.

Runs ``benchmarks.reference.generate``, the numpy twin of the Beam pipeline, with
the run's ``GeneratorConfig``. Privacy: every mechanism is planned and
calibrated by ``dpsynth.dp_ops.plan.make_ledger`` before the data is read; each is a
Gaussian mechanism whose L2 sensitivity is stated for the add/remove one
record relation (counts 1, clipped sums R, sums of squares R^2, vote
histogram 1). Classes compose in parallel (labels are public per-record).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

import numpy as np

from dpsynth.dp_ops import plan
from benchmarks import reference
from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.dp_ops.noise import make_noise_source
from benchmarks.baselines.base import (Generator, MethodOutput, assert_within_budget,
                                   check_inputs, labels_tuple)


class DPGMM(Generator):
    """Our method; ``vote_filter`` adds the DP nearest-neighbour vote filter.

    ``overrides`` are ``GeneratorConfig`` fields (clusters, clip_norm...).
    Noise: ``dpsynth.dp_ops.noise.make_noise_source(noise_seed)`` (PyDP secure
    sampler when ``noise_seed`` is None, as in the product).
    """

    def __init__(self, vote_filter: bool = False, adaptive: bool = False,
                 **overrides) -> None:
        fields = {f.name for f in dataclasses.fields(GeneratorConfig)}
        bad = sorted(set(overrides) - fields)
        if bad:
            raise ValueError(f"unknown GeneratorConfig fields {bad}")
        if adaptive and vote_filter:
            raise ValueError("the adaptive plan has no vote filter")
        self.vote_filter = vote_filter
        self.adaptive = adaptive  # dpsynth.dp_ops.adaptive two-phase plan (issue 13)
        self.overrides = overrides
        self.normalize = overrides.get("normalize", "unit")
        self.name = ("dpgmm-adaptive" if adaptive else
                     "dpgmm-vote" if vote_filter else "dpgmm")
        self.display = ("DP-GMM, adaptive plan (ours)" if adaptive else
                        "DP-GMM + vote filter (ours)" if vote_filter
                        else "DP-GMM (ours)")

    def config(self, labels: Sequence[int], epsilon: float, delta: float,
               seed: int) -> GeneratorConfig:
        return GeneratorConfig(labels=labels_tuple(labels), epsilon=epsilon,
                               delta=delta, vote_filter=self.vote_filter,
                               seed=seed, **self.overrides)

    def fit(self, x: np.ndarray, y: np.ndarray, labels: Sequence[int],
            epsilon: float, delta: float, seed: int = 0,
            noise_seed: Optional[int] = None) -> MethodOutput:
        x, y = check_inputs(x, y, labels, epsilon, delta)
        cfg = self.config(labels, epsilon, delta, seed)
        info = {"config": {k: v for k, v in dataclasses.asdict(cfg).items()
                           if k != "labels"}}
        if self.adaptive:
            _, xs, ys, ledger, structure = reference.generate_adaptive(
                x, y, cfg, make_noise_source(noise_seed))
            info["structure"] = structure.to_manifest()
        else:
            ledger = plan.make_ledger(cfg)
            _, xs, ys = reference.generate(x, y, cfg, ledger,
                                           make_noise_source(noise_seed))
        assert_within_budget(ledger, epsilon)
        notes = []
        if math.isinf(epsilon):
            notes.append("epsilon=inf: no noise, NOT differentially private")
        return MethodOutput(ledger, xs, ys, notes=notes, info=info)
