"""Readers and writers for labelled embeddings: .npz, TFRecord, Parquet.

All file access goes through Beam's FileSystems, so local paths and gs:// work
the same. Files are read in workers, one file per element, and yield numpy
blocks ``(x [b, d] float64, y [b] int64)``; nothing collects the dataset.

Every block is validated where the file and row are known, so a bad input
fails the run with an error naming them (and nothing is published). Error
messages name the file, the row (or record / byte offset) and the flag to
change; they never quote embedding values or raw record bytes.

Non-finite values (``--non-finite``): a row holding NaN or +-inf (or whose
squared norm overflows float64) either fails the whole run (``reject``, the
default: a NaN usually means an upstream bug) or is dropped (``drop``).
Dropping looks at that one record only, so it is a data-independent
per-record rule, like clipping: the DP guarantee is unchanged (the dropped
record is treated as absent). The number dropped is private; it only goes to
the Beam counter ``dpsynth/rows_dropped_non_finite`` for the operator, never
to the release, the manifest or the logs.
"""

from __future__ import annotations

import dataclasses
import io
import os
from typing import Iterator, Optional, Sequence

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

FORMATS = ("npz", "tfrecord", "parquet")
NON_FINITE_POLICIES = ("reject", "drop")


class InputError(ValueError):
    """Bad input data: the message names the file (and row or flag)."""


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """Where and how to read the private embeddings (public configuration)."""

    pattern: str
    fmt: Optional[str] = None
    embedding_feature: str = "embedding"
    label_feature: str = "label"
    labels: Optional[tuple[int, ...]] = None  # None: accept any integer
    non_finite: str = "reject"
    block_size: int = 4096

    def __post_init__(self) -> None:
        if self.fmt is not None and self.fmt not in FORMATS:
            raise InputError(f"--input-format must be one of {FORMATS}, got {self.fmt!r}")
        if self.non_finite not in NON_FINITE_POLICIES:
            raise InputError(f"--non-finite must be one of {NON_FINITE_POLICIES}")
        if self.block_size < 1:
            raise InputError("--block-size must be >= 1")


def detect_format(path: str, fmt: Optional[str] = None) -> str:
    if fmt:
        return fmt
    name = path.lower()
    if name.endswith(".npz"):
        return "npz"
    if name.endswith((".tfrecord", ".tfrecords", ".tfrec")) or ".tfrecord-" in name:
        return "tfrecord"
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    raise InputError(f"{path}: cannot tell the format from the file name; "
                     f"pass --input-format ({'|'.join(FORMATS)})")


def match_files(pattern: str) -> list[str]:
    """Expands a glob (local or gs://); errors name the pattern."""
    if "://" not in pattern and os.path.isdir(pattern):
        raise InputError(f"--input {pattern!r} is a directory; pass a glob "
                         f"such as {os.path.join(pattern, '*.npz')!r}")
    try:
        results = FileSystems.match([pattern])[0].metadata_list
    except Exception as err:  # Beam raises several types for bad paths
        raise InputError(f"--input {pattern!r}: cannot list files ({err})") from None
    paths = sorted(m.path for m in results if not m.path.endswith("/"))
    if not paths and "://" not in pattern and os.path.lexists(pattern):
        raise InputError(f"--input {pattern!r}: exists but cannot be read "
                         f"(a broken symbolic link?)")
    if not paths:
        raise InputError(f"--input {pattern!r}: no files match")
    return paths


def _read_bytes(path: str) -> bytes:
    try:
        with FileSystems.open(path, compression_type="uncompressed") as f:
            return f.read()
    except Exception as err:
        raise InputError(f"{path}: cannot read ({err})") from None


# ---------------------------------------------------------------- decoding

def _npz_arrays(path: str, spec: InputSpec) -> tuple[np.ndarray, np.ndarray]:
    data = _read_bytes(path)
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            missing = [k for k in ("embeddings", "labels") if k not in z.files]
            if missing:
                raise InputError(f"{path}: npz lacks arrays {missing} "
                                 f"(has {sorted(z.files)})")
            return z["embeddings"], z["labels"]
    except InputError:
        raise
    except Exception as err:
        raise InputError(f"{path}: not a readable .npz ({err})") from None


