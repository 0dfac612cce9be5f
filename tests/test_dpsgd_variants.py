"""DP-SGD comparators of issue 13: library defaults and private tuning."""

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant

from benchmarks.baselines import dpsgd, dpsgd_variants as dv, make_method
from tests.conftest import gmm_data

LABELS = [0, 1, 2]


@pytest.mark.parametrize("shape,mean", [(0.0, 5.0), (1.0, 9.0), (2.5, 3.0)])
def test_theorem2_bound_matches_dp_accounting(shape, mean):
    event = dv.trial_event(1.3, 0.05, 40, 20.0)
    single = rdp_privacy_accountant.RdpAccountant()
    single.compose(event)
    ours = dv.repeat_and_select_rdp(single.orders, single.rdp, mean, shape)
    lib = rdp_privacy_accountant.RdpAccountant()
    lib.compose(dp_accounting.dp_event.RepeatAndSelectDpEvent(event, mean, shape))
    finite = np.isfinite(lib.rdp)
    np.testing.assert_allclose(ours[finite], lib.rdp[finite], rtol=1e-9)
    # Selection costs more than one trial, less than mean-fold composition.
    assert np.all(ours[finite] >= single.rdp[finite])


@pytest.mark.parametrize("eps", [1.0, 8.0])
def test_selection_calibration_meets_the_target(eps):
    args = dict(q=0.05, steps=100, score_z=20.0, mean=9.0, shape=1.0)
    z = dv.calibrate_selection(eps, 1e-5, **args)
    ledger = dv.SelectionLedger(eps, 1e-5, {"z": z, **args})
    spent = ledger.spent_epsilon()
    assert 0.95 * eps <= spent <= eps
    # One trial alone at this z would be much cheaper (the search is paid).
    alone = dpsgd.calibrate_noise_multiplier(eps, 1e-5, 0.05, 100)
    assert z > alone
    less = dv.SelectionLedger(eps, 1e-5, {"z": 0.97 * z, **args})
    assert less.spent_epsilon() > eps


def test_validation_part_is_a_per_record_rule():
    x = np.random.default_rng(0).normal(size=(400, 5))
    mask = dv.validation_mask(x, 0.1)
    assert 0.05 < mask.mean() < 0.15
    # Removing a record never moves any other record between parts.
    np.testing.assert_array_equal(dv.validation_mask(x[1:], 0.1), mask[1:])


@pytest.mark.parametrize("shape", [0.0, 1.0])
def test_trial_count_has_the_accounted_mean(shape):
    rng = np.random.default_rng(1)
    cfg = dv.TuningConfig(shape=shape, mean_trials=6.0)
    ks = np.array([dv.draw_trials(rng, cfg, 9) for _ in range(4000)])
    assert ks.min() >= 1
    assert ks.mean() == pytest.approx(6.0, rel=0.08)


def test_library_defaults_are_fixed_and_not_marked_tuned():
    x, y = gmm_data(600, d=8, classes=3, spread=0.2)
    m = make_method("dpsgd-linear-default", epochs=2)
    for k, v in dv.LIBRARY_DEFAULTS.items():
        if k != "epochs":
            assert getattr(m.cfg, k) == v
    out = m.fit(x, y, LABELS, 4.0, 1e-5, noise_seed=0)
    assert dpsgd.TUNING_NOTE not in out.unaccounted
    assert out.spent_epsilon <= 4.0


def test_private_tuning_runs_within_budget():
    x, y = gmm_data(800, d=8, classes=3, spread=0.2)
    m = make_method("dpsgd-linear-private-tuning", epochs=3, batch_size=100)
    out = m.fit(x, y, LABELS, 2.0, 1e-5, noise_seed=4)
    assert out.spent_epsilon <= 2.0
    assert out.info["trials"] >= 1
    assert out.info["chosen"] in m.tuning.candidates()
    names = [mech.name for mech in out.ledger.mechanisms]
    assert any("validation-correct-count" in n for n in names)
    assert not math.isnan(out.classifier.accuracy(m.preprocess(x), y))
