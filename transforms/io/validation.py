"""What every reader checks: the input spec (public configuration), the
format a file name tells, the columns ``--embedding-columns`` picks, and
each block's rows (numbers, one dimension, integer labels, ``--labels``,
``--non-finite``). ``InputError`` is the one error bad input raises: its
message names the file, the row (or record / byte offset) and the flag to
change, never an embedding value."""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence, Union

import numpy as np

from dpsynth.transforms.formats import FORMATS, NON_FINITE_POLICIES, SPLIT_BYTES


class InputError(ValueError):
    """Bad input data: the message names the file (and row or flag)."""


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """Where and how to read the private embeddings (public configuration)."""

    pattern: str
    fmt: Optional[str] = None
    embedding_feature: str = "embedding"
    label_feature: str = "label"
    labels: Optional[tuple[int, ...]] = None  # None: accept any integer
    non_finite: str = "reject"
    block_size: int = 4096
    split_bytes: int = SPLIT_BYTES  # read range size (TFRecord, Parquet)
    # CSV/Parquet: one numeric column per dimension, named or matched by
    # glob patterns ("f*", "dim_*", "x0,x1,x2"); None: embedding_feature
    embedding_columns: Optional[tuple[str, ...]] = None

    def __post_init__(self) -> None:
        if self.fmt is not None and self.fmt not in FORMATS:
            raise InputError(f"--input-format must be one of {FORMATS}, got {self.fmt!r}")
        if self.non_finite not in NON_FINITE_POLICIES:
            raise InputError(f"--non-finite must be one of {NON_FINITE_POLICIES}")
        if self.block_size < 1:
            raise InputError("--block-size must be >= 1")
        if self.split_bytes < 1:
            raise InputError("--split-bytes must be >= 1")
        if self.embedding_columns is not None and (
                not self.embedding_columns or not all(self.embedding_columns)):
            raise InputError("--embedding-columns needs column names or "
                             "patterns, e.g. 'f*' or x0,x1,x2")


def match_columns(names: Sequence[str], path: str,
                  spec: InputSpec) -> list[str]:
    """The embedding columns ``--embedding-columns`` picks from a file's
    columns: each entry a name or glob pattern (fnmatch), its matches in
    the file's order, the label column never. An entry matching nothing is
    refused: a typo must not silently drop dimensions."""
    import fnmatch
    found: list[str] = []
    for entry in spec.embedding_columns or ():
        hits = [n for n in names if n != spec.label_feature
                and fnmatch.fnmatchcase(n, entry)]
        if not hits:
            raise InputError(f"{path}: --embedding-columns {entry!r} matches "
                             f"no column (has {_column_names(names)})")
        found += [n for n in hits if n not in found]
    return found


def check_columns_format(path: str, spec: InputSpec) -> None:
    """--embedding-columns names table columns: CSV and Parquet only."""
    fmt = detect_format(path, spec.fmt)
    if spec.embedding_columns and fmt not in ("csv", "parquet"):
        raise InputError(f"--embedding-columns: {path} is {fmt} input; the "
                         f"flag picks CSV or Parquet columns (see "
                         f"--embedding-feature)")


def detect_format(path: str, fmt: Optional[str] = None) -> str:
    if fmt:
        return fmt
    name = path.lower()
    if name.endswith(".npz"):
        return "npz"
    if name.endswith((".tfrecord", ".tfrecords", ".tfrec")) or ".tfrecord-" in name:
        return "tfrecord"
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    if name.endswith(".csv"):
        return "csv"
    raise InputError(f"{path}: cannot tell the format from the file name; "
                     f"pass --input-format ({'|'.join(FORMATS)})")


def _column_names(names: Sequence[str]) -> str:
    names = list(names)
    return str(names) if len(names) <= 8 else f"{names[:8]} and {len(names) - 8} more"


@dataclasses.dataclass(frozen=True)
class Rows:
    """Names the rows of a block in error messages: their row numbers in the
    file when known (``first``), else the byte offsets of their TFRecord
    records (a range that starts inside a file does not know how many rows
    precede it)."""

    first: Optional[int] = 0
    offsets: Optional[tuple[int, ...]] = None

    def row(self, i: int) -> str:
        if self.offsets is not None:
            return f"the record at byte {self.offsets[i]}"
        return f"row {self.first + i}"

    def span(self, n: Optional[int] = None, noun: str = "rows") -> str:
        if self.offsets is not None:
            last = self.offsets[-1] if n is None else self.offsets[n - 1]
            return f"records at bytes {self.offsets[0]}..{last}"
        return (f"{noun} {self.first}.." if n is None
                else f"{noun} {self.first}..{self.first + n - 1}")


