"""Parquet embeddings read from Arrow buffers (issue 27 item 2): the same
rows (float32 values stay float32, others become float64) and the same errors as the per-row Python-list path it
replaced (``parquet._stack_rows``), for fixed-size, list and large-list columns,
float16/32/64 and integer values, sliced and chunked arrays, null rows,
null values and ragged rows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dpsynth.transforms import io
from dpsynth.transforms.io import parquet

LIST_TYPES = {
    "fixed": lambda value: pa.list_(value, 3),
    "list": pa.list_,
    "large": pa.large_list,
}


def _column(kind: str, value, rows) -> pa.Array:
    return pa.array(rows, LIST_TYPES[kind](value))


def _both(column, where=io.Rows(0)):
    """(new, old): the fast path's result or error, and the old path's."""
    def run(fn):
        try:
            return fn()
        except io.InputError as err:
            return str(err)
    rows = column.to_pylist() if not isinstance(column, pa.ChunkedArray) \
        else [r for c in column.chunks for r in c.to_pylist()]
    return (run(lambda: parquet._list_rows(column, "f.parquet", where)),
            run(lambda: parquet._stack_rows(rows, "f.parquet", where)))


@pytest.mark.parametrize("kind", sorted(LIST_TYPES))
@pytest.mark.parametrize("value", [pa.float16(), pa.float32(), pa.float64(),
                                   pa.int64()])
def test_values_are_exactly_those_of_python_lists(kind, value):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((50, 3)) * 1e3
    x = x.round() if pa.types.is_integer(value) else x
    column = _column(kind, value, x.tolist())
    new, old = _both(column)
    kept = np.float32 if value == pa.float32() else np.float64
    assert new.dtype == kept and new.shape == (50, 3)
    np.testing.assert_array_equal(new, old)
    for part in (column.slice(7, 20), pa.chunked_array(
            [column.slice(0, 13), column.slice(13)])):
        new, old = _both(part)
        np.testing.assert_array_equal(new, old)


@pytest.mark.parametrize("kind", sorted(LIST_TYPES))
def test_null_rows_name_the_row_as_before(kind):
    rows = [[1.0, 2.0, 3.0]] * 5
    column = _column(kind, pa.float32(), rows[:3] + [None] + rows[3:])
    new, old = _both(column, io.Rows(10))
    assert new == old == ("f.parquet: row 13 has no embedding values, "
                          "expected 3")
    new, old = _both(_column(kind, pa.float32(), [None] + rows))
    assert new == old == ("f.parquet: row 0 has no embedding values, "
                          "expected some")


@pytest.mark.parametrize("kind", ["list", "large"])
def test_ragged_rows_name_the_row_as_before(kind):
    rows = [[1.0, 2.0]] * 4 + [[1.0]] + [[1.0, 2.0, 3.0]]
    new, old = _both(_column(kind, pa.float64(), rows), io.Rows(3))
    assert new == old == ("f.parquet: row 7 has 1 embedding values, "
                          "expected 2")
    chunked = pa.chunked_array([_column(kind, pa.float64(), rows[:4]),
                                _column(kind, pa.float64(), rows[4:])])
    assert _both(chunked)[0] == ("f.parquet: row 4 has 1 embedding values, "
                                 "expected 2")


def test_a_null_value_is_nan_as_before():
    """A null inside a row became NaN (``np.asarray`` of None), so
    ``--non-finite`` decides: refused naming the row, or that row dropped."""
    column = _column("fixed", pa.float32(), [[1.0, 2.0, 3.0], [1.0, None, 3.0]])
    new, old = _both(column)
    np.testing.assert_array_equal(new, old)
    assert np.isnan(new[1, 1]) and np.isfinite(new[0]).all()


def test_non_numeric_values_keep_their_error():
    column = _column("list", pa.string(), [["a", "b"], ["c", "d"]])
    new, old = _both(column, io.Rows(4))
    assert new == old == ("f.parquet: rows 4..5: embedding values are not "
                          "numeric")


def _write(path, column, labels, row_group_size=None) -> str:
    pq.write_table(pa.table({"embedding": column, "label": pa.array(labels)}),
                   str(path), row_group_size=row_group_size)
    return str(path)


def test_files_read_as_before_with_errors_naming_file_and_row(tmp_path):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((300, 4)).astype(np.float32)
    y = rng.integers(0, 3, 300)
    rows = x.tolist()
    path = _write(tmp_path / "a.parquet", pa.array(rows, pa.list_(pa.float32())),
                  y, row_group_size=64)
    spec = io.InputSpec(path, block_size=50)
    blocks = list(io.read_file_blocks(path, spec))
    np.testing.assert_array_equal(np.vstack([b[0] for b in blocks]),
                                  x.astype(np.float64))
    np.testing.assert_array_equal(np.concatenate([b[1] for b in blocks]), y)

    rows[150] = None
    path = _write(tmp_path / "n.parquet", pa.array(rows, pa.list_(pa.float32())),
                  y, row_group_size=64)
    with pytest.raises(io.InputError, match=(
            r"n.parquet: row 150 has no embedding values, expected 4$")):
        list(io.read_file_blocks(path, io.InputSpec(path, block_size=50)))

    rows[150] = [1.0, None, 2.0, 3.0]
    path = _write(tmp_path / "v.parquet", pa.array(rows, pa.list_(pa.float32())),
                  y, row_group_size=64)
    with pytest.raises(io.InputError, match=r"v.parquet: row 150 has NaN"):
        list(io.read_file_blocks(path, io.InputSpec(path, block_size=50)))
    dropped = io.InputSpec(path, block_size=50, non_finite="drop")
    assert sum(b[2] for b in io.read_file_blocks(path, dropped)) == 1
