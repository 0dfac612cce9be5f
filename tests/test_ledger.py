import math

import dp_accounting
import pytest
from dp_accounting.pld import pld_privacy_accountant

from dpsynth.dp_ops.ledger import GLOBAL, Mechanism, PrivacyLedger, compose_epsilon


def _pld_eps(events, delta):
    acc = pld_privacy_accountant.PLDAccountant()
    acc.compose(dp_accounting.ComposedDpEvent(events))
    return acc.get_epsilon(delta)


def test_compose_matches_direct_dp_accounting():
    mechs = [Mechanism("a", "s", "class=0", 1.0, 3.0),
             Mechanism("b", "s", "class=0", 2.0, 10.0, count=3)]
    direct = _pld_eps([dp_accounting.GaussianDpEvent(3.0),
                       dp_accounting.SelfComposedDpEvent(
                           dp_accounting.GaussianDpEvent(5.0), 3)], 1e-5)
    # Handed over as the one Gaussian they compose to: equal up to the
    # PLD's discretisation (the identity itself is exact, see below).
    assert compose_epsilon(mechs, 1e-5) == pytest.approx(direct, rel=1e-6)


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_gaussians_compose_to_one_gaussian(accountant):
    """The identity compose_epsilon relies on: Gaussians with multipliers
    z_i compose to one Gaussian with z = (sum 1/z_i^2)^(-1/2); RDP states
    it exactly, PLD agrees to its discretisation. Subsampled mechanisms are
    not merged."""
    from dpsynth.dp_ops.ledger import make_accountant
    zs = [0.9, 2.0, 2.0, 7.5]
    merged = sum(z ** -2 for z in zs) ** -0.5
    for z_set in (zs, [merged]):
        acc = make_accountant(accountant)
        acc.compose(dp_accounting.ComposedDpEvent(
            [dp_accounting.GaussianDpEvent(z) for z in z_set]))
        if z_set is zs:
            separate = acc.get_epsilon(1e-6)
        else:
            assert acc.get_epsilon(1e-6) == pytest.approx(separate, rel=1e-6)
    mechs = [Mechanism(f"m{i}", "s", "p", 1.0, z) for i, z in enumerate(zs)]
    assert compose_epsilon(mechs, 1e-6, accountant) == pytest.approx(
        separate, rel=1e-6)
    sampled = mechs + [Mechanism("q", "s", "p", 1.0, 1.0,
                                 sampling_probability=0.01, count=50)]
    direct = make_accountant(accountant)
    direct.compose(dp_accounting.ComposedDpEvent([m.dp_event()
                                                  for m in sampled]))
    assert compose_epsilon(sampled, 1e-6, accountant) == pytest.approx(
        direct.get_epsilon(1e-6), rel=1e-6)


def test_merged_multiplier_is_rounded_towards_more_epsilon():
    from dpsynth.dp_ops.ledger import _truncate
    for z in (0.1234567891234567, 3.0, 1e-3, 123456.789):
        assert _truncate(z) <= z
        assert _truncate(z) == pytest.approx(z, rel=1e-11)


def test_classes_compose_in_parallel_globals_sequentially():
    ledger = PrivacyLedger(10, 1e-5)
    for label in range(5):
        ledger.register(Mechanism(f"c{label}", "s", f"class={label}", 1, 2.0))
    one_class = compose_epsilon([Mechanism("x", "s", "class=0", 1, 2.0)], 1e-5)
    assert ledger.spent_epsilon() == pytest.approx(one_class)
    ledger.register(Mechanism("g", "s", GLOBAL, 1, 2.0))
    two = compose_epsilon([Mechanism("x", "s", "class=0", 1, 2.0),
                           Mechanism("y", "s", GLOBAL, 1, 2.0)], 1e-5)
    assert ledger.spent_epsilon() == pytest.approx(two)


def test_worst_class_sets_epsilon():
    ledger = PrivacyLedger(10, 1e-5)
    ledger.register(Mechanism("a", "s", "class=0", 1, 5.0))
    ledger.register(Mechanism("b", "s", "class=1", 1, 1.0))
    assert ledger.spent_epsilon() == pytest.approx(
        compose_epsilon([ledger.get("b")], 1e-5))


