"""Adding a ledger mechanism's noise to keyed exact aggregates in Beam.

The sigma of every draw comes from the run's one ``PrivacyLedger``; the
draw itself from the run's keyed noise source (``dp_ops.noise``): a
deterministic function of the run's secret key and the mechanism's name.
So a runner that executes this step twice (a retried bundle, a recomputed
side-input branch) adds the same noise both times: the statistic is
released once, as the ledger counts it.

(PipelineDP's ``DPEngine.add_dp_noise`` served here before; its PyDP
sampler reads the OS random source and cannot be keyed, so a recomputed
step would redraw the noise.)
"""

from __future__ import annotations

from typing import Callable, Hashable

import apache_beam as beam
import numpy as np

from dp_ops import generator
from dp_ops.ledger import PrivacyLedger
from dp_ops.noise import NoiseSource


class AddNoise(beam.PTransform):
    """(key, exact array) -> (key, array + its mechanism's noise).

    ``name_of(key)`` gives the ledger mechanism of that key's value (one
    mechanism per key, e.g. per class label).
    """

    def __init__(self, ledger: PrivacyLedger,
                 name_of: Callable[[Hashable], str],
                 noise: NoiseSource) -> None:
        super().__init__()
        self._ledger, self._name_of, self._noise = ledger, name_of, noise

    def expand(self, pcoll):
        ledger, name_of, noise = self._ledger, self._name_of, self._noise

        def add(kv):
            key, value = kv
            return key, generator.add_noise(
                ledger, noise, name_of(key), np.asarray(value, np.float64))
        return pcoll | "AddNoise" >> beam.Map(add)
