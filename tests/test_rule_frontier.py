"""benchmarks/studies/rule_frontier.py (issue 61): every threshold rule on
the grid scored on fresh seeds and on the simulated shapes."""

from __future__ import annotations

from benchmarks.studies import rule_frontier as frontier

# d = 64, two classes of 100 rows, mu = 1: s = 100 / 64^1.5 = 0.195, so
# the current rule picks shared (s < 1.35; 100 rows < 3 d for the
# spiked band) and a rule with subspace from s = 0.1 picks the subspace.
ACC = {"20news": {"shared": 0.78, "subspace": 0.80, "per-class": 0.70,
                  "per-class+spiked": 0.72},
       "k2-n100-d64-class": {"shared": 0.75, "subspace": 0.70,
                             "per-class": 0.60, "per-class+spiked": 0.65}}


def runs(seeds) -> list[dict]:
    return [{"shape": shape, "mode": mode, "epsilon": 4.0, "seed": seed,
             "accuracy": acc, "d": 64, "noisy_counts": [100.0, 100.0],
             "mu": 1.0}
            for shape, modes in ACC.items() for mode, acc in modes.items()
            for seed in seeds]


def test_a_lower_subspace_threshold_trades_the_simulated_shape():
    main = frontier.menu_cells(runs((0, 1, 2)))
    fresh = frontier.menu_cells([r for r in runs((3, 4, 5))
                                 if frontier.fitting(r["shape"])])
    now = frontier.score(frontier.current(), main, fresh)
    low = frontier.score(dict(frontier.current(), subspace_min_signal=0.1),
                         main, fresh)
    assert round(now["fresh_mean"], 6) == -2.0 and now["sim_mean"] == 0.0
    assert low["fresh_mean"] == 0.0 and round(low["sim_mean"], 6) == -5.0
    assert (now["sim_misses"], low["sim_misses"]) == (0, 1)
    kept = frontier.frontier([now, low])
    assert kept == [low, now]  # neither beats the other on both means


def test_a_seed_without_every_menu_structure_is_left_out():
    some = [r for r in runs((0, 1)) if not (r["seed"] == 1
                                             and r["mode"] == "subspace")]
    cells = frontier.menu_cells(some)
    assert all(sorted(by) == [0] for by in cells.values())


def test_the_report_marks_the_current_rule_and_counts_the_grid():
    text = frontier.report(runs((0, 1, 2)), [r for r in runs((3, 4, 5))
                                              if frontier.fitting(r["shape"])])
    assert "| * 1.35 | 0.6 | 3 |" in text
    assert f"{len(frontier.grid())} rules on the grid" in text
