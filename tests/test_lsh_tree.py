import numpy as np

from dpsynth.dp_ops import lsh_tree


def _codes(n=2000, d=8, depth=6, seed=0):
    x = np.random.default_rng(seed).normal(size=(n, d))
    return lsh_tree.leaf_codes(x, lsh_tree.hyperplanes(d, depth, 0)), depth


def test_level_counts_are_consistent_prefixes():
    codes, depth = _codes()
    levels = lsh_tree.level_counts(codes, depth)
    for lvl in range(1, depth):
        parent = {}
        for key, c in levels[lvl].items():
            parent[key >> 1] = parent.get(key >> 1, 0) + c
        assert parent == levels[lvl - 1]
    assert sum(levels[0].values()) == len(codes)


def test_noiseless_tree_releases_dense_children_and_partitions_space():
    codes, depth = _codes()
    exact = lsh_tree.level_counts(codes, depth)
    tree = lsh_tree.build_tree(exact, depth, threshold=50,
                               noise=lambda lvl, size: np.zeros(size))
    for lvl in range(1, depth + 1):
        keys = set(tree.noisy_counts[lvl - 1])
        assert all((k ^ 1) in keys for k in keys)  # both children released
        for k, v in tree.noisy_counts[lvl - 1].items():
            assert v == exact[lvl - 1].get(k, 0)
    idx = tree.leaf_index(codes)
    assert (idx >= 0).all()  # every record sits in exactly one leaf
    counts = np.bincount(idx, minlength=len(tree.leaves))
    np.testing.assert_array_equal(counts, tree.leaf_counts())


def test_branching_uses_only_noisy_counts():
    codes, depth = _codes()
    exact = lsh_tree.level_counts(codes, depth)
    huge = lsh_tree.build_tree(exact, depth, threshold=1e9,
                               noise=lambda lvl, size: np.zeros(size))
    assert huge.leaves == [(1, 0), (1, 1)]
    calls = []
    def noise(level, size):
        calls.append((level, size))
        return np.full(size, 1e9)  # everything looks big: full binary tree
    full = lsh_tree.build_tree(exact, 3, threshold=10, noise=noise)
    assert calls == [(1, 2), (2, 4), (3, 8)]
    assert len(full.leaves) == 8
    # Exact level-1 counts far over the threshold, released ones 0: the
    # tree must not branch (branching on the exact counts would).
    assert min(exact[0].values()) >= 10 * 50
    def cancel(level, size):
        return -np.array([exact[level - 1].get(k, 0) for k in range(size)],
                         float)
    flat = lsh_tree.build_tree(exact, depth, threshold=50, noise=cancel)
    assert flat.leaves == [(1, 0), (1, 1)]
    assert flat.noisy_counts[0] == {0: 0.0, 1: 0.0}


def test_merge_level_counts():
    a = [{0: 1, 1: 2}]
    b = [{1: 3, 5: 1}]
    assert lsh_tree.merge_level_counts(a, b) == [{0: 1, 1: 5, 5: 1}]
