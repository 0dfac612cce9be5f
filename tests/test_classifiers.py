"""Downstream classifiers: the paper's MLP and the logistic probe."""

import numpy as np
import pytest

from dpsynth.models import classifiers
from tests.conftest import gmm_data


def test_mlp_defaults_match_the_paper():
    cfg = classifiers.MLPConfig()
    assert (cfg.hidden, cfg.dropout, cfg.learning_rate, cfg.label_smoothing,
            cfg.weight_decay, cfg.batch_size, cfg.epochs) == (
        128, 0.5, 1e-3, 0.2, 1e-4, 512, 50)
    assert cfg.batch_norm and cfg.cosine_decay
    assert classifiers.LogRegConfig().C == 0.001


def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match="dropout"):
        classifiers.MLPConfig(dropout=1.0)
    with pytest.raises(ValueError, match="C must be"):
        classifiers.LogRegConfig(C=0)


def test_label_index_keeps_public_order_and_rejects_unknown():
    labels = [7, 3, 5]
    assert classifiers.label_index(np.array([3, 7, 5, 5]), labels).tolist() == [
        1, 0, 2, 2]
    with pytest.raises(ValueError, match="label 4 is not in"):
        classifiers.label_index(np.array([4]), labels)


def test_subsample_to_cuts_only_larger_sets():
    x = np.arange(20.0)[:, None]
    y = np.arange(20)
    xs, ys = classifiers.subsample_to(x, y, 8, seed=1)
    assert len(ys) == 8 and len(set(ys.tolist())) == 8
    assert np.array_equal(xs[:, 0], ys)
    assert classifiers.subsample_to(x, y, 50, 1)[1] is y


def test_logreg_learns_separable_classes_with_sparse_labels():
    x, y = gmm_data(900, d=16, classes=3)
    y = np.array([10, 20, 30])[y]
    xt, yt = gmm_data(300, d=16, classes=3, seed=5)
    yt = np.array([10, 20, 30])[yt]
    clf = classifiers.train_logreg(x, y, [10, 20, 30],
                                   classifiers.LogRegConfig(C=1.0))
    assert set(np.unique(clf.predict(xt))) <= {10, 20, 30}
    assert clf.accuracy(xt, yt) > 0.95


def test_logreg_single_class_predicts_it():
    x, _ = gmm_data(50, d=4)
    clf = classifiers.train_logreg(x, np.full(50, 2), [0, 1, 2])
    assert (clf.predict(x) == 2).all()


def test_mlp_learns_and_is_seeded():
    x, y = gmm_data(1500, d=16, classes=3)
    xt, yt = gmm_data(400, d=16, classes=3, seed=7)
    cfg = classifiers.MLPConfig(epochs=15, batch_size=128, learning_rate=0.05)
    a = classifiers.train_mlp(x, y, [0, 1, 2], cfg, seed=3)
    assert a.accuracy(xt, yt) > 0.95
    b = classifiers.train_mlp(x, y, [0, 1, 2], cfg, seed=3)
    assert np.array_equal(a.predict(xt), b.predict(xt))


def test_trainers_refuse_bad_rows():
    x = np.ones((4, 2))
    x[1, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        classifiers.train_logreg(x, np.array([0, 1, 0, 1]), [0, 1])


def test_log_loss_is_zero_for_a_sure_right_model_and_ln_k_for_uniform():
    labels = [4, 9, 2]
    y = np.array([9, 2, 4, 4, 9])
    x = np.zeros((len(y), 1))
    idx = classifiers.label_index(y, labels)
    sure = classifiers.Classifier(labels, lambda a: idx,
                                  lambda a: np.eye(3)[idx])
    assert sure.log_loss(x, y) == pytest.approx(0.0, abs=1e-12)
    uniform = classifiers.Classifier(labels, lambda a: np.zeros(len(a), int),
                                     lambda a: np.full((len(a), 3), 1 / 3))
    assert uniform.log_loss(x, y) == pytest.approx(np.log(3))
    wrong = classifiers.Classifier(labels, lambda a: (idx + 1) % 3,
                                   lambda a: np.eye(3)[(idx + 1) % 3])
    assert np.isfinite(wrong.log_loss(x, y)) and wrong.log_loss(x, y) > 30
    with pytest.raises(NotImplementedError):
        classifiers.Classifier(labels, lambda a: idx).log_loss(x, y)


def test_trained_models_give_probabilities_in_label_order():
    x, y = gmm_data(600, d=8, classes=3)
    y = np.array([10, 20, 30])[y]
    cfg = classifiers.MLPConfig(epochs=10, batch_size=128, learning_rate=0.05)
    for clf in (classifiers.train_mlp(x, y, [30, 10, 20], cfg, seed=1),
                classifiers.train_logreg(x, y, [30, 10, 20],
                                         classifiers.LogRegConfig(C=1.0))):
        p = clf.predict_proba(x)
        assert p.shape == (600, 3) and np.allclose(p.sum(1), 1)
        assert np.array_equal(clf.labels[p.argmax(1)], clf.predict(x))
        assert clf.log_loss(x, y) < 0.5 * np.log(3)
    one = classifiers.train_logreg(x, np.full(600, 20), [30, 10, 20])
    assert one.predict_proba(x[:2]).tolist() == [[0, 0, 1], [0, 0, 1]]
