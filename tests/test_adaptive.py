"""Adaptive two-phase plan (issue 13): the rule, its calibration, the new
mechanism's sensitivity and noise, and the in-memory reference."""

import inspect
import math

import numpy as np
import pytest

from dpsynth.dp_ops import adaptive, covariance
from benchmarks import reference
from dpsynth.dp_ops.adaptive import ledgers
from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.dp_ops.ledger import compose_epsilon
from dpsynth.dp_ops.noise import SeededNoise
from tests.conftest import gmm_data


class RecordingNoise:
    """SeededNoise that records (mechanism, sigma) of every draw (a
    matrix's off-diagonal part is drawn with sigma / sqrt(2))."""

    def __init__(self, seed=0):
        self.inner, self.draws = SeededNoise(seed), {}

    def add(self, value, sigma, key, grid):
        name, _, part = key.partition("#")
        if part != "off-diagonal":
            self.draws[name] = sigma
        return self.inner.add(value, sigma, key, grid)


def test_rule_reads_only_public_inputs():
    params = list(inspect.signature(adaptive.choose_structure).parameters)
    # mode: the operator's --covariance (public configuration)
    assert params == ["epsilon", "delta", "d", "noisy_counts", "constants",
                      "mu", "mode"]
    counts = [480.3, 512.9, 300.1]
    a = adaptive.choose_structure(4.0, 1e-5, 384, counts)
    b = adaptive.choose_structure(4.0, 1e-5, 384, list(counts))
    assert a == b and a.to_manifest() == b.to_manifest()
    inputs = a.to_manifest()["rule_inputs"]
    assert inputs["noisy_counts"] == counts and inputs["d"] == 384


def test_rule_adapts_to_class_size_and_epsilon():
    # thresholds of the issue-30 sweep: s = n_typ mu / d^1.5 >= 1.35
    # (subspace), >= 5.5 (per-class)
    small = adaptive.choose_structure(1.0, 1e-5, 1280, [300.0] * 10)
    mid = adaptive.choose_structure(2.0, 1e-5, 128, [5000.0] * 10)
    big = adaptive.choose_structure(8.0, 1e-5, 128, [5000.0] * 10)
    assert (small.mode, mid.mode, big.mode) == ("shared", "subspace",
                                                "per-class")
    assert mid.class_rank == 21
    # the issue-30 text set (16 classes of ~1,000 rows, d = 384) stays
    # shared at eps = 8 (per-class matrices scored below eps = 4 there)
    assert adaptive.choose_structure(8.0, 1e-5, 384,
                                     [1000.0] * 16).mode == "shared"
    # two large classes may use class matrices
    assert adaptive.choose_structure(1.0, 1e-5, 128,
                                     [10000.0] * 2).mode == "subspace"
    # without noise, a class's d x d matrix still needs n_typ >= 4 d rows
    assert adaptive.choose_structure(math.inf, 1e-5, 64,
                                     [100.0] * 5).mode == "subspace"
    assert adaptive.choose_structure(math.inf, 1e-5, 64,
                                     [300.0] * 5).mode == "per-class"
    # Few rows per class, many dimensions: the noisy means need more.
    few = adaptive.choose_structure(2.0, 1e-5, 384, [450.0] * 20)
    many = adaptive.choose_structure(2.0, 1e-5, 384, [5000.0] * 2)
    assert few.sum_share > many.sum_share


@pytest.mark.parametrize("counts", [[300.0] * 20, [5000.0] * 10,
                                    [1350.0, 1350.0], [-3.0, 9000.0]])
def test_rule_output_is_in_the_certified_menu(counts):
    for eps in (1.0, 2.0, 4.0, 8.0):
        s = adaptive.choose_structure(eps, 1e-5, 384, counts)
        assert s in adaptive.menu(384)


@pytest.mark.parametrize("eps", [1.0, 8.0])
def test_every_structure_meets_the_target(eps):
    cfg = GeneratorConfig(labels=(0, 1, 2), epsilon=eps)
    mu = adaptive.calibrate_mu(cfg, 64)
    spent = []
    for s in adaptive.menu(64):
        # add_phase2 itself refuses an overspending ledger (dp_accounting)
        ledger = adaptive.add_phase2(adaptive.phase1_ledger(cfg, mu), cfg,
                                     s, mu)
        spent.append(ledgers._worst_epsilon(ledger.mechanisms, cfg.delta,
                                             cfg.accountant))
        # phase 1 sigmas do not depend on the structure
        assert ledger.get("class=1/count").sigma == pytest.approx(
            adaptive.phase1_ledger(cfg, mu).get("class=1/count").sigma)
        # GDP identity: every structure uses the whole mu^2 of a class
        z2 = sum(1 / m.noise_multiplier ** 2 for m in
                 ledger.mechanisms_affecting("class=0"))
        assert z2 == pytest.approx(mu ** 2)
    assert max(spent) <= eps
    assert min(spent) >= 0.97 * eps


def test_phase1_share_is_fixed_and_small():
    assert sum(adaptive.PHASE1.values()) < 0.05


