"""Split reads: TFRecord, Parquet and .npz files read as byte ranges give exactly
the rows of a whole-file read, whatever the range size; a record payload
that looks like a record cannot shift a split; errors in a range that
starts inside a file name the record's byte offset. (One file read by two
Dask workers, and the release unchanged: tests/test_dask.py.)"""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest

from tests.conftest import gmm_data
from dpsynth.transforms import io
from dpsynth.transforms.io import npz, tfrecord
from dpsynth.transforms.write import tfrecord_bytes


def _tfrecord(path, x, y) -> str:
    with open(path, "wb") as f:
        for start in range(0, len(y), 40):
            xs, ys = x[start:start + 40], y[start:start + 40]
            for label in np.unique(ys).tolist():
                f.write(tfrecord_bytes(xs[ys == label], label))
    return str(path)


def _parquet(path, x, y, row_group_size: int) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq
    emb = pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), x.shape[1])
    pq.write_table(pa.table({"embedding": emb, "label": pa.array(y)}), path,
                   row_group_size=row_group_size)
    return str(path)


def _rows(ranges, spec) -> tuple[np.ndarray, np.ndarray]:
    blocks = [b for r in ranges for b in io.read_range_blocks(r, spec)]
    x = np.vstack([b[0] for b in blocks])
    y = np.concatenate([b[1] for b in blocks])
    order = np.lexsort(np.c_[x, y].T)
    return x[order], y[order]


