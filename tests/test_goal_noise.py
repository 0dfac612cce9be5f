"""benchmarks/studies/goal_noise.py (issue 61): the winner's curse of
comparing one structure's mean with the largest of four noisy means."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.studies import goal_noise


def test_a_clear_winner_costs_the_oracle_nothing():
    runs = np.array([[80.0, 80.2, 79.8], [70.0, 70.2, 69.8],
                     [60.0, 60.2, 59.8], [50.0, 50.2, 49.8]])
    sd, gap, miss = goal_noise.oracle_gaps(runs, np.random.default_rng(0))
    assert sd == pytest.approx(0.2)
    assert gap == pytest.approx(0.0, abs=1e-6) and miss == 0.0


def test_four_equal_structures_put_the_oracle_below_the_best():
    """Four structures of one true accuracy: the largest of four fresh
    means exceeds any one of them by E[max of 4 standard normals] ~ 1.03
    standard errors."""
    runs = np.tile([70.0, 71.0, 69.0], (4, 1))
    sd, gap, _ = goal_noise.oracle_gaps(runs, np.random.default_rng(0))
    assert sd == pytest.approx(1.0)
    assert gap == pytest.approx(-1.029 / np.sqrt(3), abs=0.02)


def test_cells_need_every_structure_on_the_same_three_seeds():
    recs = [{"shape": "20news", "mode": m, "epsilon": 4.0, "seed": s,
             "accuracy": 0.7} for m in goal_noise.MENU for s in (0, 1, 2)]
    assert list(goal_noise.menu_cells(recs)) == [("20news", 4.0)]
    assert goal_noise.menu_cells(recs[1:]) == {}  # shared lacks seed 0
