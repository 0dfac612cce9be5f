"""The reader hands float32 rows over as float32 (issue 27: a float64 copy
of every block cost a quarter of each pass over the data), and nothing
downstream can tell: every step that computes on rows makes its own
float64 copy, and float32 -> float64 is exact.

* float32 and float64 rows pass validation as they are (no copy); other
  numbers (integers, float16) become float64 as before;
* the non-finite rule is unchanged: a float32 row whose squared norm
  overflows float32 but not float64 is finite, NaN and inf rows are not;
* every format that stores float32 (.npz, Parquet, TFRecord) yields float32;
* a release made from float32 files is byte-identical to one made from the
  same values stored as float64.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from dpsynth.pipelines import cli
from dpsynth.pipelines.release import reading, release
from tests.conftest import gmm_data
from dpsynth.transforms import io
from dpsynth.transforms.io import validation
from dpsynth.transforms.write import tfrecord_bytes


def _spec(path: str = "in.npz", **kw) -> io.InputSpec:
    return io.InputSpec(path, **kw)


def _validate(x, spec=None):
    y = np.zeros(len(x), np.int64)
    return io.validate_block(x, y, "in.npz", 0, spec or _spec())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_float_rows_pass_as_they_are(dtype):
    x = np.arange(12, dtype=dtype).reshape(4, 3)
    out, _, dropped = _validate(x)
    assert out is x and dropped == 0


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float16])
def test_other_numbers_become_float64(dtype):
    x = np.arange(12).astype(dtype).reshape(4, 3)
    out, _, _ = _validate(x)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, x.astype(np.float64))


def test_a_big_finite_float32_row_is_finite():
    """1e20 squared overflows float32, not float64: the row is kept, as it
    was when every block became float64 first."""
    x = np.ones((4, 3), np.float32)
    x[1] = 1e20
    x[2, 0] = np.nan
    x[3, 2] = -np.inf
    np.testing.assert_array_equal(validation._finite_rows(x),
                                  [True, True, False, False])
    np.testing.assert_array_equal(validation._finite_rows(x.astype(np.float64)),
                                  [True, True, False, False])
    out, _, dropped = _validate(x, _spec(non_finite="drop"))
    assert dropped == 2 and out.dtype == np.float32
    np.testing.assert_array_equal(out, x[:2])


def test_a_float64_row_whose_squared_norm_overflows_is_not_finite():
    x = np.ones((2, 3))
    x[1, 1] = 1e200
    np.testing.assert_array_equal(validation._finite_rows(x), [True, False])
    with pytest.raises(io.InputError, match="row 1 has NaN or infinite"):
        _validate(x)


def _write(fmt: str, path: Path, x: np.ndarray, y: np.ndarray) -> str:
    if fmt == "npz":
        np.savez(path, embeddings=x, labels=y)
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq
        emb = pa.FixedSizeListArray.from_arrays(
            pa.array(x.reshape(-1)), x.shape[1])
        pq.write_table(pa.table({"embedding": emb, "label": y}), path)
    else:
        assert (y == y[0]).all()  # one class a TFRecord shard
        path.write_bytes(tfrecord_bytes(x, int(y[0])))
    return str(path)


@pytest.mark.parametrize("fmt", ["npz", "parquet", "tfrecord"])
def test_every_format_yields_float32_rows_as_stored(tmp_path, fmt):
    x, _ = gmm_data(50, d=6)
    x32, y = x.astype(np.float32), np.zeros(50, np.int64)
    path = _write(fmt, tmp_path / f"in.{fmt}", x32, y)
    blocks = list(io.read_file_blocks(path, _spec(path, block_size=16)))
    assert {b[0].dtype for b in blocks} == {np.dtype(np.float32)}
    np.testing.assert_array_equal(np.concatenate([b[0] for b in blocks]), x32)
    loaded, _ = io.load_arrays(path)
    assert loaded.dtype == np.float64  # its callers' contract
    np.testing.assert_array_equal(loaded, x32)


def _digests(path: str) -> list[str]:
    manifest = release.read_manifest(path)
    return [hashlib.sha256(Path(f).read_bytes()).hexdigest()
            for f in reading.release_files(path, manifest)]


def test_float32_files_give_the_release_of_the_same_values_in_float64(
        tmp_path):
    x, y = gmm_data(400, d=8)
    x32 = x.astype(np.float32)
    outs = []
    for name, rows in (("f32", x32), ("f64", x32.astype(np.float64))):
        data = tmp_path / f"{name}.npz"
        np.savez(data, embeddings=rows, labels=y)
        out = str(tmp_path / f"out-{name}")
        assert cli.main(["generate", "--input", str(data), "--num-classes",
                         "3", "--clusters", "2", "--noise-seed", "5",
                         "--output", out, "--run-id", "same"]) == 0
        outs.append(out)
    assert _digests(outs[0]) == _digests(outs[1])
    first, second = (release.read_manifest(o) for o in outs)
    for key in ("privacy", "classes", "adaptive_plan"):
        assert first[key] == second[key], key
