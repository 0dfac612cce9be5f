"""The paid-selection study (benchmarks/studies/paid_selection.py) spends
what its docstring says: its releases run at the mu it asks for, and the
pilots, the scoring and the final release compose to the whole budget."""

import math

import numpy as np
import pytest

from benchmarks.studies import fast_probe, paid_selection
from benchmarks.studies.study_data import Split
from dpsynth.dp_ops.calibration import gdp_mu


@pytest.mark.parametrize("mu", [0.05, 0.268, 1.0, 3.2])
def test_epsilon_for_inverts_the_gdp_calibration(mu):
    assert gdp_mu(paid_selection.epsilon_for(mu), 1e-5) == \
        pytest.approx(mu, rel=1e-6)


@pytest.mark.parametrize("share", paid_selection.SHARES)
def test_selection_and_release_compose_to_the_whole_budget(share,
                                                          monkeypatch):
    """Three pilots, the scoring's share and the final release: mu^2."""
    asked = []

    def fake_release(split, mode, mu, seed):
        asked.append((mode, mu))
        return np.zeros((2, 3)), np.array([0, 1]), mu

    monkeypatch.setattr(paid_selection, "release", fake_release)
    monkeypatch.setattr(fast_probe, "accuracy", lambda *a, **k: 0.5)
    split = Split("s", np.zeros((4, 3)), np.array([0, 1, 0, 1]),
                  np.zeros((2, 3)), np.array([0, 1]), 2)
    mu = 0.7
    out = paid_selection.select_and_release(split, mu, share, seed=0)
    assert [m for m, _ in asked[:3]] == list(paid_selection.MODES)
    assert asked[3][0] == out["pick"]
    spent = sum(m ** 2 for _, m in asked) + paid_selection.EVAL_SHARE * mu ** 2
    assert spent == pytest.approx(mu ** 2)


def test_append_record_prints_the_short_view_and_logs_the_whole(tmp_path,
                                                                capsys):
    from benchmarks.studies.study_data import append_record
    log = tmp_path / "runs.jsonl"
    append_record(str(log), {"a": 1, "big": [1, 2]}, {"a": 1})
    append_record(str(log), {"a": 2})
    assert capsys.readouterr().out.splitlines() == ['{"a": 1}', '{"a": 2}']
    assert log.read_text().splitlines() == ['{"a": 1, "big": [1, 2]}',
                                            '{"a": 2}']
