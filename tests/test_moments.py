import numpy as np
import pytest

from dpsynth.dp_ops import moments
from dpsynth.dp_ops.clipping import clip_rows


def test_quantize_never_grows_magnitudes():
    x = np.random.default_rng(0).normal(size=(1000, 10))
    q = moments.quantize(x, 3.0)
    assert np.all(np.abs(q) <= np.abs(x))
    assert np.abs(q - x).max() <= 4.0 * 2.0 ** -24  # step: 2^ceil(log2 3) / 2^24


@pytest.mark.parametrize("r", [0.5, 2.0])
def test_neighbouring_datasets_differ_by_at_most_the_sensitivity(r):
    """Add/remove one worst-case record: the ledger's sensitivities hold."""
    rng = np.random.default_rng(1)
    x, _ = clip_rows(rng.normal(size=(200, 6)) * 5, r)
    extra, _ = clip_rows(np.full((1, 6), 100.0), r)  # on the clip sphere
    k = 3
    assign = rng.integers(0, k, 200)
    a = moments.block_moments(x, assign, k, r)
    b = moments.block_moments(np.vstack([x, extra]),
                              np.append(assign, 1), k, r)
    assert np.linalg.norm(b.count - a.count) <= 1
    assert np.linalg.norm(b.sum - a.sum) <= r
    assert np.linalg.norm(b.sumsq - a.sumsq) <= r * r


def test_sums_are_exact_whatever_the_block_split():
    rng = np.random.default_rng(2)
    x, _ = clip_rows(rng.normal(size=(3000, 8)), 1.0)
    assign = rng.integers(0, 4, 3000)
    whole = moments.block_moments(x, assign, 4, 1.0)
    parts = moments.Moments.zeros(4, 8)
    cuts = [0, 7, 1000, 1001, 2999, 3000]
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        parts = moments.block_moments(x[lo:hi], assign[lo:hi], 4, 1.0) + parts
    np.testing.assert_array_equal(whole.sum, parts.sum)
    np.testing.assert_array_equal(whole.sumsq, parts.sumsq)


def test_noiseless_mixture_matches_numpy_mean_and_variance():
    rng = np.random.default_rng(3)
    x, _ = clip_rows(0.2 * rng.normal(size=(500, 4)), 1.0)
    assign = (x[:, 0] > 0).astype(int)
    m = moments.block_moments(x, assign, 2, 1.0)
    w, mu, var = moments.mixture_from_moments(m, 1.0, 1e-9)
    for j in range(2):
        np.testing.assert_allclose(mu[j], x[assign == j].mean(0), atol=1e-6)
        np.testing.assert_allclose(var[j], x[assign == j].var(0), atol=1e-6)
    np.testing.assert_array_equal(w, np.bincount(assign))


def test_negative_noisy_variance_is_floored_and_empty_clusters_dropped():
    m = moments.Moments(np.array([0.3, 10.0]), np.zeros((2, 4)),
                        -np.ones((2, 4)))
    w, _, var = moments.mixture_from_moments(m, 2.0, 1e-3)
    assert w[0] == 0 and w[1] == 10
    assert np.all(var == pytest.approx(1e-3 * 4 / 4))


@pytest.mark.parametrize("bound", [0.7, 0.3, 5.0])
def test_sums_are_order_independent_for_any_bound(bound):
    """The grid step is a power of two whatever the bound (0.7 is the
    default clip radius), so sums in any order are bit-identical."""
    rng = np.random.default_rng(3)
    x = rng.uniform(-bound, bound, size=(5000, 4))
    q = moments.quantize(x, bound)
    assert np.all(np.abs(q) <= np.abs(x))
    forward = np.zeros(4)
    for row in q:
        forward += row
    backward = np.zeros(4)
    for row in q[::-1]:
        backward += row
    assert np.array_equal(forward, backward)
    assert np.array_equal(forward, q.sum(axis=0))
