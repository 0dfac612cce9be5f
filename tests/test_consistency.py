"""The staged release's self-consistency check refuses what disagrees
(pipelines/release/consistency.py ``check_staged``; issue 54, item 3).

One small real release is copied and broken one way per test: rows per
class other than the published counts, a missing or an unlisted shard, rows
or class means of another dimension. Each is refused with one line naming
what disagrees; the untouched copy passes; and a run whose staged release is
broken publishes nothing (the check is on the job's path).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.models.gmm import MixtureRelease
from dpsynth.pipelines import cli
from dpsynth.pipelines.release import protocol
from dpsynth.pipelines.release import consistency, release
from dpsynth.pipelines.api import (GenerateSpec, GeneratorOptions, InputOptions,
                                   OutputOptions, generate)
from dpsynth.transforms.write import DATA_DIR, GMM_FILE, tfrecord_bytes
from tests.conftest import gmm_data

DIM = 4


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """(release folder, manifest) of a seeded 3-class run, several shards
    per class."""
    root = tmp_path_factory.mktemp("consistency")
    x, y = gmm_data(300, d=DIM, classes=3)
    data = root / "in.npz"
    np.savez(data, embeddings=x, labels=y)
    out = root / "out"
    assert cli.main(["generate", "--input", str(data), "--output", str(out),
                     "--num-classes", "3", "--covariance", "shared",
                     "--epsilon", "4", "--rows-per-shard", "30",
                     "--noise-seed", "5"]) == 0
    manifest = release.read_manifest(str(out))
    return Path(release.release_root(str(out), manifest)), manifest


@pytest.fixture
def staged(published, tmp_path):
    """A fresh copy of the release's folder, to break."""
    folder, manifest = published
    copy = tmp_path / "staged"
    shutil.copytree(folder, copy)
    return copy, json.loads(json.dumps(manifest))


def _check(folder: Path, manifest: dict, dim: int = DIM) -> None:
    conf = dict(manifest["config"], labels=tuple(manifest["config"]["labels"]))
    consistency.check_staged(str(folder), GeneratorConfig(**conf),
                             manifest["classes"], dim)


def _refused(folder: Path, manifest: dict, match: str, dim: int = DIM):
    with pytest.raises(consistency.InconsistentRelease, match=match) as err:
        _check(folder, manifest, dim)
    assert "\n" not in str(err.value)


def _shards(folder: Path, label: int) -> list[Path]:
    return sorted((folder / DATA_DIR).glob(f"*class{label:05d}-*"))


def test_the_untouched_release_passes(staged):
    folder, manifest = staged
    assert all(len(_shards(folder, c["label"])) >= 2
               for c in manifest["classes"])
    _check(folder, manifest)


def test_a_shard_with_a_row_fewer_is_refused(staged):
    folder, manifest = staged
    shard = _shards(folder, 1)[0]
    data = shard.read_bytes()
    per_row = len(data) // 30
    shard.write_bytes(data[:-per_row])
    _refused(folder, manifest, r"class 1: its shards hold \d+ rows, not the")


def test_rows_other_than_the_noisy_count_implies_are_refused(staged):
    """summary.json and the shards agree, but not with the published
    (noisy) count: one row too many."""
    folder, manifest = staged
    entry = manifest["classes"][2]
    last = _shards(folder, 2)[-1]
    extra = tfrecord_bytes(np.zeros((1, DIM)), 2)
    last.write_bytes(last.read_bytes() + extra)
    entry["samples"] += 1
    _refused(folder, manifest, "class 2: .* rows written, but its noisy "
                               "count implies")


def test_a_summary_count_other_than_the_gmm_is_refused(staged):
    folder, manifest = staged
    manifest["classes"][0]["noisy_count"] += 1.0
    _refused(folder, manifest, "class 0: gmm.npz and summary.json hold "
                               "different noisy counts")


