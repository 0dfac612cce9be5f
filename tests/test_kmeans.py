import numpy as np

from dpsynth.dp_ops import kmeans


def test_nearest_matches_brute_force():
    rng = np.random.default_rng(0)
    x, c = rng.normal(size=(300, 5)), rng.normal(size=(7, 5))
    brute = np.argmin(((x[:, None] - c[None]) ** 2).sum(-1), axis=1)
    np.testing.assert_array_equal(kmeans.nearest(x, c), brute)


def test_weighted_kmeans_finds_separated_clusters():
    rng = np.random.default_rng(1)
    true = np.array([[5.0, 0], [-5, 0], [0, 5]])
    pts = np.vstack([t + 0.1 * rng.normal(size=(50, 2)) for t in true])
    centres = kmeans.weighted_kmeans(pts, np.ones(len(pts)), 3, rng)
    d = np.linalg.norm(centres[:, None] - true[None], axis=-1).min(axis=0)
    assert d.max() < 0.2


def test_fewer_points_than_k_are_padded():
    rng = np.random.default_rng(2)
    centres = kmeans.weighted_kmeans(np.ones((2, 3)), np.ones(2), 5, rng)
    assert centres.shape == (5, 3)


def test_lloyd_update_keeps_small_clusters():
    old = np.zeros((2, 2))
    new = kmeans.update_centres(np.array([10.0, 0.5]),
                                np.array([[10.0, 20], [5, 5]]), old, 2.0)
    np.testing.assert_allclose(new, [[1, 2], [0, 0]])
