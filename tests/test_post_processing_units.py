"""Each dp_ops step is a function of its released values alone (issue 54).

For every step that turns exact aggregates into released ones (tree,
coreset centres, Lloyd, moments, covariance, centre, vote), the test runs
it once on dataset D with real keyed noise and records every released
value, then on a different dataset D' (other rows, another size, an
outlier) with a noise source that forces the same released values (its
draw is target - exact). The step's output must not change: if it read
an exact aggregate anywhere after the mechanism, D' would show it.
Each test here is the catcher of one privacy mutation in
tests/mutations.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dpsynth.dp_ops import (covariance, generator, kmeans, lsh_tree, moments,
                            plan, vote)
from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.dp_ops.noise import SeededNoise

LABEL = 0
CFG = GeneratorConfig(labels=(LABEL,), epsilon=2.0, clusters=3, clip_norm=1.0,
                      cluster_dim=4, tree_depth=5, lloyd_rounds=1,
                      covariance_rank=2, covariance="per-class",
                      vote_filter=True, center=True)


@pytest.fixture(scope="module")
def ledger():
    return plan.make_ledger(CFG)


class RecordingNoise:
    """Real keyed noise that remembers every released value by draw name."""

    def __init__(self, seed: int = 5) -> None:
        self.inner = SeededNoise(seed)
        self.released: dict[str, np.ndarray] = {}

    def add(self, value, sigma, key, grid):
        out = self.inner.add(value, sigma, key, grid)
        self.released[key] = out.copy()
        return out

    def gaussian(self, sigma, shape, key, grid=None):
        return self.inner.gaussian(sigma, shape, key, grid)


class ForcingNoise:
    """Forces each named mechanism's release to a fixed target: the draw
    is target - exact, whatever the exact value. ``draws`` serves
    ``gaussian`` (a caller that adds a draw itself)."""

    def __init__(self, targets: dict[str, np.ndarray],
                 draws: dict[str, np.ndarray] | None = None) -> None:
        self.targets, self.draws, self.used = targets, draws or {}, set()

    def add(self, value, sigma, key, grid):
        value = np.asarray(value, np.float64)
        target = np.asarray(self.targets[key], np.float64)
        assert target.shape == value.shape, (key, target.shape, value.shape)
        self.used.add(key)
        return target.copy()  # exact + (target - exact), without rounding

    def gaussian(self, sigma, shape, key, grid=None):
        draw = np.asarray(self.draws[key], np.float64)
        size = (shape,) if isinstance(shape, int) else tuple(shape)
        # another shape means the step asked for other released values
        # than on D: its structure followed the exact input
        assert draw.shape == size, f"{key}: asked for {size}, D had {draw.shape}"
        self.used.add(key)
        return draw.copy()


def rows(n: int, seed: int, outlier: bool = False) -> np.ndarray:
    """n rows in the clip ball (radius CFG.clip_norm), a few clusters."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(3, 6))
    x = centres[rng.integers(0, 3, n)] + 0.4 * rng.normal(size=(n, 6))
    if outlier:
        x[0] = 50.0 * np.eye(6)[1]
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x * np.minimum(1.0, CFG.clip_norm / norms)


D = rows(600, 1)
D_PRIME = rows(250, 2, outlier=True)


def z_of(x: np.ndarray) -> np.ndarray:
    return x @ generator.projection(x.shape[1], CFG).T


def codes_of(x: np.ndarray) -> np.ndarray:
    return lsh_tree.leaf_codes(z_of(x), generator.planes(CFG, x.shape[1]))


def exact_levels(x: np.ndarray):
    return lsh_tree.level_counts(codes_of(x), CFG.tree_depth)


def same(a, b) -> None:
    if dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            same(getattr(a, f.name), getattr(b, f.name))
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b)
    else:
        assert a == b


def forced_tree(x: np.ndarray, tree: lsh_tree.Tree, ledger) -> lsh_tree.Tree:
    """``grow_tree`` on x with each level's release forced to ``tree``'s."""
    targets = {
        plan.name(LABEL, "tree", f"level-{level}", "count"):
            np.array([released[k] for k in sorted(released)])
        for level, released in enumerate(tree.noisy_counts, start=1)}
    return generator.grow_tree(exact_levels(x), LABEL, CFG, ledger,
                               ForcingNoise(targets))


def test_tree_shape_is_a_function_of_the_released_level_counts(ledger):
    """Mutation: ``build_tree`` branching on the exact level counts."""
    tree = generator.grow_tree(exact_levels(D), LABEL, CFG, ledger,
                               SeededNoise(3))
    assert len(tree.leaves) > 2  # it branched: there is a shape to leak
    again = forced_tree(D_PRIME, tree, ledger)
    assert again.leaves == tree.leaves
    assert again.noisy_counts == tree.noisy_counts


def leaf_sums(x: np.ndarray, tree: lsh_tree.Tree) -> np.ndarray:
    z = z_of(x)
    leaf = tree.leaf_index(codes_of(x))
    return moments.block_sums(z, leaf, len(tree.leaves), CFG.clip_norm)[1]


def test_coreset_centres_use_only_the_released_leaf_sums(ledger):
    """Mutation: ``coreset_centres`` starting from the exact leaf sums."""
    tree = generator.grow_tree(exact_levels(D), LABEL, CFG, ledger,
                               SeededNoise(3))
    rec = RecordingNoise()
    centres = generator.coreset_centres(tree, leaf_sums(D, tree), LABEL, CFG,
                                        ledger, rec)
    forcing = ForcingNoise(rec.released)
    again = generator.coreset_centres(tree, leaf_sums(D_PRIME, tree), LABEL,
                                      CFG, ledger, forcing)
    assert forcing.used == {plan.name(LABEL, "tree", "leaf-sum")}
    np.testing.assert_array_equal(again, centres)


