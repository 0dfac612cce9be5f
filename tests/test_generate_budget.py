"""`dpsynth generate` with the lifetime budget store."""

import json

import numpy as np

from dpsynth.pipelines import cli
from dpsynth.pipelines.budget import store as budget_store
from tests.conftest import gmm_data


def _run(tmp_path, out, *extra):
    return cli.main(["generate", "--input", str(tmp_path / "in.npz"),
                     "--output", str(tmp_path / out), "--num-classes", "2",
                     "--epsilon", "1", "--budget-store", str(tmp_path / "b"),
                     "--dataset-id", "patients", "--lifetime-epsilon", "1.3",
                     *extra])


def test_lifetime_cap_refuses_the_release_that_would_exceed_it(tmp_path, capsys):
    x, y = gmm_data(400, d=4, classes=2)
    np.savez(tmp_path / "in.npz", embeddings=x, labels=y)
    assert _run(tmp_path, "r1", "--run-id", "2026-11-24") == 0
    manifest = json.loads((tmp_path / "r1" / "_manifest.json").read_text())
    assert manifest["lifetime_budget"] == {
        "store": str(tmp_path / "b"), "dataset_id": "patients",
        "lifetime_cap": {"epsilon": 1.3, "delta": 1e-5}}
    assert budget_store.lifetime_spent(str(tmp_path / "b"), "patients",
                                       1e-5) <= 1.0 + 1e-9
    capsys.readouterr()
    assert _run(tmp_path, "r2", "--run-id", "2026-11-25") == 2
    assert "lifetime" in capsys.readouterr().err
    assert not (tmp_path / "r2").exists()
    entries = budget_store.history(str(tmp_path / "b"), "patients")
    assert [e["run_id"] for e in entries] == ["2026-11-24"]
    assert entries[0]["status"] == "published"


def test_rerun_of_a_published_run_id_spends_nothing(tmp_path):
    x, y = gmm_data(400, d=4, classes=2)
    np.savez(tmp_path / "in.npz", embeddings=x, labels=y)
    assert _run(tmp_path, "r1", "--run-id", "nightly-1") == 0
    before = (tmp_path / "r1" / "_manifest.json").read_bytes()
    assert _run(tmp_path, "r1", "--run-id", "nightly-1") == 0
    assert (tmp_path / "r1" / "_manifest.json").read_bytes() == before
    assert len(budget_store.history(str(tmp_path / "b"), "patients")) == 1


def test_budget_flags_go_together(tmp_path, capsys):
    assert cli.main(["generate", "--output", str(tmp_path / "r"),
                     "--budget-store", str(tmp_path / "b")]) == 2
    assert "--dataset-id" in capsys.readouterr().err
