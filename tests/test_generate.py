"""End-to-end runs of `dpsynth generate` (DirectRunner, in process)."""

import json
import os

import numpy as np
import pytest

from dpsynth.dp_ops import plan
from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.pipelines import cli
from dpsynth.pipelines.release.reading import load_gmm, load_release
from tests.conftest import (assert_release_matches_reference, gmm_data,
                            release_dir)


def _run(*argv):
    return cli.main(["generate", *map(str, argv)])


def test_demo_runs_with_no_input_and_prints_utility(tmp_path, capsys):
    out = tmp_path / "release"
    assert _run("--output", out) == 0
    printed = capsys.readouterr().out
    assert f"release: {out}" in printed
    assert "trained on real" in printed and "trained on synthetic" in printed
    manifest = json.loads((out / "_manifest.json").read_text())
    spent = manifest["privacy"]["spent"]["epsilon"]
    assert 0.9 * 4.0 <= spent <= 4.0
    assert manifest["noise"].startswith("secure")
    # per class: count and sum; globally: the centre's sum and count and
    # the shared second-moment matrix
    assert len(manifest["privacy"]["mechanisms"]) == 10 * 2 + 3
    for m in manifest["privacy"]["mechanisms"]:
        assert m["sigma"] > 0 and m["sensitivity"] > 0
    assert not [p for p in os.listdir(tmp_path) if "staging" in p]


def test_release_reads_back_with_tf_data(tmp_path):
    import tensorflow as tf
    x, y = gmm_data(900, d=12, classes=3)
    np.savez(tmp_path / "in.npz", embeddings=x, labels=y)
    out = tmp_path / "rel"
    assert _run("--input", tmp_path / "in.npz", "--output", out,
                "--num-classes", 3, "--epsilon", 2, "--clusters", 3,
                "--noise-seed", 1, "--rows-per-shard", 100) == 0
    files = sorted(str(p) for p in (release_dir(out) / "data").glob("*.tfrecord"))
    feats = {"embedding": tf.io.FixedLenFeature([12], tf.float32),
             "label": tf.io.FixedLenFeature([], tf.int64)}
    ds = tf.data.TFRecordDataset(files).map(
        lambda r: tf.io.parse_single_example(r, feats))
    rows = list(ds.as_numpy_iterator())
    manifest = json.loads((out / "_manifest.json").read_text())
    assert len(rows) == manifest["samples_total"] > 0
    assert {int(r["label"]) for r in rows} == {0, 1, 2}
    assert all(np.linalg.norm(r["embedding"]) <= 1.0 + 1e-5 for r in rows)


def test_beam_pipeline_matches_in_memory_reference(tmp_path):
    x, y = gmm_data(1500, d=10, classes=3, comps=2)
    np.savez(tmp_path / "in.npz", embeddings=x, labels=y)
    out = tmp_path / "rel"
    assert _run("--input", tmp_path / "in.npz", "--output", out,
                "--num-classes", 3, "--epsilon", 3, "--clusters", 4,
                "--noise-seed", 5, "--block-size", 128, "--vote-filter") == 0
    cfg = GeneratorConfig(labels=(0, 1, 2), epsilon=3, clusters=4,
                          vote_filter=True)
    _, _, ys = assert_release_matches_reference(out, x, y, cfg, 5,
                                                ("means", "weights"))
    xr, yr, _ = load_release(str(out))
    assert len(yr) == len(ys)


def test_epsilon_inf_warns_loudly(tmp_path, caplog):
    x, y = gmm_data(300, d=4, classes=2)
    np.savez(tmp_path / "in.npz", embeddings=x, labels=y)
    assert _run("--input", tmp_path / "in.npz", "--output", tmp_path / "r",
                "--num-classes", 2, "--epsilon", "inf") == 0
    manifest = json.loads((tmp_path / "r" / "_manifest.json").read_text())
    assert "NOT differentially private" in manifest["warnings"][0]
    assert manifest["noise"].startswith("none")
    assert "WITHOUT NOISE" in caplog.text


