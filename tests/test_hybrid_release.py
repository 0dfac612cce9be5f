"""benchmarks/studies/hybrid_release.py (issue 61): a global matrix and the
class matrices from one release, post-processed into each menu branch."""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import pytest

from benchmarks.studies import class_deviations
from benchmarks.studies import covariance_sweep as sweep
from benchmarks.studies import hybrid_release as hybrid
from dpsynth.dp_ops import adaptive, covariance, plan


def test_the_noise_is_the_isometric_upper_triangle_mechanisms():
    """Each entry of upper(E) (what the mechanism adds noise to) has std
    sigma, the entries are uncorrelated and E is symmetric."""
    rng = np.random.default_rng(0)
    draws = np.stack([covariance.upper(hybrid.symmetric_noise(6, 2.0, rng))
                      for _ in range(20000)])
    assert np.allclose(draws.std(axis=0), 2.0, rtol=0.03)
    corr = np.corrcoef(draws.T) - np.eye(draws.shape[1])
    assert np.abs(corr).max() < 0.04
    e = hybrid.symmetric_noise(5, 1.0, rng)
    assert np.array_equal(e, e.T)


def test_a_block_of_the_class_matrix_has_the_subspace_modes_noise():
    """P^T E P for an orthonormal [d, r] basis P is distributed as an
    r x r release of the same sigma: the subspace branch at share 0.5 is
    the subspace mode's release in distribution."""
    rng = np.random.default_rng(1)
    p = np.linalg.qr(rng.standard_normal((12, 3)))[0]
    blocks = np.stack([covariance.upper(p.T @ hybrid.symmetric_noise(
        12, 1.5, rng) @ p) for _ in range(20000)])
    assert np.allclose(blocks.std(axis=0), 1.5, rtol=0.03)


def test_the_branches_come_from_one_release_at_the_split_sigmas():
    split = sweep.simulate(sweep.Shape("tiny", 3, 200, 8, "own"))
    rel = hybrid.release(split, 4.0, 0, 0.5)
    assert rel.sigma_global == pytest.approx(rel.sigma_class)
    quarter = hybrid.release(split, 4.0, 0, 0.25)
    assert quarter.sigma_global == pytest.approx(
        rel.sigma_global * math.sqrt(2.0))
    assert quarter.sigma_class == pytest.approx(
        rel.sigma_class * math.sqrt(0.5 / 0.75))
    for branch in hybrid.BRANCHES:
        mixes = hybrid.branch_mixtures(rel, branch)
        assert sorted(mixes) == [0, 1, 2]
    shared = hybrid.branch_mixtures(rel, "shared")
    assert np.array_equal(shared[0].factors, shared[1].factors)
    raw = hybrid.branch_mixtures(rel, "raw")
    assert not np.array_equal(raw[0].factors, raw[1].factors)
    assert np.isfinite(hybrid.excess(rel))
    # At share 0.5 both sigmas are the subspace mode's (its global matrix
    # and its class blocks share the covariance part equally).
    rc = adaptive.RuleConstants(force_mode="subspace")
    mu = adaptive.calibrate_mu(rel.cfg, 8, rc)
    sub = adaptive.choose_structure(4.0, rel.cfg.delta, 8, rel.noisy_n, rc,
                                    mu)
    sigmas = {m.name: m.sigma for m in adaptive.mechanisms(rel.cfg, sub, mu)}
    assert sigmas[plan.COVARIANCE] == pytest.approx(rel.sigma_global)
    assert sigmas[adaptive.class_matrix_name(0)] == pytest.approx(
        rel.sigma_class)
    with pytest.raises(ValueError, match="share"):
        hybrid.release(split, 4.0, 0, 1.0)


def test_a_cell_needs_every_branch_on_three_seeds():
    recs = [{"shape": "20news", "epsilon": 4.0, "seed": s, "share": 0.5,
             "branch": b, "accuracy": 0.7, "excess": 0.01}
            for b in hybrid.BRANCHES for s in (0, 1, 2)]
    cells = hybrid.hybrid_cells(recs, 0.5)
    assert list(cells) == [("20news", 4.0)]
    assert cells[("20news", 4.0)][0]["raw"] == pytest.approx(70.0)
    assert hybrid.hybrid_cells(recs[1:], 0.5) == {}
    assert hybrid.hybrid_cells(recs, 0.25) == {}


