"""Staging, atomic publication and reading of a release.

Layout of a published release at ``--output``::

    <output>/_manifest.json         the commit point: written last
    <output>/<version>/_gmm.npz     the files the manifest's "root" names
    <output>/<version>/_summary.json
    <output>/<version>/_schema.json
    <output>/<version>/data/...

Everything but the data shards starts with "_", which Parquet readers
(pyarrow, pandas, Spark) skip: ``pd.read_parquet(<output>)`` opens a
Parquet release's rows in one call. (Releases before format 3 named them
without "_"; readers here accept both.)

A run writes everything under a staging directory beside the output
(``<output>.staging-<run_id>``), then writes the staged manifest there: a
complete staged release. Publishing links (local) or copies (object
stores) the staged files into a fresh version folder ``<output>/<version>``
(``version`` is random, fixed when the run is planned) and then writes
``<output>/_manifest.json``, which names that folder, as one atomic write
(local: temp file + rename; GCS: one object). Before that write nothing
under ``--output`` is a release: ``read_manifest`` / ``load_release`` read
only what the manifest names, and a version folder without a manifest
naming it belongs to no release. Publishing the same staged release again
(a retry after a crash) writes identical bytes into the same version folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import numpy as np


def _import_filesystems():
    """Beam's FileSystems, without the root-logger warning Beam prints while
    its GCP modules load ("apitools not found"): a reader of a release (a
    notebook, a training script) should see nothing but its data."""
    import logging
    root = logging.getLogger()
    quiet = not root.handlers  # nobody configured logging: Python would
    level = root.level         # print WARNINGs through its last resort
    if quiet:
        root.setLevel(logging.ERROR)
    try:
        from apache_beam.io.filesystems import FileSystems
        return FileSystems
    finally:
        if quiet:
            root.setLevel(level)


FileSystems = _import_filesystems()

from dpsynth.pipelines.machine import usable_cores  # noqa: E402
from dpsynth.transforms import io  # noqa: E402  (after the quiet Beam import)

MANIFEST = "_manifest.json"
LEGACY_MANIFEST = "manifest.json"  # format 2 and older
VERSION_PREFIX = "v-"  # version folders: v-<random hex>


class ReleaseError(RuntimeError):
    pass


def is_local(path: str) -> bool:
    return "://" not in path


def staging_dir(output: str, run_id: str, owner: str) -> str:
    """One launch's own staging folder (``owner``: its random token), so
    two launches of one run id never write into the same files."""
    return f"{staging_prefix(output, run_id)}{owner}"


def staging_prefix(output: str, run_id: str) -> str:
    # '@' is not allowed in run ids: run "a" never matches run "a-b".
    return f"{output.rstrip('/')}.staging-{run_id}@"


def staging_folders(output: str, run_id: str) -> dict[str, str]:
    """owner token -> staging folder, for every staging folder of the run
    id beside ``output`` (complete or not)."""
    prefix = staging_prefix(output, run_id)
    if is_local(prefix):
        folder = os.path.dirname(prefix) or "."
        base = os.path.basename(prefix)
        names = os.listdir(folder) if os.path.isdir(folder) else []
        return {n[len(base):]: os.path.join(os.path.dirname(prefix), n)
                for n in names if n.startswith(base)
                and os.path.isdir(os.path.join(folder, n))}
    found = FileSystems.match([prefix + "**"])[0].metadata_list
    out = {}
    for m in found:
        token = m.path[len(prefix):].split("/", 1)[0]
        out[token] = prefix + token
    return out


def manifest_digest(folder: str) -> str:
    """sha256 of the bytes of ``folder``'s manifest."""
    with FileSystems.open(_manifest_file(folder) or manifest_path(folder)) as f:
        return hashlib.sha256(f.read()).hexdigest()


def manifest_path(release: str) -> str:
    return io.join(release, MANIFEST)


def _manifest_file(release: str) -> Optional[str]:
    """The release's manifest: this format's, or an older release's."""
    for name in (MANIFEST, LEGACY_MANIFEST):
        path = io.join(release, name)
        if FileSystems.exists(path):
            return path
    return None


def release_exists(output: str) -> bool:
    return _manifest_file(output) is not None


def read_manifest(release: str) -> dict:
    path = _manifest_file(release)
    if path is None:
        raise ReleaseError(f"{release}: no {MANIFEST}; not a complete release")
    with FileSystems.open(path) as f:
        return json.loads(f.read().decode())


def release_root(release: str, manifest: Optional[dict] = None) -> str:
    """The folder holding a release's files (its version folder)."""
    manifest = read_manifest(release) if manifest is None else manifest
    root = manifest.get("root")
    return io.join(release, root) if root else release


