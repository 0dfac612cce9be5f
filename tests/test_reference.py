"""Utility acceptance of the generator on a well-separated labelled GMM."""

import math

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from dpsynth.dp_ops import plan
from benchmarks import reference
from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.dp_ops.noise import SeededNoise
from tests.conftest import gmm_data

CLASSES = 10


@pytest.fixture(scope="module")
def data():
    # 10 classes x 4 components, d=64, n=50,000 (the acceptance set)
    x, y = gmm_data(50_000, d=64, classes=CLASSES, comps=4, seed=0, spread=0.6)
    xt, yt = gmm_data(5_000, d=64, classes=CLASSES, comps=4, seed=1, spread=0.6)
    return x, y, xt, yt


def _accuracy(x, y, xt, yt):
    unit = lambda a: a / np.linalg.norm(a, axis=1, keepdims=True)
    clf = LogisticRegression(max_iter=500).fit(unit(x), y)
    return clf.score(unit(xt), yt)


@pytest.mark.parametrize("eps,ratio", [(8.0, 0.95), (math.inf, 0.99)])
def test_release_trains_a_classifier_nearly_as_well_as_real_data(data, eps,
                                                                   ratio):
    x, y, xt, yt = data
    cfg = GeneratorConfig(labels=tuple(range(CLASSES)), epsilon=eps,
                          clusters=8, clip_norm=1.0)
    ledger = plan.make_ledger(cfg)
    mixes, xs, ys = reference.generate(x, y, cfg, ledger, SeededNoise(0))
    assert ledger.spent_epsilon() <= eps
    assert set(ys.tolist()) == set(range(CLASSES))
    real = _accuracy(x, y, xt, yt)
    assert _accuracy(xs, ys, xt, yt) >= ratio * real


def test_unknown_labels_are_refused():
    cfg = GeneratorConfig(labels=(0, 1), epsilon=1)
    with pytest.raises(ValueError, match=r"labels \[2\]"):
        reference.generate(np.ones((3, 2)), np.array([0, 1, 2]), cfg,
                           plan.make_ledger(cfg), SeededNoise(0))


def test_empty_class_still_gets_a_noisy_mixture():
    x, y = gmm_data(600, d=8, classes=2)
    cfg = GeneratorConfig(labels=(0, 1, 2), epsilon=4, clusters=2)
    mixes, xs, ys = reference.generate(x, y, cfg, plan.make_ledger(cfg),
                                       SeededNoise(1))
    assert set(mixes) == {0, 1, 2}
    assert mixes[2].noisy_count < 50  # only noise
