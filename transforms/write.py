"""Writing the release files (DP outputs only) under a staging directory."""

from __future__ import annotations

import json

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from models.gmm import MixtureRelease
from transforms import io

DATA_DIR = "data"
GMM_FILE = "gmm.npz"
SUMMARY_FILE = "summary.json"


def shard_name(label: int, index: int) -> str:
    return f"synthetic-class{label:05d}-{index:05d}.tfrecord"


class _WriteClassShards(beam.DoFn):
    def __init__(self, staging: str, rows_per_shard: int,
                 embedding_feature: str, label_feature: str) -> None:
        self._staging, self._rows = staging, rows_per_shard
        self._features = (embedding_feature, label_feature)
        self._kept = Metrics.counter("dpsynth", "samples_written")

    def process(self, kv):
        label, x = kv
        x = np.asarray(x, np.float32)
        shards = []
        for i, start in enumerate(range(0, max(len(x), 1), self._rows)):
            rows = x[start:start + self._rows]
            path = io.join(self._staging, DATA_DIR, shard_name(label, i))
            io.write_tfrecord(path, io.serialize_examples(
                rows, np.full(len(rows), label), *self._features))
            shards.append(path)
        self._kept.inc(len(x))
        yield {"label": int(label), "samples": int(len(x)),
               "shards": [p.rsplit("/", 1)[-1] for p in shards]}


def _write_summary(staging: str, mixtures: list, shard_info: list) -> None:
    release = MixtureRelease.from_list(mixtures)
    with FileSystems.create(io.join(staging, GMM_FILE)) as f:
        f.write(release.to_npz_bytes())
    per_class = {d["label"]: d for d in shard_info}
    summary = []
    for label, mix in sorted(release.mixtures.items()):
        summary.append({
            "label": label,
            "noisy_count": mix.noisy_count,
            "components_with_mass": int((mix.weights > 0).sum()),
            "samples": per_class[label]["samples"],
            "shards": per_class[label]["shards"],
        })
    with FileSystems.create(io.join(staging, SUMMARY_FILE)) as f:
        f.write(json.dumps(summary, indent=1).encode())


class WriteRelease(beam.PTransform):
    """(label, synthetic rows) + (label, ClassMixture) -> files in staging."""

    def __init__(self, staging: str, mixtures, rows_per_shard: int = 50_000,
                 embedding_feature: str = "embedding",
                 label_feature: str = "label") -> None:
        super().__init__()
        self._staging, self._mixtures = staging, mixtures
        self._args = (rows_per_shard, embedding_feature, label_feature)

    def expand(self, synthetic):
        staging = self._staging
        shard_info = (synthetic
                      | "WriteShards" >> beam.ParDo(
                          _WriteClassShards(staging, *self._args))
                      | "ShardList" >> beam.combiners.ToList())
        mixtures = (self._mixtures
                    | "MixtureValues" >> beam.Values()
                    | "MixtureList" >> beam.combiners.ToList())
        return (mixtures
                | "WriteSummary" >> beam.Map(
                    lambda mixes, info: _write_summary(staging, mixes, info),
                    beam.pvalue.AsSingleton(shard_info)))
