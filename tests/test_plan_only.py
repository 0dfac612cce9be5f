"""`dpsynth generate --plan-only` (issue 72 item 4): the mechanisms, their
sensitivities and sigmas, the budget split and the store's charge, printed
before any data: no input is listed or read, nothing written or charged."""

from __future__ import annotations

import numpy as np
import pytest

from dpsynth.pipelines import cli, job_plan
from dpsynth.pipelines.cli import generate
from dpsynth.pipelines.budget import store as bs
from tests.conftest import gmm_data

DELTA = 1e-5


def _spec(argv: list[str]):
    args, rest = generate.parser().parse_known_args(argv)
    return generate.spec_from_args(args, rest)


def test_plan_only_reads_nothing_and_charges_nothing(tmp_path, capsys):
    store = str(tmp_path / "b")
    earlier = bs.Mechanism("class=0/count", "moments", "class=0", 1.0, 2.0)
    bs.reserve(store, "d", "run-0", [earlier], 1.0, DELTA, 10.0, DELTA)
    before = bs.history(store, "d")
    code = cli.main(["generate", "--plan-only", "--input",
                     str(tmp_path / "not-yet-*.npz"), "--num-classes", "3",
                     "--output", str(tmp_path / "out"), "--budget-store",
                     store, "--dataset-id", "d", "--epsilon", "2"])
    out = capsys.readouterr().out
    assert code == 0
    assert "class=*/moments/sum x 3 classes: stage moments, sensitivity" in out
    assert "global/covariance/second-moment" in out and "sigma" in out
    assert "budget split" in out and "epsilon charged: 2 at delta 1e-05" in out
    spent, after = bs.spend_after(store, "d", [], DELTA)
    assert f"lifetime epsilon {spent:.4g} spent" in out and "cap 10 (fits)" in out
    assert bs.history(store, "d") == before  # nothing charged
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("covariance", ["auto", "shared", "per-class"])
def test_the_plan_is_what_the_run_charges(tmp_path, covariance):
    x, y = gmm_data(60, d=4, classes=2)
    np.savez(tmp_path / "in.npz", embeddings=x, labels=y)
    argv = ["--input", str(tmp_path / "in.npz"), "--num-classes", "2",
            "--output", str(tmp_path / "out"), "--covariance", covariance,
            "--budget-store", str(tmp_path / "b"), "--dataset-id", "d",
            "--lifetime-epsilon", "10", "--epsilon", "1"]
    plan = job_plan.plan_only(_spec(argv))
    prepared = job_plan.prepare(_spec(argv))
    charged = prepared.reserved or prepared.ledger.mechanisms
    assert plan["mechanisms"] == [m.to_dict() for m in charged]
    assert plan["epsilon_charged"] <= 1.0 + 1e-9
    assert sum(plan["budget_split"].values()) == pytest.approx(1.0)
    assert plan["store"]["after"] == pytest.approx(
        bs.spend_after(str(tmp_path / "b"), "d", charged, DELTA)[1])


def test_plan_only_refuses_bad_flags_in_one_line(tmp_path, capsys):
    code = cli.main(["generate", "--plan-only", "--num-classes", "2",
                     "--budget-store", str(tmp_path / "b")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--dataset-id" in err
