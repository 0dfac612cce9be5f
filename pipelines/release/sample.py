"""`dpsynth sample`: more synthetic rows from a published release's mixture.

Everything in a release's ``_gmm.npz`` is DP output, so drawing rows from it
is post-processing: no privacy cost, no budget store, no private data read.
The new rows are written as a release of their own (same format, features
and normalisation as the source), published atomically like any release,
with a manifest that says ``"post_processing": true`` and names the source
release (its run id and the sha256 of its manifest).

``--rows N`` is the total: the classes share it in proportion to their
released noisy counts (negative counts as 0; classes with no mixture mass
get none), so the class balance of the source release is kept. The source
release drew its rows with ``config.seed`` (0 unless set); ``--seed``
(default 1) gives other rows from the same mixture.

Releases made with ``--vote-filter`` are refused: their rows are mixture
draws the DP vote selected, and plain draws would not match them.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import secrets
import sys
import time
from typing import Optional, Sequence

DESCRIPTION = (
    "Draw more synthetic rows from a published release's Gaussian mixture "
    "(post-processing: no privacy cost, nothing charged to a budget store). "
    "Writes a new release in the source's format whose manifest records "
    "post_processing: true and the source release.")

ROWS_PER_SHARD = 50_000  # as `dpsynth generate --rows-per-shard`'s default
# Rows a release may hold: what `generate` allows (--samples-per-class and
# --num-classes bounds). --rows 1e20 listed its shards until memory ran out.
MAX_SAMPLES_PER_CLASS = 10**9  # dp_ops.config.MAX_SAMPLES_PER_CLASS
MAX_ROWS = MAX_SAMPLES_PER_CLASS * 100_000  # x dp_ops.config.MAX_CLASSES


class SampleError(ValueError):
    """A bad flag or source release: one line, nothing written."""


@dataclasses.dataclass(frozen=True)
class SampleSpec:
    """One `dpsynth sample` job. ``rows``: total rows over all classes,
    shared in proportion to the source's noisy class counts."""

    release: str
    output: str
    rows: int
    seed: int = 1
    overwrite: bool = False
    rows_per_shard: int = ROWS_PER_SHARD

    def __post_init__(self) -> None:
        if self.rows < 1:
            raise SampleError(f"--rows must be >= 1, got {self.rows}")
        if self.rows > MAX_ROWS:
            raise SampleError(f"--rows must be at most {MAX_ROWS} (a release "
                              f"holds at most {MAX_SAMPLES_PER_CLASS} rows "
                              f"per class), got {self.rows}")
        if self.rows_per_shard < 1:
            raise SampleError("rows_per_shard must be >= 1")
        if self.seed < 0:
            raise SampleError(f"--seed must be >= 0, got {self.seed}")
        _check_apart(self.release, self.output)


def _check_apart(source: str, output: str) -> None:
    """--output must not be the source, lie inside it or hold it, in any
    spelling ('..', '//', file://, links, /proc/self/cwd) nor through
    another path to the same folder (a bind mount: compared by device and
    inode): publishing replaces what --output held (--overwrite deleted
    the source), and writing inside the source changes a published
    release."""
    from dpsynth.pipelines.release.release import lies_under
    if (lies_under(source, output) or lies_under(output, source)
            or _same_tree(source, output)):
        raise SampleError(
            f"--output {output} is the source release {source}, holds it or "
            "lies inside it (with '..', '/', links and mounts resolved); "
            "choose a path apart from it")


def _same_tree(source: str, output: str) -> bool:
    """Locally: whether one folder is the other or holds it, by (st_dev,
    st_ino), which a bind mount or any other second path to a folder
    shares while its spelling does not."""
    if not (_local(source) and _local(output)):
        return False
    source, output = (p.removeprefix("file://") for p in (source, output))
    src, out = _identity(source), _identity(output)
    return ((src is not None and src in _chain(output))
            or (out is not None and out in _chain(source)))


def _local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


def _identity(path: str) -> Optional[tuple[int, int]]:
    try:
        st = os.stat(path)
    except OSError:  # not there (yet): it cannot hold anything
        return None
    return st.st_dev, st.st_ino


def _chain(path: str) -> set[tuple[int, int]]:
    """The identities of ``path`` and of every existing folder above it,
    by its components."""
    path = os.path.abspath(path)
    ids = set()
    while True:
        found = _identity(path)
        if found is not None:
            ids.add(found)
        parent = os.path.dirname(path)
        if parent == path:
            return ids
        path = parent


# ------------------------------------------------------------ allocation

