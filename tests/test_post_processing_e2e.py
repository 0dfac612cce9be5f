"""End to end: a release is a function of the released statistics alone
(issue 54, item 1).

Every mechanism releases through ``NoiseSource.add`` (dp_ops/noise.py), one
draw per key. The job runs on a dataset D with a real random key, recording
each draw (``tests.forcing_noise.RecordingNoise``); then on other datasets
of the same public shape with ``ForcingNoise`` set to D's released values
(each draw = target - exact). Whatever the exact input, every mechanism then
releases what it released on D, so the release (shards, _gmm.npz,
summary.json, the manifest but for the run's id, folder and time) must be
byte-identical: a step after a mechanism that reads an exact value, or a
structure (tree shape, plan, shard count) taken from exact data, changes the
bytes or the draws.

What forcing cannot see is a leak into a later mechanism's exact input
(e.g. Lloyd centres from exact sums): those centres only pick which rows
each later aggregate sums, and the forced draw hides that. The neighbour
test catches it the way adaptive composition states the privacy condition:
on D' = D with one record added or removed and every earlier release the
same, each mechanism's exact input moves by at most its L2 sensitivity.

Plans: the adaptive plan in each of its modes (shared, subspace, per-class:
the rule picks them from the forced noisy counts; the studies' all-class
"shrunk" class matrices of issue 61 left the product in issue 73, and
tests/test_post_processing_units.py checks them on the reference),
--clusters 3 with the LSH tree, Lloyd rounds and --vote-filter, and the fixed per-class plan;
the per-class counts, sums and second moments go through the PipelineDP
aggregations (transforms/pipelinedp.py). Engines: DirectRunner
(multi_processing, two workers) and Dask (two worker processes). 22 small
runs (305 rows, d = 8): ~2-4 minutes on two cores.

Teeth (each mutation applied alone, this file run): the tree branching on
exact level counts (a forced draw's shape differs), the vote filter on
exact votes, the adaptive shared/class covariance from the exact matrices
(the bytes differ); Lloyd centres from exact counts and sums, coreset
centres from exact leaf sums (a later Lloyd input moves past its
sensitivity). The last two need rows near the k-means borders: the classes
overlap widely on purpose, and D's key is fixed so the result is
reproducible.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpsynth.pipelines import cli, job_plan
from dpsynth.pipelines.release.release import read_manifest
from tests.conftest import assert_same_release, dask_test_cluster
from tests.forcing_noise import ForcingNoise, RecordingNoise, load_draws

DIM, CLASSES = 8, 3
COMMON = ["--num-classes", CLASSES, "--delta", 1e-5, "--rows-per-shard", 40]
# The adaptive rule picks its mode from the noisy counts (~100 rows per
# class, d = 8): shared at eps 1, subspace at eps 2, per-class (spiked
# class matrices) at eps 16.
PLANS = {
    "adaptive-shared": ["--epsilon", 1],
    "adaptive-subspace": ["--epsilon", 2],
    "adaptive-per-class": ["--epsilon", 16],
    "kmeans-vote": ["--epsilon", 4, "--covariance", "shared", "--clusters", 3,
                    "--vote-filter", "--vote-threshold", 1],
    "fixed-per-class": ["--epsilon", 8, "--covariance", "per-class"],
}
ADAPTIVE_MODE = {"adaptive-shared": "shared",
                 "adaptive-subspace": "subspace",
                 "adaptive-per-class": "per-class"}
# D's run draws real keyed noise; a fixed key makes which leaks the
# neighbour test sees reproducible (tests/mutations depend on it).
KEY = bytes(range(7, 39))
DIRECT = ["--direct_num_workers", 2, "--direct_running_mode",
          "multi_processing"]


def labelled_rows(sizes, seed: int, outlier: bool = False):
    """Rows of ``CLASSES`` widely overlapping Gaussian classes (k-means
    borders cut through dense regions, so a centre moved by exact data
    moves rows between clusters), ``sizes[c]`` rows of class c; optionally
    one far outlier (clipped by the job) in class 0."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(CLASSES, DIM))
    y = np.repeat(np.arange(CLASSES), sizes)
    x = centres[y] + 2.0 * rng.normal(size=(len(y), DIM))
    if outlier:
        x = np.vstack([x, 50.0 * np.ones((1, DIM))])
        y = np.append(y, 0)
    order = rng.permutation(len(y))
    return x[order], y[order].astype(np.int64)


D = labelled_rows([110, 95, 100], seed=1)
DATASETS = {
    # Other rows, other class sizes, one row more, an outlier.
    "other": labelled_rows([70, 133, 102], seed=2, outlier=True),
    # D plus one far record; D minus one record.
    "added": (np.vstack([D[0], 40.0 * np.ones((1, DIM))]), np.append(D[1], 1)),
    "removed": (D[0][1:], D[1][1:]),
}


