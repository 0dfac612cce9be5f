"""Issue 58 item 9: huge and tiny numbers in numeric flags end in one line,
before any data is read, never in a traceback (``--epsilon 1e300`` ended in
an OverflowError; ``--variance-floor 1e300`` published rows of NaN;
``--seed -1`` and ``--num-classes 1e20`` failed with tracebacks, the first
after reading the data; ``--samples-per-class 1e20`` ran out of memory)."""

from __future__ import annotations

import math
import os

import pytest

from dpsynth.dp_ops import calibration
from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.pipelines import cli
from dpsynth.pipelines.release import protocol
from dpsynth.pipelines.budget import store as budget_store

BIG = "100000000000000000000"  # 1e20 as an integer

CASES = [
    (["--epsilon", "1e300"], "--epsilon"),
    (["--epsilon", "1e400"], "--epsilon"),  # not read as inf
    (["--epsilon", "1001"], "--epsilon"),
    (["--epsilon", "1e-400"], "--epsilon"),  # 0.0
    (["--epsilon", "nan"], "--epsilon"),
    (["--delta", "1e-400"], "--delta"),
    (["--delta", "1e300"], "--delta"),
    (["--clip-norm", "1e300"], "--clip-norm"),
    (["--clip-norm", "1e-320"], "--clip-norm"),
    (["--variance-floor", "1e300"], "--variance-floor"),
    (["--variance-floor", "1e-400"], "--variance-floor"),
    (["--vote-filter", "--vote-oversample", "1e300"], "--vote-oversample"),
    (["--vote-filter", "--vote-threshold", "inf"], "--vote-threshold"),
    (["--branch-threshold", "inf", "--clusters", "2"], "--branch-threshold"),
    (["--seed", "-1"], "--seed"),
    (["--num-classes", BIG], "--num-classes"),
    (["--samples-per-class", BIG], "--samples-per-class"),
    (["--lifetime-epsilon", "1e400", "--budget-store", "STORE",
      "--dataset-id", "d"], "--lifetime-epsilon"),
    (["--lifetime-delta", "1e-400", "--budget-store", "STORE",
      "--dataset-id", "d", "--lifetime-epsilon", "3"], "--lifetime-delta"),
]


@pytest.mark.parametrize("flags,needle", CASES,
                         ids=[" ".join(c[0]) for c in CASES])
def test_a_huge_or_tiny_number_is_one_line_before_any_data(
        flags, needle, tmp_path, monkeypatch, capsys):
    store = tmp_path / "store"
    flags = [str(store) if f == "STORE" else f for f in flags]
    out = tmp_path / "out"
    steps = []
    monkeypatch.setattr(protocol, "checkpoint", steps.append)
    try:
        code = cli.main(["generate", "--output", str(out), *flags])
    except SystemExit as stop:  # argparse's own errors
        code = stop.code
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    assert needle in err and "Traceback" not in err, err
    assert steps == []  # no attempt started: nothing read
    assert not out.exists() and not store.exists()
    assert not [p for p in os.listdir(tmp_path) if ".staging-" in p]


def test_the_api_raises_a_value_error_naming_the_flag():
    from dpsynth.dp_ops.config import parse_epsilon
    for kwargs, needle in (({"epsilon": 1e300}, "--epsilon"),
                           ({"epsilon": math.nan}, "--epsilon"),
                           ({"clip_norm": 1e300}, "--clip-norm"),
                           ({"variance_floor": 1e300}, "--variance-floor"),
                           ({"vote_oversample": 1e300}, "--vote-oversample"),
                           ({"seed": -1}, "--seed"),
                           ({"samples_per_class": 10**20},
                            "--samples-per-class")):
        with pytest.raises(ValueError, match=needle) as err:
            GeneratorConfig(labels=(0, 1), **kwargs)
        assert type(err.value) is ValueError
    assert GeneratorConfig(labels=(0,), epsilon=math.inf).noiseless
    assert GeneratorConfig(labels=(0,), epsilon=1000.0).epsilon == 1000.0
    assert parse_epsilon("inf") == parse_epsilon("Infinity") == math.inf
    with pytest.raises(ValueError, match="too large for a float"):
        parse_epsilon("1e400")


def test_calibration_takes_a_huge_epsilon_without_overflow():
    """exp(epsilon) overflowed past ~709; the delta is computed in logs
    there (the API's bound is 1000, the math has none)."""
    for eps in (709.0, 710.0, 1000.0, 1e300):
        for mu in (0.5, 30.0, 1e3):
            delta = calibration.gdp_delta(mu, eps)
            assert 0.0 <= delta <= 1.0 and not math.isnan(delta)
    # Below 700 the formula is unchanged (releases keep their sigmas).
    assert calibration.gdp_delta(1.0, 1.0) == pytest.approx(0.12693674,
                                                            rel=1e-6)
    assert calibration.gdp_mu(1000.0, 1e-5) > calibration.gdp_mu(100.0, 1e-5)


def test_budget_check_epsilon_is_one_line(tmp_path, capsys):
    store = str(tmp_path / "b")
    for value in ("1e300", "1e400"):
        with pytest.raises(SystemExit) as stop:
            budget_store.main(["check", "--budget-store", store,
                               "--dataset-id", "d", "--epsilon", value,
                               "--num-classes", "2"])
        err = capsys.readouterr().err.strip()
        assert stop.value.code == 2 and "Traceback" not in err
        assert "error: argument --epsilon" in err.splitlines()[-1]  # usage
        # before it, as argparse says every flag error
    assert not os.path.exists(store)
