"""A crash at every step of stage -> commit -> publish, then a retry of the
same run id (as the nightly DAG's retries do): the lifetime ledger never
undercounts what became readable.

Invariant, checked from the files and the ledger alone: every distinct
release whose bytes ever appeared under --output (each attempt that draws
noise writes a fresh version folder) is covered by a charged attempt in the
budget store, so the ledger's composed spend >= the composition of those
releases; bytes under --output never change once visible; the retry ends
with one readable, self-consistent, recorded release.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from dpsynth.pipelines import cli
from dpsynth.pipelines.release import protocol
from dpsynth.pipelines.budget import store as budget_store
from dpsynth.pipelines.release import consistency, publisher, reading, release
from tests.conftest import gmm_data

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gcs_emulator import gcs, gcs_server  # noqa: E402,F401  (fixtures)

STEPS = ["reserved", "running", "pipeline-done", "staged", "committed",
         "mid-publish", "published", "recorded"]
DELTA = 1e-5


class Crash(RuntimeError):
    pass


def _crash_at(monkeypatch, step: str) -> None:
    if step == "mid-publish":  # the first file lands, then the crash
        real = publisher._place

        def place(sources, targets):
            real(sources[:1], targets[:1])
            raise Crash("crash while placing the release's files")
        monkeypatch.setattr(publisher, "_place", place)
        return

    def checkpoint(name):
        if name == step:
            raise Crash(f"crash at {step}")
    monkeypatch.setattr(protocol, "checkpoint", checkpoint)


def _visible(output: str) -> dict[str, str]:
    """Every file under --output -> sha256 of its bytes."""
    from apache_beam.io.filesystems import FileSystems
    if release.is_local(output):
        paths = [str(p) for p in Path(output).rglob("*") if p.is_file()] \
            if os.path.exists(output) else []
    else:
        found = FileSystems.match([output.rstrip("/") + "/**"])[0]
        paths = [m.path for m in found.metadata_list]
    out = {}
    for path in paths:
        with FileSystems.open(path) as f:
            out[path[len(output.rstrip("/")) + 1:]] = hashlib.sha256(
                f.read()).hexdigest()
    return out


def _versions(snapshot: dict[str, str]) -> set[str]:
    return {p.split("/", 1)[0] for p in snapshot if p.startswith("v-")}


def _run(data: Path, output: str, store: str) -> int:
    return cli.main(["generate", "--input", str(data), "--output", output,
                     "--num-classes", "2", "--epsilon", "1", "--accountant",
                     "rdp", "--run-id", "nightly-1", "--budget-store", store,
                     "--dataset-id", "patients", "--lifetime-epsilon", "100"])


def _crash_then_retry(monkeypatch, tmp_path, output: str, store: str,
                      step: str) -> None:
    x, y = gmm_data(240, d=4, classes=2)
    data = tmp_path / "in.npz"
    np.savez(data, embeddings=x, labels=y)
    with monkeypatch.context() as patch:
        _crash_at(patch, step)
        with pytest.raises(Crash):
            _run(data, output, store)
        after_crash = _visible(output)
    assert _run(data, output, store) == 0  # the retry, no crash
    after_retry = _visible(output)

    # Bytes under --output never change once visible.
    for path in set(after_crash) & set(after_retry):
        assert after_crash[path] == after_retry[path], path
    # Every release that was ever visible is charged.
    visible = _versions(after_crash) | _versions(after_retry)
    attempts = budget_store.history(store, "patients")
    assert len(attempts) >= len(visible) >= 1
    manifest = release.read_manifest(output)
    one = {"mechanisms": manifest["privacy"]["mechanisms"]}
    covered = budget_store._compose([one] * len(visible), DELTA, "rdp")
    assert budget_store.lifetime_spent(store, "patients", DELTA, "rdp") \
        >= covered * (1 - 1e-9)
    # One readable, recorded, self-consistent release.
    assert attempts[-1]["status"] == budget_store.PUBLISHED
    assert _versions(after_retry) == {manifest["root"]}
    root = release.release_root(output, manifest)
    x_rel, _, _ = reading.load_release(output)
    assert len(x_rel) == manifest["samples_total"]
    from dpsynth.dp_ops.config import GeneratorConfig
    conf = dict(manifest["config"], labels=tuple(manifest["config"]["labels"]))
    consistency.check_staged(root, GeneratorConfig(**conf),
                             manifest["classes"], manifest["embedding_dim"])
    assert release.staging_folders(output, "nightly-1") == {}


@pytest.mark.parametrize("step", STEPS)
def test_local_crash_then_retry_never_undercounts(monkeypatch, tmp_path, step):
    _crash_then_retry(monkeypatch, tmp_path, str(tmp_path / "out"),
                      str(tmp_path / "budgets"), step)


@pytest.mark.parametrize("step", ["committed", "mid-publish", "published"])
def test_gcs_crash_then_retry_never_undercounts(monkeypatch, tmp_path, gcs,
                                                step):
    _crash_then_retry(monkeypatch, tmp_path, gcs.uri("releases/out"),
                      gcs.uri("budgets"), step)


def test_a_staged_release_is_republished_byte_for_byte(monkeypatch, tmp_path):
    """The retry after a crash past staging publishes the staged files (no
    new noise) and charges nothing new."""
    x, y = gmm_data(240, d=4, classes=2)
    data, out, store = tmp_path / "in.npz", str(tmp_path / "out"), \
        str(tmp_path / "b")
    np.savez(data, embeddings=x, labels=y)
    with monkeypatch.context() as patch:
        _crash_at(patch, "committed")
        with pytest.raises(Crash):
            _run(data, out, store)
    (folder,) = release.staging_folders(out, "nightly-1").values()
    staged = release.staged_manifest(folder)
    assert staged is not None
    assert _run(data, out, store) == 0
    assert release.read_manifest(out) == staged
    assert len(budget_store.history(store, "patients")) == 1
