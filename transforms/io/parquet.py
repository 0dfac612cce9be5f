"""Parquet input: a list column of embeddings (or, with
``--embedding-columns``, one numeric column per dimension) and a label
column; a range reads the row groups that start in it. Arrow list columns
become numpy rows straight from their buffers (CSV lists too)."""

from __future__ import annotations

from typing import Iterator, Optional, Sequence

import numpy as np

from dpsynth.transforms.io.validation import (InputError, InputSpec, Rows, _column_names,
    _float_rows, match_columns)
from dpsynth.transforms.io.ranges import FileRange, _open


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
    with _open(path, r.data) as f:
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
    its buffers: Python lists per row cost 20x the read. Errors
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