def write_manifest(folder: str, manifest: dict) -> None:
    """Writes ``folder/_manifest.json`` in one atomic step."""
    data = json.dumps(manifest, indent=1, sort_keys=True).encode()
    path = manifest_path(folder)
    if not is_local(path):  # one object write: atomic on GCS
        with FileSystems.create(path) as f:
            f.write(data)
        return
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".manifest-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def check_output(output: str, overwrite: bool) -> None:
    """Refuse (before any data is read) to clobber an existing release."""
    if release_exists(output) and not overwrite:
        raise ReleaseError(f"--output {output} already holds a release; pass "
                           f"--overwrite to replace it")
    if is_local(output) and os.path.exists(output) and not release_exists(output):
        # Version folders without a manifest: a crashed publish (no release).
        leftovers = os.path.isdir(output) and all(
            e.startswith(VERSION_PREFIX) and os.path.isdir(
                os.path.join(output, e)) for e in os.listdir(output))
        if not leftovers:
            raise ReleaseError(f"--output {output} exists and is not a release; "
                               f"choose an empty or new path")


def staged_manifest(staging: str) -> Optional[dict]:
    """The manifest of a complete staged release, or None (nothing staged,
    or a crashed run's partial files)."""
    try:
        return read_manifest(staging)
    except ReleaseError:
        return None


def _list(prefix: str) -> list[str]:
    if is_local(prefix):
        out = []
        for folder, _, files in os.walk(prefix):
            out += [os.path.join(folder, f) for f in files]
        return sorted(out)
    result = FileSystems.match([prefix.rstrip("/") + "/**"])[0]
    return sorted(m.path for m in result.metadata_list)


def publish(staging: str, output: str, overwrite: bool = False) -> dict:
    """Publishes a complete staged release at ``output``; returns its
    manifest. Safe to repeat after a crash (same bytes, same folder)."""
    manifest = staged_manifest(staging)
    if manifest is None:
        raise ReleaseError(f"{staging}: staging has no manifest; not publishing")
    if release_exists(output):
        current = read_manifest(output)
        if current.get("root") == manifest["root"]:
            return manifest  # this staged release is already the published one
        if current.get("run_id") == manifest.get("run_id"):
            raise ReleaseError(
                f"--output {output} already holds a release of run "
                f"{manifest.get('run_id')!r} (another launch published it); "
                "one run id has one release: not replacing it with a second "
                "draw, even with --overwrite")
        if not overwrite:
            raise ReleaseError(f"--output {output} already holds a release")
    root = io.join(output, manifest["root"])
    prefix = staging.rstrip("/") + "/"
    files = [p for p in _list(staging) if p != manifest_path(staging)]
    _place(files, [io.join(root, p[len(prefix):]) for p in files])
    write_manifest(output, manifest)  # the commit point
    return manifest


def _place(sources: list[str], targets: list[str]) -> None:
    """Hard links locally (no copy, staging stays intact for a retry),
    object copies elsewhere."""
    if not sources:
        return
    if not is_local(sources[0]):
        FileSystems.copy(sources, targets)
        return
    for src, dst in zip(sources, targets):
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if os.path.exists(dst):
            os.unlink(dst)
        try:
            os.link(src, dst)
        except OSError:  # another filesystem: copy
            shutil.copyfile(src, dst)


def remove_unreferenced(output: str) -> None:
    """Deletes version folders the published manifest does not name (an
    overwritten release, a crashed attempt's partial copy)."""
    manifest = read_manifest(output)
    keep = io.join(output, manifest["root"]).rstrip("/") + "/"
    stale = [p for p in _list(output)
             if p != manifest_path(output) and not p.startswith(keep)]
    legacy = io.join(output, LEGACY_MANIFEST)
    if is_local(output) and os.path.exists(legacy):
        os.unlink(legacy)  # an older release this one replaced
    if is_local(output):
        for entry in os.listdir(output):
            path = os.path.join(output, entry)
            if os.path.isdir(path) and path + "/" != keep:
                shutil.rmtree(path, ignore_errors=True)
    elif stale:
        FileSystems.delete(stale)


def discard(staging: str) -> None:
    """Best-effort removal of a staging directory."""
    try:
        if is_local(staging):
            shutil.rmtree(staging, ignore_errors=True)
        else:
            stale = _list(staging)
            if stale:
                FileSystems.delete(stale)
    except Exception:  # cleanup must not hide the original error
        pass


def release_files(path: str, manifest: Optional[dict] = None) -> list[str]:
    """The data shard paths of a published release, class by class."""
    manifest = read_manifest(path) if manifest is None else manifest
    root = release_root(path, manifest)
    return [io.join(root, "data", name)
            for c in manifest["classes"] for name in c["shards"]]


# Rows per block when a release is read whole: the pipeline's 4,096 makes a
# Python round per 6 MB of a 1M x 384 release (a 16,384-row block is 25 MB
# of float32 rows as read, 50 MB in the tuple form's float64).
_READ_BLOCK_ROWS = 16384


def release_blocks(path: str, manifest: dict):
    """(file, x, y) blocks of a release's data shards, in either output
    format (the manifest's ``outputs``; older releases: TFRecord)."""
    read = _shard_reader(manifest)
    for f in release_files(path, manifest):
        for x, y in read(f):
            yield f, x, y


