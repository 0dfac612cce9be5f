"""The nightly DAG's ``extra_args`` allowlist, without Airflow installed.

The DAG module imports Airflow at the top; here those imports are stubbed so
that its pure validation (``check_extra_args``, ``settings``) can be tested
in the main suite. tests/test_deploy_airflow_slow.py runs it in real Airflow.
"""

from __future__ import annotations

import importlib.util
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
    from dpsynth.pipelines import generate
    flags = {s[2:].replace("-", "_") for a in generate.parser()._actions
             for s in a.option_strings if s.startswith("--")}
    allowed = set(nightly.EXTRA_ARGS_ALLOWED)
    assert allowed <= flags, sorted(allowed - flags)
    assert not allowed & {"verbose", "record_timings", "show_row_counts",
                          "noise_seed", "allow_large_delta",
                          "bad_images_report", "input", "output", "run_id",
                          "budget_store", "dataset_id", "lifetime_epsilon",
                          "lifetime_delta", "epsilon", "delta"}
