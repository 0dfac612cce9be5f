import numpy as np
import pytest
from scipy import stats

from dp_ops.noise import SecureNoise, SeededNoise, make_noise_source


def _std_in_chi2_interval(samples: np.ndarray, sigma: float) -> bool:
    """Two-sided 99.9 % chi-square interval for the sample variance."""
    n = samples.size
    s2 = np.mean(samples ** 2)  # mean is known to be 0
    lo, hi = stats.chi2.ppf([0.0005, 0.9995], n)
    return lo / n * sigma ** 2 <= s2 <= hi / n * sigma ** 2


@pytest.mark.parametrize("source", [SeededNoise(7), SecureNoise()],
                         ids=["seeded", "secure"])
@pytest.mark.parametrize("sigma", [0.5, 3.0])
def test_empirical_std_matches_sigma(source, sigma):
    draws = source.gaussian(sigma, 20000, "k")
    assert _std_in_chi2_interval(draws, sigma)
    assert abs(draws.mean()) < 5 * sigma / np.sqrt(draws.size)
    # Gaussian shape, not just the right variance.
    assert stats.kstest(draws / sigma, "norm").pvalue > 1e-4


def test_seeded_noise_is_reproducible_and_keyed():
    a, b = SeededNoise(1), SeededNoise(1)
    assert np.array_equal(a.gaussian(1, 10, "x"), b.gaussian(1, 10, "x"))
    assert not np.array_equal(a.gaussian(1, 10, "x"), a.gaussian(1, 10, "y"))
    assert not np.array_equal(a.gaussian(1, 10, "x"),
                              SeededNoise(2).gaussian(1, 10, "x"))


def test_secure_noise_is_not_reproducible():
    s = SecureNoise()
    assert not np.array_equal(s.gaussian(1, 10, "x"), s.gaussian(1, 10, "x"))


def test_zero_sigma_is_zero_and_default_is_secure():
    assert not SeededNoise(1).gaussian(0, 3, "x").any()
    assert isinstance(make_noise_source(None), SecureNoise)
    assert isinstance(make_noise_source(5), SeededNoise)
