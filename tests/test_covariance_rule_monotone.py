"""The covariance rule never makes utility go backwards as epsilon grows
(issue 30): its mode only gets richer with epsilon for fixed counts, and
on small simulated shapes (benchmarks/studies/covariance_sweep.py) the
release it picks scores a non-decreasing probe accuracy at eps 1, 2, 4, 8.
"""

import math

import numpy as np
import pytest

from benchmarks.studies import covariance_sweep as sweep
from benchmarks.studies import fast_probe
from dpsynth.dp_ops import adaptive
from benchmarks import reference
from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.dp_ops.noise import SeededNoise

RICHNESS = {mode: i for i, mode in enumerate(adaptive.MODES)}
EPSILONS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 64.0, math.inf)


@pytest.mark.parametrize("d", [8, 64, 384, 1280])
@pytest.mark.parametrize("counts", [
    [40.0] * 2, [300.0] * 20, [1000.0] * 16, [5000.0] * 10, [10000.0] * 3,
    [100.0] * 50, [12000.0, 900.0, 3000.0, 450.0], [1350.0, 1350.0]])
def test_mode_never_gets_poorer_as_epsilon_grows(d, counts):
    ranks = [RICHNESS[adaptive.choose_structure(eps, 1e-5, d, counts).mode]
             for eps in EPSILONS]
    assert ranks == sorted(ranks), ranks


def test_sum_share_does_not_depend_on_epsilon():
    # the split follows (d, counts, mode) only, so a fixed mode's
    # release only gets less noise as epsilon grows
    counts = [800.0, 1200.0, 950.0]
    shares = {(s.mode, s.sum_share) for s in (
        adaptive.choose_structure(eps, 1e-5, 64, counts)
        for eps in EPSILONS)}
    assert len({m for m, _ in shares}) == len(shares)


# Small shapes on which the rule walks through its modes between eps 1
# and 8 (shared -> subspace -> per-class on the first two, shared ->
# subspace on the third): the switches must not cost accuracy.
SHAPES = [sweep.Shape("test-k4-shared", 4, 300, 16, "shared", separation=2.0),
          sweep.Shape("test-k3-t", 3, 400, 24, "t", separation=2.0),
          sweep.Shape("test-k6-class-unequal", 6, 250, 32, "class",
                      ratio=2.0)]


def rule_accuracy(split, eps: float, seed: int) -> tuple[str, float]:
    cfg = GeneratorConfig(labels=tuple(range(split.classes)), epsilon=eps,
                          seed=seed)
    _, xs, ys, _, st = reference.generate_adaptive(
        split.x_fit, split.y_fit, cfg, SeededNoise(1000 + seed))
    return st.mode, fast_probe.accuracy(xs, ys, split.x_val, split.y_val,
                                        split.classes)


# The accuracy of one release is noisy (its noise seed), so the curve is of
# seed means and a step may dip by as much as that noise explains: two
# standard errors of the difference of two means, from the seeds' own
# spread at the two epsilons. With 3 seeds and no tolerance the test failed
# on clean clones (issue 59: 0.7442 -> 0.7436 at eps 4 -> 8 on test-k3-t,
# seed spread ~0.004-0.01, other library builds); 6 seeds halve the
# variance. A mode switch that costs accuracy beyond the noise (issue 30's
# concern: points, not tenths of one) still fails.
SEEDS = range(6)
STANDARD_ERRORS = 2.0


def allowed_dip(a: np.ndarray, b: np.ndarray) -> float:
    """How far the mean of ``b`` may fall below that of ``a`` by noise."""
    return STANDARD_ERRORS * math.sqrt(
        (a.var(ddof=1) + b.var(ddof=1)) / len(a))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
def test_rule_release_accuracy_never_drops_as_epsilon_grows(shape):
    split = sweep.simulate(shape, val_per_class=500)
    per_eps, modes = [], set()
    for eps in (1.0, 2.0, 4.0, 8.0):
        runs = [rule_accuracy(split, eps, seed) for seed in SEEDS]
        modes.update(mode for mode, _ in runs)
        per_eps.append(np.array([acc for _, acc in runs]))
    assert len(modes) >= 2  # the rule does switch on these shapes
    curve = [round(float(a.mean()), 4) for a in per_eps]
    for a, b in zip(per_eps, per_eps[1:]):
        dip = allowed_dip(a, b)
        assert b.mean() >= a.mean() - dip, (curve, round(dip, 4))
