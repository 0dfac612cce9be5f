"""Writing the release files (DP outputs only) under a staging directory.

Data shards are TFRecord (``tf.train.Example``: float32 list + int64 label,
the default) or Parquet (``--output-format parquet``: a fixed-size list of
float32 + an int64 column); ``_schema.json`` describes them for readers
that do not know our manifest (feature names, dtypes, shape, the
normalisation real inputs need). All bytes go through Beam's FileSystems,
so local paths and gs:// work the same.
"""

from __future__ import annotations

import dataclasses
import io as stdio
import json
import struct
import time
from typing import Iterable, Optional, Sequence

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from dpsynth.dp_ops import generator
from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.models.gmm import MixtureRelease
from dpsynth.transforms import digests, heap_pages, io
from dpsynth.transforms.formats import OUTPUT_FORMATS  # noqa: F401  (re-exported)
from dpsynth.transforms.progress import trace

DATA_DIR = "data"
# "_": Parquet readers (pyarrow, pandas, Spark) skip these, so a reader
# pointed at the release gets the data shards only.
GMM_FILE = "_gmm.npz"
SUMMARY_FILE = "_summary.json"
SCHEMA_FILE = "_schema.json"


def shard_name(label: int, index: int, fmt: str = "tfrecord") -> str:
    return f"synthetic-class{label:05d}-{index:05d}.{fmt}"


# ------------------------------------------------ vectorised TFRecord rows
# The one TFRecord writer of the product code. Why not TensorFlow's or
# Beam's writers: building one tf.train.Example per row is the bottleneck.
# benchmarks/write_speed.py (results/write_speed.md, 1M x 384 rows, CPU
# time): this writer 4.5 us/row; tf.train.Example + tf.io.TFRecordWriter
# 19 us/row with a reused message, 104 us/row as documented; Beam's
# WriteToTFRecord 47-62 us/row: +15 to +100 s per million rows, against
# ~60 s for the whole pipeline at 1M x 384. TensorFlow's framing alone is
# as fast as ours but writes only through TensorFlow's own filesystems,
# not Beam's FileSystems (gs:// here goes through Beam's GCS client).
# A tf.train.Example with one float feature and one int64 feature is a fixed
# byte layout around the float32 bytes of the row, and all rows of a class
# share the label, so a whole shard is encoded with numpy. Protobuf map
# entries may come in any order (TensorFlow's own order varies between
# processes); we write the label entry first so the row ends the record.
# tests/test_writer.py and test_scaling_ops.py read them with TensorFlow.

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


def frame_records(records: Iterable[bytes]) -> bytes:
    """TFRecord framing of arbitrary records (length, masked CRC-32C of the
    length, data, masked CRC-32C of the data). For records of any size,
    e.g. encode's Examples with a source id; ``tfrecord_bytes`` frames
    equal-size rows the same way with numpy."""
    out = []
    for record in records:
        length = struct.pack("<Q", len(record))
        out += (length, struct.pack("<I", io.masked_crc32c(length)), record,
                struct.pack("<I", io.masked_crc32c(record)))
    return b"".join(out)


def tfrecord_bytes(x: np.ndarray, label: int,
                   embedding_feature: str = "embedding",
                   label_feature: str = "label") -> bytes:
    """The TFRecord file content of rows ``x`` (all of class ``label``)."""
    return _tfrecord_frames(x, label, embedding_feature,
                            label_feature).tobytes()


def _tfrecord_frames(x: np.ndarray, label: int, embedding_feature: str,
                     label_feature: str) -> np.ndarray:
    """``tfrecord_bytes`` as a uint8 array [n, record frame] (written as it
    is: no copy of the whole shard into a bytes object)."""
    x = np.ascontiguousarray(x, dtype="<f4")
    n, dim = x.shape
    head, tail = example_layout(dim, label, embedding_feature, label_feature)
    size = len(head) + 4 * dim + len(tail)
    length = struct.pack("<Q", size)
    frame = np.empty((n, 12 + size + 4), dtype=np.uint8)
    frame[:, :8] = np.frombuffer(length, np.uint8)
    frame[:, 8:12] = np.frombuffer(struct.pack("<I", io.masked_crc32c(length)),
                                   np.uint8)
    frame[:, 12:12 + len(head)] = np.frombuffer(head, np.uint8)
    frame[:, 12 + len(head):12 + len(head) + 4 * dim] = x.view(np.uint8)
    frame[:, 12 + size - len(tail):12 + size] = np.frombuffer(tail, np.uint8)
    crcs = io.masked_crc32c_strided(frame.tobytes(), 12, size, 12 + size + 4,
                                    n).astype("<u4")
    frame[:, 12 + size:] = crcs.view(np.uint8).reshape(n, 4)
    return frame


