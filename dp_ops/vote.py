"""DP vote (one round of Private Evolution's nearest-neighbour vote).

Every real record votes for its nearest synthetic candidate. The histogram is
dense over all candidate ids (zeros included; the candidate set is public
post-processing), so adding or removing one record changes one bin by one:
L2 sensitivity 1 (add/remove one record).

What the noisy histogram does to the release (post-processing):
``resample_copies`` draws the class's rows from the candidates in proportion
to the clipped noisy votes (PE's selection step), as many as the default
release would write. Where noise swamps the votes the draw is close to
uniform over candidates, i.e. the plain mixture: the release degrades
towards the default instead of shrinking (the old threshold rule,
``keep_mask``, kept fewer rows the more budget it had, since candidates
outnumber records).

The nearest-neighbour search is the heaviest step of a run: n_class x m x d
multiply-adds per class for m candidates. It runs as tiled BLAS (rows x
candidate tiles, bounded memory whatever m) in float32; rows whose BLAS
scores leave a near tie are decided exactly (``CandidateIndex``), so the
vote of a record does not depend on the tiling, the block or the BLAS
threads. Each record casts exactly one vote, by a per-record rule: the
sensitivity is unchanged.
``vote_max_candidates`` (public configuration) caps m.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

VOTE_DTYPE = np.float32
ROW_TILE = 1024
CANDIDATE_TILE = 8192  # ROW_TILE x CANDIDATE_TILE float32 scores: 32 MiB
# Near-tied pairs scored exactly at a time (x 8 bytes x d: 24 MiB at d=384).
# Their number is that of candidates within the rounding bound of a row's
# best: one or two in practice (the mixture's variance floor spreads the
# candidates far beyond it); identical candidates are all contenders.
EXACT_CHUNK = 8192


SQUARE_CHUNK = 65536  # rows cast to float64 at a time: 192 MiB at d=384


def half_squares(points: np.ndarray, chunk: int = SQUARE_CHUNK) -> np.ndarray:
    """|c|^2 / 2 of every row in float64 (exact products of float32),
    ``chunk`` rows at a time: a float64 copy of all m x d candidates was
    twice their float32 size again (3.7 GB at 1.2M x 384). Each row's sum
    is the same whatever the chunk (rows reduce independently)."""
    out = np.empty(len(points), dtype=np.float64)
    for start in range(0, len(points), chunk):
        exact = points[start:start + chunk].astype(np.float64)
        out[start:start + chunk] = np.einsum("ij,ij->i", exact, exact)
    return 0.5 * out


class CandidateIndex:
    """Candidates prepared once for many nearest-neighbour queries.

    The rule (a function of one record and the public candidates): a row's
    vote goes to the candidate maximising x.c - |c|^2 / 2 (i.e. minimising
    |x - c|), x and c rounded to ``dtype``; lowest id on ties. The search
    runs as tiled BLAS in ``dtype``, whose rounding depends on the tiling,
    the BLAS threads and the block a row arrives in. So that the answer
    does not (releases stay byte-identical across worker counts, block
    sizes and machines' thread counts): a row whose BLAS scores put more
    than one candidate within ``tolerance`` of its best (a bound on twice
    the BLAS rounding error, for any summation order) is decided again on
    scores computed pair by pair in float64 (products of float32 values
    are exact there). Rows with one such candidate already have the exact
    answer: every other candidate is provably farther.
    """

    def __init__(self, candidates: np.ndarray, dtype=VOTE_DTYPE) -> None:
        self.size = len(candidates)
        self.dtype = np.dtype(dtype)
        self.points = np.ascontiguousarray(candidates, dtype=self.dtype)
        # argmin ||x - c||^2 = argmax x.c - ||c||^2 / 2
        self.half_sq64 = half_squares(self.points)
        self.half_sq = self.half_sq64.astype(self.dtype)
        self._cmax = float(np.sqrt(2 * self.half_sq64.max())) if self.size \
            else 0.0
        self._hmax = float(self.half_sq64.max()) if self.size else 0.0

    def __len__(self) -> int:
        return self.size

    def tolerance(self, x: np.ndarray) -> np.ndarray:
        """Per row, twice a bound on |BLAS score - exact score|:
        gamma_(d+4) (|x| max|c| + max |c|^2 / 2), gamma_n = n u / (1 - n u)
        (Higham's bound for a d-term dot product in any order, plus the
        rounding of |c|^2 / 2 and of the subtraction)."""
        u = np.finfo(self.dtype).eps / 2
        n = self.points.shape[1] + 4
        gamma = n * u / (1 - n * u)
        norms = np.sqrt(np.einsum("ij,ij->i", x, x, dtype=np.float64))
        return 2 * gamma * (norms * (1 + 1e-6) * self._cmax + self._hmax)

    def nearest(self, x: np.ndarray, row_tile: int = ROW_TILE,
                cand_tile: int = CANDIDATE_TILE) -> np.ndarray:
        """Index of the nearest candidate of every row (ties: lowest id)."""
        x = np.asarray(x, dtype=self.dtype)
        out = np.empty(len(x), dtype=np.int64)
        for r in range(0, len(x), row_tile):
            xr = x[r:r + row_tile]
            tol = self.tolerance(xr)
            arg, best, pairs = self._scan(xr, tol, cand_tile)
            out[r:r + row_tile] = self._settle(xr, arg, best, tol, *pairs)
        return out

    def _scan(self, xr: np.ndarray, tol: np.ndarray, cand_tile: int):
        """BLAS argmax per row, its score, and the contenders: (row,
        candidate, BLAS score) of every candidate that scored within tol of
        the row's best so far when its tile was scanned (a superset of
        those within tol of the final best, which include the exact best).
        Per tile one argmax and one max: the second best tells which rows
        have more than one contender there, and only those are searched."""
        n = len(xr)
        rows = np.arange(n)
        best = np.full(n, -np.inf, dtype=self.dtype)
        arg = np.zeros(n, dtype=np.int64)
        found_rows, found_cols, found_scores = [], [], []
        for c in range(0, self.size, cand_tile):
            scores = xr @ self.points[c:c + cand_tile].T
            scores -= self.half_sq[c:c + cand_tile]
            j = np.argmax(scores, axis=1)
            s = scores[rows, j]
            better = s > best  # strict: earlier tiles win ties
            best[better] = s[better]
            arg[better] = j[better] + c
            floor = best - tol
            top = s >= floor
            found_rows.append(rows[top])
            found_cols.append(j[top] + c)
            found_scores.append(s[top])
            scores[rows, j] = -np.inf
            many = np.flatnonzero(scores.max(axis=1) >= floor)
            if many.size:
                ri, ci = np.nonzero(scores[many] >= floor[many, None])
                found_rows.append(many[ri])
                found_cols.append(ci + c)
                found_scores.append(scores[many[ri], ci])
        pairs = (np.concatenate(found_rows), np.concatenate(found_cols),
                 np.concatenate(found_scores))
        return arg, best, pairs

    def _settle(self, xr: np.ndarray, arg: np.ndarray, best: np.ndarray,
                tol: np.ndarray, rows: np.ndarray, cols: np.ndarray,
                scores: np.ndarray) -> np.ndarray:
        """Rows with one contender within tol of their final best keep the
        BLAS argmax (provably the exact one); the others are decided on
        scores computed pair by pair in float64: highest, then lowest id."""
        keep = scores >= (best - tol)[rows]
        rows, cols = rows[keep], cols[keep]
        unsure = np.bincount(rows, minlength=len(xr)) > 1
        if not unsure.any():
            return arg
        pick = unsure[rows]
        rows, cols = rows[pick], cols[pick]
        exact = np.empty(len(rows))
        for a in range(0, len(rows), EXACT_CHUNK):  # bounded temporaries
            r, c = rows[a:a + EXACT_CHUNK], cols[a:a + EXACT_CHUNK]
            exact[a:a + EXACT_CHUNK] = (
                np.sum(xr[r].astype(np.float64)
                       * self.points[c].astype(np.float64), axis=1)
                - self.half_sq64[c])
        order = np.lexsort((cols, -exact, rows))  # by row, best, lowest id
        first = np.ones(len(order), bool)
        first[1:] = rows[order][1:] != rows[order][:-1]
        out = arg.copy()
        out[rows[order][first]] = cols[order][first]
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
    """The legacy threshold filter (``--vote-threshold``): candidates with
    at least ``threshold`` noisy votes, once each."""
    return noisy_votes >= threshold


def selection_weights(noisy_votes: np.ndarray) -> np.ndarray:
    """Clipped noisy votes max(v, 0), normalised; all zero (noise pushed
    every bin below 0): uniform, i.e. the plain mixture draws."""
    w = np.clip(np.asarray(noisy_votes, np.float64), 0.0, None)
    total = w.sum()
    if not total > 0:
        return np.full(len(w), 1.0 / max(len(w), 1))
    return w / total


def resample_copies(noisy_votes: np.ndarray, rows: int,
                    rng: np.random.Generator) -> np.ndarray:
    """Copies of each candidate in the release: ``rows`` draws in
    proportion to the clipped noisy votes (a multinomial with a public
    seed). Post-processing of the DP histogram and the public row count:
    no privacy cost."""
    if rows <= 0 or len(noisy_votes) == 0:
        return np.zeros(len(noisy_votes), dtype=np.int64)
    return rng.multinomial(int(rows), selection_weights(noisy_votes)
                           ).astype(np.int64)


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
