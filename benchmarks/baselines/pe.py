"""pe: Private Evolution (Lin et al. 2023) run directly in embedding space.

"PE-style (Gaussian variation)": PE needs a foundation model for its
RANDOM_API (draws from a public prior) and VARIATION_API (similar samples).
No such model is used here; both are replaced by public, data-independent
operations on the unit sphere:

- RANDOM_API: directions of |N(0, I)| (the non-negative orthant; the
  encoder's pooled post-activation features are >= 0 by construction, a
  fact about the public encoder, not about the data), or N(0, I) with
  ``init="gaussian"``;
- VARIATION_API: x -> normalise(x + N(0, tau_t^2 / d I)), with a public
  geometric schedule tau_t from ``tau_start`` to ``tau_end``.

Per class (classes are disjoint, labels public: parallel composition), for
t = 1..T: every real record votes for its nearest synthetic sample; the
dense vote histogram gets N(0, sigma^2) noise per bin (add/remove one record
changes one bin by 1: L2 sensitivity 1); bins below the threshold H are set
to 0 (H = ``threshold`` x sigma, public); the population is resampled from
the normalised histogram and, except after the last round, varied. The
output is ``output_per_class`` variations (tau_end) of draws from the last
histogram: post-processing.

Accounting: T Gaussian mechanisms of sensitivity 1 compose to a
mu-GDP mechanism with mu = sqrt(T) / sigma; sigma is calibrated with
``dpsynth.dp_ops.calibration.calibrate`` (GDP, then re-checked and certified by
dp_accounting's PLD accountant).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

import numpy as np

from dpsynth.dp_ops import vote
from dpsynth.dp_ops.calibration import Slot, calibrate
from dpsynth.dp_ops.ledger import PrivacyLedger
from dpsynth.dp_ops.noise import NoiseSource
from dpsynth.dp_ops.sampling import project_to_sphere
from benchmarks.baselines.base import (Generator, MethodOutput, assert_within_budget,
                                   check_inputs, noise_and_sampler)


@dataclasses.dataclass(frozen=True)
class PEConfig:
    rounds: int = 8
    population: int = 1000         # synthetic samples per class per round
    threshold: float = 2.0         # H, in units of the histogram noise sigma
    tau_start: float = 0.6
    tau_end: float = 0.15
    init: str = "halfnormal"       # or "gaussian"
    output_per_class: int = 5000
    accountant: str = "pld"

    def __post_init__(self) -> None:
        if self.rounds < 1 or self.population < 1 or self.output_per_class < 1:
            raise ValueError("PE: rounds, population, output size must be >= 1")
        if self.threshold < 0 or not self.tau_start > 0 or not self.tau_end > 0:
            raise ValueError("PE: threshold >= 0 and tau > 0")
        if self.init not in ("halfnormal", "gaussian"):
            raise ValueError(f"PE: init must be halfnormal or gaussian, got "
                             f"{self.init!r}")


# ``population`` (and the other defaults) were picked among 7 settings by
# linear-probe accuracy on a 40k/10k split of the private CIFAR-10 train set
# at epsilon 4 (population 300 -> 45 %, 1000 -> 57 %, 2000 -> 59 % at twice
# the cost): NOT paid for in the ledger.
TUNING_NOTE = ("unaccounted tuning: population, rounds, variation scales and "
               "prior chosen among 7 settings on a validation split of the "
               "private train set (epsilon=4)")


def histogram_name(label: int) -> str:
    return f"class={label}/pe/nn-histogram"


def plan_ledger(labels: Sequence[int], cfg: PEConfig, epsilon: float,
                delta: float) -> PrivacyLedger:
    slots = [Slot(histogram_name(c), "pe", f"class={c}", 1.0, count=cfg.rounds)
             for c in labels]
    return calibrate(slots, {"pe": 1.0}, epsilon, delta, cfg.accountant)


def taus(cfg: PEConfig) -> np.ndarray:
    """Public variation scale per round (geometric from start to end)."""
    if cfg.rounds == 1:
        return np.array([cfg.tau_end])
    return np.geomspace(cfg.tau_start, cfg.tau_end, cfg.rounds)


def random_api(m: int, dim: int, init: str,
               rng: np.random.Generator) -> np.ndarray:
    z = rng.normal(size=(m, dim))
    if init == "halfnormal":
        z = np.abs(z)
    return project_to_sphere(z, 1.0)


def variation_api(x: np.ndarray, tau: float,
                  rng: np.random.Generator) -> np.ndarray:
    step = rng.normal(size=x.shape) * (tau / math.sqrt(x.shape[1]))
    return project_to_sphere(x + step, 1.0)


def dp_histogram(real: np.ndarray, population: np.ndarray, sigma: float,
                 threshold: float, noise: NoiseSource, key: str) -> np.ndarray:
    """Thresholded noisy nearest-neighbour histogram (sensitivity 1)."""
    votes = vote.block_votes(real, population)
    noisy = votes + noise.gaussian(sigma, len(population), key)
    return np.maximum(noisy - threshold * sigma, 0.0)


def evolve_class(real: np.ndarray, label: int, cfg: PEConfig, sigma: float,
                 noise: NoiseSource, rng: np.random.Generator) -> np.ndarray:
    """T rounds of PE for one class; returns ``output_per_class`` rows."""
    dim = real.shape[1]
    pop = random_api(cfg.population, dim, cfg.init, rng)
    schedule = taus(cfg)
    for t in range(cfg.rounds):
        hist = dp_histogram(real, pop, sigma, cfg.threshold, noise,
                            f"{histogram_name(label)}/round-{t + 1}")
        p = hist / hist.sum() if hist.sum() > 0 else None
        if t == cfg.rounds - 1:
            draws = rng.choice(len(pop), cfg.output_per_class, p=p)
            return variation_api(pop[draws], cfg.tau_end, rng)
        pop = variation_api(pop[rng.choice(len(pop), len(pop), p=p)],
                            schedule[t], rng)
    raise AssertionError("unreachable")


class PE(Generator):
    display = "PE-style (Gaussian variation)"
    name = "pe"

    def __init__(self, cfg: Optional[PEConfig] = None, **overrides) -> None:
        self.cfg = dataclasses.replace(cfg or PEConfig(), **overrides)

    def fit(self, x: np.ndarray, y: np.ndarray, labels: Sequence[int],
            epsilon: float, delta: float, seed: int = 0,
            noise_seed: Optional[int] = None) -> MethodOutput:
        x, y = check_inputs(x, y, labels, epsilon, delta)
        ledger = plan_ledger(labels, self.cfg, epsilon, delta)
        noise, _ = noise_and_sampler(noise_seed)
        xp = self.preprocess(x)
        xs, ys = [], []
        for label in labels:
            sigma = ledger.get(histogram_name(label)).sigma
            # Public randomness (prior, resampling, variation): public seed.
            rng = np.random.default_rng([seed, int(label) & 0xFFFF, 0x9E])
            rows = evolve_class(xp[y == label], int(label), self.cfg, sigma,
                                noise, rng)
            xs.append(rows)
            ys.append(np.full(len(rows), int(label), np.int64))
        spent = assert_within_budget(ledger, epsilon)
        sigma0 = ledger.get(histogram_name(labels[0])).sigma
        mu = (math.sqrt(self.cfg.rounds) / sigma0 if sigma0 > 0
              else math.inf)
        return MethodOutput(
            ledger, np.vstack(xs), np.concatenate(ys),
            unaccounted=[TUNING_NOTE],
            notes=[f"PE-style (Gaussian variation, no foundation model); "
                   f"sigma={sigma0:.3f}, GDP mu=sqrt(T)/sigma={mu:.4f}"],
            info={"config": dataclasses.asdict(self.cfg), "sigma": sigma0,
                  "gdp_mu": mu, "spent_epsilon": spent})