def record_bytes(dim: int, label: int, embedding_feature: str = "embedding",
                 label_feature: str = "label") -> int:
    """Bytes of one row's TFRecord (every row of a class has this size)."""
    return len(tfrecord_bytes(np.zeros((1, dim)), label, embedding_feature,
                              label_feature))


class _Shard:
    """One shard file of class ``label`` being written to the open binary
    file ``f``, and the names of its two columns (features)."""

    def __init__(self, f, label: int, embedding_feature: str = "embedding",
                 label_feature: str = "label") -> None:
        self._f, self._label = f, label
        self._names = (embedding_feature, label_feature)


class ParquetShard(_Shard):
    """A Parquet file of rows of class ``label``, written to the open binary
    file ``f`` piece by piece (each piece one row group, its pages straight
    to ``f``): a fixed-size list<float32> column and an int64 column,
    neither nullable (pyarrow; zero-copy rows).

    The embedding column is stored plain: no compression (float32 draws do
    not compress: pyarrow's snappy default gave 0.5 % more bytes), no
    dictionary and no statistics (pyarrow tries a dictionary of floats
    before giving up, and min/max of 384 values a row select nothing); with
    no nulls it needs no definition levels. A 50,000 x 384 shard written
    whole to a local file: 0.22 -> 0.13-0.16 s, read in 0.12 instead of
    0.16 s (pyarrow 25); drawn and written ``WRITE_PIECE`` rows at a time
    instead of whole: 0.35 -> 0.30 s, the same table. The label column
    keeps pyarrow's dictionary and statistics (a reader filtering on the
    label skips other classes' shards)."""

    def __init__(self, f, label: int, embedding_feature: str = "embedding",
                 label_feature: str = "label") -> None:
        super().__init__(f, label, embedding_feature, label_feature)
        self._writer = None

    def write(self, x: np.ndarray) -> None:
        """Appends ``x`` as a row group; an empty piece only when it is the
        first (a shard with no rows is still a Parquet file with the
        schema), never an empty row group between others."""
        import pyarrow.parquet as pq
        if self._writer is not None and not len(x):
            return
        table = self._table(x)
        if self._writer is None:
            self._writer = pq.ParquetWriter(
                self._f, table.schema, compression="none",
                use_dictionary=[self._names[1]],
                write_statistics=[self._names[1]])
        self._writer.write_table(table)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()

    def _table(self, x: np.ndarray):
        import pyarrow as pa
        x = np.ascontiguousarray(x, dtype=np.float32)
        emb, lab = self._names
        row_type = pa.list_(pa.field("item", pa.float32(), nullable=False),
                            x.shape[1])
        schema = pa.schema([pa.field(emb, row_type, nullable=False),
                            pa.field(lab, pa.int64(), nullable=False)])
        values = pa.array(x.reshape(-1), type=pa.float32())
        return pa.table({
            emb: pa.FixedSizeListArray.from_arrays(values, type=row_type),
            lab: pa.array(np.full(len(x), self._label, np.int64))},
            schema=schema)


class TFRecordShard(_Shard):
    """A TFRecord file of rows of class ``label``, written to the open
    binary file ``f`` piece by piece (a TFRecord file is the concatenation
    of its records)."""

    def write(self, x: np.ndarray) -> None:
        self._f.write(_tfrecord_frames(x, self._label, *self._names).data)

    def close(self) -> None:
        pass


def parquet_bytes(x: np.ndarray, label: int,
                  embedding_feature: str = "embedding",
                  label_feature: str = "label") -> bytes:
    """A ``ParquetShard`` of rows ``x`` (all of class ``label``), as bytes."""
    buf = stdio.BytesIO()
    shard = ParquetShard(buf, label, embedding_feature, label_feature)
    shard.write(x)
    shard.close()
    return buf.getvalue()


_SHARDS = {"tfrecord": TFRecordShard, "parquet": ParquetShard}
# Rows drawn and encoded at a time for a shard (a multiple of
# generator.SAMPLE_CHUNK: ~12 MB of records, cache- and heap-friendly).
WRITE_PIECE = 8 * generator.SAMPLE_CHUNK


@dataclasses.dataclass(frozen=True)
class DrawRows:
    """The rows of a class are drawn where its shards are written: the
    class's ``total`` synthetic rows (``generator.sample_rows``)."""

    total: int


