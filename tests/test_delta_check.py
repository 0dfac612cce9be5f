"""dpsynth.dp_ops.config.check_delta: delta must be far below 1/n; large values are refused unless forced."""

import math

import pytest

from dpsynth.dp_ops.config import MAX_DELTA, check_delta


@pytest.mark.parametrize("delta", [1e-5, 1e-9, MAX_DELTA])
def test_small_delta_passes(delta):
    assert check_delta(delta) == delta


@pytest.mark.parametrize("delta", [0.5, 0.01, 1e-3, 2 * MAX_DELTA])
def test_large_delta_is_refused_unless_forced(delta):
    with pytest.raises(ValueError, match=r"--delta .* larger than 0\.0001.*--allow-large-delta"):
        check_delta(delta)
    assert check_delta(delta, allow_large=True) == delta


@pytest.mark.parametrize("delta", [0.0, 1.0, 2.0, -1e-5, math.nan])
def test_delta_outside_the_open_unit_interval_is_refused_even_when_forced(delta):
    with pytest.raises(ValueError, match=r"--delta must be in \(0, 1\)"):
        check_delta(delta, allow_large=True)
