"""The nightly DAG's ``extra_args`` allowlist, without Airflow installed.

The DAG module imports Airflow at the top; here those imports are stubbed so
that its pure validation (``check_extra_args``, ``settings``) can be tested
in the main suite. tests/test_deploy_airflow_slow.py runs it in real Airflow.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

DAG_FILE = (Path(__file__).resolve().parent.parent / "deploy" / "airflow"
            / "dpsynth_nightly.py")
_STUBBED = ("airflow", "airflow.sdk", "airflow.exceptions", "airflow.providers",
            "airflow.providers.apache", "airflow.providers.apache.beam",
            "airflow.providers.apache.beam.operators",
            "airflow.providers.apache.beam.operators.beam")


@pytest.fixture(scope="module")
def nightly():
    """The DAG module, loaded with every Airflow module a MagicMock."""
    stubs = {name: mock.MagicMock(name=name) for name in _STUBBED}
    with mock.patch.dict(sys.modules, stubs):
        spec = importlib.util.spec_from_file_location("dpsynth_nightly_t",
                                                      DAG_FILE)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    # the DAG's checks run dpsynth with this interpreter (it has dpsynth)
    module.DPSYNTH_PYTHON = sys.executable
    return module


@pytest.mark.parametrize("flag", ["record_timings", "record-timings",
                                  "verbose", "show_row_counts",
                                  "noise-seed", "allow_large_delta",
                                  "bad_images_report", "overwrite",
                                  "some_flag_dpsynth_adds_later"])
def test_an_unlisted_flag_is_refused_in_one_line_naming_it(nightly, flag):
    with pytest.raises(ValueError) as err:
        nightly.check_extra_args({"clusters": 2, flag: True})
    message = str(err.value)
    assert "\n" not in message
    assert repr(flag) in message


def test_listed_flags_pass_with_dashes_or_underscores(nightly):
    nightly.check_extra_args({"clusters": 4, "embedding-dim": 64,
                              "no_center": True, "output_format": "parquet"})
    with pytest.raises(ValueError, match="JSON object"):
        nightly.check_extra_args(["--verbose"])


def test_settings_refuses_the_variable_with_an_unlisted_flag(nightly):
    variables = {"dpsynth_config": {"extra_args": {"verbose": True}}}
    with mock.patch.object(nightly, "Variable") as variable:
        variable.get.side_effect = lambda name, default=None, **kw: \
            variables.get(name, default)
        with pytest.raises(ValueError, match="'verbose' is not allowed"):
            nightly.settings({})
        variables["dpsynth_config"]["extra_args"] = {"clusters": 2}
        assert nightly.settings({})["extra_args"] == {"clusters": 2}


def test_every_allowed_flag_is_a_quiet_generate_flag(nightly):
    """The allowlist names real flags of `dpsynth generate`, and none of
    those that print data-dependent values or weaken privacy."""
    from dpsynth.pipelines.cli import generate
    flags = {s[2:].replace("-", "_") for a in generate.parser()._actions
             for s in a.option_strings if s.startswith("--")}
    allowed = set(nightly.EXTRA_ARGS_ALLOWED)
    assert allowed <= flags, sorted(allowed - flags)
    assert not allowed & {"verbose", "record_timings", "show_row_counts",
                          "noise_seed", "allow_large_delta",
                          "bad_images_report", "input", "output", "run_id",
                          "budget_store", "dataset_id", "lifetime_epsilon",
                          "lifetime_delta", "epsilon", "delta",
                          "noise_key_location"}


class _Refused(Exception):
    """Stands in for Airflow's AirflowFailException."""


def _check_budget(nightly, monkeypatch, capsys, store: str, run_id: str,
                  cap: float):
    """``check_budget`` against a real store (dpsynth in this interpreter):
    (its line or the refusal, everything the task log got)."""
    monkeypatch.setattr(nightly, "DPSYNTH_PYTHON", sys.executable)
    monkeypatch.setitem(sys.modules, "airflow.exceptions",
                        mock.Mock(AirflowFailException=_Refused))
    cfg = {**nightly.DEFAULTS, **nightly.OPERATOR_DEFAULTS,
           "budget_store": store, "lifetime_epsilon": cap}
    try:
        result = nightly.check_budget(cfg, run_id)
    except _Refused as err:
        result = str(err)
    logged = capsys.readouterr()
    return result, logged.out + logged.err


