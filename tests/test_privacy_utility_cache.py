"""benchmarks/privacy_utility.py: the per-cell cache is keyed by the protocol
(so a --train-rows subsample never reuses full-size cells, or the reverse),
and --no-new-runs renders what is cached without starting new runs."""

import json
import os

import numpy as np
import pytest

from benchmarks import privacy_utility as pu


def _write_data(d, n_train=60, n_test=20, dim=8):
    rng = np.random.default_rng(0)
    for name, n in (("train", n_train), ("test", n_test)):
        np.savez(os.path.join(d, f"{name}.npz"),
                 embeddings=rng.normal(size=(n, dim)).astype(np.float16),
                 labels=np.arange(n) % 3)


@pytest.fixture
def bench(tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    _write_data(str(data))
    monkeypatch.setattr(pu, "CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(pu, "RESULTS", str(tmp_path / "results"))
    monkeypatch.setattr(pu, "DATA", str(tmp_path / "data-out"))
    monkeypatch.setattr(pu, "plot", lambda *a, **k: None)
    calls = []

    def fake_method(name, epsilon, seed, setup):
        calls.append((name, epsilon, seed, len(setup.y_train)))
        return {"method": name, "display": name, "epsilon": epsilon,
                "seed": seed, "spent_epsilon": epsilon, "fit_s": 0.0,
                "eval_s": 0.0, "notes": [], "unaccounted": [],
                "mlp": 0.5, "logreg": len(setup.y_train) / 100}

    monkeypatch.setattr(pu, "run_method", fake_method)

    def run(*extra):
        pu.main(["--dataset", "cifar10", "--data-dir", str(data),
                 "--methods", "dpsgd-linear", "--epsilons", "1,2",
                 "--no-ceiling", "--tag", "t", *extra])
        out = tmp_path / "data-out" / "privacy_utility-cifar10-t.json"
        with open(out) as f:
            return json.load(f)
    return run, calls


def test_train_rows_never_reuse_full_size_cells(bench):
    run, calls = bench
    full = run("--seeds", "1")
    assert [c[3] for c in calls] == [60, 60]
    sub = run("--seeds", "1", "--train-rows", "30")
    assert [c[3] for c in calls] == [60, 60, 30, 30]  # recomputed, not reused
    assert {r["logreg"] for r in full["records"]} == {0.6}
    assert {r["logreg"] for r in sub["records"]} == {0.3}
    again = run("--seeds", "1")  # full size again: all from its own cache
    assert len(calls) == 4 and again["records"] == full["records"]


def test_no_new_runs_renders_cached_cells_and_lists_the_rest(bench, tmp_path):
    run, calls = bench
    run("--seeds", "1")
    out = run("--seeds", "2", "--no-new-runs")
    assert len(calls) == 2  # nothing new ran
    assert [(r["epsilon"], r["seed"]) for r in out["records"]] == [(1.0, 0),
                                                                    (2.0, 0)]
    assert out["info"]["not_run"] == ["dpsgd-linear eps=1 seed=1",
                                      "dpsgd-linear eps=2 seed=1"]
    md = (tmp_path / "results" / "privacy_utility-cifar10-t.md").read_text()
    assert "**Cells not run** (2;" in md and "60.0" in md