def test_existing_release_is_not_overwritten(tmp_path, capsys):
    x, y = gmm_data(300, d=4, classes=2)
    np.savez(tmp_path / "in.npz", embeddings=x, labels=y)
    args = ("--input", tmp_path / "in.npz", "--output", tmp_path / "r",
            "--num-classes", 2)
    assert _run(*args) == 0
    before = (tmp_path / "r" / "_manifest.json").read_text()
    assert _run(*args) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert (tmp_path / "r" / "_manifest.json").read_text() == before
    assert _run(*args, "--overwrite") == 0
    assert (tmp_path / "r" / "_manifest.json").read_text() != before


def test_bad_row_fails_cleanly_and_writes_nothing(tmp_path, capsys):
    x, y = gmm_data(300, d=4, classes=2)
    x[17, 2] = np.nan
    np.savez(tmp_path / "in.npz", embeddings=x, labels=y)
    assert _run("--input", tmp_path / "in.npz", "--output", tmp_path / "r",
                "--num-classes", 2) == 2
    err = capsys.readouterr().err
    assert "in.npz" in err and "row 17" in err
    assert sorted(os.listdir(tmp_path)) == ["in.npz"]


def test_impossible_config_refused_before_reading(tmp_path, capsys):
    # an input that exists (a missing one is refused even earlier, before
    # Beam is imported): the weights are refused before it is read
    x, y = gmm_data(40, d=4, classes=2, comps=1)
    np.savez(tmp_path / "in.npz", embeddings=x, labels=y)
    assert _run("--input", tmp_path / "in.npz", "--output",
                tmp_path / "r", "--num-classes", 2, "--clusters", 4,
                "--budget-weights",
                "centre=0.01,tree=0.5,moments=0.2,lloyd=0.1,covariance=0.1") == 2
    assert "sum to 1" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("mode,center", [("shared", True),
                                         ("per-class", True),
                                         ("shared", False)])
def test_covariance_modes_and_centre_match_reference(tmp_path, mode, center):
    x, y = gmm_data(1200, d=10, classes=3, comps=2)
    np.savez(tmp_path / "in.npz", embeddings=x, labels=y)
    for k in (1, 3):
        out = tmp_path / f"rel{k}"
        assert _run("--input", tmp_path / "in.npz", "--output", out,
                    "--num-classes", 3, "--epsilon", 3, "--clusters", k,
                    "--covariance-rank", 4, "--covariance", mode,
                    "--center" if center else "--no-center",
                    "--noise-seed", 5) == 0
        cfg = GeneratorConfig(labels=(0, 1, 2), epsilon=3, clusters=k,
                              covariance_rank=4, covariance=mode,
                              center=center)
        ledger = plan.make_ledger(cfg)
        stages = {m.stage for m in ledger.mechanisms}
        assert ("tree" in stages) == (k > 1) and "covariance" in stages
        assert ("centre" in stages) == center
        mixes, _, _ = assert_release_matches_reference(
            out, x, y, cfg, 5, ("factors", "variances", "means", "weights"))
        gmm = load_gmm(str(out))
        for label in (0, 1, 2):
            if center:
                np.testing.assert_allclose(gmm.mixtures[label].centre,
                                           mixes[label].centre, atol=1e-12)
            else:
                assert gmm.mixtures[label].centre is None
        if mode == "per-class":  # each class has its own factors
            assert not np.allclose(gmm.mixtures[0].factors,
                                   gmm.mixtures[1].factors)


def test_materialised_blocks_give_the_same_release(tmp_path):
    x, y = gmm_data(600, d=6, classes=2)
    np.savez(tmp_path / "in.npz", embeddings=x, labels=y)
    outs = []
    for i, extra in enumerate(([], ["--materialise-blocks"])):
        out = tmp_path / f"r{i}"
        assert _run("--input", tmp_path / "in.npz", "--output", out,
                    "--num-classes", 2, "--noise-seed", 3, *extra) == 0
        outs.append((release_dir(out) / "_gmm.npz").read_bytes())
    assert outs[0] == outs[1]