def _parquet_blocks(path: str, spec: InputSpec
                    ) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    try:
        with FileSystems.open(path, compression_type="uncompressed") as f:
            pf = pq.ParquetFile(io.BytesIO(f.read()))
    except Exception as err:
        raise InputError(f"{path}: not a readable Parquet file ({err})") from None
    schema = pf.schema_arrow
    for col in (spec.embedding_feature, spec.label_feature):
        if col not in schema.names:
            raise InputError(f"{path}: no column {col!r} (has {schema.names}); "
                             f"see --embedding-feature/--label-feature")
    emb_type = schema.field(spec.embedding_feature).type
    if not (pa.types.is_list(emb_type) or pa.types.is_large_list(emb_type)
            or pa.types.is_fixed_size_list(emb_type)):
        raise InputError(f"{path}: column {spec.embedding_feature!r} must be a "
                         f"list of floats per row, got type {emb_type} (see "
                         f"--embedding-feature)")
    start = 0
    try:
        batches = pf.iter_batches(batch_size=spec.block_size,
                                  columns=[spec.embedding_feature,
                                           spec.label_feature])
        for batch in batches:
            emb = batch.column(0).to_pylist()
            lab = batch.column(1).to_numpy(zero_copy_only=False)
            yield start, _stack_rows(emb, path, start), lab
            start += len(lab)
    except InputError:
        raise
    except Exception as err:  # pyarrow decoding errors: a damaged file
        raise InputError(f"{path}: cannot decode Parquet rows from {start} "
                         f"({type(err).__name__})") from None


def _stack_rows(rows: Sequence, path: str, start: int) -> np.ndarray:
    """List-of-lists -> [b, d] float64; errors name the first bad row."""
    if not rows:
        return np.zeros((0, 0))
    width = len(rows[0]) if rows[0] is not None else None
    for i, r in enumerate(rows):
        if r is None or width is None or len(r) != width:
            got = "no" if r is None else len(r)
            expected = width if width is not None else "some"
            raise InputError(f"{path}: row {start + i} has {got} embedding "
                             f"values, expected {expected}")
    try:
        return np.asarray(rows, dtype=np.float64)
    except (TypeError, ValueError):
        for i, r in enumerate(rows):
            if any(v is None for v in r):
                raise InputError(f"{path}: row {start + i} has a null "
                                 f"embedding value") from None
        raise InputError(f"{path}: rows {start}..{start + len(rows) - 1}: "
                         f"embedding values are not numeric") from None


def _tfrecord_records(path: str) -> Iterator[bytes]:
    """Record payloads, CRC-checked; errors give the record and byte offset.

    Beam's reader quotes the damaged bytes in hex; those are private data,
    so its message is replaced by a description of the damage.
    """
    from apache_beam.io.tfrecordio import _TFRecordUtil
    data = _read_bytes(path)
    handle = io.BytesIO(data)
    index = 0
    while handle.tell() < len(data):
        offset = handle.tell()
        try:
            record = _TFRecordUtil.read_record(handle)
        except Exception as err:
            text = str(err)
            what = ("truncated (the file ends inside the record)"
                    if "Fewer than" in text else
                    "corrupt (length checksum mismatch)" if "length mask" in text
                    else "corrupt (data checksum mismatch)" if "data mask" in text
                    else "unreadable")
            raise InputError(f"{path}: TFRecord record {index} at byte "
                             f"{offset} is {what}; not a valid TFRecord file"
                             ) from None
        if record is None:
            break
        index += 1
        yield record


def _parse_examples(records: list[bytes], path: str, start: int,
                    spec: InputSpec) -> tuple[np.ndarray, np.ndarray]:
    import tensorflow as tf
    feats = {spec.embedding_feature: tf.io.RaggedFeature(tf.float32),
             spec.label_feature: tf.io.RaggedFeature(tf.int64)}
    try:
        parsed = tf.io.parse_example(tf.constant(records), feats)
    except Exception as err:
        raise InputError(f"{path}: records {start}..{start + len(records) - 1} "
                         f"are not tf.train.Example with float feature "
                         f"{spec.embedding_feature!r} and int64 feature "
                         f"{spec.label_feature!r} ({str(err).splitlines()[0]})"
                         ) from None
    emb, lab = parsed[spec.embedding_feature], parsed[spec.label_feature]
    for name, ragged in ((spec.embedding_feature, emb), (spec.label_feature, lab)):
        lengths = ragged.row_lengths().numpy()
        bad = np.flatnonzero(lengths == 0)
        if bad.size:
            raise InputError(f"{path}: row {start + int(bad[0])} has no feature "
                             f"{name!r} (see --embedding-feature/--label-feature)")
    lab_len = lab.row_lengths().numpy()
    if np.any(lab_len != 1):
        row = start + int(np.flatnonzero(lab_len != 1)[0])
        raise InputError(f"{path}: row {row}: label must be one int64 value")
    lengths = emb.row_lengths().numpy()
    if np.any(lengths != lengths[0]):
        row = start + int(np.flatnonzero(lengths != lengths[0])[0])
        raise InputError(f"{path}: row {row} has {lengths[row - start]} "
                         f"embedding values, expected {lengths[0]}")
    x = emb.flat_values.numpy().reshape(len(records), int(lengths[0]))
    return x.astype(np.float64), lab.flat_values.numpy()


