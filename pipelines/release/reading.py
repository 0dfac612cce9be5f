"""Reading a published release: ``load_release`` (each file checked
against its manifest as it is read), ``load_latest`` (``LATEST.json``,
optionally checked against the budget store), ``verify_release`` and the
mixture (``load_gmm``). Only what the manifest names is read; a reader
imports nothing of the publisher (``publisher``).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import numpy as np

from dpsynth.pipelines.release.release import (LATEST, FileSystems,
                                               ReleaseChanged, ReleaseError,
                                               read_manifest, release_root,
                                               verify_files)
from dpsynth.pipelines.runners.cores import usable_cores
from dpsynth.transforms import io


def verify_release(path: str, manifest: Optional[dict] = None,
                   require_files: bool = False) -> dict:
    """Checks a published release's files against its manifest (sizes and
    sha256; nothing missing or added); returns the manifest. Releases made
    before manifests listed their files cannot be checked: refused with
    ``require_files`` (a release this dpsynth just made always lists them,
    so a missing list means a rewritten manifest), else returned with a
    warning."""
    manifest = read_manifest(path) if manifest is None else manifest
    if "files" in manifest or require_files:
        verify_files(release_root(path, manifest), manifest)
    else:
        warnings.warn(f"{path}: its manifest lists no file digests (made "
                      "before dpsynth recorded them, or rewritten): its files "
                      "are read unchecked", stacklevel=2)
    return manifest


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

    def read(shard: str, data: Optional[bytes] = None):
        """``data``: the shard's bytes as checked, parsed instead of the
        file (``_checked_bytes``)."""
        spec = io.InputSpec(shard,
                            io.detect_format(shard, outputs.get("format")),
                            role.get("embedding", "embedding"),
                            role.get("label", "label"),
                            block_size=_READ_BLOCK_ROWS)
        for x, y, _ in io.read_file_blocks(shard, spec, data=data):
            yield x, y
    return read


def _all_blocks(path: str, manifest: dict, dtype: type,
                checked: bool = False) -> tuple[list, list]:
    """Every block of the release as (x as ``dtype``, y) lists, in the
    files' order. The shards are read on as many threads as there are
    usable cores (Arrow's decoding and numpy's conversions release the
    GIL); they hold float32, which the reader hands over as it is.
    ``checked``: each shard is read once and the bytes parsed are the bytes
    checked against the manifest (``_checked_bytes``)."""
    blocks_of = _shard_reader(manifest)
    root = release_root(path, manifest)

    def read(shard: str) -> list:
        if not checked:
            return [(x.astype(dtype, copy=False), y)
                    for x, y in blocks_of(shard)]
        data = _checked_bytes(shard, root, manifest["files"])
        return [(x.astype(dtype, copy=False), y)
                for x, y in blocks_of(shard, data)]
    with ThreadPoolExecutor(usable_cores()) as pool:
        futures = [pool.submit(read, shard)
                   for shard in release_files(path, manifest)]
    errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:  # a changed file explains another shard's parse error
        raise next((e for e in errors if isinstance(e, ReleaseChanged)),
                   errors[0])
    blocks = [b for f in futures for b in f.result()]
    return [b[0] for b in blocks], [b[1] for b in blocks]


def _checked_bytes(shard: str, root: str, files: dict) -> bytes:
    """``shard``'s bytes, read once and checked against its manifest entry
    (size, sha256); the reader parses these very bytes (TFRecord and
    Parquet readers take them in memory), never the file again: hashing a
    file and then opening it again to parse it reads whatever is there by
    then (a shard swapped between the two reads was returned as the
    release). On gs:// too the bytes hashed are the bytes parsed,
    whichever generation they came from."""
    name = shard[len(root.rstrip("/")) + 1:]
    entry = files.get(name)
    with FileSystems.open(shard, compression_type="uncompressed") as f:
        data = f.read()
    if (not isinstance(entry, dict) or len(data) != entry.get("bytes")
            or hashlib.sha256(data).hexdigest() != entry.get("sha256")):
        raise ReleaseChanged(f"{root}: {name} differs (sha256) as read: its "
                             "files are not the ones its manifest lists")
    return data


def _verify_for_reading(path: str, manifest: dict) -> bool:
    """``verify_release`` less the shards' contents, which the reader
    checks on the very bytes it parses; returns whether it will (False: a
    release made before manifests listed files, read unchecked with a
    warning)."""
    if "files" not in manifest:
        verify_release(path, manifest)  # warns
        return False
    root = release_root(path, manifest)
    verify_files(root, manifest, contents=False)  # none missing or added
    shards = {f"data/{name}" for c in manifest["classes"]
              for name in c["shards"]}
    others = [n for n in manifest["files"] if n not in shards]
    if others:
        verify_files(root, manifest, names=others)
    return True


LOAD_AS = ("tuple", "numpy", "pandas", "tf")


def load_release(path: str, as_: str = "tuple", shuffle: bool = True,
                 seed: int = 0, verify: bool = True,
                 manifest_sha256: Optional[str] = None):
    """A published release (refuses incomplete ones), read through its
    manifest.

    ``as_``: "tuple" (default) -> (x, y, manifest) in file order (shards
    hold one class each); "numpy" -> (x, y) float32 / int64, rows
    shuffled; "pandas" -> a DataFrame with an ``embedding`` column (float32
    arrays) and a ``label`` column, rows shuffled; "tf" -> a shuffled
    ``tf.data.Dataset`` of (embedding, label). Shuffling matters: training
    on the files in order gives single-class batches. ``seed`` makes the
    order reproducible (the order is public: it is not data).
    ``verify`` (default): check every file against the sizes and sha256
    digests the manifest lists, each shard on the very bytes parsed (read
    once), so a swapped, truncated or missing file raises
    ``ReleaseChanged`` instead of being read as the release, also when it
    is swapped while being read.
    ``manifest_sha256``: read only the release whose manifest has this
    digest (``LATEST.json`` carries the verified one; ``load_latest``), else
    ``ReleaseChanged``: a path alone names whatever was published there last.
    """
    if as_ not in LOAD_AS:
        raise ValueError(f"as_ must be one of {LOAD_AS}, got {as_!r}")
    manifest = read_manifest(path, manifest_sha256)
    checked = verify and _verify_for_reading(path, manifest)
    dim = manifest.get("embedding_dim", 0)
    if as_ == "tuple":
        xs, ys = _all_blocks(path, manifest, np.float64, checked)
        x = np.concatenate(xs) if xs else np.zeros((0, dim))
        y = np.concatenate(ys) if ys else np.zeros(0, np.int64)
        return x, y, manifest
    x, y = _in_order(*_all_blocks(path, manifest, np.float32, checked), dim,
                     shuffle, seed)
    if as_ == "numpy":
        return x, y
    if as_ == "pandas":
        import pandas as pd  # a base dependency; imported late (~0.5 s)
        return pd.DataFrame({"embedding": list(x), "label": y})
    return _tensorflow().data.Dataset.from_tensor_slices((x, y))


def load_latest(output_root: str, budget_store: Optional[str] = None,
                dataset_id: Optional[str] = None, **kwargs):
    """The release ``output_root/LATEST.json`` points at (written by
    ``deploy/publish.py`` after verifying it), read with ``load_release``
    (``kwargs``: its options) pinned to the manifest digest recorded there,
    so a folder re-published since (``--overwrite``) is refused, not read
    as the verified release. A ``LATEST.json`` without the digest (older
    dpsynth) is refused too: the next publish writes it.

    ``budget_store`` and ``dataset_id`` (the reader's, never LATEST.json's
    own claim): the pinned digest must be the manifest the store recorded
    for LATEST's run, else ``ReleaseChanged``; LATEST.json itself lies
    where anyone who writes under ``output_root`` can point it at a
    self-consistent copy. Without them the reader is promised only that
    the release is the one LATEST.json pins, unchanged since
    (docs/threat-model.md)."""
    where = io.join(output_root, LATEST)
    with FileSystems.open(where) as f:
        data = f.read()
    try:
        latest = json.loads(data.decode())
    except ValueError:  # also UnicodeDecodeError
        latest = None
    if not (isinstance(latest, dict)
            and isinstance(latest.get("release"), str)
            and isinstance(latest.get("manifest_sha256"), str)):
        raise ReleaseError(f"{where} names no release with its manifest_sha256"
                           " (written by an older dpsynth, or edited): re-run "
                           "dpsynth.deploy.publish")
    if budget_store is not None:
        _check_latest_recorded(where, latest, budget_store, dataset_id)
    # publish never points LATEST at a release that is not private
    # (--epsilon inf, --noise-seed); one named there was put there by hand.
    pinned = read_manifest(latest["release"], latest["manifest_sha256"])
    if pinned.get("private") is not True:
        raise ReleaseError(f"{where} names {latest['release']}, a release "
                           "that is NOT PRIVATE (its manifest does not say "
                           "private: made with --epsilon inf or --noise-seed);"
                           " LATEST never names one: not reading it")
    if budget_store is not None and pinned.get("run_id") != latest.get(
            "run_id"):
        raise ReleaseChanged(f"{where} names run {latest.get('run_id')!r}, "
                             f"but {latest['release']} holds run "
                             f"{pinned.get('run_id')!r}: not reading it")
    return load_release(latest["release"],
                        manifest_sha256=latest["manifest_sha256"], **kwargs)


def _check_latest_recorded(where: str, latest: dict, store: str,
                           dataset_id: Optional[str]) -> None:
    """LATEST's pinned digest must be the manifest ``store`` recorded for
    its run (staged or published)."""
    from dpsynth.pipelines.budget import store as budget_store
    if not dataset_id:
        raise ValueError("load_latest: budget_store needs dataset_id")
    run_id = latest.get("run_id")
    recorded = (budget_store.recorded_manifest(store, dataset_id, run_id)
                if isinstance(run_id, str) else None)
    if recorded != latest["manifest_sha256"]:
        raise ReleaseChanged(
            f"{where} pins a manifest (sha256 "
            f"{latest['manifest_sha256'][:12]}...) that budget store {store} "
            f"(dataset {dataset_id!r}) never recorded for run {run_id!r}: "
            "LATEST.json was pointed elsewhere; not reading it")


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
        data = f.read()
    listed = manifest.get("files", {}).get(name)
    if listed and hashlib.sha256(data).hexdigest() != listed.get("sha256"):
        raise ReleaseChanged(f"{io.join(root, name)} differs (sha256) from "
                             "the file its manifest lists")
    return MixtureRelease.from_npz(data)
