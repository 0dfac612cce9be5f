"""TFRecord input: tf.train.Example records with a float embedding feature
and an int64 label feature, checksums checked, records of one length read
as numpy runs."""

from __future__ import annotations

import dataclasses
import struct
from typing import Iterator, Optional, Sequence, Union

import google_crc32c
import numpy as np

from dpsynth.transforms import example_wire
from dpsynth.transforms.io.validation import InputError, InputSpec, Rows
from dpsynth.transforms.io.ranges import FileRange, _open


# Framing: uint64 length, uint32 masked CRC32C of the length, payload,
# uint32 masked CRC32C of the payload (all little-endian). A range that
# starts inside the file begins at a record boundary found when the ranges
# are listed, by walking the record lengths from the start of the file:
# bytes inside a payload are never taken for a record, so the records a
# range reads never depend on what other records hold.

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
    with _open(path, r.data) as f:
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
    payload that look like a record, so one person's record
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