def _tfrecord_blocks(path: str, spec: InputSpec
                     ) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    batch, start = [], 0
    for record in _tfrecord_records(path):
        batch.append(record)
        if len(batch) == spec.block_size:
            yield (start, *_parse_examples(batch, path, start, spec))
            start += len(batch)
            batch = []
    if batch:
        yield (start, *_parse_examples(batch, path, start, spec))


def _raw_blocks(path: str, spec: InputSpec
                ) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    fmt = detect_format(path, spec.fmt)
    if fmt == "npz":
        x, y = _npz_arrays(path, spec)
        if x.ndim != 2:
            raise InputError(f"{path}: 'embeddings' must be 2-D [n, d], got "
                             f"shape {x.shape}")
        if y.ndim != 1 or len(y) != len(x):
            raise InputError(f"{path}: 'labels' must be 1-D with {len(x)} "
                             f"rows, got shape {y.shape}")
        for s in range(0, len(x), spec.block_size):
            yield s, x[s:s + spec.block_size], y[s:s + spec.block_size]
    elif fmt == "parquet":
        yield from _parquet_blocks(path, spec)
    else:
        yield from _tfrecord_blocks(path, spec)


# -------------------------------------------------------------- validation

def validate_block(x: np.ndarray, y: np.ndarray, path: str, start: int,
                   spec: InputSpec, dim: Optional[int] = None,
                   dim_source: Optional[str] = None
                   ) -> tuple[np.ndarray, np.ndarray, int]:
    """Checks one block; returns (x, y, rows dropped as non-finite).

    ``dim`` is the embedding dimension every file must have (read from the
    schema of ``dim_source``, the first non-empty input file). Dropping
    non-finite rows (``--non-finite drop``) is a per-record rule that does
    not look at any other record, so it keeps the DP guarantee; the number
    dropped is private and only goes to an operator counter.
    """
    try:
        x = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"{path}: rows {start}..: embeddings are not "
                         f"numeric") from None
    if x.ndim != 2:
        raise InputError(f"{path}: embeddings must be 2-D [n, d], got shape "
                         f"{x.shape}")
    if dim is not None and x.shape[1] != dim and len(x):
        source = f"that of {dim_source}" if dim_source else "the first file's"
        raise InputError(f"{path}: row {start} has dimension {x.shape[1]}, "
                         f"expected {dim} ({source}); all input files must "
                         f"have the same embedding dimension")
    y = _integer_labels(np.asarray(y), path, start)
    if len(y) != len(x):
        raise InputError(f"{path}: rows {start}..: {len(x)} embeddings but "
                         f"{len(y)} labels")
    if spec.labels is not None:
        bad = np.flatnonzero(~np.isin(y, np.array(spec.labels)))
        if bad.size:
            i = int(bad[0])
            raise InputError(f"{path}: row {start + i} has label {int(y[i])}, "
                             f"which is not in --labels/--num-classes "
                             f"{_short(spec.labels)}")
    finite = _finite_rows(x)
    if finite.all():
        return x, y, 0
    if spec.non_finite == "reject":
        i = int(np.flatnonzero(~finite)[0])
        raise InputError(f"{path}: row {start + i} has NaN or infinite values "
                         f"(use --non-finite drop to drop such rows)")
    return x[finite], y[finite], int((~finite).sum())


def _finite_rows(x: np.ndarray) -> np.ndarray:
    """Rows with finite values whose squared norm also fits in float64."""
    finite = np.isfinite(x).all(axis=1)
    if finite.all() and np.abs(x).max(initial=0.0) < 1e150:
        return finite  # fast path: the squared norm cannot overflow
    with np.errstate(over="ignore", invalid="ignore"):
        return finite & np.isfinite(np.einsum("ij,ij->i", x, x))


def _short(labels: Sequence[int]) -> str:
    labels = list(labels)
    return str(labels) if len(labels) <= 12 else \
        f"[{labels[0]}, {labels[1]}, ..., {labels[-1]}] ({len(labels)} labels)"


def _integer_labels(y: np.ndarray, path: str, start: int) -> np.ndarray:
    if y.ndim != 1:
        raise InputError(f"{path}: labels must be 1-D, got shape {y.shape}")
    if y.dtype.kind in "iu":
        return y.astype(np.int64)
    if y.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(y) | (y != np.round(y)))
        if bad.size:
            i = int(bad[0])
            raise InputError(f"{path}: row {start + i} has non-integer label "
                             f"{float(y[i])!r}; labels must be integers")
        return y.astype(np.int64)
    raise InputError(f"{path}: rows {start}..: labels must be integers, got "
                     f"dtype {y.dtype}")


