"""Files and byte ranges: every file access goes through Beam's
FileSystems (local paths and gs:// alike), and a large file is read as
several ranges (``read.file_ranges`` lists them)."""

from __future__ import annotations

import dataclasses
import io
import os
from typing import Optional

from apache_beam.io.filesystems import FileSystems

from dpsynth.transforms.io.validation import InputError


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


def _open(path: str, data: Optional[bytes] = None):
    """``path`` opened for reading, or ``data`` (its bytes, already read
    by the caller) as a file object: nothing opens ``path`` then."""
    if data is not None:
        return io.BytesIO(data)
    try:
        return FileSystems.open(path, compression_type="uncompressed")
    except Exception as err:
        raise InputError(f"{path}: cannot read ({err})") from None


def join(*parts: str) -> str:
    return FileSystems.join(*parts) if "://" in parts[0] else os.path.join(*parts)


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

    ``data``: the whole file's bytes, read (and checked) by the caller,
    parsed instead of opening ``path`` (TFRecord and Parquet; ``path``
    then only names the file in errors). Never set on the pipeline's
    ranges: a release's reader sets it (pipelines/release/reading.py).
    """

    path: str
    start: int = 0
    stop: Optional[int] = None
    data: Optional[bytes] = dataclasses.field(default=None, repr=False,
                                              compare=False)