def test_a_missing_shard_is_refused(staged):
    folder, manifest = staged
    _shards(folder, 0)[-1].unlink()
    _refused(folder, manifest, r"class 0: shard synthetic-class00000-\d+"
                               r"\.tfrecord is missing")


def test_a_shard_no_class_lists_is_refused(staged):
    folder, manifest = staged
    (folder / DATA_DIR / "synthetic-class00007-00000.tfrecord").write_bytes(
        tfrecord_bytes(np.zeros((3, DIM)), 7))
    _refused(folder, manifest, "shards no class lists")


def test_a_missing_class_is_refused(staged):
    folder, manifest = staged
    del manifest["classes"][1]
    _refused(folder, manifest, r"summary labels \[0, 2\] are not the "
                               r"configured labels \[0, 1, 2\]")


def test_rows_of_another_dimension_are_refused(staged):
    """A class's shards rewritten with as many rows of dimension d + 1."""
    folder, manifest = staged
    for shard in _shards(folder, 2):
        rows = len(shard.read_bytes()) // len(tfrecord_bytes(
            np.zeros((1, DIM)), 2))
        shard.write_bytes(tfrecord_bytes(np.zeros((rows, DIM + 1)), 2))
    _refused(folder, manifest, "class 2: its shards hold -?\\d+ rows")


def test_class_means_of_another_dimension_are_refused(staged):
    folder, manifest = staged
    _refused(folder, manifest, "class 0: gmm.npz means have dimension 4, "
                               "the embeddings 5", dim=DIM + 1)
    gmm = MixtureRelease.from_npz((folder / GMM_FILE).read_bytes())
    assert gmm.mixtures[0].means.shape[1] == DIM


def _lose_a_shard_after_the_pipeline(tmp_path, monkeypatch, run_id: str):
    """Input data and an --output whose staged release loses a shard at the
    ``pipeline-done`` checkpoint (between staging and the check)."""
    x, y = gmm_data(200, d=DIM, classes=2)
    data = tmp_path / "in.npz"
    np.savez(data, embeddings=x, labels=y)
    out = tmp_path / "out"
    real = protocol.checkpoint

    def lose_a_shard(step: str) -> None:
        if step == "pipeline-done":
            staging = Path(release.staging_folders(str(out), run_id)
                           .popitem()[1])
            sorted((staging / DATA_DIR).iterdir())[0].unlink()
        real(step)
    monkeypatch.setattr(protocol, "checkpoint", lose_a_shard)
    return data, out


def test_a_broken_staged_release_is_not_published(published, tmp_path,
                                                  monkeypatch):
    """The job runs the check between staging and publishing: a shard lost
    after the pipeline leaves --output without a release."""
    data, out = _lose_a_shard_after_the_pipeline(tmp_path, monkeypatch,
                                                 "broken")
    spec = GenerateSpec(
        input=InputOptions(path=str(data), num_classes=2),
        generator=GeneratorOptions(epsilon=4.0, covariance="shared",
                                   noise_seed=3),
        output=OutputOptions(path=str(out), run_id="broken",
                             rows_per_shard=20))
    with pytest.raises(consistency.InconsistentRelease, match="is missing"):
        generate(spec)
    assert not release.release_exists(str(out))


def test_the_cli_refuses_a_broken_staged_release_in_one_line(tmp_path,
                                                             monkeypatch,
                                                             capsys):
    """`dpsynth generate` reports the failed check as one error line, exit
    2, no traceback (the check raised through the CLI before)."""
    data, out = _lose_a_shard_after_the_pipeline(tmp_path, monkeypatch,
                                                 "cli-broken")
    code = cli.main(["generate", "--input", str(data), "--output", str(out),
                     "--num-classes", "2", "--covariance", "shared",
                     "--epsilon", "4", "--rows-per-shard", "20",
                     "--run-id", "cli-broken"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "error" in line]
    assert len(lines) == 1, err
    assert "not self-consistent" in lines[0] and "is missing" in lines[0]
    assert not release.release_exists(str(out))