def read_file_blocks(path: str, spec: InputSpec, dim: Optional[int] = None,
                     dim_source: Optional[str] = None
                     ) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
    """Validated (x, y, dropped) blocks of one file."""
    for start, x, y in _raw_blocks(path, spec):
        yield validate_block(x, y, path, start, spec, dim, dim_source)


def peek_dim(path: str, spec: InputSpec) -> int:
    """Embedding dimension from the first row of a file (schema, not data)."""
    dim = _peek_dim(path, spec)
    if dim is None:
        raise InputError(f"{path}: the file holds no rows")
    return dim


def _peek_dim(path: str, spec: InputSpec) -> Optional[int]:
    """Dimension of the first row, or None for a file with no rows."""
    for _, x, _ in _raw_blocks(path, dataclasses.replace(spec, block_size=1)):
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] < 1:
            raise InputError(f"{path}: embeddings must be 2-D [n, d] with "
                             f"d >= 1, got shape {x.shape}")
        if len(x):
            return int(x.shape[1])
    return None


def input_schema(paths: Sequence[str], spec: InputSpec) -> tuple[int, str]:
    """(embedding dimension, file it was read from): the first file with
    rows. Empty files are skipped (they are valid); if every file is empty
    the input is refused, naming the pattern."""
    for path in paths:
        dim = _peek_dim(path, spec)
        if dim is not None:
            return dim, path
    files = (f"{paths[0]} holds" if len(paths) == 1
             else f"all {len(paths)} matched files hold")
    raise InputError(f"--input {spec.pattern!r}: {files} no rows "
                     f"(empty input), so the embedding dimension is unknown; "
                     f"pass --embedding-dim to release it (empty classes get "
                     f"noisy outputs like any other)")


def load_arrays(pattern: str, fmt: Optional[str] = None,
                embedding_feature: str = "embedding",
                label_feature: str = "label") -> tuple[np.ndarray, np.ndarray]:
    """In-memory read of small files (evaluation, tests): (x, y)."""
    spec = InputSpec(pattern, fmt, embedding_feature, label_feature,
                     block_size=65536)
    paths = match_files(pattern)
    dim, source = input_schema(paths, spec)
    xs, ys = [], []
    for path in paths:
        for x, y, _ in read_file_blocks(path, spec, dim, source):
            xs.append(x)
            ys.append(y)
    if not xs:
        raise InputError(f"--input {pattern!r}: the files hold no rows")
    return np.vstack(xs), np.concatenate(ys)


# ------------------------------------------------------------------- Beam

class _ReadBlocksFn(beam.DoFn):
    def __init__(self, spec: InputSpec, dim: int, dim_source: str) -> None:
        self._spec, self._dim, self._source = spec, dim, dim_source
        self._rows = Metrics.counter("dpsynth", "rows_read")
        self._dropped = Metrics.counter("dpsynth", "rows_dropped_non_finite")

    def process(self, path: str) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for x, y, dropped in read_file_blocks(path, self._spec, self._dim,
                                              self._source):
            self._rows.inc(len(y) + dropped)
            self._dropped.inc(dropped)
            if len(y):
                yield x, y


class ReadEmbeddingBlocks(beam.PTransform):
    """Files matching ``spec.pattern`` -> validated (x, y) numpy blocks.

    The file list and the embedding dimension (schema) are read when the
    graph is built, so a missing input fails before the pipeline starts.
    ``dim`` (public configuration, ``--embedding-dim``) skips reading the
    dimension from the first row: every row is checked against it, and an
    input with no rows is still a valid (empty) dataset.
    """

    def __init__(self, spec: InputSpec, dim: Optional[int] = None) -> None:
        super().__init__()
        self.spec = spec
        self.paths = match_files(spec.pattern)
        if dim is None:
            self.dim, self.dim_source = input_schema(self.paths, spec)
        else:
            self.dim, self.dim_source = int(dim), "--embedding-dim"

    def expand(self, pbegin):
        return (pbegin
                | "ListFiles" >> beam.Create(self.paths)
                | "SpreadFiles" >> beam.Reshuffle()
                | "ReadBlocks" >> beam.ParDo(_ReadBlocksFn(self.spec, self.dim,
                                                         self.dim_source)))


# ---------------------------------------------------------------- paths

def join(*parts: str) -> str:
    return FileSystems.join(*parts) if "://" in parts[0] else os.path.join(*parts)
