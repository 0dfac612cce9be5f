"""`dpsynth evaluate`: the protocol, the report and the command line."""

import argparse
import json
import os
import re

import numpy as np
import pytest

from dpsynth.dp_ops.clipping import normalize_rows
from dpsynth.pipelines import evaluation
from dpsynth.pipelines.cli import evaluate
from tests.conftest import gmm_data

FAST_MLP = ["--mlp-epochs", "3", "--mlp-lr", "0.05", "--mlp-batch-size", "64"]


@pytest.fixture
def files(tmp_path):
    x, y = gmm_data(900, d=12, classes=3, spread=0.2)
    xt, yt = gmm_data(300, d=12, classes=3, seed=5, spread=0.2)
    # "Synthetic" rows: fresh draws, already in the unit-normalised space.
    xs, ys = gmm_data(2000, d=12, classes=3, seed=6, spread=0.2)
    paths = {}
    for name, a, b in (("train", x, y), ("test", xt, yt),
                       ("syn", normalize_rows(xs, "unit"), ys)):
        paths[name] = str(tmp_path / f"{name}.npz")
        np.savez(paths[name], embeddings=a, labels=b)
    paths["out"] = str(tmp_path / "report.json")
    return paths


def run_cli(*argv):
    return evaluate.main([str(a) for a in argv])


def test_fit_size_policies():
    x = np.arange(10.0)[:, None]
    y = np.arange(10) % 2
    assert len(evaluation.fit_size(x, y, 4, "paper", 0)[1]) == 4
    assert len(evaluation.fit_size(x, y, 25, "paper", 0)[1]) == 10
    xm, ym = evaluation.fit_size(x, y, 25, "match", 0)
    assert len(ym) == 25 and set(xm[:, 0]) == set(range(10))
    assert np.array_equal(ym, xm[:, 0].astype(int) % 2)  # rows keep labels
    assert len(evaluation.fit_size(x, y, 4, "none", 0)[1]) == 10


def test_summary_uses_sample_std():
    s = evaluation.summary([0.5, 0.7])
    assert s["mean"] == pytest.approx(0.6)
    assert s["std"] == pytest.approx(np.std([0.5, 0.7], ddof=1))
    assert evaluation.summary([0.4])["std"] == 0.0


def test_cli_on_data_files_writes_report_and_table(files, capsys):
    rc = run_cli("--synthetic", files["syn"], "--real-train", files["train"],
                 "--real-test", files["test"], "--normalize", "unit",
                 "--seeds", 2, "--metrics-max-rows", 300,
                 "--output", files["out"], *FAST_MLP)
    assert rc == 0
    out = capsys.readouterr().out
    assert "trained on synthetic" in out and "real-data ceiling" in out
    assert "NOT differentially private" in out
    report = json.loads(open(files["out"]).read())
    for block in ("synthetic_trained", "real_trained_ceiling"):
        for model in ("mlp", "logreg"):
            res = report[block][model]
            assert len(res["accuracies"]) == 2
            assert res["mean"] > 0.9  # easy, well-separated classes
    dist = report["distribution"]
    assert set(dist["per_class"]) == {"0", "1", "2"}
    assert dist["mean"]["precision"] > 0.5
    assert dist["mean"]["dcr_exact_copies"] == 0
    # The paper's protocol: synthetic rows cut to the real train size.
    assert report["protocol"]["rows"]["synthetic"] == 2000
    assert report["protocol"]["size_policy"] == "paper"
    assert report["real"]["normalize"] == "unit"


def test_copied_train_rows_are_flagged(files, tmp_path):
    x, y = gmm_data(900, d=12, classes=3, spread=0.2)
    np.savez(tmp_path / "copy.npz", embeddings=normalize_rows(x, "unit"),
             labels=y)
    rc = run_cli("--synthetic", tmp_path / "copy.npz", "--real-train",
                 files["train"], "--real-test", files["test"], "--normalize",
                 "unit", "--models", "logreg", "--seeds", 1, "--no-ceiling",
                 "--output", files["out"])
    assert rc == 0
    m = json.loads(open(files["out"]).read())["distribution"]["mean"]
    assert m["dcr_exact_copies"] > 0
    assert m["dcr_share_below_holdout_p05"] == 1.0
    assert m["dcr_share_closer_to_train"] > 0.55  # diluted: see dcr_report
    assert m["frechet"] == pytest.approx(0.0, abs=1e-6)


