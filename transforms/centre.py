"""The DP centre: one pass over the raw rows before every other pass.

Mechanisms (global: every class composes with them; add/remove one record):
the sum of the normalised rows, each clipped to ``cfg.centre_bound`` B (L2
sensitivity B), and the row count (sensitivity 1). The centre, noisy sum /
noisy count, is public from then on: the other passes subtract it before
clipping to ``--clip-norm`` (``PrepareBlocks``), which lets a small clip
radius keep almost all of each row's information.
"""

from __future__ import annotations

import apache_beam as beam
import numpy as np

from dpsynth.dp_ops import clipping, generator, plan
from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.dp_ops.ledger import PrivacyLedger
from dpsynth.dp_ops.noise import NoiseSource
from dpsynth.transforms.aggregate import sum_present
from dpsynth.transforms.keyed_noise import AddNoise


def block_centre_sum(block: tuple[np.ndarray, np.ndarray],
                     cfg: GeneratorConfig) -> np.ndarray:
    """[sum of clipped normalised rows..., row count] of one raw block
    (exact: grid values), what ``CentreFromTotal`` takes summed."""
    x, _ = block
    total, count = clipping.centre_sum(x, cfg.normalize, cfg.centre_bound)
    return np.append(total, float(count))


class DPCentre(beam.PTransform):
    """Raw (x, y) blocks -> a one-element PCollection: the DP centre [d]."""

    def __init__(self, cfg: GeneratorConfig, ledger: PrivacyLedger, dim: int,
                 noise: NoiseSource) -> None:
        super().__init__()
        self._cfg = cfg
        self._noised = CentreFromTotal(cfg, ledger, dim, noise)

    def expand(self, raw_blocks):
        return (raw_blocks
                | "CentreSum" >> beam.Map(block_centre_sum, self._cfg)
                | "Total" >> beam.CombineGlobally(sum_present)
                | "Noise" >> self._noised)


class CentreFromTotal(beam.PTransform):
    """One element, the exact [sum..., count] of all raw rows (None: no
    rows) -> the DP centre [d]: the mechanisms of the module doc."""

    def __init__(self, cfg: GeneratorConfig, ledger: PrivacyLedger, dim: int,
                 noise: NoiseSource) -> None:
        super().__init__()
        self._cfg, self._ledger, self._dim = cfg, ledger, dim
        self._noise = noise

    def expand(self, exact_total):
        cfg, d = self._cfg, self._dim
        exact = exact_total | "ZeroIfEmpty" >> beam.Map(
            lambda v: np.zeros(d + 1) if v is None else v)

        def noisy(field: str, name: str, take):
            return (exact
                    | f"Take{field}" >> beam.Map(lambda v: ("global", take(v)))
                    | f"Noise{field}" >> AddNoise(
                        self._ledger, lambda _: name, self._noise)
                    | f"Value{field}" >> beam.MapTuple(lambda _, v: v))

        total = noisy("Sum", plan.CENTRE_SUM, lambda v: v[:d])
        count = noisy("Count", plan.CENTRE_COUNT, lambda v: v[d:])
        return (total
                | "Centre" >> beam.Map(
                    lambda s, c: generator.centre_from(s, float(c[0]), cfg),
                    beam.pvalue.AsSingleton(count)))