def test_the_threshold_selector_is_fitted_on_the_cells():
    cells = {("a", 1.0): ({"raw": 70.0, "subspace": 72.0}, 0.01),
             ("b", 1.0): ({"raw": 80.0, "subspace": 78.0}, 0.10)}
    best = {("a", 1.0): 72.0, ("b", 1.0): 80.0}
    assert hybrid.best_threshold(cells, best) == (0.10, 0.0, 0.0)
    cells[("b", 1.0)] = ({"raw": 80.0, "subspace": 78.0}, 0.001)
    t, mean_gap, worst = hybrid.best_threshold(cells, best)
    assert mean_gap == pytest.approx(-1.0) and worst == pytest.approx(-2.0)
    assert hybrid.best_threshold({}, {}) is None


def test_subspace_branches_of_other_ranks_are_reported_apart():
    recs = [{"shape": "s", "epsilon": 8.0, "seed": seed, "share": 0.5,
             "branch": b, "accuracy": 0.5, "excess": 0.1}
            for b in hybrid.BRANCHES + ("subspace@256",) for seed in (0, 1, 2)]
    assert list(hybrid.hybrid_cells(recs, 0.5)) == [("s", 8.0)]
    assert hybrid.rank_rows(recs, 0.5) == ["| s | 8 | 256: 50.00 |"]
    split = sweep.simulate(sweep.Shape("tiny", 2, 200, 8, "own"))
    rel = hybrid.release(split, 4.0, 0, 0.5)
    full = hybrid.branch_mixtures(rel, "subspace@99")  # capped at d
    assert full[0].factors.shape[1] >= 8 - 1


@functools.lru_cache(maxsize=1)
def _tiny_release() -> hybrid.Release:
    split = sweep.simulate(sweep.Shape("tiny", 2, 200, 8, "own"))
    return hybrid.release(split, 4.0, 0, 0.5)


def _known_release(deviation: np.ndarray, sigma: float, n: float,
                   rng: np.random.Generator) -> hybrid.Release:
    """A release around a noiseless W = diag(d .. 1) and one class whose
    covariance is W + deviation, released with noise of std sigma / n."""
    rel = _tiny_release()
    d = deviation.shape[0]
    w = np.diag(np.arange(d, 0, -1, dtype=float))
    c = w + deviation + hybrid.symmetric_noise(d, sigma, rng) / n
    return dataclasses.replace(rel, within=w, classes=[c], n=np.array([n]),
                               sigma_class=sigma)


def test_the_rank_gain_is_unbiased_for_the_frobenius_gain():
    """With W known, E[A_ij^2 - 2 v_ij] = D_ij^2 - v_ij: the true drop in
    squared error from using the class's own entry instead of W's."""
    d, sigma, n = 6, 3.0, 10.0
    dev = np.zeros((d, d))
    dev[:2, :2] = [[0.8, 0.3], [0.3, -0.5]]
    v = np.full((d, d), sigma ** 2 / (2 * n ** 2))
    v[np.diag_indices(d)] *= 2
    truth = np.concatenate([[0.0], np.diagonal(np.cumsum(np.cumsum(
        dev ** 2 - v, 0), 1))])
    rng = np.random.default_rng(5)
    gains = np.mean([hybrid.rank_gains(_known_release(dev, sigma, n, rng))[0]
                     for _ in range(4000)], axis=0)
    assert np.allclose(gains, truth, atol=0.02)
    assert int(np.argmax(truth)) == 2


