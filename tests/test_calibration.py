import math

import dp_accounting
import pytest

from dpsynth.dp_ops import calibration, plan
from dpsynth.dp_ops.calibration import Slot, calibrate, gdp_delta, gdp_mu
from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.dp_ops.ledger import compose_epsilon


@pytest.mark.parametrize("eps", [0.5, 1, 4, 8])
def test_gdp_curve_matches_dp_accounting_for_one_gaussian(eps):
    mu = gdp_mu(eps, 1e-5)
    sigma = dp_accounting.get_sigma_gaussian(eps, 1e-5)
    # dp_accounting calibrates a sensitivity-1 Gaussian to the same target.
    assert 1 / mu == pytest.approx(sigma, rel=1e-3)
    assert gdp_delta(mu, eps) == pytest.approx(1e-5, rel=1e-3)


@pytest.mark.parametrize("eps,accountant", [(1, "pld"), (4, "pld"), (8, "pld"),
                                            (2, "rdp")])
def test_calibrated_plan_spends_at_most_and_close_to_target(eps, accountant):
    cfg = GeneratorConfig(labels=(0, 1, 2), epsilon=eps, vote_filter=True,
                          accountant=accountant)
    ledger = plan.make_ledger(cfg)
    spent = ledger.spent_epsilon()
    assert spent <= eps
    # RDP is looser than PLD, so its calibration wastes more of the budget;
    # PLD's is a few 1e-4 of epsilon (a fixed 0.5 % mu step once gave away
    # 0.6 % of it at eps 2 and 4).
    assert spent >= (0.999 if accountant == "pld" else 0.8) * eps
    independent = compose_epsilon(ledger.mechanisms_affecting("class=1"),
                                  1e-5, accountant)
    assert independent == pytest.approx(spent)


@pytest.mark.parametrize("eps", [1, 2, 4, 8])
def test_adaptive_calibration_spends_close_to_target(eps):
    from dpsynth.dp_ops import adaptive
    from dpsynth.dp_ops.adaptive import ledgers
    cfg = GeneratorConfig(labels=tuple(range(10)), epsilon=eps)
    mu = adaptive.calibrate_mu(cfg, 384)
    worst = max(ledgers._worst_epsilon(adaptive.mechanisms(cfg, s, mu),
                                       cfg.delta, cfg.accountant)
                for s in adaptive.menu(384))
    assert 0.999 * eps <= worst <= eps


def test_shrink_mu_steps_by_the_overshoot():
    assert calibration.shrink_mu(1.0, 2.002, 2.0) == pytest.approx(0.9989)
    assert calibration.shrink_mu(1.0, 2.5, 2.0) == pytest.approx(0.9)
    # always strictly smaller, so the calibration loop makes progress
    assert calibration.shrink_mu(1.0, 2.0 * (1 + 1e-12), 2.0) < 1.0


def test_budget_weights_split_mu_squared():
    slots = [Slot("a", "x", "class=0", 1.0), Slot("b", "y", "class=0", 1.0)]
    ledger = calibrate(slots, {"x": 0.8, "y": 0.2}, 4, 1e-5)
    za, zb = (ledger.get(n).noise_multiplier for n in "ab")
    assert (1 / za ** 2) / (1 / zb ** 2) == pytest.approx(4.0)


def test_sigma_scales_with_sensitivity():
    slots = [Slot("a", "x", "class=0", 1.0), Slot("b", "x", "class=0", 5.0)]
    ledger = calibrate(slots, {"x": 1.0}, 2, 1e-5)
    assert ledger.get("b").sigma == pytest.approx(5 * ledger.get("a").sigma)


@pytest.mark.parametrize("weights,msg", [
    ({"x": 0.5}, "sum to 1"),
    ({"x": 0.5, "y": 0.5}, "exactly the enabled stages"),
    ({"x": -1.0, "z": 2.0}, "exactly"),
])
def test_bad_weights_refused(weights, msg):
    with pytest.raises(ValueError, match=msg):
        calibrate([Slot("a", "x", "class=0", 1.0)], weights, 1, 1e-5)


@pytest.mark.parametrize("eps,delta", [(0, 1e-5), (-1, 1e-5), (1, 0), (1, 1)])
def test_bad_targets_refused(eps, delta):
    with pytest.raises(ValueError):
        calibrate([Slot("a", "x", "class=0", 1.0)], {"x": 1.0}, eps, delta)


def test_infinite_epsilon_means_no_noise():
    ledger = calibrate([Slot("a", "x", "class=0", 1.0)], {"x": 1.0},
                       math.inf, 1e-5)
    assert ledger.get("a").sigma == 0
    assert math.isinf(ledger.spent_epsilon())


def test_default_weights_follow_enabled_stages():
    cfg = GeneratorConfig(labels=(0,), clusters=4, lloyd_rounds=0)
    assert set(cfg.weights()) == {"centre", "tree", "moments", "covariance"}
    one = GeneratorConfig(labels=(0,), clusters=1, covariance_rank=0,
                          center=False)
    assert set(one.weights()) == {"moments"}
    assert sum(cfg.weights().values()) == pytest.approx(1)
