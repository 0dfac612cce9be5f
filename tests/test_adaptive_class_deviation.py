"""The per-class mode's class deviations are post-processing only: the
product's "spiked" (RuleConstants.class_deviation) and the studies'
all-class "spectral" and "shrunk" (benchmarks/studies/class_deviations.py,
through the reference's ``class_post`` hook), and the studies' "spectral"
subspace blocks (``block_post``): same ledger, same mechanisms, same noise
draws; with zero noise they give the raw covariances' factors."""

import dataclasses
import math

import numpy as np
import pytest

from benchmarks import reference
from benchmarks.studies import class_deviations
from dpsynth.dp_ops import adaptive, covariance
from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.dp_ops.noise import SeededNoise
from tests.conftest import gmm_data

PER_CLASS = dict(per_class_min_signal=0.0)


class RecordingNoise:
    """SeededNoise recording every draw's (key, sigma, noise value)."""

    def __init__(self, seed=0):
        self.inner, self.draws = SeededNoise(seed), {}

    def add(self, value, sigma, key, grid):
        out = self.inner.add(value, sigma, key, grid)
        self.draws[key] = (sigma, np.asarray(out) - np.asarray(value))
        return out


def _run(eps, class_deviation, seed=3):
    x, y = gmm_data(3000, d=12, classes=3, spread=0.2)
    cfg = GeneratorConfig(labels=(0, 1, 2), epsilon=eps)
    noise = RecordingNoise(seed)
    mixes, xs, ys, ledger, st = class_deviations.generate(
        x, y, cfg, noise, {"class_deviation": class_deviation,
                           **({} if math.isinf(eps) else PER_CLASS)})
    assert st.mode == "per-class"
    return mixes, ledger, noise, st


def _mech(ledger):
    return sorted((m.name, m.stage, m.partition, m.sensitivity, m.sigma,
                   m.count) for m in ledger.mechanisms)


@pytest.mark.parametrize("deviation", ["spectral", "spiked", "shrunk"])
def test_class_deviation_is_post_processing_only(deviation):
    raw_mix, raw_ledger, raw_noise, raw_st = _run(2.0, "raw")
    sp_mix, sp_ledger, sp_noise, sp_st = _run(2.0, deviation)
    # the same structure: only the post-processing named in it differs
    # (a study's starts from the raw matrices: the structure says "raw")
    product = deviation in adaptive.CLASS_DEVIATIONS
    assert sp_st.class_deviation == (deviation if product else "raw")
    assert dataclasses.replace(
        raw_st, class_deviation=sp_st.class_deviation) == sp_st
    assert _mech(raw_ledger) == _mech(sp_ledger)
    assert sp_ledger.spent_epsilon() == raw_ledger.spent_epsilon()
    assert raw_noise.draws.keys() == sp_noise.draws.keys()
    for key, (sigma, value) in raw_noise.draws.items():
        assert sp_noise.draws[key][0] == sigma
        assert np.array_equal(sp_noise.draws[key][1], value)
    changed = False
    for c in raw_mix:
        assert np.array_equal(raw_mix[c].means, sp_mix[c].means)
        assert raw_mix[c].noisy_count == sp_mix[c].noisy_count
        a = raw_mix[c].factors @ raw_mix[c].factors.T
        b = sp_mix[c].factors @ sp_mix[c].factors.T
        changed |= not np.allclose(a, b)
    assert changed  # the option does something at finite epsilon


@pytest.mark.parametrize("deviation", ["spectral", "spiked", "shrunk"])
def test_zero_noise_gives_the_raw_factors(deviation):
    raw_mix, ledger, _, _ = _run(math.inf, "raw")
    sp_mix, _, _, _ = _run(math.inf, deviation)
    assert all(m.sigma == 0 for m in ledger.mechanisms)
    for c in raw_mix:
        fr, fs = raw_mix[c].factors, sp_mix[c].factors
        assert fr.shape == fs.shape
        np.testing.assert_allclose(fr @ fr.T, fs @ fs.T, atol=1e-10)
        np.testing.assert_allclose(raw_mix[c].variances,
                                   sp_mix[c].variances, atol=1e-10)


def test_shrink_class_deviations_edges():
    rng = np.random.default_rng(0)
    cs = []
    for _ in range(3):
        a = rng.normal(size=(6, 6))
        cs.append(a @ a.T)
    n = np.array([10.0, 20.0, 30.0])
    same = class_deviations.shrink_class_deviations(cs, n, [0.0] * 3)
    for a, b in zip(cs, same):
        np.testing.assert_allclose(a, b, atol=1e-10)
    pooled = sum(w * c for w, c in zip(n, cs)) / n.sum()
    big = class_deviations.shrink_class_deviations(cs, n, [1e9] * 3)
    for b in big:
        np.testing.assert_allclose(b, pooled, atol=1e-10)