def test_cli_on_a_release(tmp_path, capsys):
    from dpsynth.pipelines import cli
    x, y = gmm_data(900, d=12, classes=3, spread=0.2)
    xt, yt = gmm_data(300, d=12, classes=3, seed=5, spread=0.2)
    np.savez(tmp_path / "train.npz", embeddings=x, labels=y)
    np.savez(tmp_path / "test.npz", embeddings=xt, labels=yt)
    rel = tmp_path / "release"
    assert cli.main(["generate", "--input", str(tmp_path / "train.npz"),
                     "--output", str(rel), "--num-classes", "3",
                     "--epsilon", "4", "--clusters", "3",
                     "--noise-seed", "1"]) == 0
    capsys.readouterr()
    rc = run_cli("--synthetic", rel, "--real-train", tmp_path / "train.npz",
                 "--real-test", tmp_path / "test.npz", "--seeds", 1,
                 "--models", "logreg", "--no-distribution",
                 "--output", tmp_path / "r.json")
    assert rc == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["synthetic"]["release"] is True
    assert 0 < report["synthetic"]["epsilon_spent"] <= 4.0
    assert report["real"]["normalize"] == "unit"  # read from the manifest
    assert report["real"]["clip_norm"] is None  # centred: rows stay unit
    assert report["labels"] == [0, 1, 2]
    assert report["synthetic_trained"]["logreg"]["mean"] > 0.8


def test_errors_exit_2_with_a_clear_message(files, capsys):
    rc = run_cli("--synthetic", files["syn"], "--real-train", files["train"],
                 "--real-test", files["test"], "--output", files["out"])
    assert rc == 2
    assert "--normalize auto needs a release" in capsys.readouterr().err
    rc = run_cli("--synthetic", files["syn"], "--real-train",
                 files["train"] + ".missing", "--real-test", files["test"],
                 "--normalize", "unit", "--output", files["out"])
    assert rc == 2
    assert ".missing" in capsys.readouterr().err
    rc = run_cli("--synthetic", files["syn"], "--real-train", files["train"],
                 "--real-test", files["test"], "--normalize", "unit",
                 "--models", "svm", "--output", files["out"])
    assert rc == 2
    assert "--models" in capsys.readouterr().err


def test_register_adds_the_subcommand():
    parser = argparse.ArgumentParser(prog="dpsynth")
    sub = parser.add_subparsers(dest="command", required=True)
    evaluate.register(sub)
    args = parser.parse_args(["evaluate", "--synthetic", "s", "--real-train",
                              "a", "--real-test", "b", "--mlp-epochs", "7"])
    assert args.handler is evaluate.handle
    cfg = evaluation.mlp_config(evaluate.spec_from_args(args))
    assert cfg.epochs == 7 and cfg.hidden == 128 and cfg.label_smoothing == 0.2


def test_real_rows_are_clipped_only_for_uncentred_releases():
    from dpsynth.pipelines.evaluation import resolve_clip
    assert resolve_clip("auto", {"config": {"center": False,
                                            "clip_norm": 0.5}}) == 0.5
    assert resolve_clip("auto", {"config": {"center": True,
                                            "clip_norm": 0.5}}) is None
    assert resolve_clip("unit", {"config": {"clip_norm": 0.5}}) is None


def test_default_quick_protocol_reports_progress_per_model_and_seed(files, capsys):
    rc = run_cli("--synthetic", files["syn"], "--real-train", files["train"],
                 "--real-test", files["test"], "--normalize", "unit",
                 "--metrics-max-rows", 300, "--output", files["out"],
                 "--mlp-lr", "0.05", "--mlp-batch-size", "64")
    assert rc == 0
    lines = capsys.readouterr().err.strip().splitlines()
    steps = [l for l in lines if "trained on" in l]
    assert [l.split(":")[1].strip() for l in steps] == [
        "mlp trained on synthetic, seed 0", "logreg trained on synthetic, seed 0",
        "mlp trained on real (ceiling), seed 0", "logreg trained on real (ceiling), seed 0"]
    assert all(re.fullmatch(r"dpsynth evaluate: .*: test accuracy [01]\.\d{4} "
                            r"\(\d+ s\) \[\d+:\d\d elapsed\]", l) for l in steps), steps
    assert any("distribution metrics" in l for l in lines)
    assert "protocol quick" in lines[0]
    report = json.loads(open(files["out"]).read())
    assert report["protocol"]["name"] == "quick"
    assert report["protocol"]["seeds"] == [0]
    assert report["protocol"]["mlp"]["epochs"] == evaluation.PROTOCOLS["quick"]["mlp_epochs"]


