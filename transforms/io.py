"""Readers and writers for labelled embeddings: .npz, TFRecord, Parquet, CSV.

All file access goes through Beam's FileSystems, so local paths and gs:// work
the same. Files are read in workers, one byte range per element (a file
larger than ``--split-bytes`` is split into ranges of that size, so one
large file is read by every worker; a compressed .npz is read whole), and
yield numpy blocks ``(x [b, d], y [b] int64)``, x float32 or float64 as
stored (other numbers become float64; every later step computes in float64
from its own copy, and float32 -> float64 is exact); nothing collects the
dataset. Block boundaries do not change the release: every sum is exact
fixed-point.

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
import zipfile
from typing import Iterator, Optional, Sequence, Union

import apache_beam as beam
import google_crc32c
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from dpsynth.transforms import allocator, coders, example_wire

from dpsynth.transforms.formats import FORMATS, NON_FINITE_POLICIES, SPLIT_BYTES  # noqa: F401  (re-exported)


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
    # CSV/Parquet: one numeric column per dimension, named or matched by
    # glob patterns ("f*", "dim_*", "x0,x1,x2"); None: embedding_feature
    embedding_columns: Optional[tuple[str, ...]] = None

    def __post_init__(self) -> None:
        if self.fmt is not None and self.fmt not in FORMATS:
            raise InputError(f"--input-format must be one of {FORMATS}, got {self.fmt!r}")
        if self.non_finite not in NON_FINITE_POLICIES:
            raise InputError(f"--non-finite must be one of {NON_FINITE_POLICIES}")
        if self.block_size < 1:
            raise InputError("--block-size must be >= 1")
        if self.split_bytes < 1:
            raise InputError("--split-bytes must be >= 1")
        if self.embedding_columns is not None and (
                not self.embedding_columns or not all(self.embedding_columns)):
            raise InputError("--embedding-columns needs column names or "
                             "patterns, e.g. 'f*' or x0,x1,x2")


def match_columns(names: Sequence[str], path: str,
                  spec: InputSpec) -> list[str]:
    """The embedding columns ``--embedding-columns`` picks from a file's
    columns: each entry a name or glob pattern (fnmatch), its matches in
    the file's order, the label column never. An entry matching nothing is
    refused: a typo must not silently drop dimensions."""
    import fnmatch
    found: list[str] = []
    for entry in spec.embedding_columns or ():
        hits = [n for n in names if n != spec.label_feature
                and fnmatch.fnmatchcase(n, entry)]
        if not hits:
            raise InputError(f"{path}: --embedding-columns {entry!r} matches "
                             f"no column (has {_column_names(names)})")
        found += [n for n in hits if n not in found]
    return found


def check_columns_format(path: str, spec: InputSpec) -> None:
    """--embedding-columns names table columns: CSV and Parquet only."""
    fmt = detect_format(path, spec.fmt)
    if spec.embedding_columns and fmt not in ("csv", "parquet"):
        raise InputError(f"--embedding-columns: {path} is {fmt} input; the "
                         f"flag picks CSV or Parquet columns (see "
                         f"--embedding-feature)")


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
    if name.endswith(".csv"):
        return "csv"
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
# A large input file is read as several byte ranges, one Beam element
# each, so its rows spread over every worker. The ranges are listed
# when the graph is built, from file sizes (Parquet: row groups are placed
# by the footer when read) and, for a TFRecord file larger than one range,
# one walk over its record headers (``_record_boundaries``), and spread
# with a Reshuffle (DirectRunner, Dataflow, Flink) or as separate Dask
# partitions. Beam's own sources are not used: its TFRecord source is not
# splittable, and on the DaskRunner ``beam.io.Read`` is not translated while
# ``ReadAll*`` makes the ranges inside a ParDo, where they stay in the
# partition of their file.

@dataclasses.dataclass(frozen=True)
class FileRange:
    """Bytes [start, stop) of one input file (stop None: to its end).

    A TFRecord record, a Parquet row group or an .npz row belongs to the
    range that holds its first byte (a compressed .npz: all to the first
    range). A TFRecord range's start and stop are record boundaries, found
    by ``file_ranges`` walking the file's records from its start.
    """

    path: str
    start: int = 0
    stop: Optional[int] = None


def list_ranges(pattern: str, spec: InputSpec) -> list["FileRange"]:
    """Every read range of the files matching ``pattern``."""
    return [r for path, size in _match(pattern)
            for r in file_ranges(path, size, spec)]


def file_ranges(path: str, size: int, spec: InputSpec) -> list[FileRange]:
    """The ranges of one file of ``size`` bytes: as few equal pieces as
    keep each within ``spec.split_bytes`` (equal, so that the workers that
    split a pass's ranges between them get equal work: a 154 MB file in
    64 MB pieces left a 26 MB third, and DirectRunner deals ranges out by
    count); a TFRecord range runs from the first record starting in its
    piece to the next range's."""
    fmt = detect_format(path, spec.fmt)
    if size <= spec.split_bytes or fmt == "csv":  # CSV: read whole
        return [FileRange(path)]
    pieces = -(-size // spec.split_bytes)
    starts = [size * i // pieces for i in range(pieces)]
    if fmt == "tfrecord":  # the first record starting in each piece
        starts = [0] + _record_boundaries(path, size, starts[1:])
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
        embedding = _check_parquet_schema(pf.schema_arrow, path, spec)
        if r.start == 0 and pf.metadata.num_rows == 0:
            width = _fixed_list_size(pf.schema_arrow, spec) or 0
            yield Rows(0), np.zeros((0, width)), np.zeros(0, np.int64)
        first, groups = 0, []
        for i in range(pf.metadata.num_row_groups):
            group = pf.metadata.row_group(i)
            offset = _row_group_offset(group)
            if r.start <= offset and (r.stop is None or offset < r.stop):
                groups.append((i, first))
            first += group.num_rows
        columns = embedding + [spec.label_feature]
        for index, start in groups:
            try:
                for batch in pf.iter_batches(batch_size=spec.block_size,
                                             row_groups=[index],
                                             columns=columns):
                    lab = batch.column(len(embedding)).to_numpy(
                        zero_copy_only=False)
                    emb = _embedding_rows(batch, spec, path, Rows(start))
                    yield Rows(start), emb, lab
                    start += len(lab)
            except InputError:
                raise
            except Exception as err:  # pyarrow decoding errors: a damaged file
                raise InputError(f"{path}: cannot decode Parquet rows from "
                                 f"{start} ({type(err).__name__})") from None


def _check_parquet_schema(schema, path: str, spec: InputSpec
                          ) -> list[str]:
    """The embedding column(s) to read, checked against the schema."""
    import pyarrow as pa
    if spec.embedding_columns:
        return _parquet_scalar_columns(schema, path, spec)
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
    return [spec.embedding_feature]


def _parquet_scalar_columns(schema, path: str, spec: InputSpec
                            ) -> list[str]:
    """--embedding-columns of a Parquet schema: numeric, one per dimension."""
    import pyarrow as pa
    if spec.label_feature not in schema.names:
        raise InputError(f"{path}: no column {spec.label_feature!r} (has "
                         f"{_column_names(schema.names)}); see --label-feature")
    columns = match_columns(schema.names, path, spec)
    for col in columns:
        kind = schema.field(col).type
        if not (pa.types.is_floating(kind) or pa.types.is_integer(kind)):
            raise InputError(f"{path}: column {col!r} (--embedding-columns) "
                             f"must hold one number per row, got type {kind}")
    return columns


def _embedding_rows(batch, spec: InputSpec, path: str,
                    where: Rows) -> np.ndarray:
    """[b, d] rows of a Parquet batch (its embedding columns first): one
    column per dimension (--embedding-columns; a null value becomes NaN,
    so --non-finite decides), else its list column."""
    if spec.embedding_columns:
        return _float_rows(np.column_stack([
            batch.column(i).to_numpy(zero_copy_only=False)
            for i in range(batch.num_columns - 1)]))
    return _list_rows(batch.column(0), path, where)


def _list_rows(column, path: str, where: Rows) -> np.ndarray:
    """An Arrow list column (fixed-size, list or large list; one array or
    chunked) -> [b, d] float32 or float64 (``_float_rows``) straight from
    its buffers: Python lists per row cost 20x the read (issue 27). Errors
    name the first bad row, with the messages of ``_stack_rows``; value
    types numpy cannot take from Arrow (decimals, strings, ...) go through
    it."""
    import pyarrow as pa
    if isinstance(column, pa.ChunkedArray):
        column = (column.combine_chunks() if column.num_chunks != 1
                  else column.chunk(0))
    n = len(column)
    if pa.types.is_fixed_size_list(column.type):
        width = column.type.list_size
        lengths = np.full(n, width, np.int64)
    else:
        lengths = np.diff(column.offsets.to_numpy())
        width = int(lengths[0]) if n else 0
    if n == 0:
        return np.zeros((0, width))
    null = (column.is_null().to_numpy(zero_copy_only=False)
            if column.null_count else np.zeros(n, bool))
    bad = null | (lengths != width) if not null[0] else np.ones(n, bool)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        got = "no" if null[i] else int(lengths[i])
        expected = "some" if null[0] else width
        raise InputError(f"{path}: {where.row(i)} has {got} embedding "
                         f"values, expected {expected}")
    values = column.flatten()  # no null rows: n * width values, in order
    kind = values.type
    if not (pa.types.is_floating(kind) or pa.types.is_integer(kind)
            or pa.types.is_boolean(kind)):
        return _stack_rows(column.to_pylist(), path, where)
    # A null value becomes NaN, as before (so --non-finite decides).
    flat = values.to_numpy(zero_copy_only=False)
    return _float_rows(flat).reshape(n, width)


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


# ---------------------------------------------------------------------- CSV
# A header row, then one row per record: the label column and either one
# list column (``--embedding-feature``; "[0.1, 0.2]" or "0.1 0.2") or one
# column per dimension, named <feature>_0 .. <feature>_{d-1}. Every cell is
# read as text and converted here, so an error names its row and column
# (never its value). A CSV file is read whole by one worker: a quoted
# field may hold a newline, so a byte range cannot find its first row.

def _csv_header(f, path: str) -> list[str]:
    import csv
    line = f.readline()
    try:
        text = line.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InputError(f"{path}: the CSV header is not UTF-8 "
                         f"text") from None
    names = next(csv.reader([text]), [])
    if not names or names == [""]:
        raise InputError(f"{path}: empty CSV file (a header row naming the "
                         f"columns is needed)")
    return names


def csv_embedding_columns(names: Sequence[str], path: str,
                          spec: InputSpec) -> tuple[list[str], bool]:
    """(embedding columns, whether that is one list column), checked
    against the header like a Parquet schema."""
    feature, label = spec.embedding_feature, spec.label_feature
    if label not in names:
        raise InputError(f"{path}: no column {label!r} (has "
                         f"{_column_names(names)}); see --label-feature")
    if spec.embedding_columns:
        return match_columns(names, path, spec), False
    if feature in names:
        return [feature], True
    dims = []
    while f"{feature}_{len(dims)}" in names:
        dims.append(f"{feature}_{len(dims)}")
    if not dims:
        raise InputError(f"{path}: no column {feature!r} (a list per row) "
                         f"or {feature}_0, {feature}_1, ... (one per "
                         f"dimension); has {_column_names(names)}; see "
                         f"--embedding-feature")
    stray = [n for n in names if n.startswith(f"{feature}_")
             and n not in dims]
    if stray:
        raise InputError(f"{path}: column {stray[0]!r} does not follow "
                         f"{dims[-1]!r} (dimension columns must be "
                         f"numbered 0, 1, ... without gaps)")
    return dims, False


def _column_names(names: Sequence[str]) -> str:
    names = list(names)
    return str(names) if len(names) <= 8 else f"{names[:8]} and {len(names) - 8} more"


def _csv_schema_dim(f, path: str, spec: InputSpec) -> Optional[int]:
    """The dimension a CSV header records (one column per dimension)."""
    columns, is_list = csv_embedding_columns(_csv_header(f, path), path,
                                             spec)
    return None if is_list else len(columns)


def _csv_blocks(path: str, spec: InputSpec
                ) -> Iterator[tuple[Rows, np.ndarray, np.ndarray]]:
    import pyarrow as pa
    import pyarrow.csv as pacsv
    with _open(path) as f:
        names = _csv_header(f, path)
    columns, is_list = csv_embedding_columns(names, path, spec)
    wanted = columns + [spec.label_feature]
    start = 0
    with _open(path) as f:
        reader = _csv_reader(f, path, pacsv, pa.string(), wanted)
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                break
            except (pa.ArrowInvalid, UnicodeDecodeError) as err:
                raise _csv_parse_error(err, path, start) from None
            where = Rows(start)
            label = _csv_numbers(batch.column(spec.label_feature), path,
                                 where, spec.label_feature, pa.int64())
            emb = (_csv_list(batch.column(columns[0]), path, where, columns[0])
                   if is_list else np.column_stack([_csv_numbers(
                       batch.column(c), path, where, c, pa.float64())
                       for c in columns]))
            yield where, emb, label
            start += len(label)
    if start == 0:  # no rows: an empty block of the header's width
        width = 0 if is_list else len(columns)
        yield Rows(0), np.zeros((0, width)), np.zeros(0, np.int64)


def _csv_reader(f, path: str, pacsv, text, wanted: list[str]):
    """pyarrow's streaming reader of the ``wanted`` columns, as text (row
    numbers in its errors need one thread: each reader is one worker's)."""
    try:
        return pacsv.open_csv(
            f, read_options=pacsv.ReadOptions(use_threads=False),
            convert_options=pacsv.ConvertOptions(
                column_types={c: text for c in wanted},
                include_columns=wanted, strings_can_be_null=False))
    except Exception as err:  # noqa: BLE001  (pyarrow: several types)
        raise _csv_parse_error(err, path, 0) from None


def _csv_parse_error(err: Exception, path: str, start: int) -> InputError:
    """pyarrow's parse error as one line; its text quotes the row, which
    may hold embedding values, so only the row and counts are kept."""
    import re
    found = re.search(r"Row #(\d+): Expected (\d+) columns, got (\d+)",
                      str(err))
    if found:
        line, expected, got = map(int, found.groups())
        return InputError(f"{path}: row {line - 2} (line {line}) has {got} "
                          f"fields, expected {expected}")
    return InputError(f"{path}: cannot parse CSV after row {start} "
                      f"({type(err).__name__})")


def _csv_numbers(column, path: str, where: Rows, name: str,
                 kind) -> np.ndarray:
    """A text column as numbers of ``kind`` (labels: int64, else float64;
    a label such as 3.0 is checked for integrality later)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    text = pc.utf8_trim_whitespace(column)
    for target in (kind, pa.float64()):
        try:
            return pc.cast(text, target).to_numpy(zero_copy_only=False)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
    for i, value in enumerate(text.to_pylist()):
        try:
            float(value)
        except ValueError:
            raise InputError(f"{path}: {where.row(i)}: column {name!r} is "
                             f"not a number") from None
    raise InputError(f"{path}: {where.span(len(text))}: column {name!r} is "
                     f"not numeric")


def _csv_list(column, path: str, where: Rows, name: str) -> np.ndarray:
    """A text column of lists ("[0.1, 0.2]" or "0.1 0.2") as [b, d] rows
    (lengths checked by ``_list_rows``)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    parts = pc.split_pattern_regex(pc.utf8_trim(column, "[] \t"), r"[,\s]+")
    try:
        values = pc.cast(parts, pa.list_(pa.float64()))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        for i, row in enumerate(parts.to_pylist()):
            try:
                [float(v) for v in row]
            except ValueError:
                raise InputError(f"{path}: {where.row(i)}: column {name!r} "
                                 f"is not a list of numbers") from None
        raise InputError(f"{path}: {where.span(len(parts))}: column "
                         f"{name!r} is not a list of numbers") from None
    return _list_rows(values, path, where)


# ----------------------------------------------------------------- TFRecord
# Framing: uint64 length, uint32 masked CRC32C of the length, payload,
# uint32 masked CRC32C of the payload (all little-endian). A range that
# starts inside the file begins at a record boundary found when the ranges
# are listed, by walking the record lengths from the start of the file:
# bytes inside a payload are never taken for a record, so the records a
# range reads never depend on what other records hold (issue 25).

_HEADER = struct.Struct("<QI")


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


def tfrecord_payloads(path: str) -> Iterator[bytes]:
    """The payloads of a TFRecord file of records of any size, in order,
    checksums checked; damage raises the error of ``_record_damage``
    (file, record number, byte offset)."""
    with _open(path) as f:
        read, pos, index = _Window(f, 0), 0, 0
        while True:
            record = _read_record(read, path, pos, index)
            if record is None:
                return
            yield record
            pos += _HEADER.size + len(record) + 4
            index += 1


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
    """The records of the range, as runs of equal-length records.

    Embedding files hold records of one length (a fixed-size float list and
    a small label), so after one record is read and checked the next ones
    sit at a fixed stride: their headers are compared as one numpy array
    and only the payload checksums are computed per record (4.9 -> ~1 us a
    record at 384-d). Anything else falls back to one record at a time.
    ``r.start`` must be a record boundary (``file_ranges``)."""
    path, pos = r.path, r.start
    if r.stop is not None and pos >= r.stop:
        return  # no record starts in this range
    with _open(path) as f:
        index = 0 if r.start == 0 else None
        read = _Window(f, pos)
        while r.stop is None or pos < r.stop:
            record = _read_record(read, path, pos, index)
            if record is None:
                break
            stride = _HEADER.size + len(record) + 4
            header = np.frombuffer(read(pos, _HEADER.size), np.uint8)
            yield _Run(pos, index, stride,
                       np.frombuffer(record, np.uint8)[None, :])
            pos += stride
            index = None if index is None else index + 1
            run = _uniform_run(read, path, pos, index, header, stride, r.stop)
            if run is not None:
                yield run
                pos += len(run.rows) * stride
                index = None if index is None else index + len(run.rows)


def _record_boundaries(path: str, size: int, points: Sequence[int]
                       ) -> list[int]:
    """For each point (ascending), the offset of the first record that
    starts at or after it (``size`` if none), found by walking the frames
    from the start of the file: lengths only, runs of equal headers
    compared as numpy arrays, no payload checksum (the readers check
    those). A search from the point itself could stop at bytes inside a
    payload that look like a record (issue 25), so one person's record
    could change how others are read; the walk cannot.

    Where a header is damaged or the file ends inside a record, the walk
    stops: later points get ``size``, so the range holding the damage reads
    to the end of the file and names it."""
    out: list[int] = []
    with _open(path) as f:
        read = _Window(f, 0)
        pos, header, stride = 0, None, 0
        for point in points:
            while pos < point:
                head = read(pos, _HEADER.size)
                if len(head) < _HEADER.size:
                    pos = size  # the end, or a truncated header
                    break
                if head != header:
                    length, crc = _HEADER.unpack(head)
                    if masked_crc32c(head[:8]) != crc:
                        pos = size  # damaged: its range reads to the end
                        break
                    header, stride = head, _HEADER.size + length + 4
                if pos + stride > size:
                    pos = size  # truncated: its range reads to the end
                    break
                pos += stride
                # The following records of this length, up to the point.
                m = min(_RUN_RECORDS, -(-(point - pos) // stride))
                if m > 0:
                    buf = read(pos, m * stride)
                    m = len(buf) // stride  # whole records only
                    frames = np.frombuffer(buf, np.uint8, m * stride
                                           ).reshape(m, stride)
                    same = (frames[:, :_HEADER.size]
                            == np.frombuffer(header, np.uint8)).all(axis=1)
                    pos += stride * (m if same.all() else int(np.argmin(same)))
            out.append(min(pos, size))
    return out


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
    return parsed.arrays()  # float32 rows, as the records hold them


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

def _check_npz_shapes(path: str, x_shape: tuple, y_shape: tuple,
                      min_width: int = 0) -> None:
    """'embeddings' [n, d] (d >= min_width) and 'labels' [n]."""
    if len(x_shape) != 2 or x_shape[1] < min_width:
        raise InputError(f"{path}: 'embeddings' must be 2-D [n, d], got "
                         f"shape {x_shape}")
    if tuple(y_shape) != (x_shape[0],):
        raise InputError(f"{path}: 'labels' must be 1-D with {x_shape[0]} "
                         f"rows, got shape {y_shape}")


def _npz_blocks(path: str, spec: InputSpec
                ) -> Iterator[tuple[Rows, np.ndarray, np.ndarray]]:
    x, y = _npz_arrays(path, spec)
    _check_npz_shapes(path, x.shape, y.shape)
    if not len(x):  # its width is still checked against the input's
        yield Rows(0), x, y
    for s in range(0, len(x), spec.block_size):
        yield Rows(s), x[s:s + spec.block_size], y[s:s + spec.block_size]


# An .npz written by numpy.savez stores each array uncompressed (zip
# "stored"), so row i of 'embeddings' sits at a fixed byte offset and a
# large file is read in ranges like TFRecord and Parquet files. A whole-file
# range still goes through numpy.load, which also checks the zip's CRC; a
# range inside the file reads its rows' bytes directly (shapes, dtypes and
# every value are checked as for any block, not the CRC, which needs the
# whole member). A compressed .npz (numpy.savez_compressed) cannot be cut:
# its first range reads it whole, the others nothing.

@dataclasses.dataclass(frozen=True)
class _NpyArray:
    """One array stored uncompressed in an .npz: where its first element
    sits in the file, its shape and its dtype."""

    offset: int
    shape: tuple[int, ...]
    dtype: np.dtype


def _npz_stored_arrays(f, path: str) -> Optional[dict[str, _NpyArray]]:
    """'embeddings' and 'labels' of an open .npz file when both are stored
    uncompressed in C order; None otherwise (compressed, Fortran order, or
    missing: the whole-file reader then reads or refuses the file)."""
    try:
        with zipfile.ZipFile(f) as z:
            found = {}
            for name in ("embeddings", "labels"):
                info = z.NameToInfo.get(f"{name}.npy")
                if info is None or info.compress_type != zipfile.ZIP_STORED:
                    return None
                with z.open(info) as member:
                    shape, fortran, dtype = _npy_header(member)
                    header = member.tell()
                if fortran or dtype.hasobject:
                    return None
                found[name] = _NpyArray(_member_data_offset(f, info) + header,
                                       tuple(shape), dtype)
            return found
    except (zipfile.BadZipFile, ValueError, OSError, struct.error) as err:
        raise InputError(f"{path}: not a readable .npz ({err})") from None


def _npy_header(member):
    version = np.lib.format.read_magic(member)
    read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
            else np.lib.format.read_array_header_2_0)
    return read(member)


def _member_data_offset(f, info: zipfile.ZipInfo) -> int:
    """Where a zip member's data start: after its local header, whose name
    and extra fields (zip64 sizes) may differ in length from the central
    directory's."""
    f.seek(info.header_offset)
    local = f.read(30)
    if local[:4] != b"PK\x03\x04":
        raise ValueError("bad local file header")
    name_len, extra_len = struct.unpack("<HH", local[26:30])
    return info.header_offset + 30 + name_len + extra_len


def _npz_range_blocks(r: FileRange, spec: InputSpec
                      ) -> Iterator[tuple[Rows, np.ndarray, np.ndarray]]:
    """The rows of an .npz whose first byte lies in [r.start, r.stop)."""
    with _open(r.path) as f:
        arrays = _npz_stored_arrays(f, r.path)
        if arrays is None:  # compressed: the first range reads it whole
            if r.start == 0:
                yield from _npz_blocks(r.path, spec)
            return
        emb, lab = arrays["embeddings"], arrays["labels"]
        # d >= 1 here: a row's first byte must move with its index
        _check_npz_shapes(r.path, emb.shape, lab.shape, min_width=1)
        n, d = emb.shape
        row_bytes = d * emb.dtype.itemsize
        first, last = (_first_row_at(b, emb.offset, row_bytes, n)
                       for b in (r.start, r.stop))
        if n == 0 and r.start == 0:  # its width is still checked
            yield Rows(0), np.empty((0, d), emb.dtype), np.empty(0, lab.dtype)
        # The labels lie after every embedding: read the range's in one go,
        # then the embeddings front to back. Jumping between the two for
        # each block made an object store's reader fetch a new chunk (GCS:
        # 16 MB) twice a block, ~19 MB fetched per block (issue 60).
        labels = _read_rows(f, lab, first, last, r.path) if last > first \
            else None
        for s in range(first, last, spec.block_size):
            e = min(s + spec.block_size, last)
            x = _read_rows(f, emb, s, e, r.path).reshape(e - s, d)
            yield Rows(s), x, labels[s - first:e - first]


def _first_row_at(byte: Optional[int], offset: int, row_bytes: int,
                  n: int) -> int:
    """The first row whose first byte is at or after ``byte`` (None: n)."""
    if byte is None:
        return n
    return min(n, max(0, -(-(byte - offset) // row_bytes)))


def _read_rows(f, array: _NpyArray, start: int, stop: int,
               path: str) -> np.ndarray:
    per_row = array.dtype.itemsize * int(np.prod(array.shape[1:], dtype=int))
    f.seek(array.offset + start * per_row)
    data = f.read((stop - start) * per_row)
    if len(data) != (stop - start) * per_row:
        raise InputError(f"{path}: the file ends inside rows "
                         f"{start}..{stop - 1} (truncated .npz)")
    return np.frombuffer(data, array.dtype)


def _raw_blocks(r: FileRange, spec: InputSpec
                ) -> Iterator[tuple[Rows, np.ndarray, np.ndarray]]:
    fmt = detect_format(r.path, spec.fmt)
    if fmt == "npz" and (r.start, r.stop) == (0, None):
        yield from _npz_blocks(r.path, spec)
    elif fmt == "npz":
        yield from _npz_range_blocks(r, spec)
    elif fmt == "parquet":
        yield from _parquet_blocks(r, spec)
    elif fmt == "csv":
        yield from _csv_blocks(r.path, spec)
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
        x = _float_rows(x)
    except (TypeError, ValueError):
        raise InputError(f"{path}: {where.span()}: embeddings are not "
                         f"numeric") from None
    if x.ndim != 2:
        raise InputError(f"{path}: embeddings must be 2-D [n, d], got shape "
                         f"{x.shape}")
    if dim is not None and x.shape[1] != dim and (len(x) or x.shape[1]):
        # An empty block of known width (an empty .npz or fixed-size
        # Parquet file) is checked like a row: as if it held one.
        source = f"that of {dim_source}" if dim_source else "the first file's"
        what = where.row(0) if len(x) else "its schema (no rows)"
        raise InputError(f"{path}: {what} has dimension {x.shape[1]}, "
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


def _float_rows(x) -> np.ndarray:
    """x as float32 or float64 rows: those two dtypes as they are (no
    copy: a float64 copy of float32 rows costs a quarter of a pass, and the
    step that uses them copies them anyway), anything else as float64."""
    if isinstance(x, np.ndarray) and x.dtype in (np.float32, np.float64):
        return x
    return np.asarray(x, dtype=np.float64)


def _finite_rows(x: np.ndarray) -> np.ndarray:
    """Rows with finite values whose squared norm also fits in float64: one
    pass, since the sum of squares is NaN or inf exactly when a value is
    non-finite or the squared norm overflows. Float32 rows are summed in
    float32 and only the rows that overflow there are summed again in
    float64 (a finite float32 row's squared norm always fits in float64)."""
    with np.errstate(over="ignore", invalid="ignore"):
        finite = np.isfinite(np.einsum("ij,ij->i", x, x))
        if x.dtype != np.float64 and not finite.all():
            again = np.flatnonzero(~finite)
            wide = x[again].astype(np.float64)
            finite[again] = np.isfinite(np.einsum("ij,ij->i", wide, wide))
    return finite


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
    """The dimension the file records (``_schema_dim``), else that of its
    first row; None for a file with no rows and no recorded dimension."""
    dim = _schema_dim(path, spec)
    if dim is not None:
        return dim
    one_row = dataclasses.replace(spec, block_size=1)
    for _, x, _ in _raw_blocks(FileRange(path), one_row):
        x = np.asarray(x)
        if not len(x) and x.ndim == 2:
            continue  # an empty file's block
        if x.ndim != 2 or x.shape[1] < 1:
            raise InputError(f"{path}: embeddings must be 2-D [n, d] with "
                             f"d >= 1, got shape {x.shape}")
        if len(x):
            return int(x.shape[1])
    return None


def _schema_dim(path: str, spec: InputSpec) -> Optional[int]:
    """The embedding dimension a file records without its rows: an .npz
    array's header (shape [n, d], also for n = 0), a Parquet fixed-size
    list's size. None where the format does not record it (TFRecord,
    variable-length Parquet lists) or the file is not as expected: reading
    its rows then reports what is wrong. So an empty file of these formats
    takes the same path as one with a row (issue 25)."""
    try:
        fmt = detect_format(path, spec.fmt)
        with _open(path) as f:
            if fmt == "npz":
                return _npz_header_dim(f)
            if fmt == "parquet":
                return _fixed_list_size(_parquet_schema(f), spec)
            if fmt == "csv":
                return _csv_schema_dim(f, path, spec)
    except Exception:  # noqa: BLE001  (the rows' reader names the problem)
        return None
    return None


def _npz_header_dim(f) -> Optional[int]:
    """d of the 'embeddings' array of an .npz (zip) file: its .npy header
    only, whatever the array's size or compression."""
    with zipfile.ZipFile(f) as z:
        if "labels.npy" not in z.namelist():
            return None
        with z.open("embeddings.npy") as member:
            shape, _, dtype = _npy_header(member)
    if len(shape) != 2 or shape[1] < 1 or dtype.kind not in "biuf":
        return None
    return int(shape[1])


def _parquet_schema(f):
    import pyarrow.parquet as pq
    return pq.ParquetFile(f).schema_arrow


def _fixed_list_size(schema, spec: InputSpec) -> Optional[int]:
    """The embedding column's fixed list size (None: not a fixed-size list
    of numbers, or no such column)."""
    import pyarrow as pa
    if spec.embedding_columns:  # one column per dimension
        return len(_parquet_scalar_columns(schema, "", spec))
    if spec.embedding_feature not in schema.names:
        return None
    kind = schema.field(spec.embedding_feature).type
    if not pa.types.is_fixed_size_list(kind) or kind.list_size < 1:
        return None
    value = kind.value_type
    if not (pa.types.is_floating(value) or pa.types.is_integer(value)):
        return None
    return int(kind.list_size)


def input_schema(paths: Sequence[str], spec: InputSpec) -> tuple[int, str]:
    """(embedding dimension, file it was read from): the first file that
    records it (``_schema_dim``: .npz, fixed-size Parquet lists, also with
    no rows) or has a row. Other empty files are skipped (they are valid);
    if no file gives a dimension the input is refused, naming the pattern
    and ``--embedding-dim``."""
    for path in paths:
        dim = _peek_dim(path, spec)
        if dim is not None:
            return dim, path
    files = (f"{paths[0]} holds" if len(paths) == 1
             else f"all {len(paths)} matched files hold")
    raise InputError(f"--input {spec.pattern!r}: {files} no rows "
                     f"(empty input) and the format does not record the "
                     f"embedding dimension, so it is unknown; pass "
                     f"--embedding-dim to release it (empty classes get "
                     f"noisy outputs like any other)")


def release_schema(paths: Sequence[str], spec: InputSpec,
                   from_rows: bool = True) -> tuple[int, str]:
    """(embedding dimension, file it was read from) for a release without
    ``--embedding-dim``: what a file's schema records (.npz header,
    fixed-size Parquet list, with or without rows); for a Parquet column of
    variable-length lists (pandas and pyarrow write arrays so) the first
    row's length, every later row checked against it. TFRecord and CSV
    list columns are refused whatever the files hold: they record no
    dimension.

    A dimension taken from a row is the encoder's width, the same for every
    dataset of that input; only an input without any row then differs (it
    is refused, naming --embedding-dim). ``--embedding-dim`` releases n = 0
    and n = 1 alike. ``from_rows`` False (a charged release, with a budget
    store) takes no dimension from a row: whether such a release exists
    then never depends on n, as for TFRecord."""
    fmt = detect_format(paths[0], spec.fmt)
    if fmt == "csv":  # a header without the expected columns, named first
        with _open(paths[0]) as f:
            csv_embedding_columns(_csv_header(f, paths[0]), paths[0], spec)
    for path in paths:
        dim = _schema_dim(path, spec)
        if dim is not None:
            return dim, path
    if fmt == "npz" or (fmt == "parquet" and from_rows):
        # Malformed files are named by reading; a variable-length Parquet
        # list column gives its first row's length.
        return input_schema(paths, spec)
    what = ("TFRecord input does" if fmt == "tfrecord" else
            "a Parquet column of variable-length lists charged to a budget "
            "store does" if fmt == "parquet" else
            f"a CSV list column {spec.embedding_feature!r} does")
    raise InputError(f"--input {spec.pattern!r}: {what} not record the "
                     "embedding dimension; pass --embedding-dim (public "
                     "configuration: taken from the data, an empty input "
                     "would fail where a one-row input is released)")


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
    return np.concatenate(xs, dtype=np.float64), np.concatenate(ys)


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

    The file list and the embedding dimension (schema) are checked when
    the graph is built, so a missing input fails before the pipeline
    starts; the graph itself holds only the pattern (a service that keeps
    the job graph, like Dataflow, never sees the private file names): the
    read ranges (``file_ranges``: files in ``spec.split_bytes`` pieces, a
    compressed .npz whole) are listed by a worker. Each range is one
    element, spread over the workers: one large file is read by all of
    them.
    ``dim`` (public configuration, ``--embedding-dim``) skips reading the
    dimension from the input: every row is checked against it, and an
    input with no rows is still a valid (empty) dataset. Without it the
    dimension is the one the first file's schema records (.npz header,
    fixed-size Parquet list, even with no rows: ``release_schema``) or, for
    a Parquet list column, its first row's; other formats need ``dim``.
    """

    def __init__(self, spec: InputSpec, dim: Optional[int] = None,
                 dim_from_rows: bool = True) -> None:
        super().__init__()
        self.spec = spec
        sizes = _match(spec.pattern)
        self.paths = [path for path, _ in sizes]
        for path in self.paths:
            check_columns_format(path, spec)
        if dim is None:
            self.dim, first = release_schema(self.paths, spec,
                                             dim_from_rows)
            # Named by the pattern: the DoFns (the job graph) carry no
            # private file name.
            self.dim_source = (f"the first file matching --input "
                               f"{spec.pattern!r}" if first != spec.pattern
                               else first)
        else:
            self.dim, self.dim_source = int(dim), "--embedding-dim"

    @property
    def ranges(self) -> list["FileRange"]:
        """The read ranges, as the workers list them."""
        return list_ranges(self.spec.pattern, self.spec)

    def expand(self, pbegin):
        spec = self.spec
        return (pbegin
                | "Pattern" >> beam.Create([spec.pattern])
                | "ListRanges" >> beam.FlatMap(list_ranges, spec)
                | "SpreadRanges" >> beam.Reshuffle()
                | "ReadBlocks" >> beam.ParDo(_ReadBlocksFn(
                    self.spec, self.dim, self.dim_source)
                ).with_output_types(coders.RAW_BLOCK))


# ---------------------------------------------------------------- paths

def join(*parts: str) -> str:
    return FileSystems.join(*parts) if "://" in parts[0] else os.path.join(*parts)
