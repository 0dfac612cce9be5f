"""The read: a file's ranges, each range's validated blocks, the embedding
dimension a release takes from the input's schema, and the Beam transform
that reads the ranges in the workers."""

from __future__ import annotations

import dataclasses
from typing import Iterator, Optional, Sequence

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from dpsynth.transforms import coders, heap_pages
from dpsynth.transforms.io.csv import (_csv_blocks, _csv_header, _csv_schema_dim,
    csv_embedding_columns)
from dpsynth.transforms.io.npz import _npz_blocks, _npz_header_dim, _npz_range_blocks
from dpsynth.transforms.io.parquet import (_fixed_list_size, _parquet_blocks,
    _parquet_schema)
from dpsynth.transforms.io.ranges import FileRange, _match, _open, match_files
from dpsynth.transforms.io.tfrecord import _record_boundaries, _tfrecord_blocks
from dpsynth.transforms.io.validation import (InputError, InputSpec, Rows,
    check_columns_format, detect_format, validate_block)


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


def _raw_blocks(r: FileRange, spec: InputSpec
                ) -> Iterator[tuple[Rows, np.ndarray, np.ndarray]]:
    fmt = detect_format(r.path, spec.fmt)
    if r.data is not None and fmt not in ("tfrecord", "parquet"):
        raise InputError(f"{r.path}: in-memory bytes are parsed as "
                         f"TFRecord or Parquet only, not {fmt}")
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


def read_file_blocks(path: str, spec: InputSpec, dim: Optional[int] = None,
                     dim_source: Optional[str] = None,
                     data: Optional[bytes] = None
                     ) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
    """Validated (x, y, dropped) blocks of one whole file; with ``data``
    (the file's bytes, TFRecord or Parquet), of those bytes: ``path`` is
    not opened, only named in errors."""
    return read_range_blocks(FileRange(path, data=data), spec, dim,
                             dim_source)


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


# ------------------------------------------------------------- schema

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
    takes the same path as one with a row (whether a release exists never
    depends on whether the input has a row)."""
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


@dataclasses.dataclass(frozen=True)
class InputSchema:
    """The input as checked before a run (``check_schema``): the matched
    files, the embedding dimension and where it came from, worded by the
    pattern (the job graph carries no private file name). A run checks it
    once and builds each of its readers from it."""

    paths: tuple[str, ...]
    dim: int
    dim_source: str


def check_schema(spec: InputSpec, dim: Optional[int] = None,
                 dim_from_rows: bool = True) -> InputSchema:
    """Lists the files matching ``spec.pattern`` (missing input: refused),
    checks their columns' format and takes the embedding dimension:
    ``dim`` (public configuration, ``--embedding-dim``) as given, else
    what the schema records (``release_schema``; ``dim_from_rows`` False,
    a charged release, takes none from a row)."""
    paths = tuple(path for path, _ in _match(spec.pattern))
    for path in paths:
        check_columns_format(path, spec)
    if dim is not None:
        return InputSchema(paths, int(dim), "--embedding-dim")
    found, first = release_schema(list(paths), spec, dim_from_rows)
    return InputSchema(paths, found, (
        f"the first file matching --input {spec.pattern!r}"
        if first != spec.pattern else first))


# ------------------------------------------------------------------- Beam

class _ReadBlocksFn(beam.DoFn):
    def __init__(self, spec: InputSpec, dim: int, dim_source: str) -> None:
        self._spec, self._dim, self._source = spec, dim, dim_source
        self._rows = Metrics.counter("dpsynth", "rows_read")
        self._dropped = Metrics.counter("dpsynth", "rows_dropped_non_finite")

    def setup(self) -> None:
        heap_pages.keep_heap_pages()

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
    the graph is built (``check_schema``; or passed in as ``schema``, what
    the run checked before its charge), so a missing input fails before
    the pipeline starts; the graph itself holds only the pattern (a service that keeps
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
                 dim_from_rows: bool = True,
                 schema: Optional[InputSchema] = None) -> None:
        super().__init__()
        self.spec = spec
        if schema is None:
            schema = check_schema(spec, dim, dim_from_rows)
        self.paths = list(schema.paths)
        # dim_source is named by the pattern: the DoFns (the job graph)
        # carry no private file name.
        self.dim, self.dim_source = schema.dim, schema.dim_source

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
