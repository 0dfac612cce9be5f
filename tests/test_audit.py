"""Empirical privacy audit (small version of benchmarks/privacy_audit.py).

The statistics are checked against scipy and for coverage on a mechanism
whose true epsilon is known; the canary audit of the generator must never
beat the claimed epsilon, must find the canary when there is no noise, and
must catch an under-noised (mis-calibrated) run.

What each bound can see. The threshold attack's Clopper-Pearson bound
cannot exceed ~4.9 at 600 trials an arm (5.43 at 1,000) whatever the
noise, and at a claimed epsilon of 1 it stays at 0 for a run with half the
sigma (true epsilon 2.15): it catches only gross errors (sigma for
epsilon 30 claimed as 1, below). The noise-scale bound (``audit.noise_bound``:
the measured spread of the released count and sum) sees sigma x 0.5 at
claimed epsilon 1, 4 and 8 with 100 trials an arm (measured bounds 1.5,
6.3, 12.8; 0.7, 2.7, 5.4 for the right sigma), so a 2x noise error fails
``test_noise_bound_stays_below_the_claimed_epsilon``.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy import stats

from benchmarks import audit
from dpsynth.dp_ops import plan
from dpsynth.dp_ops.calibration import gdp_delta
from dpsynth.dp_ops.ledger import PrivacyLedger


def test_clopper_pearson_matches_scipy():
    for k, n in ((0, 50), (3, 50), (25, 50), (50, 50), (997, 1000)):
        want = stats.binomtest(k, n).proportion_ci(0.95, method="exact")
        got = audit.clopper_pearson(k, n, alpha=0.05)
        assert got == pytest.approx((want.low, want.high), abs=1e-9)
    with pytest.raises(ValueError):
        audit.clopper_pearson(5, 4)


def test_epsilon_from_rates_both_directions():
    assert audit.epsilon_from_rates(0.5, 0.05) == pytest.approx(math.log(10))
    # The complement attack: few true positives, fewer false negatives.
    assert audit.epsilon_from_rates(0.95, 0.5) == pytest.approx(math.log(10))
    assert audit.epsilon_from_rates(0.3, 0.3) == 0.0
    assert audit.epsilon_from_rates(1.0, 0.0) == math.inf
    # delta absorbs the advantage: (0.5 - 0.45) / 0.05 = 1.
    assert audit.epsilon_from_rates(0.5, 0.05, delta=0.45) == 0.0


def test_lower_bound_is_below_the_estimate_and_tightens_with_trials():
    small = audit.epsilon_lower_bound(60, 100, 5, 100, delta=1e-5)
    large = audit.epsilon_lower_bound(6000, 10000, 500, 10000, delta=1e-5)
    assert small.lower < small.estimate
    assert small.estimate == pytest.approx(large.estimate)
    assert small.lower < large.lower < large.estimate


def _gdp_epsilon(mu, delta):
    lo, hi = 0.0, 50.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if gdp_delta(mu, mid) <= delta else (mid, hi)
    return hi


def test_lower_bound_covers_the_true_epsilon_of_a_gaussian_mechanism():
    """Scores N(mu, 1) vs N(0, 1) are exactly mu-GDP: over 300 repeated
    audits the 95 % lower bound may exceed the true epsilon <= 5 % of the
    time, and the bound comes close to it."""
    mu, delta, trials = 2.0, 1e-5, 2000
    true_eps = _gdp_epsilon(mu, delta)
    rng = np.random.default_rng(0)
    threshold = 2.5  # fixed in advance, as if from calibration trials
    tpr, fpr = stats.norm.sf(threshold - mu), stats.norm.sf(threshold)
    tp = rng.binomial(trials, tpr, size=300)
    fp = rng.binomial(trials, fpr, size=300)
    lows = np.array([audit.epsilon_lower_bound(int(a), trials, int(b), trials,
                                               delta).lower
                     for a, b in zip(tp, fp)])
    assert np.mean(lows > true_eps) <= 0.05
    assert np.median(lows) > 0.5 * audit.epsilon_from_rates(tpr, fpr, delta)


def test_choose_threshold_separates_clean_scores():
    rng = np.random.default_rng(1)
    s_in, s_out = rng.normal(5, 1, 300), rng.normal(0, 1, 300)
    t = audit.choose_threshold(s_in, s_out, delta=1e-5)
    assert 1.0 < t < 5.0
    assert audit.bound_at(s_in, s_out, t, 1e-5).lower > 2


# ------------------------------------------------------ the canary audit

@pytest.mark.parametrize("epsilon", [1.0, 4.0])
def test_audit_never_beats_the_claimed_epsilon(epsilon):
    cfg = audit.tight_config(epsilon)
    result = audit.canary_audit(cfg, trials=600, calibration_trials=300,
                                seed=int(epsilon))
    assert result.bound.lower <= epsilon
    assert result.noise.lower <= epsilon
    assert result.bound.trials_in == result.bound.trials_out == 600


def test_audit_has_power_at_epsilon_8():
    """The threshold attack finds the canary at epsilon 8 (its bound cannot
    pass 5.43 at 1,000 trials, so "<= 8" is the noise bound's to check)."""
    cfg = audit.tight_config(8.0)
    result = audit.canary_audit(cfg, trials=1000, calibration_trials=500,
                                seed=8)
    assert result.bound.lower > 0.5
    assert 4.0 < result.noise.lower <= 8.0


def test_audit_detects_the_canary_without_noise():
    cfg = audit.tight_config(math.inf)
    result = audit.canary_audit(cfg, trials=200, calibration_trials=50)
    assert result.bound.tpr == 1.0 and result.bound.fpr == 0.0
    assert result.bound.lower >= 2.0
    assert result.noise.lower == math.inf


def scaled_ledger(cfg, factor: float):
    """The plan's ledger with every sigma times ``factor`` (a calibration
    bug: the run adds that noise while claiming cfg.epsilon)."""
    ledger = plan.make_ledger(cfg)
    out = PrivacyLedger(ledger.target_epsilon, ledger.target_delta,
                        ledger.accountant)
    for m in ledger.mechanisms:
        out.register(dataclasses.replace(m, sigma=m.sigma * factor))
    return out


@pytest.mark.parametrize("epsilon", [1.0, 4.0])
def test_noise_bound_stays_below_the_claimed_epsilon(epsilon):
    """100 trials an arm (seconds): the catcher of sigma-calibration
    mutations (tests/mutations.py)."""
    cfg = audit.tight_config(epsilon)
    result = audit.canary_audit(cfg, trials=100, calibration_trials=50,
                                seed=int(epsilon))
    assert result.noise.lower <= epsilon
    assert result.noise.lower > 0.5 * epsilon  # not vacuous


@pytest.mark.parametrize("epsilon", [1.0, 4.0, 8.0])
def test_noise_bound_sees_half_the_noise(epsilon):
    """sigma x 0.5 (true epsilon 2.15 at a claimed 1, 9.08 at 4)."""
    cfg = audit.tight_config(epsilon)
    result = audit.canary_audit(cfg, trials=100, calibration_trials=50,
                                seed=int(epsilon),
                                ledger=scaled_ledger(cfg, 0.5))
    assert result.claimed_epsilon == epsilon
    assert result.noise.lower > epsilon


def test_noise_bound_is_a_gaussians_epsilon():
    """On exactly Gaussian noise of known sigma the bound's mu is just
    below the true one, and its epsilon is the GDP epsilon."""
    rng = np.random.default_rng(0)
    sigma = {"count": 2.0, "sum": 3.0}
    noise = {f: rng.normal(0, s, 20000) for f, s in sigma.items()}
    got = audit.noise_bound(noise, {"count": 1.0, "sum": 1.5}, 1e-5)
    mu = math.hypot(1 / 2.0, 1.5 / 3.0)
    assert 0.97 * mu < got.mu_lower < mu
    assert gdp_delta(got.mu_lower, got.lower) == pytest.approx(1e-5, rel=1e-4)
    assert audit.gaussian_epsilon(0.0, 1e-5) == 0.0
    assert audit.gaussian_epsilon(math.inf, 1e-5) == math.inf


def test_audit_catches_an_under_noised_run():
    """A calibration bug (noise for epsilon=30 while claiming 1) is found."""
    claimed = audit.tight_config(1.0)
    buggy = dataclasses.replace(audit.tight_config(30.0), accountant="rdp")
    buggy_ledger = plan.make_ledger(buggy)
    result = audit.canary_audit(claimed, trials=300, calibration_trials=150,
                                ledger=buggy_ledger)
    assert result.claimed_epsilon == 1.0
    assert result.bound.lower > 1.0
