"""Readers and writers for labelled embeddings: .npz, TFRecord, Parquet.

All file access goes through Beam's FileSystems, so local paths and gs:// work
the same. Files are read in workers, one byte range per element (TFRecord and
Parquet files are split into ``--split-bytes`` ranges, so one large file is
read by every worker; an .npz file is always read whole), and yield numpy
blocks ``(x [b, d] float64, y [b] int64)``; nothing collects the dataset.
Block boundaries do not change the release: every sum is exact fixed-point.

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
import struct
from typing import Iterator, Optional, Sequence, Union

import apache_beam as beam
import google_crc32c
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from transforms import allocator, coders, example_wire

FORMATS = ("npz", "tfrecord", "parquet")
SPLIT_BYTES = 64 << 20
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
    split_bytes: int = SPLIT_BYTES  # read range size (TFRecord, Parquet)

    def __post_init__(self) -> None:
        if self.fmt is not None and self.fmt not in FORMATS:
            raise InputError(f"--input-format must be one of {FORMATS}, got {self.fmt!r}")
        if self.non_finite not in NON_FINITE_POLICIES:
            raise InputError(f"--non-finite must be one of {NON_FINITE_POLICIES}")
        if self.block_size < 1:
            raise InputError("--block-size must be >= 1")
        if self.split_bytes < 1:
            raise InputError("--split-bytes must be >= 1")


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
    return [path for path, _ in _match(pattern)]


def _match(pattern: str) -> list[tuple[str, int]]:
    """(path, size in bytes) of the files matching a glob, sorted."""
    if "://" not in pattern and os.path.isdir(pattern):
        raise InputError(f"--input {pattern!r} is a directory; pass a glob "
                         f"such as {os.path.join(pattern, '*.npz')!r}")
    try:
        results = FileSystems.match([pattern])[0].metadata_list
    except Exception as err:  # Beam raises several types for bad paths
        raise InputError(f"--input {pattern!r}: cannot list files ({err})") from None
    found = sorted((m.path, m.size_in_bytes) for m in results
                   if not m.path.endswith("/"))
    if not found and "://" not in pattern and os.path.lexists(pattern):
        raise InputError(f"--input {pattern!r}: exists but cannot be read "
                         f"(a broken symbolic link?)")
    if not found:
        raise InputError(f"--input {pattern!r}: no files match")
    return found


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


# ------------------------------------------------------------ file ranges
# A large TFRecord or Parquet file is read as several byte ranges, one Beam
# element each, so its rows spread over every worker. The ranges are listed
# when the graph is built, from file sizes alone (no data read), and spread
# with a Reshuffle (DirectRunner, Dataflow, Flink) or as separate Dask
# partitions. Beam's own sources are not used: its TFRecord source is not
# splittable, and on the DaskRunner ``beam.io.Read`` is not translated while
# ``ReadAll*`` makes the ranges inside a ParDo, where they stay in the
# partition of their file.

@dataclasses.dataclass(frozen=True)
class FileRange:
    """Bytes [start, stop) of one input file (stop None: to its end).

    A TFRecord record or a Parquet row group belongs to the range that
    holds its first byte; .npz files are always one whole-file range.
    """

    path: str
    start: int = 0
    stop: Optional[int] = None


def file_ranges(path: str, size: int, spec: InputSpec) -> list[FileRange]:
    """The ranges of one file of ``size`` bytes (``spec.split_bytes`` each)."""
    if detect_format(path, spec.fmt) == "npz" or size <= spec.split_bytes:
        return [FileRange(path)]
    starts = list(range(0, size, spec.split_bytes))
    return [FileRange(path, a, b) for a, b in zip(starts, starts[1:])] + [
        FileRange(path, starts[-1])]


@dataclasses.dataclass(frozen=True)
class Rows:
    """Names the rows of a block in error messages: their row numbers in the
    file when known (``first``), else the byte offsets of their TFRecord
    records (a range that starts inside a file does not know how many rows
    precede it)."""

    first: Optional[int] = 0
    offsets: Optional[tuple[int, ...]] = None

    def row(self, i: int) -> str:
        if self.offsets is not None:
            return f"the record at byte {self.offsets[i]}"
        return f"row {self.first + i}"

    def span(self, n: Optional[int] = None, noun: str = "rows") -> str:
        if self.offsets is not None:
            last = self.offsets[-1] if n is None else self.offsets[n - 1]
            return f"records at bytes {self.offsets[0]}..{last}"
        return (f"{noun} {self.first}.." if n is None
                else f"{noun} {self.first}..{self.first + n - 1}")


def _open(path: str):
    try:
        return FileSystems.open(path, compression_type="uncompressed")
    except Exception as err:
        raise InputError(f"{path}: cannot read ({err})") from None


# ------------------------------------------------------------------ Parquet

def _row_group_offset(group) -> int:
    """First byte of a Parquet row group (its first column chunk)."""
    chunk = group.column(0)
    offsets = [chunk.data_page_offset]
    if chunk.has_dictionary_page and chunk.dictionary_page_offset:
        offsets.append(chunk.dictionary_page_offset)
    return min(offsets)


def _parquet_blocks(r: FileRange, spec: InputSpec
                    ) -> Iterator[tuple[Rows, np.ndarray, np.ndarray]]:
    """Blocks of the row groups that start in the range (row numbers are
    exact: the footer gives every row group's size)."""
    import pyarrow.parquet as pq
    path = r.path
    with _open(path) as f:
        try:
            pf = pq.ParquetFile(f)
        except Exception as err:
            raise InputError(f"{path}: not a readable Parquet file "
                             f"({err})") from None
        _check_parquet_schema(pf.schema_arrow, path, spec)
        first, groups = 0, []
        for i in range(pf.metadata.num_row_groups):
            group = pf.metadata.row_group(i)
            offset = _row_group_offset(group)
            if r.start <= offset and (r.stop is None or offset < r.stop):
                groups.append((i, first))
            first += group.num_rows
        columns = [spec.embedding_feature, spec.label_feature]
        for index, start in groups:
            try:
                for batch in pf.iter_batches(batch_size=spec.block_size,
                                             row_groups=[index],
                                             columns=columns):
                    emb = batch.column(0).to_pylist()
                    lab = batch.column(1).to_numpy(zero_copy_only=False)
                    yield Rows(start), _stack_rows(emb, path, Rows(start)), lab
                    start += len(lab)
            except InputError:
                raise
            except Exception as err:  # pyarrow decoding errors: a damaged file
                raise InputError(f"{path}: cannot decode Parquet rows from "
                                 f"{start} ({type(err).__name__})") from None


def _check_parquet_schema(schema, path: str, spec: InputSpec) -> None:
    import pyarrow as pa
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


def _stack_rows(rows: Sequence, path: str, where: Rows) -> np.ndarray:
    """List-of-lists -> [b, d] float64; errors name the first bad row."""
    if not rows:
        return np.zeros((0, 0))
    width = len(rows[0]) if rows[0] is not None else None
    for i, r in enumerate(rows):
        if r is None or width is None or len(r) != width:
            got = "no" if r is None else len(r)
            expected = width if width is not None else "some"
            raise InputError(f"{path}: {where.row(i)} has {got} embedding "
                             f"values, expected {expected}")
    try:
        return np.asarray(rows, dtype=np.float64)
    except (TypeError, ValueError):
        for i, r in enumerate(rows):
            if any(v is None for v in r):
                raise InputError(f"{path}: {where.row(i)} has a null "
                                 f"embedding value") from None
        raise InputError(f"{path}: {where.span(len(rows))}: embedding values "
                         f"are not numeric") from None


# ----------------------------------------------------------------- TFRecord
# Framing: uint64 length, uint32 masked CRC32C of the length, payload,
# uint32 masked CRC32C of the payload (all little-endian). A range that
# starts inside the file begins at the first offset holding a whole valid
# record (both checksums); the range before it checks, once it has read its
# last record, that this search lands exactly on the record that follows,
# so a payload that happens to look like a record cannot shift the split.

_HEADER = struct.Struct("<QI")
_SCAN_BYTES = 1 << 16


def _mask(crc):
    """TFRecord's CRC mask, of a Python int or a uint32 array."""
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def masked_crc32c(data) -> int:
    """TFRecord's masked CRC32C."""
    return _mask(google_crc32c.value(bytes(data)))


def masked_crc32c_strided(buf: bytes, first: int, size: int, stride: int,
                          count: int) -> np.ndarray:
    """TFRecord's masked CRC32C of ``count`` payloads of ``size`` bytes at
    ``first``, ``first + stride``, ... in ``buf`` (uint32): one bytes slice
    and one C call per record, the masking as one array operation (per-row
    ``tobytes`` and a Python-level mask cost twice the CRC itself)."""
    value = google_crc32c.value
    crc = np.fromiter((value(buf[i:i + size]) for i in
                       range(first, first + count * stride, stride)),
                      np.uint32, count)
    return _mask(crc)


def _record_damage(path: str, offset: int, index: Optional[int],
                   what: str) -> InputError:
    """Beam's own reader quotes the damaged bytes; those are private data,
    so the message only names the place and the kind of damage."""
    record = f"record {index}" if index is not None else "record"
    return InputError(f"{path}: TFRecord {record} at byte {offset} is {what}; "
                      f"not a valid TFRecord file")


def _read_record(read, path: str, offset: int,
                 index: Optional[int]) -> Optional[bytes]:
    """The payload of the record at ``offset``; None at a clean end of file.
    ``read(pos, n)``: up to n bytes at byte pos (fewer only at the end)."""
    header = read(offset, _HEADER.size)
    if not header:
        return None
    truncated = "truncated (the file ends inside the record)"
    if len(header) < _HEADER.size:
        raise _record_damage(path, offset, index, truncated)
    length, crc = _HEADER.unpack(header)
    if masked_crc32c(header[:8]) != crc:
        raise _record_damage(path, offset, index,
                             "corrupt (length checksum mismatch)")
    data = read(offset + _HEADER.size, length + 4)
    if len(data) < length + 4:
        raise _record_damage(path, offset, index, truncated)
    if masked_crc32c(data[:length]) != struct.unpack("<I", data[length:])[0]:
        raise _record_damage(path, offset, index,
                             "corrupt (data checksum mismatch)")
    return data[:length]


def _seek_read(f):
    def read(pos: int, n: int) -> bytes:
        f.seek(pos)
        return f.read(n)
    return read


class _Window:
    """Reads a file forward in large chunks: two small reads per record
    through the file object cost more than the records' checksums."""

    CHUNK = 1 << 22

    def __init__(self, f, pos: int) -> None:
        f.seek(pos)
        self.f, self.base, self.buf = f, pos, b""

    def __call__(self, pos: int, n: int) -> bytes:
        end = pos + n
        have = self.base + len(self.buf)
        if end > have:
            parts = [self.buf[pos - self.base:]]
            want = max(self.CHUNK, end - have)
            while want > 0:
                more = self.f.read(want)
                if not more:
                    break
                parts.append(more)
                want -= len(more)
            self.buf, self.base = b"".join(parts), pos
        start = pos - self.base
        return self.buf[start:start + n]


def _valid_record_at(f, offset: int) -> bool:
    try:
        return _read_record(_seek_read(f), "", offset, None) is not None
    except InputError:
        return False


def _find_record(f, start: int, limit: Optional[int]) -> Optional[int]:
    """First offset in [start, limit) holding a whole valid record (None:
    none). Lengths are taken to be < 4 GiB, so candidates are the offsets
    followed by four zero bytes at +4; their length checksum filters the
    rest before the payload is read."""
    pos = start
    while limit is None or pos < limit:
        f.seek(pos)
        want = _SCAN_BYTES if limit is None else min(_SCAN_BYTES, limit - pos)
        buf = f.read(want + _HEADER.size - 1)
        if len(buf) < _HEADER.size:
            return None
        b = np.frombuffer(buf, np.uint8)
        n = len(buf) - _HEADER.size + 1  # offsets with a whole header
        zero = b == 0
        cand = np.flatnonzero(zero[4:n + 4] & zero[5:n + 5] & zero[6:n + 6]
                              & zero[7:n + 7])
        for p in cand[cand < want].tolist():
            length_crc = struct.unpack_from("<I", buf, p + 8)[0]
            if masked_crc32c(buf[p:p + 8]) == length_crc and \
                    _valid_record_at(f, pos + p):
                return pos + p
        pos += min(want, n)
    return None


@dataclasses.dataclass(frozen=True)
class _Run:
    """Consecutive records of one length: the first at byte ``offset``
    (record ``index`` of the file, None if unknown), one every ``stride``
    bytes; ``rows`` holds their payloads [m, length] (checksums checked)."""

    offset: int
    index: Optional[int]
    stride: int
    rows: np.ndarray

    def offsets(self) -> list[int]:
        return [self.offset + i * self.stride for i in range(len(self.rows))]


_RUN_RECORDS = 4096


def _tfrecord_runs(r: FileRange) -> Iterator[_Run]:
    """The records starting in the range, as runs of equal-length records.

    Embedding files hold records of one length (a fixed-size float list and
    a small label), so after one record is read and checked the next ones
    sit at a fixed stride: their headers are compared as one numpy array
    and only the payload checksums are computed per record (4.9 -> ~1 us a
    record at 384-d). Anything else falls back to one record at a time."""
    path = r.path
    with _open(path) as f:
        pos = r.start if r.start == 0 else _find_record(f, r.start, r.stop)
        if pos is None:
            return  # no record starts in this range
        index = 0 if r.start == 0 else None
        read = _Window(f, pos)
        last = None
        while r.stop is None or pos < r.stop:
            record = _read_record(read, path, pos, index)
            if record is None:
                break
            stride = _HEADER.size + len(record) + 4
            header = np.frombuffer(read(pos, _HEADER.size), np.uint8)
            yield _Run(pos, index, stride,
                       np.frombuffer(record, np.uint8)[None, :])
            last, pos = pos, pos + stride
            index = None if index is None else index + 1
            run = _uniform_run(read, path, pos, index, header, stride, r.stop)
            if run is not None:
                yield run
                last = pos + (len(run.rows) - 1) * stride
                pos += len(run.rows) * stride
                index = None if index is None else index + len(run.rows)
        if r.stop is not None and last is not None:
            _check_split(f, path, r.stop, pos, last)


def _uniform_run(read, path: str, pos: int, index: Optional[int],
                 header: np.ndarray, stride: int, stop: Optional[int]
                 ) -> Optional[_Run]:
    """The records at pos, pos + stride, ... that have ``header`` (the
    same length, whose checksum is already verified), up to the range's
    stop; None if the next one differs (the caller reads it singly)."""
    m = _RUN_RECORDS if stop is None else min(_RUN_RECORDS,
                                              -(-(stop - pos) // stride))
    if m <= 0:
        return None
    buf = read(pos, m * stride)
    m = len(buf) // stride
    if m == 0:
        return None
    frames = np.frombuffer(buf, np.uint8, m * stride).reshape(m, stride)
    same = (frames[:, :_HEADER.size] == header).all(axis=1)
    m = m if same.all() else int(np.argmin(same))
    if m == 0:
        return None
    length = stride - _HEADER.size - 4
    rows = frames[:m, _HEADER.size:_HEADER.size + length]
    stored = frames[:m, _HEADER.size + length:].copy().view("<u4").ravel()
    crcs = masked_crc32c_strided(buf, _HEADER.size, length, stride, m)
    bad = np.flatnonzero(crcs != stored)
    if bad.size:
        i = int(bad[0])
        raise _record_damage(path, pos + i * stride,
                             None if index is None else index + i,
                             "corrupt (data checksum mismatch)")
    return _Run(pos, index, stride, rows)


def _check_split(f, path: str, stop: int, boundary: int, last: int) -> None:
    """The next range starts its search at ``stop``: it must find the
    record at ``boundary`` (or nothing when the file ends there)."""
    f.seek(boundary)
    at_end = not f.read(1)
    found = _find_record(f, stop, None if at_end else boundary + 1)
    if found != (None if at_end else boundary):
        raise InputError(f"{path}: cannot split this TFRecord file at byte "
                         f"{stop}: the payload of the record at byte {last} "
                         f"looks like a record; pass a larger --split-bytes "
                         f"or write the data in several files")


def _parse_examples(records: Union[list, np.ndarray], path: str,
                    where: Rows, spec: InputSpec
                    ) -> tuple[np.ndarray, np.ndarray]:
    """``records``: payloads as bytes, or as the rows of a uint8 array
    when they all have one length."""
    parse = (example_wire.parse_rows if isinstance(records, np.ndarray)
             else example_wire.parse_examples)
    try:
        parsed = parse(records, spec.embedding_feature, spec.label_feature)
    except example_wire.WireError as err:
        raise InputError(f"{path}: {where.row(err.index)} is not a "
                         f"tf.train.Example with float feature "
                         f"{spec.embedding_feature!r} and int64 feature "
                         f"{spec.label_feature!r} ({err})") from None
    for name, lengths in ((spec.embedding_feature, parsed.emb_lengths),
                          (spec.label_feature, parsed.lab_lengths)):
        bad = np.flatnonzero(lengths == 0)
        if bad.size:
            raise InputError(f"{path}: {where.row(int(bad[0]))} has no feature "
                             f"{name!r} (see --embedding-feature/--label-feature)")
    if np.any(parsed.lab_lengths != 1):
        i = int(np.flatnonzero(parsed.lab_lengths != 1)[0])
        raise InputError(f"{path}: {where.row(i)}: label must be one int64 value")
    lengths = parsed.emb_lengths
    if np.any(lengths != lengths[0]):
        i = int(np.flatnonzero(lengths != lengths[0])[0])
        raise InputError(f"{path}: {where.row(i)} has {lengths[i]} "
                         f"embedding values, expected {lengths[0]}")
    x, y = parsed.arrays()
    return x.astype(np.float64), y


def _tfrecord_blocks(r: FileRange, spec: InputSpec
                     ) -> Iterator[tuple[Rows, np.ndarray, np.ndarray]]:
    """Blocks of ``spec.block_size`` records (the last one shorter)."""
    pieces: list[_Run] = []
    have = 0
    for run in _tfrecord_runs(r):
        while len(run.rows):
            take = min(spec.block_size - have, len(run.rows))
            pieces.append(_Run(run.offset, run.index, run.stride,
                               run.rows[:take]))
            have += take
            run = _Run(run.offset + take * run.stride,
                       None if run.index is None else run.index + take,
                       run.stride, run.rows[take:])
            if have == spec.block_size:
                yield _block_of(pieces, r.path, spec)
                pieces, have = [], 0
    if pieces:
        yield _block_of(pieces, r.path, spec)


def _block_of(pieces: list, path: str, spec: InputSpec
              ) -> tuple[Rows, np.ndarray, np.ndarray]:
    first = pieces[0].index
    where = (Rows(first) if first is not None else
             Rows(None, tuple(o for p in pieces for o in p.offsets())))
    if len({p.rows.shape[1] for p in pieces}) == 1:
        records = np.concatenate([p.rows for p in pieces])
    else:
        records = [row.tobytes() for p in pieces for row in p.rows]
    return (where, *_parse_examples(records, path, where, spec))


# ---------------------------------------------------------------------- npz

def _npz_blocks(path: str, spec: InputSpec
                ) -> Iterator[tuple[Rows, np.ndarray, np.ndarray]]:
    x, y = _npz_arrays(path, spec)
    if x.ndim != 2:
        raise InputError(f"{path}: 'embeddings' must be 2-D [n, d], got "
                         f"shape {x.shape}")
    if y.ndim != 1 or len(y) != len(x):
        raise InputError(f"{path}: 'labels' must be 1-D with {len(x)} "
                         f"rows, got shape {y.shape}")
    for s in range(0, len(x), spec.block_size):
        yield Rows(s), x[s:s + spec.block_size], y[s:s + spec.block_size]


def _raw_blocks(r: FileRange, spec: InputSpec
                ) -> Iterator[tuple[Rows, np.ndarray, np.ndarray]]:
    fmt = detect_format(r.path, spec.fmt)
    if fmt == "npz":
        yield from _npz_blocks(r.path, spec)
    elif fmt == "parquet":
        yield from _parquet_blocks(r, spec)
    else:
        yield from _tfrecord_blocks(r, spec)


# -------------------------------------------------------------- validation

def validate_block(x: np.ndarray, y: np.ndarray, path: str,
                   start: Union[int, Rows], spec: InputSpec, dim: Optional[int] = None,
                   dim_source: Optional[str] = None
                   ) -> tuple[np.ndarray, np.ndarray, int]:
    """Checks one block; returns (x, y, rows dropped as non-finite).

    ``dim`` is the embedding dimension every file must have (read from the
    schema of ``dim_source``, the first non-empty input file). Dropping
    non-finite rows (``--non-finite drop``) is a per-record rule that does
    not look at any other record, so it keeps the DP guarantee; the number
    dropped is private and only goes to an operator counter. ``start``: the
    block's first row number in the file, or a ``Rows`` naming its rows
    (errors then name a TFRecord record by its byte offset).
    """
    where = start if isinstance(start, Rows) else Rows(start)
    try:
        x = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"{path}: {where.span()}: embeddings are not "
                         f"numeric") from None
    if x.ndim != 2:
        raise InputError(f"{path}: embeddings must be 2-D [n, d], got shape "
                         f"{x.shape}")
    if dim is not None and x.shape[1] != dim and len(x):
        source = f"that of {dim_source}" if dim_source else "the first file's"
        raise InputError(f"{path}: {where.row(0)} has dimension {x.shape[1]}, "
                         f"expected {dim} ({source}); all input files must "
                         f"have the same embedding dimension")
    y = _integer_labels(np.asarray(y), path, where)
    if len(y) != len(x):
        raise InputError(f"{path}: {where.span()}: {len(x)} embeddings but "
                         f"{len(y)} labels")
    if spec.labels is not None:
        bad = np.flatnonzero(~np.isin(y, np.array(spec.labels)))
        if bad.size:
            i = int(bad[0])
            raise InputError(f"{path}: {where.row(i)} has label {int(y[i])}, "
                             f"which is not in --labels/--num-classes "
                             f"{_short(spec.labels)}")
    finite = _finite_rows(x)
    if finite.all():
        return x, y, 0
    if spec.non_finite == "reject":
        i = int(np.flatnonzero(~finite)[0])
        raise InputError(f"{path}: {where.row(i)} has NaN or infinite values "
                         f"(use --non-finite drop to drop such rows)")
    return x[finite], y[finite], int((~finite).sum())


def _finite_rows(x: np.ndarray) -> np.ndarray:
    """Rows with finite values whose squared norm also fits in float64: one
    pass, since the sum of squares is NaN or inf exactly when a value is
    non-finite or the squared norm overflows."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.isfinite(np.einsum("ij,ij->i", x, x))


def _short(labels: Sequence[int]) -> str:
    labels = list(labels)
    return str(labels) if len(labels) <= 12 else \
        f"[{labels[0]}, {labels[1]}, ..., {labels[-1]}] ({len(labels)} labels)"


def _integer_labels(y: np.ndarray, path: str, where: Rows) -> np.ndarray:
    if y.ndim != 1:
        raise InputError(f"{path}: labels must be 1-D, got shape {y.shape}")
    if y.dtype.kind in "iu":
        return y.astype(np.int64)
    if y.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(y) | (y != np.round(y)))
        if bad.size:
            i = int(bad[0])
            raise InputError(f"{path}: {where.row(i)} has non-integer label "
                             f"{float(y[i])!r}; labels must be integers")
        return y.astype(np.int64)
    raise InputError(f"{path}: {where.span()}: labels must be integers, got "
                     f"dtype {y.dtype}")


def read_file_blocks(path: str, spec: InputSpec, dim: Optional[int] = None,
                     dim_source: Optional[str] = None
                     ) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
    """Validated (x, y, dropped) blocks of one whole file."""
    return read_range_blocks(FileRange(path), spec, dim, dim_source)


def read_range_blocks(r: FileRange, spec: InputSpec,
                      dim: Optional[int] = None,
                      dim_source: Optional[str] = None
                      ) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
    """Validated (x, y, dropped) blocks of one file range.

    Errors name the file and the row number; in a TFRecord range that
    starts inside the file the row number is not known, so they name the
    record's byte offset instead (``the record at byte N``).
    """
    for where, x, y in _raw_blocks(r, spec):
        yield validate_block(x, y, r.path, where, spec, dim, dim_source)


def peek_dim(path: str, spec: InputSpec) -> int:
    """Embedding dimension from the first row of a file (schema, not data)."""
    dim = _peek_dim(path, spec)
    if dim is None:
        raise InputError(f"{path}: the file holds no rows")
    return dim


def _peek_dim(path: str, spec: InputSpec) -> Optional[int]:
    """Dimension of the first row, or None for a file with no rows."""
    one_row = dataclasses.replace(spec, block_size=1)
    for _, x, _ in _raw_blocks(FileRange(path), one_row):
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

    def setup(self) -> None:
        allocator.keep_heap_pages()

    def process(self, r: FileRange
                ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for x, y, dropped in read_range_blocks(r, self._spec, self._dim,
                                               self._source):
            self._rows.inc(len(y) + dropped)
            self._dropped.inc(dropped)
            if len(y):
                yield x, y


class ReadEmbeddingBlocks(beam.PTransform):
    """Files matching ``spec.pattern`` -> validated (x, y) numpy blocks.

    The file list, the embedding dimension (schema) and the read ranges
    (``file_ranges``: TFRecord and Parquet files in ``spec.split_bytes``
    pieces, .npz whole) are made when the graph is built, so a missing
    input fails before the pipeline starts. Each range is one element,
    spread over the workers: one large file is read by all of them.
    ``dim`` (public configuration, ``--embedding-dim``) skips reading the
    dimension from the first row: every row is checked against it, and an
    input with no rows is still a valid (empty) dataset.
    """

    def __init__(self, spec: InputSpec, dim: Optional[int] = None) -> None:
        super().__init__()
        self.spec = spec
        sizes = _match(spec.pattern)
        self.paths = [path for path, _ in sizes]
        if dim is None:
            self.dim, self.dim_source = input_schema(self.paths, spec)
        else:
            self.dim, self.dim_source = int(dim), "--embedding-dim"
        self.ranges = [r for path, size in sizes
                       for r in file_ranges(path, size, spec)]

    def expand(self, pbegin):
        return (pbegin
                | "ListRanges" >> beam.Create(self.ranges)
                | "SpreadRanges" >> beam.Reshuffle()
                | "ReadBlocks" >> beam.ParDo(_ReadBlocksFn(
                    self.spec, self.dim, self.dim_source)
                ).with_output_types(coders.RAW_BLOCK))


# ---------------------------------------------------------------- paths

def join(*parts: str) -> str:
    return FileSystems.join(*parts) if "://" in parts[0] else os.path.join(*parts)