@dataclasses.dataclass(frozen=True)
class KeptRows:
    """The vote's rows of a class: the candidates (the class's first
    ``total`` rows of ``generator.sample_rows``), candidate i written
    ``copies[i]`` times (0 or 1 with the legacy threshold filter). Writers
    draw the candidate ranges of their shards and repeat those rows, so no
    worker draws a whole class's candidates and only the counts travel."""

    total: int
    copies: np.ndarray


def shard_bounds(total: int, rows_per_shard: int) -> list[tuple[int, int]]:
    """[start, stop) of each shard of a class's ``total`` rows: as few
    shards as hold at most ``rows_per_shard`` rows each, of equal size (to
    one row), so that the workers that split a class's shards get equal
    work; a class with no rows gets one empty shard."""
    count = max(1, -(-total // rows_per_shard))
    cuts = [total * i // count for i in range(count + 1)]
    return list(zip(cuts[:-1], cuts[1:]))


def shard_tasks(kv, rows_per_shard: int):
    """(label, DrawRows | KeptRows | rows) -> (label, shard index, (start,
    stop, total, copies or None) | rows) for each shard (``shard_bounds``;
    for ``KeptRows`` over the written rows, whole candidates per shard: a
    shard draws candidates start..stop and writes each ``copies`` times)."""
    label, rows = kv
    if isinstance(rows, KeptRows):
        yield from _voted_shards(label, rows, rows_per_shard)
        return
    total = rows.total if isinstance(rows, DrawRows) else len(rows)
    for i, (start, stop) in enumerate(shard_bounds(total, rows_per_shard)):
        part = ((start, stop, total, None) if isinstance(rows, DrawRows)
                else np.asarray(rows[start:stop], np.float32))
        yield label, i, part


def _voted_shards(label, rows: KeptRows, rows_per_shard: int):
    """Shards of a voted class: the written rows split as ``shard_bounds``
    does, each candidate (all its copies) in the shard where its first
    copy falls."""
    copies = np.asarray(rows.copies).astype(np.int64)
    kept = np.flatnonzero(copies)
    first = np.cumsum(copies[kept]) - copies[kept]  # offset of 1st copy
    written = int(copies.sum())
    for i, (a, b) in enumerate(shard_bounds(written, rows_per_shard)):
        lo, hi = np.searchsorted(first, [a, b], side="left")
        sel = kept[lo:hi]
        start, stop = (int(sel[0]), int(sel[-1]) + 1) if len(sel) else (0, 0)
        yield label, i, (start, stop, rows.total, copies[start:stop].copy())


class _WriteShard(beam.DoFn):
    """(label, index, rows or a range to draw) -> one shard file.

    Drawing here (float32, two matrix products per chunk) means no worker
    samples a whole class and no synthetic row crosses the network."""

    def __init__(self, staging: str, embedding_feature: str,
                 label_feature: str, fmt: str,
                 cfg: Optional[GeneratorConfig]) -> None:
        self._staging, self._fmt, self._cfg = staging, fmt, cfg
        self._features = (embedding_feature, label_feature)
        self._kept = Metrics.counter("dpsynth", "samples_written")

    def setup(self) -> None:
        heap_pages.keep_heap_pages()

    def process(self, task, mixtures=None):
        start = time.time()
        label, index, part = task
        name = shard_name(label, index, self._fmt)
        rows = 0
        path = io.join(self._staging, DATA_DIR, name)
        with FileSystems.create(path, compression_type="uncompressed") as f:
            # The shard's size and sha256 from the very buffers written
            # (transforms/digests.py: never read back).
            out = digests.DigestingFile(f, path)
            shard = _SHARDS[self._fmt](out, int(label), *self._features)
            for x in self._pieces(label, part, mixtures):
                shard.write(x)
                rows += len(x)
            shard.close()
        self._kept.inc(rows)
        trace(f"write:class{int(label)}", start, time.time())
        yield {"label": int(label), "index": index, "samples": rows,
               "shard": name, **out.digest()}

    def _pieces(self, label, part, mixtures) -> Iterable[np.ndarray]:
        """The shard's rows: given, or drawn here ``WRITE_PIECE`` at a time
        (no shard-sized arrays; at least one piece, maybe empty, so every
        shard is a valid file); pieces end on multiples of it, so each
        draws whole ``SAMPLE_CHUNK``s once."""
        if not isinstance(part, tuple):
            yield part
            return
        start, stop, total, copies = part  # the vote's copies, or None
        ends = [min(stop, e) for e in range(
            (start // WRITE_PIECE + 1) * WRITE_PIECE, stop + WRITE_PIECE,
            WRITE_PIECE)] or [stop]
        for a, b in zip([start] + ends[:-1], ends):  # one BLAS thread each
            rows = generator.sample_rows(mixtures[label], self._cfg, total,
                                         a, b)
            yield (rows if copies is None else
                   np.repeat(rows, copies[a - start:b - start], axis=0))


# ------------------------------------------------- what the release holds

def normalisation(cfg: GeneratorConfig) -> dict:
    """The public per-record map users must apply to their real inputs
    before mixing or comparing them with the synthetic rows (the same one
    ``dpsynth evaluate`` applies)."""
    steps = {"unit": "divide each row by its L2 norm (rows of norm 0 stay 0)",
             "none": "use the rows as they are"}[cfg.normalize]
    clip = None if cfg.center else cfg.clip_norm
    if clip is not None:  # centred: R bounds rows minus the DP centre only
        steps += (f"; then scale rows with L2 norm > {clip:g} down to "
                  f"norm {clip:g}")
    return {"normalize": cfg.normalize, "clip_norm": clip,
            "apply_to_real_inputs": steps,
            "python": (f"dpsynth.dp_ops.clipping.normalize_rows(x, "
                       f"{cfg.normalize!r})"
                       + (f" then dpsynth.dp_ops.clipping.clip_rows(x, {clip:g})[0]"
                          if clip is not None else ""))}


def release_schema(cfg: GeneratorConfig, dim: int, fmt: str = "tfrecord",
                   embedding_feature: str = "embedding",
                   label_feature: str = "label") -> dict:
    """_schema.json: enough to read the data shards without our manifest
    (public configuration only). tf.data: ``tf.io.FixedLenFeature(shape,
    dtype)`` per feature (see README, "The release")."""
    if fmt not in OUTPUT_FORMATS:
        raise ValueError(f"--output-format must be one of {OUTPUT_FORMATS}, "
                         f"got {fmt!r}")
    return {
        "format": fmt,
        "files": f"{DATA_DIR}/*.{fmt}",
        "features": {
            embedding_feature: {"dtype": "float32", "shape": [int(dim)],
                                "role": "embedding"},
            label_feature: {"dtype": "int64", "shape": [], "role": "label"}},
        "labels": [int(l) for l in cfg.labels],
        "normalisation": normalisation(cfg),
    }


def covariance_ranks(mixtures: Sequence) -> dict[int, int]:
    """Factor columns per class: a post-processing of DP outputs."""
    return {m.label: (0 if getattr(m, "factors", None) is None
                      else int(m.factors.shape[1])) for m in mixtures}


def describe_covariance(cfg: GeneratorConfig, dim: int,
                        ranks: Sequence[int],
                        mode: Optional[str] = None) -> dict:
    """Requested vs effective covariance rank, and why it is smaller.
    ``mode``: the structure that ran (``--covariance auto``: the rule's
    choice), default ``cfg.covariance``."""
    requested = cfg.covariance_rank
    mode = mode or cfg.covariance
    if not requested:
        return {"mode": "diagonal", "requested_rank": 0,
                "effective_rank": {"min": 0, "max": 0},
                "stored_as": "variances only (--covariance-rank 0)",
                "why_smaller": None}
    cap = min(requested, dim)
    low, high = (min(ranks), max(ranks)) if ranks else (0, 0)
    reasons = []
    if requested > dim:
        reasons.append(f"a {dim}-dimensional covariance has at most {dim} "
                       f"factors")
    if low < cap:
        reasons.append("only eigenvalues > 0 of the noisy within-class "
                       "covariance are kept as factors (DP noise on the "
                       "second-moment matrix pushes the small ones below "
                       "0; see dp_ops/covariance.py); the rest of each "
                       "coordinate's variance is in the diagonal residual")
    return {"mode": mode, "requested_rank": requested,
            "effective_rank": {"min": low, "max": high},
            "stored_as": ("shared_factors" if mode == "shared"
                          else "class_<label>_factors") + " in gmm.npz",
            "why_smaller": "; ".join(reasons) or None}


def describe_outputs(cfg: GeneratorConfig, dim: int, summary: Sequence[dict],
                     embedding_feature: str = "embedding",
                     label_feature: str = "label",
                     covariance_mode: Optional[str] = None) -> dict:
    """The manifest's ``outputs`` block: files, format, features, the
    normalisation real inputs need, and the effective covariance rank
    (from ``summary``: every value is public or DP)."""
    names = [n for c in summary for n in c.get("shards", [])]
    fmt = "parquet" if names and names[0].endswith(".parquet") else "tfrecord"
    schema = release_schema(cfg, dim, fmt, embedding_feature, label_feature)
    return {
        "data": f"{DATA_DIR}/", "gmm": GMM_FILE, "summary": SUMMARY_FILE,
        "schema": SCHEMA_FILE, "format": fmt, "files": schema["files"],
        "features": schema["features"],
        "normalisation": schema["normalisation"],
        "covariance": describe_covariance(
            cfg, dim, [c.get("covariance_rank", 0) for c in summary],
            covariance_mode),
    }


def _write_summary(staging: str, mixtures: list, shard_info: list,
                   schema: Optional[dict],
                   record_key: Optional[bytes] = None) -> None:
    """Writes _gmm.npz, _summary.json and _schema.json; with
    ``record_key``, then the authenticated record of every file's size and
    sha256 (the shards' as their writers reported them)."""
    release = MixtureRelease.from_list(mixtures)
    written = [(f"{DATA_DIR}/{i['shard']}", digests.entry(i))
               for i in shard_info if "sha256" in i]
    written.append((GMM_FILE, digests.put(io.join(staging, GMM_FILE),
                                          release.to_npz_bytes())))
    per_class: dict = {}
    for info in sorted(shard_info, key=lambda d: (d["label"], d["index"])):
        entry = per_class.setdefault(info["label"],
                                     {"samples": 0, "shards": []})
        entry["samples"] += info["samples"]
        entry["shards"].append(info["shard"])
    ranks = covariance_ranks(release.mixtures.values())
    summary = []
    for label, mix in sorted(release.mixtures.items()):
        summary.append({
            "label": label,
            "noisy_count": mix.noisy_count,
            "components_with_mass": int((mix.weights > 0).sum()),
            "covariance_rank": ranks[label],
            "samples": per_class[label]["samples"],
            "shards": per_class[label]["shards"],
        })
    written.append((SUMMARY_FILE, digests.put(
        io.join(staging, SUMMARY_FILE), json.dumps(summary, indent=1).encode())))
    if schema is not None:
        written.append((SCHEMA_FILE, digests.put(
            io.join(staging, SCHEMA_FILE),
            json.dumps(schema, indent=1).encode())))
    if record_key is not None:
        digests.put_record(staging, digests.merge(written), record_key)


class WriteRelease(beam.PTransform):
    """(label, rows or DrawRows) + (label, ClassMixture) -> files in staging.

    Each shard is its own element (spread over the workers); ``DrawRows``
    shards are sampled by the worker that writes them (needs ``cfg``). With
    ``cfg`` (and ``dim``, else read from the mixtures' means) it also
    writes _schema.json. With ``noise`` (the run's noise source) it last
    writes the record of every file's size and sha256 that the launcher
    builds the staged manifest from, authenticated by the run's secret
    (``transforms/digests.py``).
    """

    def __init__(self, staging: str, mixtures, rows_per_shard: int = 50_000,
                 embedding_feature: str = "embedding",
                 label_feature: str = "label", output_format: str = "tfrecord",
                 cfg: Optional[GeneratorConfig] = None,
                 dim: Optional[int] = None, noise=None) -> None:
        super().__init__()
        if output_format not in OUTPUT_FORMATS:
            raise ValueError(f"--output-format must be one of "
                             f"{OUTPUT_FORMATS}, got {output_format!r}")
        self._staging, self._mixtures = staging, mixtures
        self._args = (rows_per_shard, embedding_feature, label_feature,
                      output_format)
        self._cfg, self._dim, self._noise = cfg, dim, noise

    def expand(self, synthetic):
        staging, cfg, dim, noise = self._staging, self._cfg, self._dim, \
            self._noise
        _, emb, lab, fmt = self._args

        def schema(mixes: list) -> Optional[dict]:
            if cfg is None:
                return None
            d = dim or (mixes[0].means.shape[1] if mixes else 0)
            return release_schema(cfg, d, fmt, emb, lab)
        rows_per_shard = self._args[0]
        shard_info = (synthetic
                      | "Shards" >> beam.FlatMap(shard_tasks, rows_per_shard)
                      | "SpreadShards" >> beam.Reshuffle()
                      | "WriteShards" >> beam.ParDo(
                          _WriteShard(staging, emb, lab, fmt, cfg),
                          beam.pvalue.AsDict(self._mixtures))
                      | "ShardList" >> beam.combiners.ToList())
        mixtures = (self._mixtures
                    | "MixtureValues" >> beam.Values()
                    | "MixtureList" >> beam.combiners.ToList())
        return (mixtures
                | "WriteSummary" >> beam.Map(
                    lambda mixes, info: _write_summary(
                        staging, mixes, info, schema(mixes),
                        None if noise is None
                        else noise.derived_key(digests.PURPOSE)),
                    beam.pvalue.AsSingleton(shard_info)))