def test_budget_check_logs_one_fixed_line_not_the_report(nightly, tmp_path,
                                                         monkeypatch, capsys):
    """The store's report (this run id's attempts, the lifetime epsilon
    spent) stays out of the task log: attempts can follow from private
    data. A re-run of a run id with 3 attempts and an over-cap run each
    log one line of fixed text and configuration."""
    from dpsynth.dp_ops.ledger import Mechanism
    from dpsynth.pipelines.budget import store as budget_store
    store = str(tmp_path / "budgets")
    mech = [Mechanism("class=0/sum", "moments", "class=0", 1.0, 2.0)]
    for attempt in range(3):
        reservation = budget_store.reserve(
            store, "digits-demo", "digits-demo-2026-01-02", mech, 2.0, 1e-5,
            100.0, 1e-5, owner=f"launch-{attempt}")
        if attempt < 2:  # crashed after reading data: charged, re-run
            budget_store.mark_running(reservation)
            budget_store.release_failed(reservation)
    spent = budget_store.lifetime_spent(store, "digits-demo", 1e-5)
    # control: the store's own report does hold the attempt count
    report = subprocess.run(
        [sys.executable, "-m", "dpsynth.pipelines.budget.store", "check",
         "--budget-store", store, "--dataset-id", "digits-demo", "--run-id",
         "digits-demo-2026-01-02", "--epsilon", "1", "--num-classes", "10"],
        capture_output=True, text=True)
    assert "attempt 3" in report.stdout, report.stdout + report.stderr
    line, log = _check_budget(nightly, monkeypatch, capsys, store,
                              "digits-demo-2026-01-02", 100.0)
    assert line == ("budget check: run digits-demo-2026-01-02 fits under "
                    "the lifetime cap of dataset 'digits-demo'")
    assert log == ""  # budget_check prints only the returned line
    refused, log = _check_budget(nightly, monkeypatch, capsys, store,
                                 "digits-demo-2026-01-03", spent + 0.05)
    assert "over the cap" in refused and "\n" not in refused
    assert "dpsynth.pipelines.budget.store show --budget-store " + store in refused
    assert log == ""
    for private in ("attempt", f"{spent:.4f}", f"{spent:.4g}", f"{spent:g}"):
        assert private not in line + refused


# ------------------------------- issue 58 item 2: the operator's settings

def _variables(nightly, monkeypatch, config: dict) -> None:
    """Variable dpsynth_config holds ``config`` (the dataset team's)."""
    variables = {"dpsynth_config": config}
    variable = mock.Mock()
    variable.get.side_effect = lambda name, default=None, **kw: \
        variables.get(name, default)
    monkeypatch.setattr(nightly, "Variable", variable)


OPERATOR = {"output_root": "gs://releases/nightly",
            "budget_store": "gs://ops-only/budgets",
            "dataset_id": "patients",
            "lifetime_epsilon": 6.0, "lifetime_delta": 1e-6,
            "noise_key_location": "gs://ops-only/keys",
            "epsilon_range": [0.5, 2.0],
            "inputs": {"patients": "gs://private/patients/"}}


def _env(**operator) -> dict:
    return {"DPSYNTH_OPERATOR_CONFIG": json.dumps(operator)}


@pytest.mark.parametrize("key", sorted(OPERATOR))
def test_the_dataset_config_cannot_set_an_operator_setting(nightly,
                                                           monkeypatch, key):
    """Whoever edits the dataset's Variable pointed the noise key at a
    folder they read (and could point the store at an empty one): every
    operator setting in the Variable fails the run in one line naming it,
    and the settings used are the operator's."""
    _variables(nightly, monkeypatch, {"epsilon": 1.0, key: OPERATOR[key]})
    with pytest.raises(ValueError) as err:
        nightly.settings({}, _env(**OPERATOR))
    assert type(err.value) is ValueError and "\n" not in str(err.value)
    assert repr(key) in str(err.value) and "operator" in str(err.value)