def class_rows(noisy_counts: dict[int, float], rows: int) -> dict[int, int]:
    """``rows`` shared by the classes in proportion to their noisy counts
    (negatives as 0), by largest remainder: the shares sum to ``rows``.
    Post-processing of DP counts."""
    weights = {label: max(float(c), 0.0) for label, c in noisy_counts.items()}
    total = sum(weights.values())
    if total <= 0:
        raise SampleError("no class of the release has rows to draw (every "
                          "noisy count is <= 0)")
    exact = {label: rows * w / total for label, w in weights.items()}
    out = {label: int(e) for label, e in exact.items()}
    by_remainder = sorted(exact, key=lambda l: (out[l] - exact[l], l))
    for label in by_remainder[:rows - sum(out.values())]:
        out[label] += 1
    return out


# ----------------------------------------------------------- the source

@dataclasses.dataclass(frozen=True)
class Source:
    """A verified source release: its manifest, mixture and file bytes."""

    path: str
    manifest: dict
    manifest_sha256: str
    gmm_bytes: bytes
    schema_bytes: Optional[bytes]
    mixtures: object  # models.gmm.MixtureRelease


def _read(path: str) -> bytes:
    from dpsynth.pipelines.release.release import FileSystems
    with FileSystems.open(path) as f:
        return f.read()


def read_source(path: str) -> Source:
    """The published release at ``path``, refused (``ReleaseError`` /
    ``SampleError``) when absent, unpublished, vote-filtered, or when its
    mixture does not match its manifest (wrong classes, noisy counts,
    width or covariance ranks: a swapped or damaged ``_gmm.npz``)."""
    from dpsynth.models.gmm import MixtureRelease
    from dpsynth.pipelines.release import publisher, reading, release
    from dpsynth.transforms import io
    if ".staging-" in path.rstrip("/").rsplit("/", 1)[-1]:
        raise SampleError(f"{path} is a run's staging folder, not a "
                          "published release")
    # The digest is of the very manifest bytes used (read once, pinned),
    # and the mixture is checked on the bytes read below: a release
    # replaced between the checks and the reads is refused, not sampled.
    release.read_manifest(path)  # none: not a (complete) release
    digest = release.manifest_digest(path)
    manifest = release.read_manifest(path, digest)
    reading.verify_release(path, manifest)  # its files are the manifest's
    if not str(manifest.get("format", "")).startswith("dpsynth-release/"):
        raise SampleError(f"{path}: not a dpsynth release (format "
                          f"{manifest.get('format')!r})")
    if manifest.get("config", {}).get("vote_filter"):
        raise SampleError(f"{path}: made with --vote-filter; its rows are "
                          "the mixture draws a DP vote selected, so plain "
                          "draws would not match them: not sampling")
    root = release.release_root(path, manifest)
    outputs = manifest.get("outputs", {})
    gmm_name = outputs.get("gmm", "gmm.npz")
    gmm_path = io.join(root, gmm_name)
    try:
        gmm_bytes = _read(gmm_path)
    except Exception as err:  # missing
        raise SampleError(f"{gmm_path}: unreadable mixture "
                          f"({type(err).__name__}: {err})") from None
    listed = manifest.get("files", {}).get(gmm_name, {}).get("sha256")
    if hashlib.sha256(gmm_bytes).hexdigest() != listed:
        raise SampleError(f"{gmm_path}: not the mixture its manifest lists "
                          "(sha256); the release changed: not sampling")
    try:
        mixtures = MixtureRelease.from_npz(gmm_bytes)
    except Exception as err:  # truncated, not an npz
        raise SampleError(f"{gmm_path}: unreadable mixture "
                          f"({type(err).__name__}: {err})") from None
    _check_mixture(path, manifest, mixtures)
    schema_name = outputs.get("schema")
    schema = None
    if schema_name:
        schema = _read(io.join(root, schema_name))
    return Source(path, manifest, digest, gmm_bytes, schema, mixtures)


def _check_mixture(path: str, manifest: dict, mixtures) -> None:
    """The mixture must be the one the manifest describes."""
    classes = {c["label"]: c for c in manifest.get("classes", [])}
    mixes = mixtures.mixtures
    if sorted(classes) != sorted(mixes):
        raise SampleError(f"{path}: the mixture's classes {sorted(mixes)} "
                          f"are not the manifest's {sorted(classes)}: the "
                          "release fails verification")
    dim = manifest.get("embedding_dim")
    for label, mix in mixes.items():
        entry = classes[label]
        rank = 0 if mix.factors is None else int(mix.factors.shape[1])
        if (mix.noisy_count != entry.get("noisy_count")
                or mix.means.shape[1] != dim
                or rank != entry.get("covariance_rank", rank)):
            raise SampleError(f"{path}: class {label}'s mixture does not "
                              "match the manifest (noisy count, width or "
                              "covariance rank): the release fails "
                              "verification")


