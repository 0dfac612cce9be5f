"""Shared fixtures: repo on sys.path, ../shared data, small labelled data."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

SHARED = os.path.join(os.path.dirname(ROOT), "shared")

# Beam (2.77) leaves temporary folders behind for each pipeline run outside
# dpsynth.pipelines.runners.temp_cleanup.pipeline_run (a dependency folder per environment, a
# beam-temp folder) or built and never run, as many tests do: ~45 a suite
# run. The suite's temporary files (its processes' too) go to one folder,
# removed at the end (pytest_unconfigure); tests of "nothing left behind"
# compare its content.
SUITE_TMP = tempfile.mkdtemp(prefix="dpsynth-tests-")
os.environ["TMPDIR"] = tempfile.tempdir = SUITE_TMP


def assert_release_matches_reference(out, x, y, cfg, noise_seed: int,
                                     fields=("means",)):
    """The release written to ``out`` holds the mixture fields that the
    in-memory reference computes on (x, y) with the same noise seed;
    returns the reference's (mixtures, synthetic x, synthetic y)."""
    from dpsynth.dp_ops import plan
    from benchmarks import reference
    from dpsynth.dp_ops.noise import SeededNoise
    from dpsynth.pipelines.release.reading import load_gmm
    mixes, xs, ys = reference.generate(x, y, cfg, plan.make_ledger(cfg),
                                       SeededNoise(noise_seed))
    gmm = load_gmm(str(out))
    for label in cfg.labels:
        for field in fields:
            np.testing.assert_allclose(getattr(gmm.mixtures[label], field),
                                       getattr(mixes[label], field),
                                       atol=1e-6, err_msg=f"{label} {field}")
    return mixes, xs, ys


def release_dir(out):
    """The folder holding a published release's files (gmm.npz, data/...):
    the version folder its manifest names."""
    from pathlib import Path
    from dpsynth.pipelines.release.release import release_root
    return Path(release_root(str(out)))


def release_bytes(out) -> dict:
    """A published release's files (its version folder) as bytes, by path
    relative to that folder: what byte-identity tests compare."""
    root = release_dir(out)
    return {str(p.relative_to(root)): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def dask_test_cluster(tmp_path_factory):
    """A scheduler + 2 single-threaded worker processes on loopback (their
    scratch space under pytest's tmp, the scheduler's HTTP routes on a free
    port); yields its address and closes it after."""
    import distributed
    scratch = str(tmp_path_factory.mktemp("dask-scratch"))
    cluster = distributed.LocalCluster(
        n_workers=2, processes=True, threads_per_worker=1, host="127.0.0.1",
        dashboard_address=None, local_directory=scratch,
        scheduler_kwargs={"local_directory": scratch,
                          "dashboard_address": "127.0.0.1:0"})
    try:
        yield cluster.scheduler_address
    finally:
        cluster.close()


# Manifest fields that name one run, not its outputs.
RUN_FIELDS = frozenset({"run_id", "created_utc", "root"})


def assert_same_release(a, b, may_differ: frozenset = frozenset()) -> None:
    """Two published releases hold the same bytes: every file of the
    version folder, and the manifest but for the fields naming the run."""
    from pathlib import Path
    from dpsynth.pipelines.release.release import read_manifest
    fa, fb = release_bytes(a), release_bytes(b)
    assert sorted(fa) == sorted(fb) and any(
        f.startswith("data/") for f in fa)
    for name in fa:  # shards, gmm.npz, summary.json, schema.json
        assert fa[name] == fb[name], f"{name} differs"
    ma, mb = read_manifest(str(Path(a))), read_manifest(str(Path(b)))
    assert {k for k in ma.keys() | mb.keys()
            if ma.get(k) != mb.get(k)} <= RUN_FIELDS | may_differ


def shared_image_subset(split: str, per_class: int, dest,
                        classes=("cat", "ship")):
    """Copies the first ``per_class`` shared CIFAR-10 JPEGs of each class
    into ``dest/<class>/`` (skips the test without ../shared); returns dest."""
    import shutil
    src = shared_path("data", "cifar10-images", split)
    for name in classes:
        (dest / name).mkdir(parents=True)
        for f in sorted(os.listdir(os.path.join(src, name)))[:per_class]:
            shutil.copy(os.path.join(src, name, f), dest / name / f)
    return dest


def shared_path(*parts: str) -> str:
    """Path under ../shared, or skip the test with the reason."""
    path = os.path.join(SHARED, *parts)
    if not os.path.exists(path):
        pytest.skip(f"shared data not available: {path} is absent "
                    f"(see ../shared/README.md)")
    return path


def gmm_data(n: int, d: int = 16, classes: int = 3, comps: int = 2,
             seed: int = 0, spread: float = 0.3):
    """Well-separated labelled Gaussian mixture (class centres fixed by d)."""
    centres = np.random.default_rng(1234 + d).normal(size=(classes, comps, d))
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    c = rng.integers(0, comps, n)
    x = centres[y, c] + spread * rng.normal(size=(n, d))
    return x, y.astype(np.int64)


@pytest.fixture
def small_npz(tmp_path):
    x, y = gmm_data(1200)
    path = tmp_path / "train.npz"
    np.savez(path, embeddings=x, labels=y)
    return str(path)


@pytest.fixture(scope="session")
def sample_source(tmp_path_factory) -> str:
    """The default demo release with ``--noise-seed 3`` (no input: the
    bundled demo data), the source of the ``dpsynth sample`` tests
    (tests/test_sample.py, tests/test_release_round5.py): one run for both.
    Tests copy it or read it; one that changes a file puts its bytes back."""
    from dpsynth.pipelines import cli
    out = str(tmp_path_factory.mktemp("sample") / "source")
    assert cli.main(["generate", "--output", out, "--noise-seed", "3"]) == 0
    return out


def pytest_unconfigure(config):
    shutil.rmtree(SUITE_TMP, ignore_errors=True)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "engines: runs dpsynth on Flink / Spark / Prism "
        "(tests/test_engines.py); deselect with -m 'not engines'")
    config.addinivalue_line(
        "markers", "mutations: applies the privacy mutations of "
        "tests/mutations.py to a copy of the repo and runs their catching "
        "tests (minutes); deselect with -m 'not mutations'")
    config.addinivalue_line(
        "markers", "hosts_faults: kills / cuts off / slows Dask hosts "
        "(tests/test_hosts.py, ~4 min as root); deselect with "
        "-m 'not hosts_faults'")
