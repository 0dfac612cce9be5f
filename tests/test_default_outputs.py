"""Default outputs never collide between runs or users (issue 72):
``evaluate`` writes beside what it evaluates, not into the working
directory, and the demo's files live in this user's cache folder, not a
fixed /tmp/dpsynth-demo."""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np

from dpsynth.pipelines import cli, demo, evaluation
from dpsynth.pipelines.cli import evaluate


def _data(tmp_path) -> dict:
    from dpsynth.dp_ops.clipping import normalize_rows
    rng = np.random.default_rng(0)
    paths = {}
    for name, n in (("train", 300), ("test", 100), ("syn-a", 200),
                    ("syn-b", 200)):
        y = np.arange(n) % 2
        x = rng.normal(size=(n, 4)) + y[:, None]
        paths[name] = tmp_path / f"{name}.npz"
        np.savez(paths[name], embeddings=normalize_rows(x, "unit"), labels=y)
    return paths


def _evaluate(synthetic, paths, *extra) -> int:
    return evaluate.main([str(a) for a in (
        "--synthetic", synthetic, "--real-train", paths["train"],
        "--real-test", paths["test"], "--seeds", 1, "--models", "logreg",
        "--no-distribution", "--normalize", "unit", *extra)])


def test_evaluate_writes_beside_the_release_not_in_the_cwd(
        tmp_path, monkeypatch, capsys):
    paths = _data(tmp_path)
    rel = tmp_path / "release"
    assert cli.main(["generate", "--input", str(paths["train"]), "--output",
                     str(rel), "--num-classes", "2", "--noise-seed", "1"]) == 0
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    before = sorted(p.name for p in rel.rglob("*"))
    assert _evaluate(rel, paths) == 0
    report = tmp_path / "release-evaluation.json"
    assert json.loads(report.read_text())["synthetic"]["release"] is True
    assert f"report written to {report}" in capsys.readouterr().out
    # The next evaluation (of another file) finds no report in its way.
    assert _evaluate(paths["syn-a"], paths) == 0
    assert (tmp_path / "syn-a-evaluation.json").is_file()
    assert _evaluate(tmp_path / "syn-*.npz", paths) == 0
    assert (tmp_path / "syn-evaluation.json").is_file()
    assert list(cwd.iterdir()) == []
    assert sorted(p.name for p in rel.rglob("*")) == before  # not inside


def test_evaluate_of_the_cwd_release_names_its_folder(tmp_path, monkeypatch):
    paths = _data(tmp_path)
    folder = tmp_path / "syn"
    folder.mkdir()
    monkeypatch.chdir(folder)
    assert evaluation.default_output(".") == str(tmp_path / "syn-evaluation.json")
    assert evaluation.default_output(str(paths["syn-b"])) == str(
        tmp_path / "syn-b-evaluation.json")


def test_a_remote_release_is_evaluated_into_the_users_cache(
        tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert evaluation.default_output("gs://bucket/out/rel/") == str(
        tmp_path / "cache" / "dpsynth-evaluations" / "rel-evaluation.json")


def test_the_demo_files_live_in_the_users_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    train, test = demo.demo_files()
    folder = tmp_path / "home" / ".cache" / "dpsynth-demo"
    assert (train, test) == (str(folder / "digits-train.npz"),
                             str(folder / "digits-test.npz"))
    shared = os.path.join(tempfile.gettempdir(), "dpsynth-demo")
    assert not os.path.exists(shared)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert demo.demo_folder() == str(tmp_path / "xdg" / "dpsynth-demo")


def test_an_unwritable_cache_gets_a_fresh_private_folder(tmp_path,
                                                         monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    first, second = demo.demo_folder(), demo.demo_folder()
    assert first != second and os.path.basename(first) == "dpsynth-demo"
    assert first != os.path.join(tempfile.gettempdir(), "dpsynth-demo")


def test_a_demo_release_is_still_known_to_evaluate(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    train, _ = demo.demo_files()
    manifest = {"input": {"pattern": train}}
    assert evaluation.made_from_demo(manifest)