def test_noise_key_location_left_extra_args(nightly, monkeypatch):
    assert "noise_key_location" not in nightly.EXTRA_ARGS_ALLOWED
    for name in ("noise_key_location", "noise-key-location"):
        _variables(nightly, monkeypatch,
                   {"extra_args": {name: "/tmp/reviewer-readable"}})
        with pytest.raises(ValueError, match=f"{name!r} is not allowed"):
            nightly.settings({}, _env(**OPERATOR))


@pytest.mark.parametrize("params", [
    {"output_root": "/tmp/elsewhere"}, {"budget_store": "/tmp/empty"},
    {"noise_key_location": "/tmp/readable"}, {"dataset_id": "fresh"},
    {"lifetime_epsilon": 100.0}, {"epsilon_range": [0.1, 100]},
    {"input": "/tmp/other/*.npz"}, {"extra_args": {"clusters": 2}}])
def test_trigger_params_cannot_set_what_is_not_theirs(nightly, monkeypatch,
                                                      params):
    _variables(nightly, monkeypatch, {})
    with pytest.raises(ValueError) as err:
        nightly.settings(params, _env(**OPERATOR))
    assert repr(next(iter(params))) in str(err.value) \
        and "\n" not in str(err.value)


def test_the_operator_settings_come_from_the_environment(nightly,
                                                         monkeypatch):
    _variables(nightly, monkeypatch, {"epsilon": 1.5, "extra_args": {
        "clusters": 2}, "input": "gs://private/patients/2026/*.npz"})
    cfg = nightly.settings({"epsilon": None, "runner": None},
                           _env(**OPERATOR))
    for key, value in OPERATOR.items():
        assert cfg[key] == value
    assert cfg["epsilon"] == 1.5
    # The flags generate gets: the operator's, whatever the runner's
    # options held (they are set last).
    plan = nightly.run_plan(cfg, "2026-01-02", [
        "--runner=DirectRunner", "--budget_store=/tmp/empty",
        "--noise_key_location=/tmp/readable", "--output=/tmp/x",
        "--direct_num_workers=2"])
    options = plan["options"]
    assert options["budget_store"] == OPERATOR["budget_store"]
    assert options["noise_key_location"] == OPERATOR["noise_key_location"]
    assert options["dataset_id"] == "patients"
    assert options["lifetime_epsilon"] == 6.0
    assert options["output"] == "gs://releases/nightly/2026-01-02"
    assert plan["output_root"] == OPERATOR["output_root"]
    assert plan["run_id"] == "patients-2026-01-02"
    assert options["clusters"] == 2 and options["direct_num_workers"] == "2"
    assert "runner" not in options
    # A trigger's epsilon within the operator's range is taken; outside it
    # (or the Variable's) the run fails in one line.
    assert nightly.settings({"epsilon": 2.0}, _env(**OPERATOR))["epsilon"] \
        == 2.0
    for bad in (2.5, 0.1, "1", True):
        with pytest.raises(ValueError, match="epsilon_range") as err:
            nightly.settings({"epsilon": bad}, _env(**OPERATOR))
        assert "\n" not in str(err.value)


def test_a_bad_operator_config_fails_in_one_line(nightly, monkeypatch):
    _variables(nightly, monkeypatch, {})
    for env, needle in (({"DPSYNTH_OPERATOR_CONFIG": "{not json"},
                         "JSON object"),
                        ({"DPSYNTH_OPERATOR_CONFIG": "[1]"}, "JSON object"),
                        (_env(budget_stor="x"), "unknown keys"),
                        (_env(epsilon_range=[2, 1]), "epsilon_range"),
                        (_env(epsilon_range=[0, 1]), "epsilon_range"),
                        (_env(epsilon_range=5), "epsilon_range")):
        with pytest.raises(ValueError, match=needle) as err:
            nightly.settings({}, env)
        assert "\n" not in str(err.value)
    # None set: the defaults (the demo's), never anything of the dataset's.
    cfg = nightly.settings({}, {})
    assert {k: cfg[k] for k in nightly.OPERATOR_DEFAULTS} == \
        nightly.OPERATOR_DEFAULTS