def test_the_risk_rank_keeps_what_rises_above_the_noise():
    rng = np.random.default_rng(6)
    dev = np.zeros((8, 8))
    dev[:3, :3] = np.diag([4.0, -3.0, 2.5])
    rel = _known_release(dev, 1.0, 20.0, rng)
    assert hybrid.chosen_ranks(rel, "risk") == [3]
    assert hybrid.chosen_ranks(rel, "riskc") == [3]
    assert hybrid.branch_ranks(rel, "subspace@risk") == [3]
    assert hybrid.branch_ranks(rel, "subspace@5") == [5]
    # No deviation: every expected gain is negative, so the (noisy) argmax
    # stays at rank 0 in most releases.
    picks = [hybrid.chosen_ranks(_known_release(np.zeros((8, 8)), 1.0, 20.0,
                                                rng), "risk")[0]
             for _ in range(50)]
    assert np.median(picks) == 0
    mixes = hybrid.branch_mixtures(rel, "subspace@risk")
    assert sorted(mixes) == [0]
    recs = [{"shape": "s", "epsilon": 8.0, "seed": seed, "share": 0.5,
             "branch": "subspace@risk", "accuracy": 0.5, "excess": 0.1,
             "ranks": [3]} for seed in (0, 1, 2)]
    assert hybrid.rank_rows(recs, 0.5) == []
    assert hybrid.risk_rows(recs, 0.5) == [
        "| s | 8 | subspace@risk: 50.00 (median rank 3) |"]


