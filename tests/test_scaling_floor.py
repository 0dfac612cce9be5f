"""benchmarks/scaling.py's issue 15 floor helpers (pure functions)."""

import numpy as np

from benchmarks import scaling


def test_timed_moments_sums_every_block_in_float32():
    rng = np.random.default_rng(0)
    blocks = [(rng.standard_normal((n, 5)), np.zeros(n, np.int64), 0)
              for n in (7, 1, 12)]
    got = scaling.timed_moments(iter(blocks))
    x = np.vstack([b[0] for b in blocks]).astype(np.float32)
    assert got["rows"] == 20
    assert got["sum"].dtype == got["gram"].dtype == np.float32
    np.testing.assert_allclose(got["sum"], x.sum(axis=0), rtol=1e-5)
    np.testing.assert_allclose(got["gram"], x.T @ x, rtol=1e-4, atol=1e-5)
    assert got["read_s"] >= 0 and got["compute_s"] >= 0


def test_timed_moments_of_no_blocks():
    got = scaling.timed_moments(iter([]))
    assert got["rows"] == 0 and got["sum"] is None


def test_floor_is_passes_times_read_plus_compute():
    assert scaling.floor_seconds(3, 2.0, 0.5) == 7.5


def test_floor_row_ratios_use_the_beam_runs_passes():
    ok = {"rc": 0}
    runs = {"direct2-reread": {**ok, "wall_s": 30.0,
                               "passes": ["Counts", "Moments"]},
            "reference": {**ok, "wall_s": 20.0},
            "floor": {**ok, "wall_s": 9.0, "read_s": 4.0, "compute_s": 1.0}}
    row = scaling.floor_row(runs)
    assert row["floor"] == 10.0
    assert row["beam_ref"] == "1.50" and row["beam_floor"] == "3.00"


def test_floor_row_without_a_beam_run_has_no_floor():
    row = scaling.floor_row({"floor": {"rc": 0, "wall_s": 1.0,
                                       "read_s": 1.0, "compute_s": 0.1}})
    assert row["floor"] is None and row["beam_floor"] == "-"


def test_vote_nn_flops_counts_rows_times_capped_candidates_times_d():
    # 1M rows, 10 classes of 100k, 6 candidates a row capped at 10k a class
    assert scaling.vote_nn_flops(10**6, 384, 6.0, 10_000) == \
        2.0 * 10**6 * 10_000 * 384
    assert scaling.vote_nn_flops(1000, 8, 6.0, None) == 2.0 * 1000 * 600 * 8


def test_vote_floor_adds_the_nn_arithmetic_to_the_issue_floor():
    ok = {"rc": 0}
    runs = {"direct2-reread": {**ok, "wall_s": 60.0,
                               "passes": ["Counts", "Moments", "Votes"]},
            "floor": {**ok, "wall_s": 9.0, "read_s": 4.0, "compute_s": 1.0,
                      "vote_nn_s": 15.0}}
    row = scaling.floor_row(runs)
    assert row["floor"] == 15.0 and row["beam_floor"] == "4.00"
    assert row["beam_floor_nn"] == "2.00"
    no_vote = scaling.floor_row({**runs, "floor": {**runs["floor"],
                                                   "vote_nn_s": None}})
    assert no_vote["beam_floor_nn"] == "-"


def test_sgemm_rate_is_a_positive_flop_rate():
    assert scaling.sgemm_rate(16, repeats=1) > 1e6


def test_output_floor_times_the_release_rows():
    doc = scaling.output_floor(2000, 16)
    assert doc["output_s"] > 0


def test_floor_row_adds_the_output_to_the_floor():
    ok = {"rc": 0}
    runs = {"direct2-reread": {**ok, "wall_s": 30.0,
                               "passes": ["Counts", "Moments"]},
            "floor": {**ok, "wall_s": 9.0, "read_s": 4.0, "compute_s": 1.0,
                      "output_s": 5.0}}
    row = scaling.floor_row(runs)
    assert row["beam_floor"] == "3.00" and row["beam_floor_out"] == "2.00"


def test_fixed_cost_is_the_intercept_through_the_two_largest_sizes():
    ok = {"rc": 0}

    def runs(n, wall):
        base = {"config": "default", "d": 8, "n": n, "flags": ""}
        return [{**base, **ok, "mode": "direct2-reread", "wall_s": wall,
                 "passes": ["Counts", "Moments"]},
                {**base, **ok, "mode": "floor", "wall_s": 1.0,
                 "read_s": n / 1e6, "compute_s": n / 1e6, "output_s": 0.0}]
    # wall = 8 + 10 s per million rows: fixed 8, per-row part 10 at 1M
    lines = scaling.fixed_cost_lines(runs(10**5, 9.0) + runs(10**6, 18.0))
    row = lines[-1].split(" | ")
    assert row[2:6] == ["8.0", "10.0", "4.0", "2.50"]
    assert scaling.fixed_cost_lines(runs(10**6, 18.0)) == []