class Runner:
    """Runs the job on one input path (the manifest names it) with a
    chosen noise source; D's recorded run per plan is cached."""

    def __init__(self, root, dask_address: str) -> None:
        self.root, self.dask_address = root, dask_address
        self.input = root / "input" / "train.npz"
        self.input.parent.mkdir()
        self.recorded: dict[str, tuple] = {}
        self.count = 0

    def run(self, plan: str, data, noise, engine: str):
        self.count += 1
        out = self.root / f"out-{self.count}"
        np.savez(self.input, embeddings=data[0], labels=data[1])
        flags = (DIRECT if engine == "direct" else
                 ["--runner", "dask",
                  f"--dask_client_address={self.dask_address}"])
        argv = ["generate", "--input", str(self.input), "--output", str(out),
                *map(str, COMMON + PLANS[plan] + flags)]
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(job_plan, "make_noise_source", lambda seed: noise)
            assert cli.main(argv) == 0, f"{plan} on {engine} failed"
        return out

    def folder(self, name: str) -> str:
        path = self.root / f"draws-{self.count + 1}-{name}"
        path.mkdir()
        return str(path)

    def on_d(self, plan: str):
        """D's release with a real key, and its draws."""
        if plan not in self.recorded:
            folder = self.folder("recorded")
            out = self.run(plan, D, RecordingNoise(folder, KEY), "direct")
            self.recorded[plan] = out, load_draws(folder)
        return self.recorded[plan]

    def forced(self, plan: str, dataset: str, engine: str):
        """The release on ``dataset`` with D's released values forced, and
        the draws (exact inputs) it made."""
        out_d, draws_d = self.on_d(plan)
        folder = self.folder(f"{dataset}-{engine}")
        targets = {k: released for k, (_, released) in draws_d.items()}
        out = self.run(plan, DATASETS[dataset],
                       ForcingNoise(targets, folder), engine)
        return out, load_draws(folder)


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    pytest.importorskip("distributed", reason="the Dask runs need "
                        "pip install -e '.[test]' (apache-beam[dask])")
    for address in dask_test_cluster(tmp_path_factory):
        yield Runner(tmp_path_factory.mktemp("post-processing"), address)


def _same_draw_keys(draws_d: dict, draws: dict) -> None:
    assert sorted(draws) == sorted(draws_d), "the runs drew other mechanisms"


@pytest.mark.parametrize("engine", ["direct", "dask"])
@pytest.mark.parametrize("plan", list(PLANS))
def test_release_on_other_data_is_byte_identical_when_draws_are_forced(
        runner, plan, engine):
    """Other rows, other class sizes, one row more, an outlier: with D's
    released values forced, D's release byte for byte."""
    out_d, draws_d = runner.on_d(plan)
    out, draws = runner.forced(plan, "other", engine)
    _same_draw_keys(draws_d, draws)
    moved = [k for k in draws if not np.array_equal(draws[k][0],
                                                     draws_d[k][0])]
    assert moved, "the exact inputs did not change: the test proves nothing"
    assert_same_release(out_d, out)
    if plan in ADAPTIVE_MODE:
        doc = read_manifest(str(out))["adaptive_plan"]
        assert doc["mode"] == ADAPTIVE_MODE[plan]
        assert doc["class_matrices"] == ("spiked" if doc["mode"] == "per-class"
                                         else "raw")


def _isometric_norm(draws: dict, name: str, other: dict) -> float:
    """L2 norm of the change of mechanism ``name``'s exact input (a second
    moment is drawn as diagonal + off-diagonal, sensitivity stated for
    its isometric upper triangle: off-diagonal entries count sqrt(2))."""
    total = 0.0
    for key in draws:
        if key.split("#")[0] != name:
            continue
        weight = math.sqrt(2) if key.endswith("#off-diagonal") else 1.0
        diff = draws[key][0] - other[key][0]
        total += (weight * np.linalg.norm(diff)) ** 2
    return math.sqrt(total)


@pytest.mark.parametrize("plan, dataset, engine", [
    ("adaptive-shared", "added", "direct"),
    ("adaptive-subspace", "removed", "dask"),
    ("adaptive-per-class", "added", "direct"),
    ("adaptive-per-class", "removed", "dask"),
    ("kmeans-vote", "added", "direct"),
    ("kmeans-vote", "removed", "dask"),
    ("fixed-per-class", "removed", "direct"),
])
def test_neighbour_moves_each_exact_input_by_at_most_its_sensitivity(
        runner, plan, dataset, engine):
    """D' = D with one record added or removed, every release forced to
    D's: the same bytes, and each mechanism's exact input within its L2
    sensitivity of D's (a later mechanism whose rows were picked by exact
    data, e.g. by centres from exact sums, moves further)."""
    out_d, draws_d = runner.on_d(plan)
    out, draws = runner.forced(plan, dataset, engine)
    _same_draw_keys(draws_d, draws)
    assert_same_release(out_d, out)
    mechanisms = read_manifest(str(out_d))["privacy"]["mechanisms"]
    assert {k.split("#")[0] for k in draws} <= {m["name"] for m in mechanisms}
    over = [f"{m['name']}: moved {moved:.4g} > sensitivity "
            f"{m['sensitivity']:g}" for m in mechanisms
            if (moved := _isometric_norm(draws, m["name"], draws_d))
            > m["sensitivity"] * (1 + 1e-12)]
    assert not over, "exact inputs moved past their sensitivity between " \
        "neighbours: " + "; ".join(over)