def _sampling_config(manifest: dict, seed: int):
    """The source's generator configuration (its public ``config``) with
    the sampling seed: what ``generator.sample_rows`` draws with."""
    from dpsynth.dp_ops.config import GeneratorConfig
    config = dict(manifest["config"])
    config["labels"] = tuple(config["labels"])
    names = {f.name for f in dataclasses.fields(GeneratorConfig)}
    config = {k: v for k, v in config.items() if k in names}
    return dataclasses.replace(GeneratorConfig(**config), seed=seed)


# ------------------------------------------------------------- writing

def _write_class(staging: str, label: int, mix, cfg, total: int, fmt: str,
                 features: tuple[str, str], rows_per_shard: int,
                 files: dict) -> list[str]:
    """Draws the class's ``total`` rows shard by shard, a piece at a time
    (as the generate pipeline's writers do); returns the shard names and
    adds each shard's size and sha256, of the bytes written, to ``files``."""
    from dpsynth.dp_ops import generator
    from dpsynth.pipelines.release.release import FileSystems
    from dpsynth.transforms import digests, io, write
    shard_class = {"tfrecord": write.TFRecordShard,
                   "parquet": write.ParquetShard}[fmt]
    names = []
    for index, (start, stop) in enumerate(write.shard_bounds(total,
                                                             rows_per_shard)):
        name = write.shard_name(label, index, fmt)
        path = io.join(staging, write.DATA_DIR, name)
        with FileSystems.create(path, compression_type="uncompressed") as f:
            out = digests.DigestingFile(f, path)
            shard = shard_class(out, label, *features)
            for a in range(start, stop, write.WRITE_PIECE):
                b = min(stop, a + write.WRITE_PIECE)
                shard.write(generator.sample_rows(mix, cfg, total, a, b))
            if start == stop:
                shard.write(generator.sample_rows(mix, cfg, 0, 0, 0))
            shard.close()
        files[f"{write.DATA_DIR}/{name}"] = out.digest()
        names.append(name)
    return names


def _features(manifest: dict) -> tuple[str, str]:
    role = {f.get("role"): name for name, f in
            manifest.get("outputs", {}).get("features", {}).items()}
    return role.get("embedding", "embedding"), role.get("label", "label")


def _summary(source: Source, rows: dict[int, int],
             shards: dict[int, list[str]]) -> list[dict]:
    by_label = {c["label"]: c for c in source.manifest["classes"]}
    return [dict(by_label[label], samples=rows[label], shards=shards[label])
            for label in sorted(rows)]


def sample_manifest(source: Source, spec: SampleSpec, run_id: str,
                    root: str, summary: list[dict]) -> dict:
    """The new release's manifest: the source's public description of the
    rows (format, features, normalisation, configuration), the source
    release it was drawn from, and no privacy cost."""
    src = source.manifest
    warnings = list(src.get("warnings", []))
    # Never more than the source claims: its flag, its warnings, and no
    # "DP" in the text when the source is not private.
    private = src.get("private") is True
    mixture = ("the source release's DP mixture" if private else
               "the source release's mixture, which is NOT PRIVATE (like "
               "its source: --epsilon inf or --noise-seed)")
    return {
        "format": src["format"],
        "post_processing": True,
        "source": {"release": source.path, "run_id": src.get("run_id"),
                   "root": src.get("root"),
                   "manifest_sha256": source.manifest_sha256,
                   "gmm_sha256": hashlib.sha256(source.gmm_bytes).hexdigest()},
        "sampling": {"rows": spec.rows, "seed": spec.seed,
                     "allocation": "proportional to the source's noisy class "
                                   "counts (negatives as 0), largest "
                                   "remainder"},
        "privacy_cost": {"epsilon": 0.0, "delta": 0.0,
                         "why": f"post-processing of {mixture}; no private "
                                "data was read"},
        "run_id": run_id,
        "root": root,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        # The guarantee covering these rows is the source's, unchanged.
        "privacy": src.get("privacy"),
        "private": private,
        "adaptive_plan": src.get("adaptive_plan"),
        "noise": f"none added here: rows drawn from {mixture}",
        "config": src.get("config"),
        "input": {"release": source.path},
        "embedding_dim": src.get("embedding_dim"),
        "classes": summary,
        "samples_total": sum(c["samples"] for c in summary),
        "outputs": src.get("outputs"),
        "lifetime_budget": None,
        "versions": src.get("versions"),
        "warnings": warnings,
    }


