"""DP vote filter (one round of Private Evolution's nearest-neighbour vote).

Every real record votes for its nearest synthetic candidate. The histogram is
dense over all candidate ids (zeros included; the candidate set is public
post-processing), so adding or removing one record changes one bin by one:
L2 sensitivity 1 (add/remove one record).

The nearest-neighbour search is the heaviest step of a run: n_class x m x d
multiply-adds per class for m candidates. It runs as tiled BLAS (rows x
candidate tiles, bounded memory whatever m) in float32. Each record still
casts exactly one vote, for a candidate that is nearest up to float32
rounding: a per-record rule, so the sensitivity is unchanged.
``vote_max_candidates`` (public configuration) caps m.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

VOTE_DTYPE = np.float32
ROW_TILE = 1024
CANDIDATE_TILE = 8192  # ROW_TILE x CANDIDATE_TILE float32 scores: 32 MiB


class CandidateIndex:
    """Candidates prepared once for many nearest-neighbour queries."""

    def __init__(self, candidates: np.ndarray, dtype=VOTE_DTYPE) -> None:
        self.size = len(candidates)
        self.dtype = np.dtype(dtype)
        self.points = np.ascontiguousarray(candidates, dtype=self.dtype)
        # argmin ||x - c||^2 = argmax x.c - ||c||^2 / 2
        self.half_sq = 0.5 * np.einsum("ij,ij->i", self.points, self.points)

    def __len__(self) -> int:
        return self.size

    def nearest(self, x: np.ndarray, row_tile: int = ROW_TILE,
                cand_tile: int = CANDIDATE_TILE) -> np.ndarray:
        """Index of the nearest candidate of every row (ties: lowest id)."""
        x = np.asarray(x, dtype=self.dtype)
        out = np.empty(len(x), dtype=np.int64)
        for r in range(0, len(x), row_tile):
            xr = x[r:r + row_tile]
            best = np.full(len(xr), -np.inf, dtype=self.dtype)
            arg = np.zeros(len(xr), dtype=np.int64)
            for c in range(0, self.size, cand_tile):
                scores = xr @ self.points[c:c + cand_tile].T
                scores -= self.half_sq[c:c + cand_tile]
                j = np.argmax(scores, axis=1)
                s = scores[np.arange(len(xr)), j]
                better = s > best  # strict: earlier tiles win ties
                best[better] = s[better]
                arg[better] = j[better] + c
            out[r:r + row_tile] = arg
        return out


def block_votes(x: np.ndarray, candidates, chunk: int = ROW_TILE
                ) -> np.ndarray:
    """Exact vote histogram [len(candidates)] of one block of real rows.

    ``candidates``: an array or a ``CandidateIndex`` (reuse one across
    blocks: it holds the float32 copy and the squared norms).
    """
    index = (candidates if isinstance(candidates, CandidateIndex)
             else CandidateIndex(candidates))
    if len(index) == 0 or len(x) == 0:
        return np.zeros(len(index))
    idx = index.nearest(x, row_tile=chunk)
    return np.bincount(idx, minlength=len(index)).astype(np.float64)


def keep_mask(noisy_votes: np.ndarray, threshold: float) -> np.ndarray:
    return noisy_votes >= threshold


def max_candidates(cfg) -> Optional[int]:
    """``cfg.vote_max_candidates`` (public; None: no cap)."""
    cap = getattr(cfg, "vote_max_candidates", None)
    if cap is not None and int(cap) < 1:
        raise ValueError(f"--vote-max-candidates must be >= 1, got {cap}")
    return None if cap is None else int(cap)


def candidate_oversample(wanted: int, cfg) -> float:
    """Candidates per wanted sample: ``vote_oversample``, lowered so that at
    most ``vote_max_candidates`` are drawn. ``wanted`` is the DP sample
    count, so the result is post-processing of DP outputs and config."""
    if not cfg.vote_filter:
        return 1.0
    over = cfg.vote_oversample
    cap = max_candidates(cfg)
    if cap is not None and wanted > 0 and wanted * over > cap:
        over = cap / wanted
    return over
