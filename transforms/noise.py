"""Adding calibrated Gaussian noise to keyed aggregates inside Beam.

The sigma of every draw comes from the run's one ``PrivacyLedger``. With no
noise seed, per-cluster moments get their noise from PipelineDP
(``DPEngine.add_dp_noise`` on its ``BeamBackend``) through a budget accountant
that hands PipelineDP the ledger's noise multiplier instead of computing its
own. With a (secret) noise seed, the same sigma is drawn reproducibly from
``dp_ops.noise.SeededNoise`` so releases are byte-identical across runs.
"""

from __future__ import annotations

from typing import Callable, Optional

import apache_beam as beam
import numpy as np
import pipeline_dp
from pipeline_dp import budget_accounting

from dp_ops.ledger import Mechanism, PrivacyLedger
from dp_ops.noise import SeededNoise


class LedgerNoiseAccountant(budget_accounting.BudgetAccountant):
    """A PipelineDP accountant that only relays one ledger mechanism.

    PipelineDP asks it for a ``MechanismSpec``; we return one whose noise
    standard deviation (normalised by sensitivity) is the ledger's noise
    multiplier. Accounting itself is done by the ledger, not here.
    """

    def __init__(self, mechanism: Mechanism) -> None:
        super().__init__(total_epsilon=1.0, total_delta=1e-10,
                         num_aggregations=None, aggregation_weights=None)
        self._mechanism = mechanism

    def request_budget(self, mechanism_type, sensitivity: float = 1,
                       weight: float = 1, count: int = 1,
                       noise_standard_deviation: Optional[float] = None,
                       name: str = ""):
        if mechanism_type != pipeline_dp.aggregate_params.MechanismType.GAUSSIAN:
            raise ValueError("dpsynth only uses Gaussian noise")
        spec = budget_accounting.MechanismSpec(mechanism_type, name=name)
        spec.set_noise_standard_deviation(self._mechanism.noise_multiplier)
        spec.set_eps_delta(0.0, 0.0)  # the ledger, not PipelineDP, accounts
        return spec

    def compute_budgets(self) -> None:
        pass


def _same_mechanism(ledger: PrivacyLedger, names: list[str]) -> Mechanism:
    """One PipelineDP call serves all classes: their sigmas must agree."""
    mechs = [ledger.get(n) for n in names]
    first = mechs[0]
    for m in mechs[1:]:
        if (m.sigma, m.sensitivity) != (first.sigma, first.sensitivity):
            raise AssertionError(f"{m.name} differs from {first.name}")
    return first


class AddNoise(beam.PTransform):
    """(label, exact array) -> (label, array + N(0, sigma^2)) per ledger.

    ``name_of(label)`` gives the ledger mechanism of that label's value.
    """

    def __init__(self, ledger: PrivacyLedger, name_of: Callable[[int], str],
                 labels: list[int], noise_seed: Optional[int]) -> None:
        super().__init__()
        self._ledger, self._name_of = ledger, name_of
        self._labels, self._noise_seed = labels, noise_seed

    def expand(self, pcoll):
        mech = _same_mechanism(self._ledger,
                               [self._name_of(l) for l in self._labels])
        if mech.sigma == 0:
            return pcoll | "NoNoise" >> beam.Map(
                lambda kv: (kv[0], np.asarray(kv[1], np.float64)))
        if self._noise_seed is not None:
            noise, name_of = SeededNoise(self._noise_seed), self._name_of

            def add(kv):
                label, value = kv
                value = np.asarray(value, np.float64)
                return label, value + noise.gaussian(mech.sigma, value.shape,
                                                     name_of(label))
            return pcoll | "SeededNoise" >> beam.Map(add)
        return pcoll | "PipelineDPNoise" >> _PipelineDPNoise(mech)


class _PipelineDPNoise(beam.PTransform):
    def __init__(self, mechanism: Mechanism) -> None:
        super().__init__()
        self._mechanism = mechanism

    def expand(self, pcoll):
        engine = pipeline_dp.DPEngine(LedgerNoiseAccountant(self._mechanism),
                                      pipeline_dp.BeamBackend())
        params = pipeline_dp.AddDPNoiseParams(
            noise_kind=pipeline_dp.NoiseKind.GAUSSIAN,
            l2_sensitivity=self._mechanism.sensitivity)
        floats = pcoll | "AsFloat" >> beam.Map(
            lambda kv: (kv[0], np.asarray(kv[1], np.float64)))
        return engine.add_dp_noise(floats, params)
