"""Public, per-record preprocessing: normalisation and L2 clipping.

Both are functions of one record alone (no statistics of the dataset), so
they do not touch the privacy budget; clipping is what bounds sensitivity.
The optional centre subtracted before clipping is a DP output (its own
mechanisms, see plan.global_slots), hence public by then.
"""

from __future__ import annotations

import numpy as np

from dp_ops.moments import quantize

NORMALIZATIONS = ("none", "unit")


def row_norms(x: np.ndarray) -> np.ndarray:
    """L2 norm of each row, without an n x d temporary (einsum)."""
    return np.sqrt(np.einsum("ij,ij->i", x, x))


def normalize_rows(x: np.ndarray, mode: str) -> np.ndarray:
    """``unit`` scales each row to L2 norm 1 (zero rows stay zero)."""
    if mode == "none":
        return x
    if mode == "unit":
        norms = row_norms(x)
        return x * (1.0 / np.where(norms > 0, norms, 1.0))[:, None]
    raise ValueError(f"--normalize must be one of {NORMALIZATIONS}, got {mode!r}")


def clip_rows(x: np.ndarray, clip_norm: float) -> tuple[np.ndarray, int]:
    """Scales rows with L2 norm > clip_norm onto the ball; returns #clipped."""
    if not clip_norm > 0:
        raise ValueError(f"--clip-norm must be > 0, got {clip_norm}")
    x = np.asarray(x, dtype=np.float64)
    norms = row_norms(x)
    over = norms > clip_norm
    scale = np.where(over, clip_norm / np.where(over, norms, 1.0), 1.0)
    # Rounding can leave a row a hair over the bound; shave it explicitly.
    out = x * (scale * (1 - 1e-12))[:, None]
    return out, int(over.sum())


def preprocess(x: np.ndarray, normalize: str, clip_norm: float,
               centre: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """Normalise, subtract the (public, DP) centre if given, clip."""
    x = normalize_rows(np.asarray(x, np.float64), normalize)
    if centre is not None:
        x = x - centre[None, :]
    return clip_rows(x, clip_norm)


def centre_sum(x: np.ndarray, normalize: str,
               bound: float) -> tuple[np.ndarray, int]:
    """Exact (grid-quantised, order-independent) sum of the normalised rows
    clipped to ``bound``, and the row count: the centre's aggregates."""
    rows, _ = clip_rows(normalize_rows(np.asarray(x, np.float64), normalize),
                        bound)
    return quantize(rows, bound).sum(axis=0), len(rows)