def test_spiked_within_keeps_spikes_and_flattens_the_bulk():
    """A rank-2 signal plus symmetric Gaussian noise (the mechanism's, on
    a within covariance): the two spikes come back near their size, every
    other eigenvalues are one flat level that keeps the noisy matrix's
    trace outside the spikes (unbiased: the noise has zero trace in
    expectation)."""
    rng = np.random.default_rng(1)
    d, tau = 200, 0.01  # off-diagonal noise std tau / sqrt(2)
    u = np.linalg.qr(rng.normal(size=(d, 2)))[0]
    signal = (u * [3.0, 1.5]) @ u.T + 0.002 * np.eye(d)
    g = rng.normal(size=(d, d)) * tau / math.sqrt(2)
    noisy = signal + np.triu(g, 1) + np.triu(g, 1).T + \
        np.diag(rng.normal(size=d) * tau)
    edge = math.sqrt(2 * d) * tau
    out = adaptive.spiked_within(noisy, edge)
    vals = np.sort(np.linalg.eigvalsh(out))[::-1]
    np.testing.assert_allclose(vals[:2], [3.002, 1.502], rtol=0.02)
    assert np.ptp(vals[2:]) < 1e-9  # one flat level
    assert vals[2] == pytest.approx(0.002, abs=0.002)
    noisy_vals = np.sort(np.linalg.eigvalsh(noisy))[::-1]
    assert vals[2:].sum() == pytest.approx(np.trace(noisy)
                                           - noisy_vals[:2].sum())


def test_spiked_within_without_noise_is_the_identity():
    a = np.random.default_rng(2).normal(size=(5, 5))
    np.testing.assert_array_equal(adaptive.spiked_within(a @ a.T, 0.0),
                                  a @ a.T)


def test_unknown_deviation_is_refused():
    """The product knows the deviations it ships; the studies' are
    refused there and named only through class_deviations.split."""
    for name in ("js", *class_deviations.CLASS_DEVIATIONS):
        with pytest.raises(ValueError):
            adaptive.RuleConstants(class_deviation=name)
    with pytest.raises(ValueError):
        class_deviations.split({"deviation": "js"})
    consts, hooks = class_deviations.split({"class_deviation": "shrunk",
                                            "deviation": "spectral"})
    assert consts.class_deviation == "raw"
    assert set(hooks) == {"class_post", "block_post"}


def test_spectral_subspace_blocks_are_post_processing_only():
    """The studies' "spectral" subspace blocks (``block_post``): the same
    mechanisms and draws as the product's raw blocks, other factors."""
    x, y = gmm_data(3000, d=24, classes=3, spread=0.2)
    cfg = GeneratorConfig(labels=(0, 1, 2), epsilon=4.0)
    runs = []
    for deviation in ("raw", "spectral"):
        noise = RecordingNoise(5)
        mixes, _, _, ledger, st = class_deviations.generate(
            x, y, cfg, noise, {"force_mode": "subspace",
                               "deviation": deviation})
        assert st.mode == "subspace"
        runs.append((mixes, ledger, noise))
    (raw, raw_ledger, raw_noise), (sp, sp_ledger, sp_noise) = runs
    assert _mech(raw_ledger) == _mech(sp_ledger)
    assert raw_noise.draws.keys() == sp_noise.draws.keys()
    for key, (sigma, value) in raw_noise.draws.items():
        assert np.array_equal(sp_noise.draws[key][1], value)
    assert any(not np.allclose(raw[c].factors @ raw[c].factors.T,
                               sp[c].factors @ sp[c].factors.T) for c in raw)


