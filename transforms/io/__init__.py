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

One module per format (``npz``, ``tfrecord``, ``parquet``, ``csv``) over
the shared ``ranges`` (files and byte ranges) and ``validation`` (the spec,
the checks, ``InputError``); ``read`` lists the ranges, reads each one's
validated blocks, takes the dimension from the schema and holds the Beam
transform. This package exposes the names its importers use as ``io.X``.
"""

from dpsynth.transforms.io.csv import csv_embedding_columns
from dpsynth.transforms.io.ranges import FileRange, join, match_files
from dpsynth.transforms.io.read import (
    InputSchema, ReadEmbeddingBlocks, check_schema, file_ranges, input_schema,
    list_ranges, load_arrays, peek_dim, read_file_blocks, read_range_blocks,
    release_schema)
from dpsynth.transforms.io.tfrecord import (
    masked_crc32c, masked_crc32c_strided, tfrecord_payloads)
from dpsynth.transforms.io.validation import (
    InputError, InputSpec, Rows, check_columns_format, detect_format,
    match_columns, validate_block)

__all__ = [
    "FileRange", "InputError", "InputSchema", "InputSpec",
    "ReadEmbeddingBlocks", "Rows", "check_columns_format", "check_schema",
    "csv_embedding_columns", "detect_format",
    "file_ranges", "input_schema", "join", "list_ranges", "load_arrays",
    "masked_crc32c", "masked_crc32c_strided", "match_columns", "match_files",
    "peek_dim", "read_file_blocks", "read_range_blocks", "release_schema",
    "tfrecord_payloads", "validate_block",
]
