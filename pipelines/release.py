"""Atomic publication and reading of a release directory.

A run writes everything under a staging directory next to the output and
publishes it last. Locally the publish is one ``rename`` (atomic). On object
stores (gs://) there is no rename: data objects are copied first and
``manifest.json`` last, so a release is *readable* only once its manifest
exists; ``load_release`` refuses a prefix without one.
"""

from __future__ import annotations

import json
import os
import shutil
import time

import numpy as np
from apache_beam.io.filesystems import FileSystems

from transforms import io

MANIFEST = "manifest.json"


class ReleaseError(RuntimeError):
    pass


def is_local(path: str) -> bool:
    return "://" not in path


def staging_dir(output: str, run_id: str) -> str:
    return f"{output.rstrip('/')}.staging-{run_id}"


def manifest_path(release: str) -> str:
    return io.join(release, MANIFEST)


def release_exists(output: str) -> bool:
    return FileSystems.exists(manifest_path(output))


def read_manifest(release: str) -> dict:
    path = manifest_path(release)
    if not FileSystems.exists(path):
        raise ReleaseError(f"{release}: no {MANIFEST}; not a complete release")
    with FileSystems.open(path) as f:
        return json.loads(f.read().decode())


def write_manifest(staging: str, manifest: dict) -> None:
    with FileSystems.create(manifest_path(staging)) as f:
        f.write(json.dumps(manifest, indent=1, sort_keys=True).encode())


def check_output(output: str, overwrite: bool) -> None:
    """Refuse (before any data is read) to clobber an existing release."""
    if release_exists(output) and not overwrite:
        raise ReleaseError(f"--output {output} already holds a release; pass "
                           f"--overwrite to replace it")
    if is_local(output) and os.path.exists(output) and not release_exists(output):
        if os.path.isfile(output) or os.listdir(output):
            raise ReleaseError(f"--output {output} exists and is not a release; "
                               f"choose an empty or new path")


def check_staging(staging: str) -> None:
    """Refuse to reuse a staging directory: stale files from a crashed run
    with the same --run-id would otherwise end up in the new release."""
    exists = (os.path.exists(staging) if is_local(staging)
              else bool(_list(staging)))
    if exists:
        raise ReleaseError(f"staging directory {staging} already exists (left "
                           f"by a crashed run with the same --run-id?); "
                           f"remove it or choose another --run-id")


def _list(prefix: str) -> list[str]:
    result = FileSystems.match([prefix.rstrip("/") + "/**"])[0]
    return sorted(m.path for m in result.metadata_list)


def publish(staging: str, output: str, overwrite: bool = False) -> None:
    """Moves a complete staging directory (manifest included) to ``output``."""
    if not release_exists(staging):
        raise ReleaseError(f"{staging}: staging has no manifest; not publishing")
    if is_local(output):
        _publish_local(staging, output, overwrite)
    else:
        _publish_remote(staging, output, overwrite)


def _publish_local(staging: str, output: str, overwrite: bool) -> None:
    old = None
    if os.path.exists(output):
        if release_exists(output) and not overwrite:
            raise ReleaseError(f"--output {output} already holds a release")
        old = f"{output.rstrip('/')}.replaced-{int(time.time() * 1e3)}"
        os.rename(output, old)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
        os.rename(staging, output)
    except BaseException:
        if old:  # put the previous release back
            os.rename(old, output)
        raise
    if old:
        shutil.rmtree(old, ignore_errors=True)


def _publish_remote(staging: str, output: str, overwrite: bool) -> None:
    if release_exists(output):
        if not overwrite:
            raise ReleaseError(f"--output {output} already holds a release")
        FileSystems.delete([manifest_path(output)])  # unreadable from now on
    # No manifest here now: whatever is under the prefix (an old release's
    # or a crashed publish's objects) is not part of any release.
    stale = _list(output)
    if stale:
        FileSystems.delete(stale)
    src = _list(staging)
    manifest = manifest_path(staging)
    data = [p for p in src if p != manifest]
    rel = [p[len(staging.rstrip("/")) + 1:] for p in data]
    if data:
        FileSystems.copy(data, [io.join(output, r) for r in rel])
    FileSystems.copy([manifest], [manifest_path(output)])  # commit point
    FileSystems.delete(src)


def discard(staging: str) -> None:
    """Best-effort removal of a failed run's staging directory."""
    try:
        if is_local(staging):
            shutil.rmtree(staging, ignore_errors=True)
        elif FileSystems.exists(staging) or _list(staging):
            FileSystems.delete(_list(staging))
    except Exception:  # cleanup must not hide the original error
        pass


def release_blocks(path: str, manifest: dict):
    """(file, x, y) blocks of a release's data shards, in either output
    format (the manifest's ``outputs``; older releases: TFRecord)."""
    outputs = manifest.get("outputs", {})
    features = outputs.get("features") or {}
    role = {f.get("role"): name for name, f in features.items()}
    for c in manifest["classes"]:
        for name in c["shards"]:
            f = io.join(path, "data", name)
            spec = io.InputSpec(f, io.detect_format(f, outputs.get("format")),
                                role.get("embedding", "embedding"),
                                role.get("label", "label"))
            for x, y, _ in io.read_file_blocks(f, spec):
                yield f, x, y


def load_release(path: str) -> tuple[np.ndarray, np.ndarray, dict]:
    """(x, y, manifest) of a published release; refuses incomplete ones."""
    manifest = read_manifest(path)
    xs, ys = [], []
    for _, x, y in release_blocks(path, manifest):
        xs.append(x)
        ys.append(y)
    dim = manifest.get("embedding_dim", 0)
    if not xs:
        return np.zeros((0, dim)), np.zeros(0, np.int64), manifest
    return np.vstack(xs), np.concatenate(ys), manifest


def load_gmm(path: str):
    from models.gmm import MixtureRelease
    read_manifest(path)
    with FileSystems.open(io.join(path, "gmm.npz")) as f:
        return MixtureRelease.from_npz(f.read())


def versions() -> dict:
    from importlib import metadata
    out = {}
    for pkg in ("dpsynth", "apache-beam", "pipeline-dp", "dp-accounting",
                "numpy", "tensorflow", "scikit-learn"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out
