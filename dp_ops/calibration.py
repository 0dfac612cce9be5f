"""Noise calibration: turn a target (epsilon, delta) and a plan into sigmas.

Every mechanism of dpsynth is Gaussian. A Gaussian mechanism with noise
multiplier z (= sigma / L2 sensitivity) is exactly (1/z)-GDP, and GDP composes
as mu^2 = sum_i mu_i^2, so the whole run (per class) is one mu-GDP mechanism.
We split mu^2 across stages by the user's budget weights, solve the GDP
(epsilon, delta) curve for mu, then *re-check* the result with
``dp_accounting`` (PLD or RDP) and add noise until that accountant agrees the
target is met. The re-check is what the manifest reports.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

from dpsynth.dp_ops.ledger import GLOBAL, Mechanism, PrivacyLedger, compose_epsilon


@dataclasses.dataclass(frozen=True)
class Slot:
    """A planned mechanism whose sigma is not known yet.

    ``share`` is its relative share of its stage's budget (per application);
    ``count`` is how many times it is applied.
    """

    name: str
    stage: str
    partition: str
    sensitivity: float
    share: float = 1.0
    count: int = 1


def gdp_delta(mu: float, epsilon: float) -> float:
    """delta(epsilon) of a mu-GDP mechanism (Dong, Roth, Su 2019, Cor. 2.13)."""
    if mu <= 0:
        return 0.0
    tail = _norm_cdf(-epsilon / mu - mu / 2)
    if epsilon < 700:
        return _norm_cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * tail
    # exp(epsilon) overflows past ~709 while the product stays <= 1: take it
    # in logs (a tail of 0 leaves nothing to subtract).
    scaled = math.exp(epsilon + math.log(tail)) if tail > 0 else 0.0
    return _norm_cdf(-epsilon / mu + mu / 2) - scaled


def _norm_cdf(x: float) -> float:
    # math's erfc rather than scipy.stats: the import cost ~0.6 s in every
    # Beam worker, which imports this module and never calls it.
    return 0.5 * math.erfc(-x / math.sqrt(2))


def gdp_epsilon(mu: float, delta: float) -> float:
    """Smallest epsilon with delta(epsilon) <= delta for a mu-GDP mechanism
    (one Gaussian of sensitivity / sigma = mu is exactly mu-GDP): the
    inverse of ``gdp_delta`` in epsilon (decreasing), by bisection."""
    if mu <= 0:
        return 0.0
    lo, hi = 0.0, 1.0
    while gdp_delta(mu, hi) > delta:
        hi *= 2
        if hi > 1e6:
            raise ValueError("delta is too small for this mu")
    for _ in range(200):
        mid = (lo + hi) / 2
        if gdp_delta(mu, mid) > delta:
            lo = mid
        else:
            hi = mid
    return hi


def gdp_mu(epsilon: float, delta: float) -> float:
    """Largest mu such that mu-GDP is (epsilon, delta)-DP (bisection)."""
    lo, hi = 0.0, 1.0
    while gdp_delta(hi, epsilon) < delta:
        hi *= 2
        if hi > 1e6:
            raise ValueError("target (epsilon, delta) is too loose to calibrate")
    for _ in range(200):
        mid = (lo + hi) / 2
        if gdp_delta(mid, epsilon) <= delta:
            lo = mid
        else:
            hi = mid
    return lo


def validate_weights(weights: Mapping[str, float],
                     stages: Sequence[str]) -> dict[str, float]:
    """Budget weights must name exactly the planned stages and sum to 1."""
    missing = sorted(set(stages) - set(weights))
    extra = sorted(set(weights) - set(stages))
    if missing or extra:
        raise ValueError(
            f"--budget-weights must name exactly the enabled stages "
            f"{sorted(set(stages))}; missing {missing}, not enabled {extra}")
    if any(not w > 0 for w in weights.values()):
        raise ValueError(f"--budget-weights must all be > 0, got {dict(weights)}")
    total = sum(weights.values())
    if abs(total - 1.0) > 1e-6:
        raise ValueError(f"--budget-weights must sum to 1, they sum to {total:g}")
    return dict(weights)


def _slot_mus(slots: Sequence[Slot], weights: Mapping[str, float],
              mu: float) -> dict[str, float]:
    """Per-application mu of each slot, for a per-partition total ``mu``."""
    used: dict[tuple[str, str], float] = {}
    for s in slots:
        key = (s.partition, s.stage)
        used[key] = used.get(key, 0.0) + s.share * s.count
    return {s.name: mu * math.sqrt(weights[s.stage] * s.share
                                   / used[(s.partition, s.stage)])
            for s in slots}


def _mechanisms(slots: Sequence[Slot], weights: Mapping[str, float],
                mu: float) -> list[Mechanism]:
    mus = _slot_mus(slots, weights, mu)
    out = []
    for s in slots:
        sigma = 0.0 if math.isinf(mu) else s.sensitivity / mus[s.name]
        out.append(Mechanism(name=s.name, stage=s.stage, partition=s.partition,
                             sensitivity=s.sensitivity, sigma=sigma,
                             count=s.count))
    return out


def _check_partition_totals(slots: Sequence[Slot],
                            weights: Mapping[str, float]) -> None:
    """Each class (with the globals) must use exactly the whole budget."""
    parts = {s.partition for s in slots} - {GLOBAL} or {GLOBAL}
    for p in parts:
        stages = {s.stage for s in slots if s.partition in (p, GLOBAL)}
        if abs(sum(weights[st] for st in stages) - 1.0) > 1e-6:
            raise ValueError(f"partition {p} does not use every stage")


def calibrate(slots: Sequence[Slot], weights: Mapping[str, float],
              epsilon: float, delta: float,
              accountant: str = "pld") -> PrivacyLedger:
    """Returns a ledger holding every slot as a calibrated mechanism.

    Raises ValueError (before any data is read) when the plan or the target
    is invalid or cannot be met.
    """
    if not slots:
        raise ValueError("nothing to calibrate: the plan has no mechanisms")
    if not (epsilon > 0):
        raise ValueError(f"--epsilon must be > 0 (or inf), got {epsilon}")
    if not (0 < delta < 1):
        raise ValueError(f"--delta must be in (0, 1), got {delta}")
    weights = validate_weights(weights, sorted({s.stage for s in slots}))
    _check_partition_totals(slots, weights)
    names = [s.name for s in slots]
    if len(set(names)) != len(names):
        raise ValueError("duplicate mechanism names in the plan")

    ledger = PrivacyLedger(epsilon, delta, accountant)
    if math.isinf(epsilon):
        mechanisms = _mechanisms(slots, weights, math.inf)
    else:
        mu = gdp_mu(epsilon, delta)
        mechanisms = _mechanisms(slots, weights, mu)
        # Re-check with dp_accounting; its discretisation is pessimistic, so
        # shrink mu until the accountant itself certifies the target.
        partition = _worst_partition(mechanisms)
        for _ in range(60):
            spent = compose_epsilon(partition, delta, accountant)
            if spent <= epsilon:
                break
            mu = shrink_mu(mu, spent, epsilon)
            mechanisms = _mechanisms(slots, weights, mu)
            partition = _worst_partition(mechanisms)
        else:  # pragma: no cover - would mean an accountant bug
            raise ValueError("calibration did not converge")
    for m in mechanisms:
        ledger.register(m)
    if not math.isinf(epsilon):
        spent = ledger.spent_epsilon()
        if spent > epsilon * (1 + 1e-9):
            raise AssertionError(f"calibration overspends: {spent} > {epsilon}")
    return ledger


def shrink_mu(mu: float, spent: float, epsilon: float) -> float:
    """Next mu to try when dp_accounting finds ``spent`` > ``epsilon`` at
    ``mu``: smaller by the relative overshoot (+1e-4). A Gaussian
    composition's epsilon grows at least in proportion to mu, so one step
    usually certifies; the PLD grid's pessimism is a few 1e-4 of epsilon,
    and a fixed 0.5 % step gave away ~0.6 % of epsilon at some targets."""
    over = spent / epsilon - 1.0
    return mu * (0.9 if over >= 0.1 else 1.0 - over - 1e-4)


def _worst_partition(mechanisms: Sequence[Mechanism]) -> list[Mechanism]:
    """The mechanisms one record can affect, for the costliest class."""
    parts = {m.partition for m in mechanisms} - {GLOBAL} or {GLOBAL}
    def cost(p: str) -> float:
        return sum(m.count / m.noise_multiplier ** 2 for m in mechanisms
                   if m.partition in (p, GLOBAL))
    worst = max(parts, key=cost)
    return [m for m in mechanisms if m.partition in (worst, GLOBAL)]
