"""The noise layer: keyed, exact discrete Gaussian on the aggregate's grid."""

import pickle
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from dpsynth.dp_ops import discrete_gaussian as dg
from dpsynth.dp_ops.noise import (KeyedNoise, SecureNoise, SeededNoise, WordStream,
                          lattice_step, make_noise_source)


def _std_in_chi2_interval(samples: np.ndarray, sigma: float) -> bool:
    """Two-sided 99.9 % chi-square interval for the sample variance."""
    n = samples.size
    s2 = np.mean(samples ** 2)  # mean is known to be 0
    lo, hi = stats.chi2.ppf([0.0005, 0.9995], n)
    return lo / n * sigma ** 2 <= s2 <= hi / n * sigma ** 2


@pytest.mark.parametrize("source", [SeededNoise(7), SecureNoise()],
                         ids=["seeded", "secure"])
@pytest.mark.parametrize("sigma,grid", [(0.5, None), (3.0, 1.0),
                                        (1e-3, 2.0 ** -24)])
def test_empirical_std_matches_sigma(source, sigma, grid):
    draws = source.gaussian(sigma, 20000, "k", grid)
    assert _std_in_chi2_interval(draws, sigma)
    assert abs(draws.mean()) < 5 * sigma / np.sqrt(draws.size)
    # Gaussian shape, not just the right variance.
    assert stats.kstest(draws / sigma, "norm").pvalue > 1e-4


def test_noise_is_a_function_of_key_and_name_only():
    """A re-executed step (retry, recomputed branch) redraws nothing new."""
    a, b = SeededNoise(1), SeededNoise(1)
    assert np.array_equal(a.gaussian(1, 10, "x"), b.gaussian(1, 10, "x"))
    assert np.array_equal(a.gaussian(1, 10, "x"), a.gaussian(1, 10, "x"))
    assert not np.array_equal(a.gaussian(1, 10, "x"), a.gaussian(1, 10, "y"))
    assert not np.array_equal(a.gaussian(1, 10, "x"),
                              SeededNoise(2).gaussian(1, 10, "x"))
    secure = SecureNoise()
    copy = pickle.loads(pickle.dumps(secure))  # what a worker receives
    assert np.array_equal(secure.gaussian(1, 50, "x"), copy.gaussian(1, 50, "x"))


def test_each_run_has_its_own_secret_key():
    assert not np.array_equal(SecureNoise().gaussian(1, 10, "x"),
                              SecureNoise().gaussian(1, 10, "x"))
    assert "<secret>" in repr(SecureNoise())


def test_zero_sigma_is_zero_and_default_is_secure():
    assert not SeededNoise(1).gaussian(0, 3, "x").any()
    assert isinstance(make_noise_source(None), SecureNoise)
    assert isinstance(make_noise_source(5), SeededNoise)
    assert isinstance(make_noise_source(5), KeyedNoise)


@pytest.mark.parametrize("sigma", [1e-3, 0.7, 3.0, 1e4])
def test_lattice_is_fine_and_a_power_of_two(sigma):
    q = lattice_step(sigma)
    assert sigma / q >= 2 ** 20 and np.log2(q) == round(np.log2(q))
    assert lattice_step(sigma, grid=2.0 ** -40) == min(q, 2.0 ** -40)
    with pytest.raises(ValueError, match="power of two"):
        lattice_step(sigma, grid=0.3)


def test_add_is_exact_on_the_grid_and_refuses_off_grid_values():
    """value + noise lands on the lattice, and the noise is exactly the
    difference: the low-order bits of the output carry no information."""
    noise, grid, sigma = SeededNoise(3), 2.0 ** -20, 0.37
    value = np.round(np.random.default_rng(0).normal(size=500) / grid) * grid
    out = noise.add(value, sigma, "m", grid)
    q = lattice_step(sigma, grid)
    steps = out / q
    assert np.array_equal(steps, np.round(steps))
    assert np.array_equal(out - value, noise.gaussian(sigma, 500, "m", grid))
    with pytest.raises(AssertionError, match="not on its grid"):
        noise.add(value + grid / 3, sigma, "m", grid)


def _words(seed: bytes = b"t" * 32) -> WordStream:
    return WordStream(seed)


@pytest.mark.parametrize("s", [0.8, 1.5, 4.0])
def test_discrete_gaussian_matches_its_pmf(s):
    k = dg.discrete_gaussian(200_000, s, _words())
    support = np.arange(-int(10 * s) - 2, int(10 * s) + 3)
    pmf = np.exp(-support.astype(float) ** 2 / (2 * s * s))
    pmf /= pmf.sum()
    observed = np.array([(k == v).sum() for v in support])
    keep = pmf * k.size > 5
    expected = pmf[keep] / pmf[keep].sum() * observed[keep].sum()
    assert observed.sum() == k.size  # nothing outside the support
    assert stats.chisquare(observed[keep], expected).pvalue > 1e-4


def test_slow_path_gives_the_same_distribution(monkeypatch):
    """With a huge float margin every trial takes the exact decimal path."""
    monkeypatch.setattr(dg, "FLOAT_MARGIN", 2.0)
    k = dg.discrete_gaussian(4000, 1.2, _words())
    pmf = {v: np.exp(-v * v / (2 * 1.44)) for v in range(-6, 7)}
    total = sum(pmf.values())
    for v in (-1, 0, 1):
        expected = pmf[v] / total
        assert abs((k == v).mean() - expected) < 4 * np.sqrt(expected / 4000)


def test_exact_trial_refines_until_decided():
    assert dg._exact_trial(2 ** 53 - 1, Fraction(0), _words())  # p = 1
    # gamma a hair above ln 2: p = exp(-gamma) = 0.5 - 1.5e-35. The first 53
    # bits put U in [0.5 - 2^-53, 0.5): undecided; one more word decides.
    gamma = Fraction(6931471805599453094172321214581766, 10 ** 34)
    below = 2 ** 52 - 1
    ones = iter([np.array([np.uint64(2 ** 64 - 1)])])
    assert not dg._exact_trial(below, gamma, lambda n: next(ones))
    zeros = iter([np.array([np.uint64(0)])])
    assert dg._exact_trial(below, gamma, lambda n: next(zeros))


def test_uniform_and_geometric_parts():
    u = dg.uniform_below(100_000, 7, _words())
    assert u.min() == 0 and u.max() == 6
    assert stats.chisquare(np.bincount(u, minlength=7)).pvalue > 1e-4
    g = dg.geometric_e1(100_000, _words(b"g" * 32))
    p = np.exp(-1.0)  # P(V >= v) = p^v
    for v in (1, 2, 3):
        assert abs((g >= v).mean() - p ** v) < 5 * np.sqrt(p ** v / 1e5)
