""".npz input: 'embeddings' [n, d] and 'labels' [n]. A whole file goes
through numpy.load; a range of an uncompressed .npz reads its rows' bytes
directly, found from the members' raw .npy headers."""

from __future__ import annotations

import dataclasses
import io
import struct
import zipfile
from typing import Iterator, Optional

import numpy as np

from dpsynth.transforms.io.validation import InputError, InputSpec, Rows
from dpsynth.transforms.io.ranges import FileRange, _open, _read_bytes


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
        # 16 MB) twice a block, ~19 MB fetched per block.
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