@pytest.mark.parametrize("fmt", ["tfrecord", "parquet"])
def test_ranges_hold_exactly_the_rows_of_the_file(tmp_path, fmt):
    x, y = gmm_data(600, d=5, classes=3, seed=3)
    x = x.astype(np.float32)
    path = (_tfrecord(tmp_path / "a.tfrecord", x, y) if fmt == "tfrecord"
            else _parquet(tmp_path / "a.parquet", x, y, row_group_size=50))
    size = os.path.getsize(path)
    _assert_ranges_hold_the_file(path, (331, size // 3, size))


def _assert_ranges_hold_the_file(path: str, splits) -> None:
    """Every split size cuts the file into ceil(size / split) ranges that
    together hold exactly the rows of a whole-file read."""
    size = os.path.getsize(path)
    whole = _rows([io.FileRange(path)], io.InputSpec(path, block_size=64))
    for split in splits:
        spec = io.InputSpec(path, block_size=64, split_bytes=split)
        ranges = io.file_ranges(path, size, spec)
        assert len(ranges) == -(-size // split)
        got = _rows(ranges, spec)
        np.testing.assert_array_equal(got[0], whole[0])
        np.testing.assert_array_equal(got[1], whole[1])


def test_a_file_is_cut_into_equal_ranges(tmp_path):
    """As few ranges as --split-bytes allows, equal to a byte (a 154 MB
    file in 64 MB pieces is three of 51 MB, not 64 + 64 + 26: DirectRunner
    deals a pass's ranges out to its workers by count)."""
    path = str(tmp_path / "e.npz")
    np.savez(path, embeddings=np.ones((1000, 8), np.float32),
             labels=np.zeros(1000, np.int64))
    size = os.path.getsize(path)
    for split in (size // 3 + 1, 1000, 4096, size - 1):
        ranges = io.file_ranges(path, size, io.InputSpec(path,
                                                          split_bytes=split))
        lengths = [(size if r.stop is None else r.stop) - r.start
                   for r in ranges]
        assert len(ranges) == -(-size // split)
        assert max(lengths) <= split and max(lengths) - min(lengths) <= 1
        assert ranges[0].start == 0 and ranges[-1].stop is None


@pytest.mark.parametrize("dtype", ["<f4", ">f8"])
def test_npz_ranges_hold_exactly_the_rows_of_the_file(tmp_path, dtype):
    """A stored .npz (numpy.savez) is cut into ranges like the other
    formats: every row is read once, whatever the range size, also ranges
    smaller than a row or inside the zip headers."""
    x, y = gmm_data(600, d=5, classes=3, seed=3)
    path = str(tmp_path / "a.npz")
    np.savez(path, embeddings=x.astype(dtype), labels=y)
    size = os.path.getsize(path)
    _assert_ranges_hold_the_file(path, (7, 331, size // 3, size - 1))


def test_compressed_npz_is_read_whole_by_its_first_range(tmp_path):
    x, y = gmm_data(300, d=4, classes=2, seed=1)
    path = str(tmp_path / "c.npz")
    np.savez_compressed(path, embeddings=x, labels=y)
    spec = io.InputSpec(path, block_size=50, split_bytes=500)
    ranges = io.file_ranges(path, os.path.getsize(path), spec)
    assert len(ranges) > 1
    per_range = [list(io.read_range_blocks(r, spec)) for r in ranges]
    assert sum(len(b[0]) for b in per_range[0]) == 300
    assert all(not blocks for blocks in per_range[1:])


def test_npz_range_errors_name_the_file_row(tmp_path):
    x = np.ones((600, 4), np.float32)
    x[470, 2] = np.nan
    path = str(tmp_path / "n.npz")
    np.savez(path, embeddings=x, labels=np.zeros(600, np.int64))
    size = os.path.getsize(path)
    spec = io.InputSpec(path, split_bytes=size // 2)
    first, second = io.file_ranges(path, size, spec)[:2]
    assert sum(len(b[0]) for b in io.read_range_blocks(first, spec)) < 470
    with pytest.raises(io.InputError, match=r"n.npz: row 470 has NaN"):
        list(io.read_range_blocks(second, spec))


def test_npz_range_refuses_mismatched_or_truncated_arrays(tmp_path):
    path = str(tmp_path / "m.npz")
    np.savez(path, embeddings=np.ones((10, 3)), labels=np.zeros(9, int))
    r = io.FileRange(path, 1, 2000)
    spec = io.InputSpec(path, split_bytes=100)
    with pytest.raises(io.InputError, match=r"m.npz: 'labels' must be 1-D "
                       r"with 10 rows"):
        list(io.read_range_blocks(r, spec))
    short = str(tmp_path / "t.npz")
    np.savez(short, embeddings=np.ones((100, 3)), labels=np.zeros(100, int))
    data = open(short, "rb").read()
    open(short, "wb").write(data[:len(data) // 2])
    with pytest.raises(io.InputError, match=r"t.npz: "):
        list(io.read_range_blocks(io.FileRange(short, 1, None), spec))


def _frame(payload: bytes) -> bytes:
    length = struct.pack("<Q", len(payload))
    return (length + struct.pack("<I", io.masked_crc32c(length)) + payload
            + struct.pack("<I", io.masked_crc32c(payload)))


def test_a_payload_that_looks_like_a_record_does_not_move_a_split(tmp_path):
    """A split inside a record whose payload embeds a whole valid record:
    ranges start at record boundaries walked from the file's start, so the
    fake one is never taken for a record (issue 25: one person's bytes must
    not change how other records are read) and nothing is refused."""
    good = _frame(b"a" * 40)
    fake = _frame(b"b" * 8)
    path = tmp_path / "f.tfrecord"
    outer = _frame(b"\x01" * 20 + fake + b"\x02" * 20)
    path.write_bytes(good + outer + good)
    spec = io.InputSpec(str(path), split_bytes=len(good) + 10)
    ranges = io.file_ranges(str(path), os.path.getsize(path), spec)
    starts = {len(good), len(good) + len(outer)}  # real records only
    for r in ranges[1:]:
        assert r.start in starts | {os.path.getsize(path)}, r
    offsets = [o for r in ranges for run in tfrecord._tfrecord_runs(r)
               for o in run.offsets()]
    assert offsets == [0, len(good), len(good) + len(outer)]


def test_errors_in_a_later_range_name_the_byte_offset(tmp_path):
    x = np.ones((60, 4), np.float32)
    x[47, 2] = np.nan
    path = _tfrecord(tmp_path / "n.tfrecord", x, np.zeros(60, np.int64))
    size = os.path.getsize(path)
    record = size // 60
    spec = io.InputSpec(path, split_bytes=size // 2)
    second = io.file_ranges(path, size, spec)[1]
    with pytest.raises(io.InputError, match=(
            rf"n.tfrecord: the record at byte {47 * record} has NaN")):
        list(io.read_range_blocks(second, spec))
    with pytest.raises(io.InputError, match=r"n.tfrecord: row 47 has NaN"):
        list(io.read_file_blocks(path, spec))


def test_damage_in_a_later_range_names_the_byte_offset(tmp_path):
    path = _tfrecord(tmp_path / "d.tfrecord", np.ones((60, 4), np.float32),
                     np.zeros(60, np.int64))
    data = bytearray(open(path, "rb").read())
    record = len(data) // 60
    data[record * 50 + 20] ^= 0xFF  # a payload byte of record 50
    open(path, "wb").write(bytes(data))
    spec = io.InputSpec(path, split_bytes=len(data) // 2)
    second = io.file_ranges(path, len(data), spec)[1]
    with pytest.raises(io.InputError, match=(
            rf"d.tfrecord: TFRecord record at byte {record * 50} is corrupt "
            rf"\(data checksum mismatch\)")):
        list(io.read_range_blocks(second, spec))


def test_runs_of_equal_records_keep_order_lengths_and_checksums(tmp_path):
    """The reader takes runs of equal-length records at a fixed stride
    (issue 15); records of another length (a label >= 128 has a 2-byte
    varint) break a run, and a bad payload checksum inside a run is named
    by its own record number and byte offset."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((300, 6)).astype(np.float32)
    y = np.where(np.arange(300) % 7 == 3, 200, np.arange(300) % 3)
    blob = b"".join(tfrecord_bytes(x[i:i + 1], int(y[i])) for i in range(300))
    path = tmp_path / "r.tfrecord"
    path.write_bytes(blob)
    spec = io.InputSpec(str(path), block_size=64)
    blocks = list(io.read_range_blocks(io.FileRange(str(path)), spec))
    np.testing.assert_array_equal(np.vstack([b[0] for b in blocks]), x)
    np.testing.assert_array_equal(np.concatenate([b[1] for b in blocks]), y)
    assert [len(b[1]) for b in blocks] == [64, 64, 64, 64, 44]

    sizes = [len(tfrecord_bytes(x[i:i + 1], int(y[i]))) for i in range(300)]
    offset = sum(sizes[:250])
    damaged = bytearray(blob)
    damaged[offset + 20] ^= 0xFF  # inside record 250's payload
    path.write_bytes(bytes(damaged))
    with pytest.raises(io.InputError, match=(
            rf"r.tfrecord: TFRecord record 250 at byte {offset} is corrupt "
            rf"\(data checksum mismatch\)")):
        list(io.read_range_blocks(io.FileRange(str(path)), spec))


class _Reads:
    """A file that records where each read starts and how long it is."""

    def __init__(self, f, log: list) -> None:
        self._f, self._log = f, log

    def read(self, size=-1):
        at = self._f.tell()
        data = self._f.read(size)
        self._log.append((at, len(data)))
        return data

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


def test_an_npz_range_reads_its_labels_once_then_rows_in_order(
        tmp_path, monkeypatch):
    """Object stores fetch a chunk on every jump: a range reads the zip's
    headers, its labels (after all the embeddings) once, and then the
    embeddings front to back; it jumped twice a block before."""
    x, y = gmm_data(2000, d=8, classes=3, seed=1)
    path = tmp_path / "a.npz"
    np.savez(path, embeddings=x.astype(np.float32), labels=y)
    log: list = []
    real = npz._open
    monkeypatch.setattr(npz, "_open", lambda p: _Reads(real(p), log))
    spec = io.InputSpec(str(path), block_size=50)
    r = io.FileRange(str(path), 4096, 40_000)
    blocks = list(io.read_range_blocks(r, spec))
    assert len(blocks) >= 20
    row_reads = [(at, size) for at, size in log if size == 50 * 8 * 4]
    assert len(row_reads) >= 20
    assert [at for at, _ in row_reads] == sorted(at for at, _ in row_reads)
    jumps = sum(1 for (a, n), (b, _) in zip(log, log[1:]) if b != a + n)
    # The zip's directory and headers, the labels, the first row: a fixed
    # few (two a block before, 44 here).
    assert jumps <= 8, log
    whole = _rows([io.FileRange(str(path))], spec)
    parts = _rows([io.FileRange(str(path), 0, 4096), r,
                   io.FileRange(str(path), 40_000, None)], spec)
    assert all(np.array_equal(a, b) for a, b in zip(whole, parts))