def test_subsampled_mechanism_uses_poisson_event():
    m = Mechanism("sgd", "train", GLOBAL, 1.0, 1.1, count=100,
                  sampling_probability=0.01)
    direct = _pld_eps([dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(
            0.01, dp_accounting.GaussianDpEvent(1.1)), 100)], 1e-5)
    assert compose_epsilon([m], 1e-5) == pytest.approx(direct, rel=1e-6)


def test_zero_sigma_is_infinite_epsilon():
    assert math.isinf(compose_epsilon([Mechanism("a", "s", GLOBAL, 1, 0.0)],
                                      1e-5))


@pytest.mark.parametrize("kwargs", [dict(sensitivity=0), dict(sigma=-1),
                                    dict(count=0),
                                    dict(sampling_probability=0),
                                    dict(neighbouring="replace one")])
def test_bad_mechanisms_rejected(kwargs):
    base = dict(name="a", stage="s", partition=GLOBAL, sensitivity=1, sigma=1)
    with pytest.raises(ValueError):
        Mechanism(**{**base, **kwargs})


def test_duplicate_registration_rejected():
    ledger = PrivacyLedger(1, 1e-5)
    ledger.register(Mechanism("a", "s", GLOBAL, 1, 1))
    with pytest.raises(ValueError, match="twice"):
        ledger.register(Mechanism("a", "s", GLOBAL, 1, 1))


def test_manifest_lists_every_mechanism():
    ledger = PrivacyLedger(2, 1e-5, "rdp")
    ledger.register(Mechanism("a", "s", "class=0", 2.0, 4.0))
    ledger.register(Mechanism("b", "t", "class=1", 1.0, 3.0))
    ledger.register(Mechanism("c", "t", "global", 1.0, 5.0))
    doc = ledger.to_manifest()
    assert doc["accountant"] == "rdp"
    assert [m["name"] for m in doc["mechanisms"]] == ["a", "b", "c"]
    assert doc["mechanisms"][0]["noise_multiplier"] == 2.0
    assert doc["mechanisms"][1]["noise_multiplier"] == 3.0
    assert all(m["neighbouring"] == "add/remove one record"
               for m in doc["mechanisms"])
    # the spend the manifest states is the ledger's composition, not less
    assert doc["spent"]["epsilon"] == ledger.spent_epsilon() > 0
    # classes compose in parallel, the global mechanism with each class
    worst = max(compose_epsilon([ledger.get(n), ledger.get("c")], 1e-5, "rdp")
                for n in "ab")
    assert doc["spent"]["epsilon"] == pytest.approx(worst)


@pytest.mark.parametrize("z", [0.3, 1.0, 4.0, 20.0])
@pytest.mark.parametrize("delta", [1e-5, 1e-8])
def test_ledger_pld_grid_is_an_upper_bound_close_to_the_default(z, delta):
    """The ledger's coarser PLD grid (speed: calibration runs several
    compositions) never reports less epsilon than dp_accounting's default
    grid, and at most 0.1 % more for a Gaussian (a plan composes to one)."""
    from dpsynth.dp_ops.ledger import make_accountant
    ours = make_accountant("pld", one_gaussian=True)
    ours.compose(dp_accounting.GaussianDpEvent(z))
    fine = _pld_eps([dp_accounting.GaussianDpEvent(z)], delta)
    assert fine <= ours.get_epsilon(delta) <= fine * 1.001


def test_plain_gaussians_use_the_coarse_grid_and_subsampled_the_default():
    from dpsynth.dp_ops import ledger
    plain = [Mechanism("a", "s", "p", 1.0, 0.7), Mechanism("b", "s", "p",
                                                          1.0, 2.0)]
    z = sum(m.noise_multiplier ** -2 for m in plain) ** -0.5
    coarse = ledger.make_accountant("pld", one_gaussian=True)
    coarse.compose(dp_accounting.GaussianDpEvent(ledger._truncate(z)))
    assert compose_epsilon(plain, 1e-5) == coarse.get_epsilon(1e-5)
    assert compose_epsilon(plain, 1e-5) >= _pld_eps(
        [dp_accounting.GaussianDpEvent(z)], 1e-5)