def test_the_pooled_bulk_branches_fall_back_to_each_side():
    """Edge 0: every direction is the class's own; an edge above every
    eigenvalue: the pooled matrix everywhere."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((6, 6))
    b = rng.standard_normal((6, 6))
    within, pooled = a @ a.T + np.eye(6), b @ b.T + np.eye(6)
    for post in (hybrid.spiked_pooled, hybrid.pooled_rank):
        assert np.allclose(post(within, pooled, 0.0), within)
        assert np.allclose(post(within, pooled, 1e6), pooled)
    mid = hybrid.spiked_pooled(within, pooled, np.linalg.eigvalsh(within)[3])
    assert np.allclose(mid, mid.T)
    rel = _tiny_release()
    for branch in ("spiked+pooled", "rank+pooled"):
        assert sorted(hybrid.branch_mixtures(rel, branch)) == [0, 1]


def test_a_union_draws_half_its_rows_from_each_branch():
    rel = _tiny_release()
    plain = hybrid.synthetic_rows(rel, "shared")
    union = hybrid.synthetic_rows(rel, "union:shared+raw")
    for p, u in zip(plain, union):
        assert abs(len(p) - len(u)) <= 1
        assert not np.array_equal(p[:len(p) // 2], u[:len(p) // 2])
    assert hybrid.branch_list("", "union:shared+raw,raw") == (
        "union:shared+raw", "raw")
    assert hybrid.branch_list("64,risk", "") == ("subspace@64",
                                                 "subspace@risk")
    assert hybrid.branch_list("", "") == hybrid.BRANCHES


def test_every_branch_is_summarised_against_the_best_menu_structure():
    recs = [{"shape": "s", "epsilon": e, "seed": seed, "share": 0.5,
             "branch": b, "accuracy": acc, "excess": 0.1}
            for b, acc in (("subspace@64", 0.70), ("raw", 0.69))
            for e in (4.0, 8.0) for seed in (0, 1, 2)]
    best = {("s", 4.0): 70.0, ("s", 8.0): 69.5}
    gaps = hybrid.branch_gaps(recs, 0.5, best)
    assert gaps["raw"] == pytest.approx({("s", 4.0): -1.0, ("s", 8.0): -0.5})
    assert hybrid.gap_rows(recs, 0.5, best) == [
        "| 0.5 | raw | 2 | -0.75 | -1.00 | 0 |",
        "| 0.5 | subspace@64 | 2 | +0.25 | +0.00 | 2 |"]
    assert hybrid.gap_rows(recs, 0.25, best) == []


def test_a_held_out_pick_never_sees_its_own_set():
    # Set "a" alone favours option X (its own noise); the other set of the
    # same d favours Y, and a set of another d (which must be ignored)
    # favours X strongly. The pick for "a" is Y, scored on a's own means.
    x, y = (0.9, "shared"), (0.5, "subspace@64")
    cells = {("a", 1.0): {x: 71.0, y: 70.0},
             ("b", 1.0): {x: 60.0, y: 61.0},
             ("c", 1.0): {x: 90.0, y: 80.0}}
    best = {k: 70.0 for k in cells}
    dims = {"a": 384, "b": 384, "c": 1280}
    assert hybrid.held_out_pick(cells, best, dims, ("a", 1.0)) == y
    assert hybrid.held_out_pick(cells, best, dims, ("c", 1.0)) is None
    recs = [{"shape": s, "epsilon": 1.0, "seed": seed, "share": a,
             "branch": b, "accuracy": acc / 100}
            for (s, _), by in cells.items() for (a, b), acc in by.items()
            for seed in (0, 1, 2)]
    rows = hybrid.family_rows(recs, best, dims)
    assert rows[0] == "| a | 1 | 2 | 0.9 / shared | +1.00 | 0.5 / subspace@64 | +0.00 |"
    assert rows[2] == "| c | 1 | 2 | 0.9 / shared | +20.00 | - | - |"
    assert rows[-1].startswith("| leave-one-set-out pick on (d, eps) | | 2 cells")


def test_fresh_seeds_score_what_the_fit_seeds_picked(monkeypatch):
    # Per-class is best on seeds 0-2 but shared on 3-5; rank 512 looks
    # best on seeds 0-2 only, rank 256 holds on 3-5.
    menu = {m: 70.0 for m in hybrid.goal_noise.MENU}
    menu["per-class"] = 71.0
    sweep_recs = [{"shape": "s", "mode": m, "epsilon": 8.0, "seed": seed,
                   "accuracy": (acc + (seed >= 3) * (m == "shared") * 2)
                   / 100} for m, acc in menu.items() for seed in range(6)]
    hyb = [{"shape": "s", "epsilon": 8.0, "seed": seed, "share": 0.5,
            "branch": f"subspace@{r}",
            "accuracy": (72.0 if (r == 512) == (seed < 3) else 70.5) / 100}
           for r in (256, 512) for seed in range(6)]
    hyb += [{"shape": "s", "epsilon": 8.0, "seed": seed, "share": 0.5,
             "branch": "subspace@risk", "accuracy": 0.99} for seed in range(6)]
    # Seeds 3-5 of the menu live in the sweep's fresh log.
    logs = {hybrid.LOG: hyb,
            None: [r for r in sweep_recs if r["seed"] < 3],
            hybrid.sweep.FRESH_LOG: [r for r in sweep_recs if r["seed"] >= 3]}
    monkeypatch.setattr(hybrid.sweep, "load_log",
                        lambda path=None: logs[path])
    # The default: the rule's pick on each seed (here spiked on seed 4).
    monkeypatch.setattr(hybrid.sweep, "rule_mode", lambda r: (
        "per-class+spiked" if r["seed"] == 4 else "shared"))
    rows = hybrid.confirm_rows(["s", "absent"], (3, 4, 5))
    assert rows[0] == ("| s | 8 | 2 | shared 72.00 | -0.67 | "
                       "per-class: -1.00 | 0.5/subspace@512: +1.00 / -1.50 |")
    assert rows[1].endswith("| mean -0.67, worst -0.67, within 0.3: 0 |")
    assert rows[2].endswith("| mean -1.00, worst -1.00, within 0.3: 0 |")
    assert rows[3].endswith("| mean -1.50, worst -1.50, within 0.3: 0 |")
    assert len(rows) == 4


def test_the_js_block_keeps_a_real_deviation_and_drops_pure_noise():
    """js_weight's v is the noise energy of an r x r block at the class
    sigma and count: a deviation that is only that noise gets lambda
    near 1 (the shared block), one far above it near 0 (the class's own
    block)."""
    rng = np.random.default_rng(3)
    r, sigma, n = 20, 50.0, 400.0
    noise = [hybrid.symmetric_noise(r, sigma, rng) / n for _ in range(200)]
    weights = [hybrid.js_weight(e, sigma, n) for e in noise]
    assert min(weights) > 0.8
    signal = np.diag(np.linspace(4.0, 0.4, r))  # energy ~36 v
    v = class_deviations.noise_energy(sigma, n, r)
    lam = hybrid.js_weight(signal + noise[0], sigma, n)
    assert lam == pytest.approx(v / np.sum((signal + noise[0]) ** 2))
    assert lam < 0.05
    shared = np.linspace(2.0, 1.0, r)
    block = np.diag(shared) + signal + noise[0]
    out = hybrid.js_block(block, shared, sigma, n)
    assert np.allclose(out, np.diag(shared) + (1 - lam) * (signal + noise[0]))
