"""tune_mlp_on_holdout: MLP settings chosen on a hold-out of the given rows."""

import numpy as np
import pytest

from dpsynth.models import classifiers
from tests.conftest import gmm_data


class _Recorder:
    """Fake trainer: records the rows (ids in column 0) it trains on. With
    learning rate ``good`` its model looks each row's true label up (accuracy
    1); otherwise it predicts the first label."""

    def __init__(self, good: float):
        self.good, self.calls = good, []

    def __call__(self, x, y, labels, cfg, seed):
        self.calls.append((x[:, 0].copy(), cfg, seed))
        truth = self.lookup if cfg.learning_rate == self.good else {}
        labels = np.asarray(labels)

        def predict_index(a):
            return np.array([int(np.flatnonzero(labels == truth[v])[0])
                             if v in truth else 0 for v in a[:, 0]])
        return classifiers.Classifier(labels, predict_index)


def _rows(n=200, classes=4, seed=0):
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(classes), n // classes) + 1  # labels 1..classes
    x = np.column_stack([np.arange(n, dtype=float), rng.normal(size=n)])
    return x, y


def _recorder(x, y, good):
    rec = _Recorder(good)
    rec.lookup = {float(a): int(b) for a, b in zip(x[:, 0], y)}
    return rec


def test_holdout_is_stratified_disjoint_and_seeded():
    y = np.array([0] * 50 + [1] * 30 + [2] * 20)
    tr, va = classifiers.stratified_holdout(y, 0.2, seed=1)
    assert len(np.intersect1d(tr, va)) == 0
    assert sorted(np.concatenate([tr, va]).tolist()) == list(range(100))
    assert np.bincount(y[va]).tolist() == [10, 6, 4]
    tr2, va2 = classifiers.stratified_holdout(y, 0.2, seed=1)
    assert np.array_equal(va, va2)
    assert not np.array_equal(va, classifiers.stratified_holdout(y, 0.2, 2)[1])
    # A one-row class stays in training.
    _, va = classifiers.stratified_holdout(np.array([0, 0, 0, 0, 0, 1]), 0.5, 0)
    assert 5 not in va.tolist()


def test_selection_sees_only_the_given_rows_and_returns_the_best_config():
    x, y = _rows()
    rec = _recorder(x, y, good=1e-2)
    base = classifiers.MLPConfig(epochs=7)
    out = classifiers.tune_mlp_on_holdout(x, y, [1, 2, 3, 4], base,
                                          classifiers.TUNING_GRID, seed=5,
                                          train=rec)
    assert out.chosen == {"learning_rate": 1e-2}
    assert out.config == classifiers.MLPConfig(epochs=7, learning_rate=1e-2)
    assert out.val_accuracy[1] == 1.0 and max(out.val_accuracy[::2]) < 1.0
    # 3 grid fits on the 80 % split, then one refit on all rows.
    assert len(rec.calls) == 4
    given = set(x[:, 0].tolist())
    for seen, _, seed in rec.calls:
        assert set(seen.tolist()) <= given and seed == 5
    split = rec.calls[0][0]
    assert len(split) == 160 and all(
        np.array_equal(split, c[0]) for c in rec.calls[:3])
    assert np.array_equal(np.sort(rec.calls[3][0]), np.sort(x[:, 0]))
    assert rec.calls[3][1] == out.config


def test_selection_is_deterministic_and_ties_keep_grid_order():
    x, y = _rows()
    runs = [classifiers.tune_mlp_on_holdout(
        x, y, [1, 2, 3, 4], grid=classifiers.TUNING_GRID, seed=3,
        train=_recorder(x, y, good=-1.0)) for _ in range(2)]
    assert runs[0].val_accuracy == runs[1].val_accuracy
    assert runs[0].chosen == {"learning_rate": 1e-3}  # all tie: first point
    with pytest.raises(ValueError, match="empty"):
        classifiers.tune_mlp_on_holdout(x, y, [1, 2, 3, 4], grid=())


def test_tuning_with_the_real_mlp_on_tiny_data():
    x, y = gmm_data(400, d=8, classes=3)
    xt, yt = gmm_data(200, d=8, classes=3, seed=9)
    base = classifiers.MLPConfig(epochs=5, batch_size=64)
    grid = ({"learning_rate": 1e-4}, {"learning_rate": 0.1})
    out = classifiers.tune_mlp_on_holdout(x, y, [0, 1, 2], base, grid, seed=0)
    assert out.chosen == {"learning_rate": 0.1}
    assert out.classifier.accuracy(xt, yt) > 0.9
