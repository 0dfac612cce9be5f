"""Self-consistency of a staged release, checked before it is published.

A runner that re-executes steps could, with noise that is not tied to the
run (it is, see dp_ops/noise.py), write rows from one noise draw next to a
summary from another: the same statistic released twice, accounted once.
This check refuses to publish a staged release whose parts disagree:

* summary.json has exactly one entry per configured label;
* its noisy counts are those stored in gmm.npz, whose class means have the
  run's embedding dimension;
* unless the legacy vote threshold filtered it, each class wrote exactly
  the number of rows its noisy count implies (``generator.num_samples``;
  the vote's resampling writes that many too);
* each class's shard files exist, are the only shards of that class, and
  their sizes hold exactly the rows the summary says (fixed-size records).

Everything compared is a DP output or public configuration; the check reads
only the staged files (no private data).
"""

from __future__ import annotations

from typing import Sequence

from apache_beam.io.filesystems import FileSystems

from dpsynth.dp_ops import generator
from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.models.gmm import MixtureRelease
from dpsynth.pipelines.release.release import ReleaseError
from dpsynth.transforms import io
from dpsynth.transforms.write import DATA_DIR, GMM_FILE, record_bytes


class InconsistentRelease(ReleaseError):
    """The staged files disagree with each other: nothing is published.
    A ReleaseError, so that every command reports it in one line (exit 2)
    instead of a traceback."""


def _fail(staging: str, what: str) -> None:
    raise InconsistentRelease(f"staged release {staging} is not "
                              f"self-consistent ({what}); not publishing")


def check_staged(staging: str, cfg: GeneratorConfig, summary: Sequence[dict],
                 dim: int, embedding_feature: str = "embedding",
                 label_feature: str = "label", fmt: str = "tfrecord") -> None:
    labels = [c["label"] for c in summary]
    if sorted(labels) != sorted(cfg.labels) or len(set(labels)) != len(labels):
        _fail(staging, f"summary labels {sorted(labels)} are not the "
                       f"configured labels {sorted(cfg.labels)}")
    with FileSystems.open(io.join(staging, GMM_FILE)) as f:
        gmm = MixtureRelease.from_npz(f.read())
    sizes = _shard_sizes(staging)
    listed = set()
    for entry in summary:
        label = entry["label"]
        mix = gmm.mixtures.get(label)
        if mix is None or mix.noisy_count != entry["noisy_count"]:
            _fail(staging, f"class {label}: gmm.npz and summary.json hold "
                           f"different noisy counts")
        if mix.means.shape[-1] != dim:
            _fail(staging, f"class {label}: gmm.npz means have dimension "
                           f"{mix.means.shape[-1]}, the embeddings {dim}")
        # the vote's resampling writes the same count; only the legacy
        # threshold filter writes fewer
        legacy = cfg.vote_filter and cfg.vote_threshold is not None
        if not legacy and entry["samples"] != generator.num_samples(
                mix, cfg):
            _fail(staging, f"class {label}: {entry['samples']} rows written, "
                           f"but its noisy count implies "
                           f"{generator.num_samples(mix, cfg)}")
        per_row = record_bytes(dim, label, embedding_feature, label_feature)
        rows = 0
        for name in entry["shards"]:
            if name not in sizes:
                _fail(staging, f"class {label}: shard {name} is missing")
            rows += _rows(staging, name, sizes[name], per_row, fmt)
            listed.add(name)
        if rows != entry["samples"]:
            _fail(staging, f"class {label}: its shards hold {rows} rows, not "
                           f"the {entry['samples']} summary.json lists")
    extra = sorted(set(sizes) - listed)
    if extra:
        _fail(staging, f"shards no class lists: {extra[:3]}")


def _rows(staging: str, name: str, size: int, per_row: int, fmt: str) -> int:
    """Rows of a shard: fixed-size TFRecord rows (size / row size; -1 when
    the size is no whole number of rows), or the Parquet footer's count."""
    if fmt == "parquet":
        import pyarrow.parquet as pq
        with FileSystems.open(io.join(staging, DATA_DIR, name)) as f:
            return pq.ParquetFile(f).metadata.num_rows
    return size // per_row if size % per_row == 0 else -1


def _shard_sizes(staging: str) -> dict[str, int]:
    pattern = io.join(staging, DATA_DIR, "*")
    found = FileSystems.match([pattern])[0].metadata_list
    return {m.path.rsplit("/", 1)[-1]: int(m.size_in_bytes) for m in found}



def check_manifest(folder: str, manifest: dict) -> None:
    """``check_staged`` of the release in ``folder`` with everything it
    compares taken from the release's own manifest (its configuration,
    classes, dimension, features and format): run again before every
    publication, also of a release staged by an earlier launch."""
    try:
        conf = dict(manifest["config"], labels=tuple(
            manifest["config"]["labels"]))
        cfg = GeneratorConfig(**conf)
        outputs = manifest.get("outputs") or {}
        role = {f.get("role"): name for name, f in
                (outputs.get("features") or {}).items()}
        summary, dim = manifest["classes"], int(manifest["embedding_dim"])
    except (KeyError, TypeError, ValueError) as err:
        _fail(folder, f"its manifest cannot be read back ({err})")
    try:
        check_staged(folder, cfg, summary, dim,
                     role.get("embedding", "embedding"),
                     role.get("label", "label"),
                     outputs.get("format", "tfrecord"))
    except InconsistentRelease:
        raise
    except Exception as err:  # unreadable files: not a release either
        _fail(folder, f"{type(err).__name__}: {err}")
