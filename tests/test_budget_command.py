"""`dpsynth budget show|check|set-cap|set-label-rule` (issue 72 item 7):
the budget store's own commands under the `dpsynth` entry point, with
their one-line errors, and no pipeline library loaded."""

from __future__ import annotations

import json

from dpsynth.pipelines import cli
from dpsynth.pipelines.budget import store as bs

DELTA = 1e-6


def _store_with_one_run(tmp_path) -> list[str]:
    store = str(tmp_path / "budgets")
    mechanism = bs.Mechanism("class=0/count", "moments", "class=0", 1.0, 4.0)
    bs.reserve(store, "digits", "run-1", [mechanism], 1.0, DELTA, 10.0, DELTA)
    return ["--budget-store", store, "--dataset-id", "digits"]


def test_budget_show_prints_the_history(tmp_path, capsys):
    common = _store_with_one_run(tmp_path)
    assert cli.main(["budget", "show", *common]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["history"][0]["run_id"] == "run-1"
    assert shown["lifetime_cap"] == {"epsilon": 10.0, "delta": DELTA}


def test_budget_check_and_set_cap_run_the_stores_commands(tmp_path, capsys):
    common = _store_with_one_run(tmp_path)
    assert cli.main(["budget", "check", *common, "--epsilon", "1",
                     "--num-classes", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["fits"] is True
    assert cli.main(["budget", "set-cap", *common, "--lifetime-epsilon", "20",
                     "--lifetime-delta", str(DELTA), "--reason", "audit"]) == 0
    assert bs.pinned_cap(common[1], "digits")["epsilon"] == 20.0


def test_budget_errors_are_one_line(tmp_path, capsys):
    common = _store_with_one_run(tmp_path)
    code = cli.main(["budget", "set-cap", *common, "--lifetime-epsilon", "20",
                     "--lifetime-delta", str(DELTA), "--reason", " "])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "reason" in err
    try:
        cli.main(["budget", "shw", *common])
    except SystemExit as exit_:
        assert exit_.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid choice: 'shw'" in err