def test_the_study_hook_path_is_the_raw_rule_bit_for_bit():
    """``per_class_mixture`` (the pipeline forms each class's mixture on
    the worker that released its moments) gives the same bits as the
    studies' path over all classes at once (``class_within``, a
    ``class_post`` that changes nothing, ``within_mixture``)."""
    rng = np.random.default_rng(4)
    cfg = GeneratorConfig(labels=(0, 1, 2), epsilon=2.0)
    d, counts = 12, np.array([900.0, 0.4, 2100.0])  # a class under 1 row
    st = adaptive.make_structure("per-class", 0.4, d, adaptive.RuleConstants())
    mu = adaptive.calibrate_mu(cfg, d)
    ledger = adaptive.add_phase2(adaptive.phase1_ledger(cfg, mu), cfg, st, mu)
    sums = rng.standard_normal((3, d)) * counts[:, None] * 0.1
    second = [a @ a.T for a in rng.standard_normal((3, d, d))]
    n, means = adaptive.class_means(sums, counts, cfg.clip_norm)
    centre = rng.standard_normal(d) * 0.01
    whole = reference.per_class_mixtures(
        second, counts, n, means, centre, st, cfg, ledger,
        class_post=lambda withins, n, sigmas: withins)
    for i, c in enumerate(cfg.labels):
        n_c, mean_c = adaptive.class_means(sums[i:i + 1], counts[i:i + 1],
                                           cfg.clip_norm)
        one = adaptive.per_class_mixture(c, second[i], counts[i],
                                         (n_c[0], mean_c[0]), centre, st, cfg)
        for field in ("weights", "means", "variances", "factors", "centre"):
            assert np.array_equal(getattr(one, field),
                                  getattr(whole[c], field)), (c, field)
        assert one.noisy_count == whole[c].noisy_count


# Issue 61: the "shrunk" deviation's James-Stein weights.

def _noise(rng, sigma, d):
    """Mechanism noise on a second moment: isometric upper triangle of
    std sigma (diagonal sigma, off-diagonal sigma / sqrt(2))."""
    return covariance.symmetric_from_upper(
        rng.normal(size=covariance.upper_size(d)) * sigma, d)


def _classes(rng, d, k, own):
    """k true class covariances: one shared matrix, or each its own."""
    base = rng.normal(size=(d, d)) / math.sqrt(d)
    mats = []
    for _ in range(k):
        a = rng.normal(size=(d, d)) / math.sqrt(d) if own else base
        mats.append(a @ a.T)
    return mats


def test_noise_energy_is_the_frobenius_energy_of_the_mechanism_noise():
    rng = np.random.default_rng(5)
    d, sigma, n_c = 20, 3.0, 50.0
    got = np.mean([np.sum((_noise(rng, sigma, d) / n_c) ** 2)
                   for _ in range(400)])
    assert got == pytest.approx(class_deviations.noise_energy(sigma, n_c, d),
                                rel=0.03)


def test_shared_covariance_under_heavy_noise_pools():
    """Classes with one covariance, noise far above it: lambda near 1 (the
    observed distance from the pooled matrix is the noise's, whose
    expectation is (1 - w_c) v_c for equal classes)."""
    rng = np.random.default_rng(6)
    d, k, n = 40, 4, np.array([500.0, 500.0, 500.0, 500.0])
    sigmas = [2000.0] * k
    withins = [c + _noise(rng, s, d) / m for c, s, m in
               zip(_classes(rng, d, k, own=False), sigmas, n)]
    lam = class_deviations.shrinkage_weights(withins, n, sigmas)
    assert np.all(lam > 0.9)
    out = class_deviations.shrink_towards_pooled(withins, n, sigmas)
    pooled = class_deviations.pooled_within(withins, n)
    for c, o, l in zip(withins, out, lam):
        np.testing.assert_allclose(o, l * pooled + (1 - l) * c)


def test_distinct_covariances_under_light_noise_stay_own():
    rng = np.random.default_rng(7)
    d, k, n = 40, 3, np.array([800.0, 1500.0, 3000.0])
    sigmas = [5.0] * k
    withins = [c + _noise(rng, s, d) / m for c, s, m in
               zip(_classes(rng, d, k, own=True), sigmas, n)]
    lam = class_deviations.shrinkage_weights(withins, n, sigmas)
    assert np.all(lam < 0.01) and np.all(lam > 0)


def test_no_noise_keeps_the_raw_matrices_and_one_class_cannot_pool():
    rng = np.random.default_rng(8)
    mats = _classes(rng, 6, 3, own=True)
    n = np.array([10.0, 20.0, 30.0])
    assert np.array_equal(class_deviations.shrinkage_weights(mats, n, [0.0] * 3),
                          np.zeros(3))
    for a, b in zip(mats, class_deviations.shrink_towards_pooled(mats, n,
                                                         [0.0] * 3)):
        np.testing.assert_array_equal(a, b)
    # one class: w_c = 1, its pooled matrix is itself: nothing to gain
    assert class_deviations.shrinkage_weights(mats[:1], n[:1], [9.0])[0] == 0.0