def lloyd_input(x: np.ndarray, centres: np.ndarray):
    z = z_of(x)
    return moments.block_sums(z, kmeans.nearest(z, centres), CFG.clusters,
                              CFG.clip_norm)


def test_lloyd_moves_centres_with_the_released_counts_and_sums(ledger):
    """Mutation: ``lloyd_update`` with the exact counts and sums."""
    start = np.random.default_rng(0).normal(size=(CFG.clusters, 4)) * 0.3
    rec = RecordingNoise()
    centres = generator.lloyd_update(*lloyd_input(D, start), start, 1, LABEL,
                                     CFG, ledger, rec)
    forcing = ForcingNoise(rec.released)
    again = generator.lloyd_update(*lloyd_input(D_PRIME, start), start, 1,
                                   LABEL, CFG, ledger, forcing)
    assert len(forcing.used) == 2
    assert not np.array_equal(centres, start)  # the step moved them
    np.testing.assert_array_equal(again, centres)


def class_moments(x: np.ndarray) -> moments.Moments:
    assign = np.arange(len(x)) % CFG.clusters
    return moments.block_moments(x, assign, CFG.clusters, CFG.clip_norm,
                                 sumsq=not CFG.covariance_rank)


def test_mixture_uses_only_the_released_moments(ledger):
    rec = RecordingNoise()
    mix = generator.mixture(generator.add_moment_noise(
        class_moments(D), LABEL, ledger, rec), LABEL, CFG)
    forcing = ForcingNoise(rec.released)
    again = generator.mixture(generator.add_moment_noise(
        class_moments(D_PRIME), LABEL, ledger, forcing), LABEL, CFG)
    assert forcing.used == set(rec.released)
    same(again, mix)


def test_covariance_factors_use_only_the_released_second_moment(ledger):
    name = plan.covariance_name(LABEL, CFG)
    mix = generator.mixture(generator.add_moment_noise(
        class_moments(D), LABEL, ledger, SeededNoise(1)), LABEL, CFG)

    def factors(x, noise):
        m = generator.noisy_second_moment(
            covariance.block_second_moment(x, CFG.clip_norm), ledger, noise,
            name)
        return generator.add_factors([mix], m, CFG)[0]
    rec = RecordingNoise()
    first = factors(D, rec)
    forcing = ForcingNoise(rec.released)
    again = factors(D_PRIME, forcing)
    assert forcing.used == {name + "#diagonal", name + "#off-diagonal"}
    same(again, first)


def test_centre_uses_only_the_released_sum_and_count(ledger):
    def centre(x, noise):
        return generator.noisy_centre(moments.quantize(
            x, CFG.centre_bound).sum(axis=0), float(len(x)), CFG, ledger,
            noise)
    rec = RecordingNoise()
    first = centre(D, rec)
    forcing = ForcingNoise(rec.released)
    np.testing.assert_array_equal(centre(D_PRIME, forcing), first)
    assert forcing.used == {plan.CENTRE_SUM, plan.CENTRE_COUNT}


@pytest.mark.parametrize("threshold", [None, 6.0])
def test_vote_filter_keeps_candidates_by_the_released_votes(ledger,
                                                            threshold):
    """Mutation: the vote's selection (the resampling draw, or the legacy
    threshold) reading the exact votes."""
    cfg = dataclasses.replace(CFG, vote_threshold=threshold)
    rng = np.random.default_rng(4)
    cands = rng.normal(size=(40, 6)) * 0.3
    # D's votes spread wide around 6: the exact and the noisy histograms
    # select differently
    votes = rng.integers(0, 18, size=40).astype(float)
    rec = RecordingNoise()
    kept = generator.filter_by_votes(cands, votes, LABEL, cfg, ledger, rec,
                                     rows=25)
    other = vote.block_votes(D_PRIME, cands).astype(float)
    forcing = ForcingNoise(rec.released)
    again = generator.filter_by_votes(cands, other, LABEL, cfg, ledger,
                                      forcing, rows=25)
    if threshold is None:
        assert len(kept) == 25  # the row count asked for, whatever the votes
    else:
        assert 0 < len(kept) < len(cands)
    np.testing.assert_array_equal(again, kept)


def test_shrunk_class_matrices_use_only_the_released_values():
    """The studies' "shrunk" class matrices (issue 61, not in the product:
    benchmarks/studies/class_deviations.py; each class covariance mixed
    with the pooled one by weights from the released matrices and the
    ledger's sigma, through the reference's ``class_post`` hook): on D'
    with D's released values forced, D's mixtures and rows."""
    from benchmarks.studies import class_deviations
    from tests.conftest import gmm_data
    cfg = GeneratorConfig(labels=(0, 1, 2), epsilon=4.0)
    weights = []
    spy = class_deviations.shrinkage_weights

    def run(data, noise):
        mixes, xs, _, _, st = class_deviations.generate(
            *data, cfg, noise, {"class_deviation": "shrunk",
                                "per_class_min_signal": 0.0})
        assert st.mode == "per-class"
        return mixes, xs
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(class_deviations, "shrinkage_weights",
                      lambda *a: weights.append(spy(*a)) or weights[-1])
        rec = RecordingNoise()
        first = run(gmm_data(900, d=6, seed=1, spread=0.3), rec)
        forcing = ForcingNoise(rec.released)
        again = run(gmm_data(500, d=6, seed=2, spread=0.9), forcing)
    assert len(weights) == 2 and np.all(weights[0] > 0)  # it did shrink
    assert forcing.used == set(rec.released)
    for c in cfg.labels:
        same(again[0][c], first[0][c])
    np.testing.assert_array_equal(again[1], first[1])
