"""Distribution metrics on cases with known answers."""

import numpy as np
import pytest

from dpsynth.models import metrics


def gauss(n, d, seed, shift=0.0, scale=1.0):
    return shift + scale * np.random.default_rng(seed).normal(size=(n, d))


def test_frechet_identical_sets_is_zero():
    a = gauss(500, 8, 0)
    assert metrics.frechet_distance(a, a) == pytest.approx(0.0, abs=1e-8)


def test_frechet_closed_form_gaussians():
    # N(m, I) vs N(0, s^2 I): ||m||^2 + d (1 - s)^2 exactly.
    d, s = 6, 2.0
    m = np.arange(d) / d
    cov_a, cov_b = np.eye(d), s ** 2 * np.eye(d)
    want = m @ m + d * (1 - s) ** 2
    got = metrics.frechet_from_moments(m, cov_a, np.zeros(d), cov_b)
    assert got == pytest.approx(want, rel=1e-10)


def test_frechet_non_commuting_covariances():
    # 2-D closed form: Tr((A B)^1/2) for A = diag(4, 1), B = R diag(1, 9) R^T.
    a = np.diag([4.0, 1.0])
    th = 0.7
    r = np.array([[np.cos(th), -np.sin(th)], [np.sin(th), np.cos(th)]])
    b = r @ np.diag([1.0, 9.0]) @ r.T
    from scipy.linalg import sqrtm
    want = np.trace(a + b - 2 * np.real(sqrtm(a @ b)))
    got = metrics.frechet_from_moments(np.zeros(2), a, np.zeros(2), b)
    assert got == pytest.approx(want, rel=1e-8)


def test_frechet_shifted_samples():
    d, n = 4, 20000
    shift = np.array([1.0, -2.0, 0.5, 0.0])
    fd = metrics.frechet_distance(gauss(n, d, 1), gauss(n, d, 2, shift=shift))
    assert fd == pytest.approx(shift @ shift, rel=0.05)


def test_precision_recall_identical_sets():
    a = gauss(400, 5, 3)
    pr = metrics.knn_precision_recall(a, a.copy(), k=3)
    assert pr["precision"] == 1.0 and pr["recall"] == 1.0


def test_precision_recall_far_apart_sets():
    pr = metrics.knn_precision_recall(gauss(300, 5, 4),
                                      gauss(300, 5, 5, shift=50.0), k=3)
    assert pr["precision"] == 0.0 and pr["recall"] == 0.0


def test_precision_recall_mode_collapse():
    # Synthetic = one tight blob at the real mean: precise but no recall.
    real = gauss(1000, 3, 6)
    synthetic = gauss(1000, 3, 7, scale=0.01)
    pr = metrics.knn_precision_recall(real, synthetic, k=3)
    assert pr["precision"] > 0.95
    assert pr["recall"] < 0.05


def test_precision_recall_same_distribution_is_high():
    pr = metrics.knn_precision_recall(gauss(2000, 4, 8), gauss(2000, 4, 9),
                                      k=5)
    assert 0.85 < pr["precision"] <= 1 and 0.85 < pr["recall"] <= 1


def test_nearest_distances_known_values():
    ref = np.array([[0.0], [1.0], [3.0]])
    q = np.array([[0.2], [2.9]])
    assert np.allclose(metrics.nearest_distances(q, ref), [0.2, 0.1])
    assert np.allclose(metrics.nearest_distances(q, ref, k=2), [0.8, 1.9])
    self_nn = metrics.nearest_distances(ref, ref, 1, exclude_self=True)
    assert np.allclose(self_nn, [1.0, 1.0, 2.0])


def test_dcr_copied_records_flagged():
    train, hold = gauss(800, 6, 10), gauss(800, 6, 11)
    copies = train[:300]
    rep = metrics.dcr_report(copies, train, hold)
    assert rep["exact_copies"] == 300
    assert rep["synthetic_to_train"]["p50"] == pytest.approx(0.0, abs=1e-6)
    assert rep["share_closer_to_train"] == 1.0
    assert rep["share_below_holdout_p05"] == 1.0


def test_dcr_fresh_samples_not_flagged():
    train, hold, fresh = gauss(1500, 6, 12), gauss(1500, 6, 13), gauss(1500, 6, 14)
    rep = metrics.dcr_report(fresh, train, hold)
    assert rep["exact_copies"] == 0
    assert 0.43 < rep["share_closer_to_train"] < 0.57
    assert rep["share_below_holdout_p05"] < 0.1


def test_per_class_report_structure():
    x = gauss(600, 4, 15)
    y = np.repeat([0, 1], 300)
    x[y == 1] += 5
    rep = metrics.per_class_report(x, y, x + 0.01, y, x[::3] + 0.3, y[::3])
    assert set(rep["per_class"]) == {"0", "1"}
    assert rep["mean"]["precision"] > 0.9
    assert rep["mean"]["frechet"] < 0.01
    assert "NOT differentially private" in rep["note"]


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="dimension mismatch"):
        metrics.frechet_distance(gauss(5, 2, 0), gauss(5, 3, 0))
    with pytest.raises(ValueError, match="non-empty 2-D"):
        metrics.dcr(np.zeros((0, 2)), gauss(5, 2, 0))
