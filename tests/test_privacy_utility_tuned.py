"""privacy_utility: the mlp-tuned scoring protocol and its report."""

import math

import numpy as np
import pytest

from benchmarks import privacy_utility as pu


def _rec(method, eps, seed, **acc):
    rec = {"method": method, "display": method, "epsilon": eps, "seed": seed,
           "spent_epsilon": eps, "fit_s": 1.0, "eval_s": 2.0, "notes": [],
           "unaccounted": []}
    rec.update(acc)
    return rec


def _old_records():
    recs = []
    for s in range(2):
        recs.append(_rec(pu.CEILING, math.inf, s, mlp=0.64, logreg=0.74))
        recs.append(_rec("dpgmm-adaptive", 1.0, s, mlp=0.58, logreg=0.70,
                         rows=100))
        recs.append(_rec("dpsgd", 1.0, s, mlp=0.65))
    return recs


def _args(**kw):
    args = pu.parse_args(["--epsilons", "1", "--seeds", "2"] + kw.pop("argv", []))
    for k, v in kw.items():
        setattr(args, k, v)
    return args


INFO = {"command": "c", "data": "d", "n_train": 100, "n_test": 50,
        "classes": 3, "kind": "k", "mlp": "m", "machine": "x",
        "wall_min": 0.1, "reduced": None}


def test_old_records_render_without_the_tuned_section():
    md = pu.markdown(_old_records(), _args(), INFO, ["dpgmm-adaptive", "dpsgd"])
    assert "paper MLP trained on the output" in md
    assert "MLP tuned on the release" not in md


def test_tuned_records_render_table_gaps_and_choices():
    recs = _old_records()
    for r in recs:
        if pu.releases_rows(r):
            r.update({pu.TUNED: 0.70, f"{pu.TUNED}_chosen":
                      {"learning_rate": 0.01}, f"{pu.TUNED}_train_s": 3.0,
                      f"{pu.TUNED}_refit_s": 1.0})
    md = pu.markdown(recs, _args(), INFO, ["dpgmm-adaptive", "dpsgd"])
    assert ("## Test accuracy, MLP tuned on the release (synthetic "
            "validation split, no privacy cost)") in md
    assert "| dpgmm-adaptive: dpgmm-adaptive | 70.0 ± 0.0 |" in md
    assert "dpsgd (reference, not re-scored)" in md
    assert "vs dpsgd 65.0 → +5.0 points" in md
    assert "| dpgmm-adaptive | lr 0.01; lr 0.01 |" in md
    recs[1][f"{pu.TUNED}_val"] = [0.5, 1.0, 1.0]  # tie: grid order decided
    md = pu.markdown(recs, _args(), INFO, ["dpgmm-adaptive", "dpsgd"])
    assert "| dpgmm-adaptive | lr 0.01*; lr 0.01 |" in md


def test_models_flag_and_tuned_methods():
    args = _args(argv=["--models", "mlp,logreg,mlp-tuned",
                       "--tuned-methods", "dpgmm-adaptive"])
    assert pu.models_for("dpgmm-adaptive", args) == ["mlp", "logreg",
                                                     "mlp-tuned"]
    assert pu.models_for(pu.CEILING, args) == ["mlp", "logreg", "mlp-tuned"]
    assert pu.models_for("pe", args) == ["mlp", "logreg"]
    assert _args().models == ["mlp", "logreg"]  # default unchanged
    with pytest.raises(SystemExit):
        _args(argv=["--models", "mlp,svm"])


def test_complete_record_adds_only_missing_models(monkeypatch):
    seen = {}

    def fake_score(x, y, setup, seed, models=None):
        seen.update(rows=len(y), seed=seed, models=models)
        return {m: 0.5 for m in models}
    monkeypatch.setattr(pu, "score_rows", fake_score)
    setup = pu.Setup(None, np.zeros(7), None, None, [0], 1e-5, None, None,
                     False, x_train_unit=np.zeros((7, 2)))
    old = _rec(pu.CEILING, math.inf, 2, mlp=0.6, logreg=0.7)
    new = pu.complete_record(old, setup, ["mlp", "logreg", pu.TUNED])
    assert seen == {"rows": 7, "seed": 2, "models": [pu.TUNED]}
    assert new["mlp"] == 0.6 and new[pu.TUNED] == 0.5 and pu.TUNED not in old
    dpsgd = _rec("dpsgd", 1.0, 0, mlp=0.6)  # a classifier: nothing to add
    assert pu.complete_record(dpsgd, setup, [pu.TUNED]) is dpsgd


def test_shown_command_hides_the_note():
    assert pu._shown_argv(["--reduced-note", "long text", "--seeds", "3"]) == [
        "--reduced-note", "<the note below>", "--seeds", "3"]