def _shard_reader(manifest: dict):
    """shard path -> its (x, y) blocks (x as the shards store it: float32),
    as the release's manifest names its format and features."""
    outputs = manifest.get("outputs", {})
    features = outputs.get("features") or {}
    role = {f.get("role"): name for name, f in features.items()}

    def read(shard: str):
        spec = io.InputSpec(shard,
                            io.detect_format(shard, outputs.get("format")),
                            role.get("embedding", "embedding"),
                            role.get("label", "label"),
                            block_size=_READ_BLOCK_ROWS)
        for x, y, _ in io.read_file_blocks(shard, spec):
            yield x, y
    return read


def _all_blocks(path: str, manifest: dict, dtype: type
                ) -> tuple[list, list]:
    """Every block of the release as (x as ``dtype``, y) lists, in the
    files' order. The shards are read on as many threads as there are
    usable cores (Arrow's decoding and numpy's conversions release the
    GIL); they hold float32, which the reader hands over as it is."""
    blocks_of = _shard_reader(manifest)

    def read(shard: str) -> list:
        return [(x.astype(dtype, copy=False), y) for x, y in blocks_of(shard)]
    with ThreadPoolExecutor(usable_cores()) as pool:
        blocks = [b for shard in pool.map(read, release_files(path, manifest))
                  for b in shard]
    return [b[0] for b in blocks], [b[1] for b in blocks]


LOAD_AS = ("tuple", "numpy", "pandas", "tf")


def load_release(path: str, as_: str = "tuple", shuffle: bool = True,
                 seed: int = 0):
    """A published release (refuses incomplete ones), read through its
    manifest.

    ``as_``: "tuple" (default) -> (x, y, manifest) in file order (shards
    hold one class each); "numpy" -> (x, y) float32 / int64, rows
    shuffled; "pandas" -> a DataFrame with an ``embedding`` column (float32
    arrays) and a ``label`` column, rows shuffled; "tf" -> a shuffled
    ``tf.data.Dataset`` of (embedding, label). Shuffling matters: training
    on the files in order gives single-class batches. ``seed`` makes the
    order reproducible (the order is public: it is not data).
    """
    if as_ not in LOAD_AS:
        raise ValueError(f"as_ must be one of {LOAD_AS}, got {as_!r}")
    manifest = read_manifest(path)
    dim = manifest.get("embedding_dim", 0)
    if as_ == "tuple":
        xs, ys = _all_blocks(path, manifest, np.float64)
        x = np.concatenate(xs) if xs else np.zeros((0, dim))
        y = np.concatenate(ys) if ys else np.zeros(0, np.int64)
        return x, y, manifest
    x, y = _in_order(*_all_blocks(path, manifest, np.float32), dim, shuffle,
                     seed)
    if as_ == "numpy":
        return x, y
    if as_ == "pandas":
        import pandas as pd  # a base dependency; imported late (~0.5 s)
        return pd.DataFrame({"embedding": list(x), "label": y})
    return _tensorflow().data.Dataset.from_tensor_slices((x, y))


def _tensorflow():
    """TensorFlow (the ``tf`` extra, ~2 GB), or one line saying how to get
    it."""
    try:
        import tensorflow as tf
    except ImportError:
        raise ImportError("load_release(as_='tf') needs TensorFlow: "
                          "pip install 'dpsynth[tf]'") from None
    return tf


def _in_order(xs: list, ys: list, dim: int, shuffle: bool, seed: int
              ) -> tuple[np.ndarray, np.ndarray]:
    """The blocks as one float32 x and int64 y, rows in the seeded random
    order (the files' order without ``shuffle``). Each block's rows go
    straight to their places and the block is dropped: the release is held
    once beside its blocks (a 1M x 384 release: ~3 GB at most), not stacked
    in float64 and then gathered (~10 GB, 33 s here)."""
    n = sum(len(y) for y in ys)
    dim = xs[0].shape[1] if xs else dim  # the files' own width
    order = (np.random.default_rng(seed).permutation(n) if shuffle
             else np.arange(n))
    place = np.empty(n, np.int64)
    place[order] = np.arange(n)  # row i of the files goes to place[i]
    x, y = np.empty((n, dim), np.float32), np.empty(n, np.int64)
    start = 0
    xs.reverse()  # pop() from the end: the files' order
    ys.reverse()
    while xs:
        xb, yb = xs.pop(), ys.pop()
        rows = place[start:start + len(yb)]
        x[rows], y[rows] = xb, yb
        start += len(yb)
    return x, y


def load_gmm(path: str):
    from dpsynth.models.gmm import MixtureRelease
    manifest = read_manifest(path)
    root = release_root(path, manifest)
    name = manifest.get("outputs", {}).get("gmm", "gmm.npz")
    with FileSystems.open(io.join(root, name)) as f:
        return MixtureRelease.from_npz(f.read())


def versions() -> dict:
    from importlib import metadata
    out = {}
    for pkg in ("dpsynth", "apache-beam", "dp-accounting", "numpy",
                "tensorflow", "scikit-learn"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out
