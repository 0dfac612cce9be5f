"""Same seed + noise seed + input => byte-identical release, however the
work is split.

Why it holds: every exact aggregate is a sum of values on a fixed-point grid
(``dpsynth.dp_ops.moments.quantize``) or of integers, so float addition is exact and
order-free; noise is drawn per (secret seed, mechanism name) by
``SeededNoise``, not per worker; sampling uses per-class generators seeded by
the public seed; shards are named by class and index; every list written is
sorted by label. The manifest differs only in run_id, timestamps, timings
and the input file list.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from dpsynth.pipelines import cli
from tests.conftest import gmm_data, release_bytes, release_dir

COMMON = ["--num-classes", 3, "--clusters", 3, "--accountant", "rdp",
          "--epsilon", 3, "--rows-per-shard", 60, "--vote-filter",
          "--vote-threshold", 2]
VOLATILE = {"run_id", "created_utc", "root", "input"}


def _split(x, y, order, parts, directory, tag):
    """Rows ``order`` cut into ``parts`` files; names sort in file order."""
    paths = []
    for i, idx in enumerate(np.array_split(order, parts)):
        path = directory / f"{tag}-part-{i}.npz"
        np.savez(path, embeddings=x[idx], labels=y[idx])
        paths.append(path)
    return str(directory / f"{tag}-part-*.npz")


@pytest.fixture(scope="module")
def releases(tmp_path_factory):
    root = tmp_path_factory.mktemp("det")
    x, y = gmm_data(900, d=6, classes=3, seed=4)
    single = root / "all.npz"
    np.savez(single, embeddings=x, labels=y)
    rng = np.random.default_rng(0)
    split_a = _split(x, y, np.arange(len(y)), 3, root, "a")
    split_b = _split(x, y, rng.permutation(len(y)), 4, root, "b")

    runs = {
        "one-worker": [single],
        "two-workers": [single, "--direct_num_workers", 2,
                        "--direct_running_mode", "multi_processing",
                        "--block-size", 64],
        "npz-ranges": [single, "--split-bytes", 4000, "--direct_num_workers",
                       2, "--direct_running_mode", "multi_processing"],
        "split-a": [split_a, "--block-size", 37],
        "split-b": [split_b, "--block-size", 100],
        "other-noise-seed": [single, "--noise-seed", 12],
    }
    out = {}
    for name, (path, *extra) in runs.items():
        if "--noise-seed" not in extra:
            extra += ["--noise-seed", 11]
        target = root / name
        rc = cli.main(["generate", "--input", str(path), "--output",
                       str(target), *map(str, COMMON), *map(str, extra)])
        assert rc == 0, name
        out[name] = target
    return out


def _manifest(release) -> dict:
    doc = json.loads((release / "_manifest.json").read_text())
    return {k: v for k, v in doc.items() if k not in VOLATILE}


def test_release_has_several_shards_and_a_gmm(releases):
    files = release_bytes(releases["one-worker"])
    shards = [f for f in files if f.endswith(".tfrecord")]
    assert len(shards) >= 4 and "_gmm.npz" in files
    assert {f.split("-")[1] for f in shards} == {
        "class00000", "class00001", "class00002"}


@pytest.mark.parametrize("other", ["two-workers", "npz-ranges", "split-a",
                                   "split-b"])
def test_byte_identical_across_workers_block_sizes_and_file_splits(releases,
                                                                   other):
    ref = release_bytes(releases["one-worker"])
    got = release_bytes(releases[other])
    assert sorted(got) == sorted(ref)
    for name in ref:
        assert got[name] == ref[name], f"{other}: {name} differs"
    assert _manifest(releases[other]) == _manifest(releases["one-worker"])


def test_manifest_differs_only_in_run_metadata(releases):
    a = json.loads((releases["one-worker"] / "_manifest.json").read_text())
    b = json.loads((releases["split-a"] / "_manifest.json").read_text())
    differ = {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)}
    assert differ <= VOLATILE and "run_id" in differ


def test_different_noise_seed_gives_different_noise(releases):
    from dpsynth.pipelines.release.reading import load_gmm
    ref = load_gmm(str(releases["one-worker"]))
    other = load_gmm(str(releases["other-noise-seed"]))
    ref_files = release_bytes(releases["one-worker"])
    other_files = release_bytes(releases["other-noise-seed"])
    assert ref_files["_gmm.npz"] != other_files["_gmm.npz"]
    for label in (0, 1, 2):
        assert not np.allclose(ref.mixtures[label].means,
                               other.mixtures[label].means)
        assert ref.mixtures[label].noisy_count != \
            other.mixtures[label].noisy_count
    # Same plan, same sigmas: only the secret noise seed changed.
    assert _manifest(releases["other-noise-seed"])["privacy"] == \
        _manifest(releases["one-worker"])["privacy"]