def test_protocols_and_explicit_overrides():
    parser = evaluate.parser()
    base = ["--synthetic", "s", "--real-train", "a", "--real-test", "b"]

    def settings(*extra):
        spec = evaluate.spec_from_args(parser.parse_args(base + list(extra)))
        return evaluation.protocol_settings(spec)
    assert settings() == (1, 50)
    assert settings("--protocol", "full") == (3, 50) == (
        evaluation.PROTOCOLS["full"]["seeds"], classifiers_epochs())
    assert settings("--protocol", "full", "--seeds", "5", "--mlp-epochs", "7") == (5, 7)
    with pytest.raises(ValueError, match="--seeds must be >= 1"):
        settings("--seeds", "0")
    helptext = parser.format_help()
    assert "(default: quick)" in helptext and "(default: 2000)" in helptext
    assert "full: the paper's protocol, 3 seeds, MLP 50 epochs" in " ".join(helptext.split())


def test_a_deterministic_fit_on_seed_independent_rows_runs_once(monkeypatch):
    calls = []

    def fake(model, x, y, *rest):
        calls.append(model)
        return 0.5 + 0.1 * len(calls)
    monkeypatch.setattr(evaluation, "train_and_score", fake)
    x, y = np.zeros((10, 2)), np.arange(10) % 2
    args = (np.zeros((4, 2)), np.arange(4) % 2, [0, 1], ["logreg", "mlp"],
            [0, 1, 2], None, None)
    out = evaluation.utility(x, y, 10, *args, size_policy="paper")
    assert calls == ["logreg", "mlp", "mlp", "mlp"]
    assert out["logreg"]["accuracies"] == [0.6] * 3 and out["logreg"]["std"] == 0
    calls.clear()
    evaluation.utility(x, y, 5, *args, size_policy="paper")  # cut to 5 rows: seeded
    assert calls == ["logreg"] * 3 + ["mlp"] * 3


def classifiers_epochs():
    from dpsynth.models.classifiers import MLPConfig
    return MLPConfig().epochs  # the paper's 50


def test_missing_inputs_name_their_own_flag(files, tmp_path, capsys):
    common = ["--normalize", "unit", "--output", files["out"]]
    assert run_cli("--synthetic", tmp_path / "missing/", "--real-train", files["train"],
                   "--real-test", files["test"], *common) == 2
    err = capsys.readouterr().err
    assert "--synthetic" in err and "missing" in err and "--input" not in err
    (tmp_path / "empty").mkdir()
    assert run_cli("--synthetic", tmp_path / "empty", "--real-train", files["train"],
                   "--real-test", files["test"], *common) == 2
    assert "--synthetic" in capsys.readouterr().err
    assert run_cli("--synthetic", files["syn"], "--real-train", files["train"],
                   "--real-test", tmp_path / "nope-*.npz", *common) == 2
    err = capsys.readouterr().err
    assert "--real-test" in err and "no files match" in err and "--input" not in err
    assert not (tmp_path / "report.json").exists()


def test_existing_report_is_not_overwritten_without_the_flag(files, capsys):
    with open(files["out"], "w") as f:
        f.write("earlier report")
    argv = ["--synthetic", files["syn"], "--real-train", files["train"],
            "--real-test", files["test"], "--normalize", "unit", "--models",
            "logreg", "--no-ceiling", "--no-distribution", "--output", files["out"]]
    assert run_cli(*argv) == 2
    assert "already exists; pass --overwrite" in capsys.readouterr().err
    assert open(files["out"]).read() == "earlier report"
    assert run_cli(*argv, "--overwrite") == 0
    assert json.loads(open(files["out"]).read())["synthetic_trained"]["logreg"]["mean"] > 0.9
    assert [p for p in os.listdir(os.path.dirname(files["out"])) if ".tmp-" in p] == []