# -------------------------------------------------------------- blocks

def validate_block(x: np.ndarray, y: np.ndarray, path: str,
                   start: Union[int, Rows], spec: InputSpec, dim: Optional[int] = None,
                   dim_source: Optional[str] = None
                   ) -> tuple[np.ndarray, np.ndarray, int]:
    """Checks one block; returns (x, y, rows dropped as non-finite).

    ``dim`` is the embedding dimension every file must have (read from the
    schema of ``dim_source``, the first non-empty input file). Dropping
    non-finite rows (``--non-finite drop``) is a per-record rule that does
    not look at any other record, so it keeps the DP guarantee; the number
    dropped is private and only goes to an operator counter. ``start``: the
    block's first row number in the file, or a ``Rows`` naming its rows
    (errors then name a TFRecord record by its byte offset).
    """
    where = start if isinstance(start, Rows) else Rows(start)
    try:
        x = _float_rows(x)
    except (TypeError, ValueError):
        raise InputError(f"{path}: {where.span()}: embeddings are not "
                         f"numeric") from None
    if x.ndim != 2:
        raise InputError(f"{path}: embeddings must be 2-D [n, d], got shape "
                         f"{x.shape}")
    if dim is not None and x.shape[1] != dim and (len(x) or x.shape[1]):
        # An empty block of known width (an empty .npz or fixed-size
        # Parquet file) is checked like a row: as if it held one.
        source = f"that of {dim_source}" if dim_source else "the first file's"
        what = where.row(0) if len(x) else "its schema (no rows)"
        raise InputError(f"{path}: {what} has dimension {x.shape[1]}, "
                         f"expected {dim} ({source}); all input files must "
                         f"have the same embedding dimension")
    y = _integer_labels(np.asarray(y), path, where)
    if len(y) != len(x):
        raise InputError(f"{path}: {where.span()}: {len(x)} embeddings but "
                         f"{len(y)} labels")
    if spec.labels is not None:
        bad = np.flatnonzero(~np.isin(y, np.array(spec.labels)))
        if bad.size:
            i = int(bad[0])
            raise InputError(f"{path}: {where.row(i)} has label {int(y[i])}, "
                             f"which is not in --labels/--num-classes "
                             f"{_short(spec.labels)}")
    finite = _finite_rows(x)
    if finite.all():
        return x, y, 0
    if spec.non_finite == "reject":
        i = int(np.flatnonzero(~finite)[0])
        raise InputError(f"{path}: {where.row(i)} has NaN or infinite values "
                         f"(use --non-finite drop to drop such rows)")
    return x[finite], y[finite], int((~finite).sum())


def _float_rows(x) -> np.ndarray:
    """x as float32 or float64 rows: those two dtypes as they are (no
    copy: a float64 copy of float32 rows costs a quarter of a pass, and the
    step that uses them copies them anyway), anything else as float64."""
    if isinstance(x, np.ndarray) and x.dtype in (np.float32, np.float64):
        return x
    return np.asarray(x, dtype=np.float64)


def _finite_rows(x: np.ndarray) -> np.ndarray:
    """Rows with finite values whose squared norm also fits in float64: one
    pass, since the sum of squares is NaN or inf exactly when a value is
    non-finite or the squared norm overflows. Float32 rows are summed in
    float32 and only the rows that overflow there are summed again in
    float64 (a finite float32 row's squared norm always fits in float64)."""
    with np.errstate(over="ignore", invalid="ignore"):
        finite = np.isfinite(np.einsum("ij,ij->i", x, x))
        if x.dtype != np.float64 and not finite.all():
            again = np.flatnonzero(~finite)
            wide = x[again].astype(np.float64)
            finite[again] = np.isfinite(np.einsum("ij,ij->i", wide, wide))
    return finite


def _short(labels: Sequence[int]) -> str:
    labels = list(labels)
    return str(labels) if len(labels) <= 12 else \
        f"[{labels[0]}, {labels[1]}, ..., {labels[-1]}] ({len(labels)} labels)"


def _integer_labels(y: np.ndarray, path: str, where: Rows) -> np.ndarray:
    if y.ndim != 1:
        raise InputError(f"{path}: labels must be 1-D, got shape {y.shape}")
    if y.dtype.kind in "iu":
        return y.astype(np.int64)
    if y.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(y) | (y != np.round(y)))
        if bad.size:
            i = int(bad[0])
            raise InputError(f"{path}: {where.row(i)} has non-integer label "
                             f"{float(y[i])!r}; labels must be integers")
        return y.astype(np.int64)
    raise InputError(f"{path}: {where.span()}: labels must be integers, got "
                     f"dtype {y.dtype}")
