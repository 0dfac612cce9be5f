"""The typed boundary (issue 28): the CLI turns flags into a GenerateSpec
and the documented Python API runs the same job; nothing below the CLI
parses flags."""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

import numpy as np

from pipelines import api, cli, release
from tests.conftest import gmm_data

ROOT = Path(__file__).resolve().parent.parent
# Below the command line: the job, its typed values, the Beam transforms
# and the numpy layers never see argparse.
BELOW_CLI = ["pipelines/job.py", "pipelines/spec.py", "pipelines/api.py",
             "pipelines/release.py", "pipelines/consistency.py",
             "transforms", "dp_ops", "models"]


def _data_digests(path: str) -> list[str]:
    manifest = release.read_manifest(path)
    return [hashlib.sha256(Path(f).read_bytes()).hexdigest()
            for f in release.release_files(path, manifest)]


def test_the_api_makes_the_cli_release_byte_for_byte(tmp_path):
    x, y = gmm_data(300, d=5, classes=3)
    data = tmp_path / "in.npz"
    np.savez(data, embeddings=x, labels=y)
    cli_out, api_out = str(tmp_path / "cli"), str(tmp_path / "api")
    assert cli.main(["generate", "--input", str(data), "--num-classes", "3",
                     "--epsilon", "2", "--noise-seed", "7", "--output",
                     cli_out, "--run-id", "same"]) == 0
    made = api.generate(api.GenerateSpec(
        input=api.InputOptions(path=str(data), num_classes=3),
        generator=api.GeneratorOptions(epsilon=2.0, noise_seed=7),
        output=api.OutputOptions(path=api_out, run_id="same")))
    assert made.path == api_out
    assert _data_digests(api_out) == _data_digests(cli_out)
    cli_manifest = release.read_manifest(cli_out)
    for key in ("config", "privacy", "classes", "adaptive_plan", "outputs"):
        assert made.manifest[key] == cli_manifest[key], key
    xs, ys = made.arrays()
    assert len(xs) == len(ys) == made.manifest["samples_total"]


def test_the_spec_defaults_are_the_command_lines():
    from pipelines import generate
    args, _ = generate.parser().parse_known_args([])
    assert generate.spec_from_args(args) == api.GenerateSpec()


def test_nothing_below_the_cli_imports_argparse():
    files = [p for entry in BELOW_CLI for p in (
        [ROOT / entry] if entry.endswith(".py")
        else sorted((ROOT / entry).rglob("*.py")))]
    assert len(files) > 30
    for path in files:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            assert "argparse" not in names, path
        assert "Namespace" not in path.read_text(), path