def test_subspace_mechanism_sensitivity_worst_case():
    """The exact aggregate of ``class=<c>/covariance/subspace``: one
    record changes it by z z^T, ||z||^2 <= R^2, whatever the record."""
    rng = np.random.default_rng(0)
    d, r, clip = 12, 4, 0.7
    basis, _ = np.linalg.qr(rng.normal(size=(d, r)))
    rows = rng.normal(size=(30, d))
    rows *= clip / np.linalg.norm(rows, axis=1, keepdims=True)

    def released(x):
        return covariance.upper(adaptive.projected_block_moment(x, basis,
                                                                clip))
    base = released(rows)
    # worst case: a record at the clip radius inside the subspace
    x = (basis[:, 0] * clip)[None, :]
    change = np.linalg.norm(released(np.vstack([rows, x])) - base)
    assert change == pytest.approx(clip ** 2, rel=1e-3)  # grid truncation
    for _ in range(50):  # and never more, whatever the record
        y = rng.normal(size=(1, d)) * rng.uniform(0.1, 3)
        assert np.linalg.norm(released(np.vstack([rows, y])) - base
                              ) <= clip ** 2
    # exact: block order does not matter
    def exact(x):
        return adaptive.projected_block_moment(x, basis, clip)
    assert np.array_equal(exact(rows[:10]) + exact(rows[10:]), exact(rows))


# each mode forced (RuleConstants.force_mode);
# subspace and shared forced through the rule's constants.
MODES = {"per-class": adaptive.RuleConstants(force_mode="per-class"),
         "subspace": adaptive.RuleConstants(force_mode="subspace",
                                            subspace_dim_fraction=4),
         "shared": adaptive.RuleConstants(force_mode="shared")}


@pytest.fixture(scope="module", params=list(MODES))
def release(request):
    x, y = gmm_data(6000, d=16, classes=3, spread=0.2)
    cfg = GeneratorConfig(labels=(0, 1, 2), epsilon=8.0)
    noise = RecordingNoise(5)
    out = reference.generate_adaptive(x, y, cfg, noise, MODES[request.param])
    assert out[4].mode == request.param
    return x, y, cfg, noise, out


def test_ledger_lists_exactly_the_mechanisms_that_ran(release):
    _, _, cfg, noise, (_, _, _, ledger, structure) = release
    assert set(noise.draws) == {m.name for m in ledger.mechanisms}
    for m in ledger.mechanisms:
        assert noise.draws[m.name] == m.sigma
    assert ledger.spent_epsilon() <= cfg.epsilon
    assert compose_epsilon(ledger.mechanisms_affecting("class=2"), cfg.delta
                           ) == pytest.approx(ledger.spent_epsilon())


def test_adaptive_release_is_useful(release):
    from dpsynth.models.classifiers import LogRegConfig, train_logreg
    from dpsynth.dp_ops.clipping import normalize_rows
    x, y, cfg, _, (mixes, xs, ys, _, _) = release
    assert set(mixes) == set(cfg.labels)
    assert np.allclose(np.linalg.norm(xs, axis=1), 1.0)
    clf = train_logreg(xs, ys, list(cfg.labels), LogRegConfig(C=1.0))
    xt, yt = gmm_data(900, d=16, classes=3, seed=3, spread=0.2)
    assert clf.accuracy(normalize_rows(xt, "unit"), yt) > 0.9
    for mix in mixes.values():
        assert mix.factors.shape[0] == x.shape[1]
        assert math.isfinite(mix.noisy_count)


# Issue 53: per-class matrices with spiked post-processing below the raw
# per-class signal (``adaptive.spiked_band``).

def test_cifar10_sized_inputs_pick_spiked_class_matrices_from_eps_4():
    picks = [adaptive.choose_structure(eps, 1e-5, 1280, [5000.0] * 10)
             for eps in (1.0, 2.0, 4.0, 8.0)]
    assert [s.name for s in picks] == ["shared", "shared",
                                       "per-class (spiked)",
                                       "per-class (spiked)"]
    assert picks[2].to_manifest()["class_matrices"] == "spiked"
    assert picks[0].to_manifest()["class_matrices"] == "raw"


@pytest.mark.parametrize("eps,d,counts,mode", [
    (8.0, 1280, [3000.0] * 10, "shared"),  # n_typ < 3 d
    (2.0, 8, [100.0] * 3, "subspace"),  # mu 0.50 < 0.6
    (3.0, 8, [100.0] * 3, "per-class"),  # mu 0.72, s 3.2 < 5.5
    (8.0, 1280, [20000.0], "shared"),  # one class
    (8.0, 384, [2000.0] * 4, "per-class"),  # s 0.44 in the band
])
def test_the_spiked_band_gates(eps, d, counts, mode):
    s = adaptive.choose_structure(eps, 1e-5, d, counts)
    assert s.mode == mode
    assert s.class_deviation == ("spiked" if mode == "per-class" else "raw")


def test_the_band_is_public_and_study_constants_override_it():
    # a class deviation is only post-processing: the mechanisms of the
    # spiked and raw per-class structures are the same
    cfg = GeneratorConfig(labels=(0, 1, 2), epsilon=4.0)
    mu = adaptive.calibrate_mu(cfg, 8)
    spiked = adaptive.choose_structure(4.0, 1e-5, 8, [100.0] * 3, mu=mu)
    raw = adaptive.choose_structure(
        4.0, 1e-5, 8, [100.0] * 3,
        adaptive.RuleConstants(class_deviation="raw"), mu=mu)
    assert (spiked.class_deviation, raw.class_deviation) == ("spiked", "raw")
    mechs = [sorted((m.name, m.sensitivity, m.sigma) for m in
                    adaptive.mechanisms(cfg, s, mu)) for s in (spiked, raw)]
    assert mechs[0] == mechs[1]
    off = adaptive.choose_structure(
        4.0, 1e-5, 8, [100.0] * 3,
        adaptive.RuleConstants(spiked_min_signal=float("inf")), mu=mu)
    assert off.mode == "subspace"
    with pytest.raises(ValueError, match="per-class mode"):
        adaptive.make_structure("shared", 0.5, 8, adaptive.RuleConstants(),
                                class_deviation="spiked")
