"""Who may set what runs in a scheduled run (security review: a dataset's
config chose the binary, package, image, command or cluster that ran as
the operator), the dataset's input bound to its id, and the Variable's
delta bounded. The DAG is loaded without Airflow as in
tests/test_deploy_airflow_args.py; its checks run dpsynth in this
interpreter."""

from __future__ import annotations

import json
import os

import pytest

from dpsynth.deploy import runner_trust
from tests.test_deploy_airflow_args import (  # noqa: F401 (a fixture)
    OPERATOR, _env, _variables, nightly)

INPUT = "gs://private/patients/2026/*.npz"
THEIRS = "gs://their-bucket/thing"


def _refused(nightly, params: dict, operator: dict) -> str:
    with pytest.raises(ValueError) as err:
        nightly.settings(params, _env(**operator))
    assert type(err.value) is ValueError and "\n" not in str(err.value)
    return str(err.value)


# ------------------------------- runner options that choose what runs

@pytest.mark.parametrize("option", sorted(runner_trust.OPERATOR_ONLY))
def test_only_the_operator_sets_an_option_that_chooses_what_runs(
        nightly, monkeypatch, option):
    """The Variable (its runner_params, its top level, its extra_args) and
    a trigger's params are each refused in one line naming the option and
    who may set it; the operator's config sets it."""
    spelled = "--" + option.replace("_", "-") + "=x"
    for where, variable, params in (
            ("Variable dpsynth_config runner_params",
             {"runner_params": {option: THEIRS}}, {}),
            ("Variable dpsynth_config runner_params",
             {"runner_params": {spelled: THEIRS}}, {}),
            ("Variable dpsynth_config", {option: THEIRS}, {}),
            ("Variable dpsynth_config extra_args",
             {"extra_args": {option: THEIRS}}, {}),
            ("the run's params", {}, {option: THEIRS})):
        _variables(nightly, monkeypatch, {**variable, "input": INPUT})
        message = _refused(nightly, params, OPERATOR)
        assert message.startswith(where + ":"), message
        assert f"--{option}," in message
        assert "only the operator's config may set it" in message
    _variables(nightly, monkeypatch, {"input": INPUT})
    if option == "runner":
        operator = {**OPERATOR, "runner": "PrismRunner"}
        expected = "--runner=PrismRunner"
    else:
        operator = {**OPERATOR, "beam_options": {option: THEIRS}}
        expected = f"--{option}={THEIRS}"
    cfg = nightly.settings({}, _env(**operator))
    assert expected in nightly.runner_options(cfg)


def test_the_reviews_examples_are_refused_in_their_own_spellings(nightly,
                                                                 monkeypatch):
    """prism_location with the runner chosen by a trigger, extra_package,
    a Flink PROCESS command and a Dask scheduler, as the review sent them."""
    for runner_params in ({"prism_location": "gs://b/prism"},
                          {"extra_package": "gs://b/x.whl"},
                          {"environment_type": "PROCESS",
                           "environment_config": '{"command": "/bin/sh"}'},
                          {"client_address": "tcp://their-host:8786"},
                          {"Dask-Client-Address": "tcp://their-host:8786"},
                          {"master_url": "spark://their-host:7077"},
                          {"job_server_jar": "gs://b/js.jar"}):
        _variables(nightly, monkeypatch, {"runner_params": runner_params,
                                          "input": INPUT})
        message = _refused(nightly, {}, OPERATOR)
        assert "only the operator's config may set it" in message
    _variables(nightly, monkeypatch, {"input": INPUT})
    assert "'runner'" in _refused(nightly, {"runner": "PrismRunner"},
                                  OPERATOR)
    # the old second Variable that chose the runner
    variables = {"dpsynth_config": {"input": INPUT},
                 "dpsynth_runner": "PrismRunner"}
    monkeypatch.setattr(nightly.Variable, "get", lambda name, default=None,
                        **kw: variables.get(name, default), raising=False)
    assert "Variable dpsynth_runner" in _refused(nightly, {}, OPERATOR)


def test_the_dataset_sets_only_sizes_of_the_operators_runner(nightly,
                                                             monkeypatch):
    _variables(nightly, monkeypatch, {"runner_params": {"num-workers": 2},
                                      "input": INPUT})
    cfg = nightly.settings({}, _env(**OPERATOR))
    assert cfg["runner"] == "DirectRunner"
    args = nightly.runner_options(cfg)
    assert "--direct_num_workers=2" in args
    plan = nightly.run_plan(cfg, "2026-01-02", args)
    assert plan["runner"] == "DirectRunner"
    for bad, needle in (({"some_option": 1}, "unknown key 'some_option'"),
                        ({"max_num_workers": 3},
                         "not a parameter of DirectRunner")):
        _variables(nightly, monkeypatch, {"runner_params": bad,
                                          "input": INPUT})
        cfg = nightly.settings({}, _env(**OPERATOR))
        with pytest.raises(ValueError, match=needle) as err:
            nightly.runner_options(cfg)
        assert "\n" not in str(err.value)