def run(spec: SampleSpec) -> dict:
    """Draws ``spec.rows`` rows from the source's mixture and publishes them
    at ``spec.output``; returns the new manifest. Nothing is published on
    error (the staging folder is removed)."""
    from dpsynth.pipelines.release import publisher, reading, release
    from dpsynth.transforms import io, write
    publisher.check_output(spec.output, spec.overwrite)
    source = read_source(spec.release)
    mixes = source.mixtures.mixtures
    _check_rows(spec, len(mixes))
    rows = class_rows({l: m.noisy_count if m.weights.sum() > 0 else 0.0
                       for l, m in mixes.items()}, spec.rows)
    cfg = _sampling_config(source.manifest, spec.seed)
    fmt = source.manifest.get("outputs", {}).get("format", "tfrecord")
    run_id = f"sample-{secrets.token_hex(6)}"
    root = f"{release.VERSION_PREFIX}{secrets.token_hex(6)}"
    staging = release.staging_dir(spec.output, run_id, secrets.token_hex(4))
    files: dict = {}  # digests of the bytes written, never read back
    try:
        shards = {label: _write_class(staging, label, mixes[label], cfg, n, fmt,
                                      _features(source.manifest),
                                      spec.rows_per_shard, files)
                  for label, n in sorted(rows.items())}
        summary = _summary(source, rows, shards)
        files[write.GMM_FILE] = _put(io.join(staging, write.GMM_FILE),
                                     source.gmm_bytes)
        files[write.SUMMARY_FILE] = _put(
            io.join(staging, write.SUMMARY_FILE),
            json.dumps(summary, indent=1).encode())
        if source.schema_bytes is not None:
            files[write.SCHEMA_FILE] = _put(
                io.join(staging, write.SCHEMA_FILE), source.schema_bytes)
        doc = sample_manifest(source, spec, run_id, root, summary)
        doc["files"] = dict(sorted(files.items()))  # publish checks them
        publisher.write_manifest(staging, doc)
        publisher.check_output(spec.output, spec.overwrite)  # still ours
        _check_apart(spec.release, spec.output)  # and still apart
        return publisher.publish(staging, spec.output, spec.overwrite)
    finally:
        publisher.discard(staging)


def _check_rows(spec: SampleSpec, classes: int) -> None:
    """At most MAX_SAMPLES_PER_CLASS rows per class of the source (what its
    manifest states), the most a release of it could hold."""
    limit = MAX_SAMPLES_PER_CLASS * classes
    if spec.rows > limit:
        raise SampleError(
            f"--rows {spec.rows} is more than {spec.release} can hold: at "
            f"most {MAX_SAMPLES_PER_CLASS} rows per class, {limit} for its "
            f"{classes} class(es); nothing was written")


def _put(path: str, data: bytes) -> dict:
    from dpsynth.transforms import digests
    return digests.put(path, data)


# ------------------------------------------------------------ command line

def _rows(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a whole number of rows, got {text!r}") from None
    if not 1 <= value <= MAX_ROWS:
        raise argparse.ArgumentTypeError(
            f"must be in [1, {MAX_ROWS}], got {value}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("release", help="published release to draw from (local "
                   "or gs://)")
    p.add_argument("--rows", type=_rows, required=True,
                   help="total rows to draw, shared by the classes in "
                   "proportion to the release's noisy class counts")
    p.add_argument("--output", required=True,
                   help="where the new release is published (local or gs://)")
    p.add_argument("--seed", type=int, default=1,
                   help="public seed of the draws (the source drew its own "
                   "rows with its config.seed, 0 unless set)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a release already at --output")


def register(subparsers) -> argparse.ArgumentParser:
    """Adds `sample` to the `dpsynth` sub-commands."""
    p = subparsers.add_parser(
        "sample", help="more rows from a release's mixture (no privacy cost)",
        description=DESCRIPTION)
    add_arguments(p)
    p.set_defaults(handler=handle)
    return p


def handle(args: argparse.Namespace) -> int:
    """`dpsynth sample`: returns the exit status."""
    from dpsynth.pipelines.release import publisher, reading, release
    try:
        manifest = run(SampleSpec(args.release, args.output, args.rows,
                                  args.seed, args.overwrite))
    except (SampleError, release.ReleaseError, OSError) as err:
        print(f"dpsynth: error: {err}", file=sys.stderr)
        return 2
    what = ("post-processing, no privacy cost" if manifest["private"]
            else "NOT PRIVATE: its source is not private")
    print(f"sampled {manifest['samples_total']} rows from {args.release} "
          f"({what}) into {args.output}")
    for warning in manifest["warnings"]:
        print(f"warning: {warning}", file=sys.stderr)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="dpsynth sample", description=DESCRIPTION)
    add_arguments(p)
    return handle(p.parse_args(argv))