def test_small_sets_get_a_larger_mlp_learning_rate():
    from dpsynth.models.classifiers import MLPConfig
    paper = MLPConfig()
    # CIFAR-10's 50,000 rows make the paper's 4,900 steps: its rate stays.
    assert evaluation.scaled_learning_rate(50_000, paper) == paper.learning_rate
    # The demo's 1,437 rows: 3 batches x 50 epochs = 150 steps.
    assert evaluation.scaled_learning_rate(1437, paper) == pytest.approx(
        1e-3 * 4900 / 150)
    one_epoch = MLPConfig(epochs=1)  # 1 step: capped
    assert evaluation.scaled_learning_rate(10, one_epoch) == evaluation.MAX_AUTO_LR


@pytest.fixture(scope="module")
def demo_release(tmp_path_factory):
    from dpsynth.pipelines import cli
    rel = tmp_path_factory.mktemp("demo") / "release"
    assert cli.main(["generate", "--output", str(rel), "--noise-seed", "3"]) == 0
    return str(rel)


def test_demo_release_scores_like_generates_utility_line(demo_release,
                                                         tmp_path, capsys):
    from dpsynth.pipelines import demo
    capsys.readouterr()
    out = tmp_path / "r.json"
    # No --real-* flags: a demo release is scored on the demo's split.
    assert run_cli("--synthetic", demo_release, "--models", "logreg",
                   "--no-distribution", "--output", out) == 0
    printed = capsys.readouterr()
    report = json.loads(out.read_text())
    train, test = demo.demo_files()
    assert report["real"]["demo"] is True
    assert (report["real"]["train"], report["real"]["test"]) == (train, test)
    assert "the embedded demo's split" in printed.err
    assert "C=1 (--logreg-c) (the demo: generate's utility-line" in printed.out
    # Naming the demo's files explicitly (the command) is the same.
    again = tmp_path / "again.json"
    assert run_cli("--synthetic", demo_release, "--real-train", train,
                   "--real-test", test, "--models", "logreg",
                   "--no-distribution", "--output", again) == 0
    capsys.readouterr()
    repeat = json.loads(again.read_text())
    assert repeat["real"]["demo"] is True
    assert repeat["synthetic_trained"] == report["synthetic_trained"]
    line = demo.utility_line(demo_release, test, train)
    real, synthetic = re.findall(r"trained on (?:real|synthetic) (\d\.\d{3})",
                                 line)
    assert f"{report['real_trained_ceiling']['logreg']['mean']:.3f}" == real
    assert f"{report['synthetic_trained']['logreg']['mean']:.3f}" == synthetic


def test_plain_files_still_need_both_real_flags(files, capsys):
    assert run_cli("--synthetic", files["syn"], "--normalize", "unit",
                   "--real-test", files["test"], "--output", files["out"]) == 2
    assert "--real-train required" in capsys.readouterr().err


def test_console_is_quiet_and_explains_every_metric(files, tmp_path):
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    proc = subprocess.run(
        [sys.executable, "-m", "dpsynth.pipelines.cli.evaluate", "--synthetic",
         files["syn"], "--real-train", files["train"], "--real-test",
         files["test"], "--normalize", "unit", "--metrics-max-rows", "200",
         "--output", files["out"], "--mlp-epochs", "2", "--no-ceiling"],
        capture_output=True, text=True, env=env, timeout=300,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert proc.returncode == 0, proc.stderr
    # Only dpsynth's own progress lines: no TensorFlow / absl banners.
    noise = [l for l in proc.stderr.splitlines()
             if not l.startswith("dpsynth evaluate: ")]
    assert noise == []
    assert "mlp trained on synthetic" in proc.stderr
    for words in ("Fréchet distance", "k-NN precision", "k-NN recall",
                  "DCR (distance to the closest real train row",
                  "mlp: the paper's two-layer MLP", "logreg: standardised"):
        assert words in proc.stdout, words
    report = json.loads(open(files["out"]).read())
    reference = report["distribution"]["real_test_reference"]
    assert reference["precision"] > 0.5  # fresh real rows look real


def test_without_keras_the_default_is_the_logistic_probe(monkeypatch):
    monkeypatch.setattr(evaluation, "keras_installed", lambda: False)
    assert evaluation.parse_models(None) == ["logreg"]
    with pytest.raises(ValueError, match="dpsynth\\[tf\\]"):
        evaluation.parse_models("mlp,logreg")
    monkeypatch.setattr(evaluation, "keras_installed", lambda: True)
    assert evaluation.parse_models(None) == ["mlp", "logreg"]
