"""The synthetic-row sampler: its normals and the mixture it draws."""
import numpy as np
import pytest
from scipy import stats

from dpsynth.dp_ops import sampling


@pytest.mark.parametrize("shape", [(1,), (7,), (3, 5), (1024, 384)])
def test_normals_have_the_shape_dtype_and_are_reproducible(shape):
    a = sampling.standard_normal32(np.random.default_rng(3), shape)
    b = sampling.standard_normal32(np.random.default_rng(3), shape)
    assert a.shape == shape and a.dtype == np.float32
    assert np.array_equal(a, b)
    assert np.all(np.isfinite(a))


def test_normals_are_standard_normal_and_pairs_independent():
    x = sampling.standard_normal32(np.random.default_rng(0), (400, 1000))
    flat = x.ravel().astype(np.float64)
    assert stats.kstest(flat, "norm").pvalue > 1e-3
    assert abs(flat.mean()) < 0.01 and abs(flat.var() - 1) < 0.01
    assert abs(np.mean(flat ** 4) - 3) < 0.05  # Gaussian kurtosis
    # cos and sin halves of one uniform pair: uncorrelated, and so are
    # their squares (Box-Muller pairs are independent, not just orthogonal)
    half = flat.size // 2
    cos, sin = flat[:half], flat[half:]
    assert abs(np.corrcoef(cos, sin)[0, 1]) < 0.01
    assert abs(np.corrcoef(cos ** 2, sin ** 2)[0, 1]) < 0.01


def test_normals_tail_bound_is_the_documented_one():
    x = sampling.standard_normal32(np.random.default_rng(1), (10 ** 6,))
    assert np.abs(x).max() <= np.sqrt(48 * np.log(2)) + 1e-5


def test_mixture_rows_have_the_low_rank_plus_diagonal_covariance():
    rng = np.random.default_rng(5)
    d, r = 6, 2
    factors = rng.standard_normal((d, r)) * 0.5
    var = rng.uniform(0.1, 0.3, size=(2, d))
    means = np.array([np.zeros(d), np.full(d, 10.0)])
    weights = np.array([0.25, 0.75])
    x = sampling.sample_mixture(weights, means, var, 200_000,
                                np.random.default_rng(9), factors)
    assert x.dtype == np.float32 and x.shape == (200_000, d)
    second = x.mean(axis=1) > 5  # the two components are far apart
    assert abs(second.mean() - 0.75) < 0.01
    for j, rows in ((0, x[~second]), (1, x[second])):
        want = factors @ factors.T + np.diag(var[j])
        assert np.allclose(rows.mean(axis=0), means[j], atol=0.02)
        assert np.allclose(np.cov(rows.T), want, atol=0.02)