def test_the_table_names_the_options_beam_reads():
    """Each name is an option of the pinned Beam (or dpsynth's Dask), every
    option string Beam gives such an option is matched, and a prefix is not
    an option Beam reads (its parser has allow_abbrev=False)."""
    from apache_beam.options import pipeline_options as po
    from apache_beam.runners.dask import dask_runner  # noqa: F401
    from dpsynth.pipelines.runners.dask import runner as ours  # noqa: F401
    parser = po._BeamArgumentParser(allow_abbrev=False)
    for cls in po.PipelineOptions.__subclasses__():
        if "_add_argparse_args" in cls.__dict__:
            cls._add_argparse_args(parser)
    names = {flag.lstrip("-").replace("-", "_"): action
             for action in parser._actions for flag in action.option_strings}
    missing = (set(runner_trust.OPERATOR_ONLY) - set(names)
               - set(runner_trust.FOR_OTHER_BEAM_VERSIONS))
    assert not missing, sorted(missing)
    for name in runner_trust.OPERATOR_ONLY:
        for flag in getattr(names.get(name), "option_strings", ()):
            assert runner_trust.operator_only(flag) == name, flag
    options = po.PipelineOptions(["--prism_loc=gs://b/prism"])
    assert options.get_all_options()["prism_location"] is None


def test_what_the_dataset_may_set_is_not_in_the_table(nightly):
    for name in (*runner_trust.DATASET_RUNNER_PARAMS, *nightly.DEFAULTS,
                 *nightly.EXTRA_ARGS_ALLOWED):
        assert runner_trust.operator_only(name) is None, name


# --------------------------------------------- the input bound to its id

@pytest.mark.parametrize("path, needle", [
    ("gs://private/other/*.npz", "is not under"),
    ("gs://private/patients-b/*.npz", "is not under"),
    ("gs://private/*.npz", "is not under"),
    ("s3://private/patients/x.npz", "is not under"),
    ("gs://private/patients/../other/*.npz", "'..'"),
    ("gs://private/patients/2026/../../other/*", "'..'"),
    ("", "is not under")])
def test_an_input_outside_the_pinned_prefix_is_refused(nightly, monkeypatch,
                                                       path, needle):
    _variables(nightly, monkeypatch, {"input": path})
    assert needle in _refused(nightly, {}, OPERATOR)


def test_a_dataset_id_the_operator_did_not_pin_is_refused(nightly,
                                                          monkeypatch):
    _variables(nightly, monkeypatch, {"input": INPUT})
    operator = {**OPERATOR, "inputs": {"other": "gs://private/patients/"}}
    assert "no input location for dataset 'patients'" in _refused(
        nightly, {}, operator)


def test_an_input_under_the_pinned_prefix_is_read(nightly, monkeypatch,
                                                  tmp_path):
    for path in (INPUT, "gs://private/patients/x.npz",
                 "gs://private/patients"):
        _variables(nightly, monkeypatch, {"input": path})
        assert nightly.settings({}, _env(**OPERATOR))["input"] == path
    # local: the folder's links resolved, so one cannot lead out of it
    pinned, other = tmp_path / "patients", tmp_path / "other"
    pinned.mkdir(), other.mkdir()
    os.symlink(other, pinned / "link")
    operator = {**OPERATOR, "inputs": {"patients": str(pinned) + "/"}}
    _variables(nightly, monkeypatch, {"input": str(pinned / "a" / "*.npz")})
    assert nightly.settings({}, _env(**operator))["input"]
    _variables(nightly, monkeypatch, {"input": str(pinned / "link/*.npz")})
    assert "is not under" in _refused(nightly, {}, operator)
    # the demo: pinned as "" by default
    _variables(nightly, monkeypatch, {})
    assert nightly.settings({}, {})["input"] == ""


# ------------------------------------------------------ the Variable's delta

@pytest.mark.parametrize("delta", [0.5, 1e-3, 1.5, 0, -1e-5, True, "1e-5"])
def test_a_large_or_bad_delta_from_the_variable_is_refused(nightly,
                                                          monkeypatch, delta):
    _variables(nightly, monkeypatch, {"input": INPUT, "delta": delta})
    message = _refused(nightly, {}, OPERATOR)
    assert message.startswith("Variable dpsynth_config: ") \
        and "delta" in message, message


def test_a_usual_delta_from_the_variable_is_taken(nightly, monkeypatch):
    _variables(nightly, monkeypatch, {"input": INPUT, "delta": 1e-6})
    assert nightly.settings({}, _env(**OPERATOR))["delta"] == 1e-6
    assert json.dumps(runner_trust.OPERATOR_ONLY)  # the table is plain data
