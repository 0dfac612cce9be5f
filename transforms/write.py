"""Writing the release files (DP outputs only) under a staging directory."""

from __future__ import annotations

import json
import struct

import apache_beam as beam
import google_crc32c
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


# ------------------------------------------------ vectorised TFRecord rows
# A tf.train.Example with one float feature and one int64 feature is a fixed
# byte layout around the float32 bytes of the row, and all rows of a class
# share the label, so a whole shard is encoded with numpy (protobuf per row
# cost ~200 us; 1M rows = minutes). Protobuf map entries may come in any
# order (TensorFlow's own order varies between processes); we write the
# label entry first so the row ends the record.

def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # int64 negatives: 10-byte two's complement
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(tag: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2)."""
    return bytes([tag << 3 | 2]) + _varint(len(payload)) + payload


def example_layout(dim: int, label: int, embedding_feature: str = "embedding",
                   label_feature: str = "label") -> tuple[bytes, bytes]:
    """(head, tail): an Example's bytes are head + float32 row + tail."""
    placeholder = b"\0" * (4 * dim)
    float_list = _field(1, placeholder)                 # FloatList.value
    emb_entry = _field(1, _field(1, embedding_feature.encode())
                       + _field(2, _field(2, float_list)))  # Feature.float_list
    lab_entry = _field(1, _field(1, label_feature.encode())
                       + _field(2, _field(3, _field(1, _varint(label)))))
    example = _field(1, lab_entry + emb_entry)          # Example.features
    assert example.endswith(placeholder)
    return example[:len(example) - len(placeholder)], b""


def _masked_crc(data) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord_bytes(x: np.ndarray, label: int,
                   embedding_feature: str = "embedding",
                   label_feature: str = "label") -> bytes:
    """The TFRecord file content of rows ``x`` (all of class ``label``)."""
    x = np.ascontiguousarray(x, dtype="<f4")
    n, dim = x.shape
    head, tail = example_layout(dim, label, embedding_feature, label_feature)
    size = len(head) + 4 * dim + len(tail)
    length = struct.pack("<Q", size)
    frame = np.empty((n, 12 + size + 4), dtype=np.uint8)
    frame[:, :8] = np.frombuffer(length, np.uint8)
    frame[:, 8:12] = np.frombuffer(struct.pack("<I", _masked_crc(length)),
                                   np.uint8)
    frame[:, 12:12 + len(head)] = np.frombuffer(head, np.uint8)
    frame[:, 12 + len(head):12 + len(head) + 4 * dim] = x.view(np.uint8)
    frame[:, 12 + size - len(tail):12 + size] = np.frombuffer(tail, np.uint8)
    data = frame[:, 12:12 + size]
    crcs = np.fromiter((_masked_crc(row.tobytes()) for row in data),
                       dtype="<u4", count=n)
    frame[:, 12 + size:] = crcs.view(np.uint8).reshape(n, 4)
    return frame.tobytes()


def record_bytes(dim: int, label: int, embedding_feature: str = "embedding",
                 label_feature: str = "label") -> int:
    """Bytes of one row's TFRecord (every row of a class has this size)."""
    return len(tfrecord_bytes(np.zeros((1, dim)), label, embedding_feature,
                              label_feature))


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
            with FileSystems.create(path, compression_type="uncompressed") as f:
                f.write(tfrecord_bytes(rows, int(label), *self._features))
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
