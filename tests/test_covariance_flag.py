"""`--covariance shared|subspace|per-class|auto` (issue 72 item 8): every
structure the public rule chooses among can be asked for; "subspace" runs
the two-phase plan with the structure fixed."""

from __future__ import annotations

import json

import numpy as np

from dpsynth.dp_ops import adaptive
from dpsynth.pipelines import cli
from tests.conftest import gmm_data


def _input(tmp_path) -> str:
    x, y = gmm_data(900, d=32, classes=3)
    np.savez(tmp_path / "in.npz", embeddings=x, labels=y)
    return str(tmp_path / "in.npz")


def test_subspace_is_released_where_the_rule_would_pick_shared(tmp_path):
    data = _input(tmp_path)
    modes = {}
    for covariance in ("auto", "subspace"):
        out = tmp_path / covariance
        assert cli.main(["generate", "--input", data, "--num-classes", "3",
                         "--covariance", covariance, "--epsilon", "1",
                         "--output", str(out), "--noise-seed", "1"]) == 0
        manifest = json.loads((out / "_manifest.json").read_text())
        modes[covariance] = manifest["adaptive_plan"]["mode"]
        names = {m["name"] for m in manifest["privacy"]["mechanisms"]}
        assert manifest["privacy"]["spent"]["epsilon"] <= 1 + 1e-9
    assert modes == {"auto": "shared", "subspace": "subspace"}
    assert "class=0/covariance/subspace" in names


def test_a_fixed_structure_keeps_the_rules_split_of_the_budget():
    counts = [300.0, 310.0, 290.0]
    rule = adaptive.choose_structure(1.0, 1e-5, 64, counts)
    forced = adaptive.choose_structure(1.0, 1e-5, 64, counts, mode="subspace")
    assert (rule.mode, forced.mode) == ("shared", "subspace")
    assert rule.inputs == forced.inputs
    assert forced.sum_share == adaptive.make_structure(
        "subspace", adaptive.sum_share_rule(64, counts, adaptive.RuleConstants(),
                                            "subspace"), 64,
        adaptive.RuleConstants()).sum_share


def test_subspace_outside_the_two_phase_plan_is_one_line(tmp_path, capsys):
    code = cli.main(["generate", "--input", _input(tmp_path), "--num-classes",
                     "3", "--covariance", "subspace", "--clusters", "2",
                     "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "--covariance subspace needs the two-phase plan" in err
