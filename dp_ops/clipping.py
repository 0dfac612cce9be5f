"""Public, per-record preprocessing: normalisation and L2 clipping.

Both are functions of one record alone (no statistics of the dataset), so
they do not touch the privacy budget; clipping is what bounds sensitivity.
The optional centre subtracted before clipping is a DP output (its own
mechanisms, see plan.global_slots), hence public by then.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from dpsynth.dp_ops.moments import quantize

NORMALIZATIONS = ("none", "unit")


def row_norms(x: np.ndarray) -> np.ndarray:
    """L2 norm of each row, without an n x d temporary (einsum)."""
    return np.sqrt(np.einsum("ij,ij->i", x, x))


def _normalize_scale(x: np.ndarray, mode: str) -> np.ndarray | None:
    """Per-row factors of ``normalize_rows`` (None: leave rows as they are)."""
    if mode == "none":
        return None
    if mode == "unit":
        norms = row_norms(x)
        return 1.0 / np.where(norms > 0, norms, 1.0)
    raise ValueError(f"--normalize must be one of {NORMALIZATIONS}, got {mode!r}")


def normalize_rows(x: np.ndarray, mode: str) -> np.ndarray:
    """``unit`` scales each row to L2 norm 1 (zero rows stay zero)."""
    scale = _normalize_scale(x, mode)
    return x if scale is None else x * scale[:, None]


def _clip_scale(x: np.ndarray, clip_norm: float) -> tuple[np.ndarray, int]:
    """Per-row factors of ``clip_rows`` and the number of rows clipped."""
    if not clip_norm > 0:
        raise ValueError(f"--clip-norm must be > 0, got {clip_norm}")
    norms = row_norms(x)
    over = norms > clip_norm
    scale = np.where(over, clip_norm / np.where(over, norms, 1.0), 1.0)
    # Rounding can leave a row a hair over the bound; shave it explicitly.
    return scale * (1 - 1e-12), int(over.sum())


def clip_rows(x: np.ndarray, clip_norm: float) -> tuple[np.ndarray, int]:
    """Scales rows with L2 norm > clip_norm onto the ball; returns #clipped."""
    x = np.asarray(x, dtype=np.float64)
    scale, clipped = _clip_scale(x, clip_norm)
    return x * scale[:, None], clipped


# Rows prepared at a time: ~1 MB of float64, so that the normalise, centre
# and clip steps (and a caller's per-chunk work) re-read rows from the
# core's own cache rather than from memory (a 4096 x 384 block is 12.6 MB:
# two workers' blocks overflow a shared L3 and each step then streams from
# DRAM).
PREPARE_CHUNK_BYTES = 1 << 20


def chunk_rows(dim: int) -> int:
    """Rows per ``PREPARE_CHUNK_BYTES`` of float64 (at least one)."""
    return max(1, PREPARE_CHUNK_BYTES // (8 * max(1, dim)))


def row_chunks(n: int, dim: int) -> Iterator[tuple[int, int]]:
    """[start, stop) of each ``chunk_rows(dim)``-row chunk of n rows."""
    step = chunk_rows(dim)
    for start in range(0, n, step):
        yield start, min(n, start + step)


def prepare_into(out: np.ndarray, x: np.ndarray, normalize: str,
                 clip_norm: float, centre: np.ndarray | None) -> int:
    """``preprocess`` of rows ``x`` written into the float64 array ``out``
    of the same shape, every step in place: the same operations in the
    same order as normalize_rows, the centre's subtraction and clip_rows
    (identical bits: each is a function of one row); returns the number of
    rows clipped."""
    out[...] = x
    scale = _normalize_scale(out, normalize)
    if scale is not None:
        out *= scale[:, None]
    if centre is not None:
        out -= centre[None, :]
    scale, clipped = _clip_scale(out, clip_norm)
    out *= scale[:, None]
    return clipped


def _prepared_copy(x: np.ndarray, normalize: str, clip_norm: float,
                   centre: np.ndarray | None) -> tuple[np.ndarray, int]:
    """``preprocess`` on one float64 copy of x (the caller's rows stay),
    ``chunk_rows`` at a time, without n x d temporaries."""
    x = np.asarray(x)
    out = np.empty(x.shape, dtype=np.float64)
    if out.size == 0:
        return out, 0
    clipped = 0
    for a, b in row_chunks(len(out), out.shape[-1]):
        clipped += prepare_into(out[a:b], x[a:b], normalize, clip_norm,
                                centre)
    return out, clipped


def preprocess(x: np.ndarray, normalize: str, clip_norm: float,
               centre: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """Normalise, subtract the (public, DP) centre if given, clip."""
    return _prepared_copy(x, normalize, clip_norm, centre)


def centre_sum(x: np.ndarray, normalize: str,
               bound: float) -> tuple[np.ndarray, int]:
    """Exact (grid-quantised, order-independent) sum of the normalised rows
    clipped to ``bound``, and the row count: the centre's aggregates."""
    x = np.asarray(x)
    total = np.zeros(x.shape[1:], dtype=np.float64)
    if x.size == 0:
        return total, len(x)
    buf = np.empty((min(chunk_rows(x.shape[-1]), len(x)),) + x.shape[1:],
                   dtype=np.float64)
    for a, b in row_chunks(len(x), x.shape[-1]):  # one cached chunk a time
        part = buf[:b - a]
        prepare_into(part, x[a:b], normalize, bound, None)
        total += quantize(part, bound, out=part).sum(axis=0)  # exact sums
    return total, len(x)
