"""CSV input, read whole by one worker."""

from __future__ import annotations

from typing import Iterator, Optional, Sequence

import numpy as np

from dpsynth.transforms.io.validation import (InputError, InputSpec, Rows, _column_names,
    match_columns)
from dpsynth.transforms.io.ranges import _open
from dpsynth.transforms.io.parquet import _list_rows


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
