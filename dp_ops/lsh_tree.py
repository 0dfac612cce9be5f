"""LSH prefix tree: the coreset of practical DP k-means (linear in n).

Records are hashed with public random hyperplanes (SimHash); the first l sign
bits are a record's node at level l. Noisy counts decide, level by level,
which nodes branch; every released level holds *both* children of every
branching node (zero counts included), so which keys are released depends
only on earlier noisy outputs. A record sits in one node per level, so each
level's count vector has L2 sensitivity 1 (add/remove one record). The
unbranched nodes partition the space; their noisy sums (sensitivity R) over
noisy counts are the coreset.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Optional

import numpy as np


def hyperplanes(dim: int, depth: int, seed: int) -> np.ndarray:
    """Public random hyperplanes [depth, dim], from the public seed only."""
    rng = np.random.default_rng([seed, 0x75E])
    return rng.normal(size=(depth, dim))


def leaf_codes(x: np.ndarray, planes: np.ndarray) -> np.ndarray:
    """Full-depth code per row: bit i (MSB first) = sign of plane i."""
    bits = (x @ planes.T) > 0
    weights = 1 << np.arange(planes.shape[0] - 1, -1, -1, dtype=np.int64)
    return bits.astype(np.int64) @ weights


def level_code(codes: np.ndarray, level: int, depth: int) -> np.ndarray:
    return codes >> (depth - level)


def level_counts(codes: np.ndarray, depth: int) -> list[dict[int, int]]:
    """Exact node counts at levels 1..depth (index 0 is level 1).

    One sort of the block's codes; each level above is a run-length merge of
    the sorted prefixes of the level below (no per-level ``np.unique``).
    """
    keys, counts = np.unique(np.asarray(codes, np.int64), return_counts=True)
    out = []
    for _ in range(depth):
        out.append(dict(zip(keys.tolist(), counts.tolist())))
        keys = keys >> 1  # parents; still sorted
        if keys.size:
            starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
            keys, counts = keys[starts], np.add.reduceat(counts, starts)
    return out[::-1]


def merge_level_counts(a: list[dict[int, int]],
                       b: list[dict[int, int]]) -> list[dict[int, int]]:
    return merge_level_counts_into([dict(d) for d in a], b)


def merge_level_counts_into(acc: list[dict[int, int]],
                            b: list[dict[int, int]]) -> list[dict[int, int]]:
    """Adds b's counts into ``acc`` (updated in place: O(size of b))."""
    for da, db in zip(acc, b):
        for key, value in db.items():
            da[key] = da.get(key, 0) + value
    return acc


@dataclasses.dataclass
class Tree:
    """Released structure: noisy counts of released nodes and the leaves."""

    depth: int
    noisy_counts: list[dict[int, float]]  # per level 1..depth
    leaves: list[tuple[int, int]]  # (level, code), a partition of the space
    _ranges: Optional[tuple[np.ndarray, ...]] = dataclasses.field(
        default=None, init=False, repr=False, compare=False)

    def leaf_ranges(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Leaves as full-depth code ranges [start, end), sorted by start,
        with each range's index into ``leaves`` (computed once)."""
        if self._ranges is None:
            leaves = np.array(self.leaves, dtype=np.int64).reshape(-1, 2)
            shift = self.depth - leaves[:, 0]
            starts = leaves[:, 1] << shift
            ends = (leaves[:, 1] + 1) << shift
            order = np.argsort(starts, kind="stable")
            self._ranges = (starts[order], ends[order], order)
        return self._ranges

    def leaf_index(self, codes: np.ndarray) -> np.ndarray:
        """Index into ``leaves`` of each full-depth code (-1 if none).

        A leaf (level, code) holds the full-depth codes whose top ``level``
        bits are ``code``: a contiguous range. The leaves partition the code
        space, so one ``searchsorted`` over the range starts finds them all.
        """
        starts, ends, order = self.leaf_ranges()
        codes = np.asarray(codes, np.int64)
        if starts.size == 0:
            return np.full(codes.shape, -1, dtype=np.int64)
        pos = np.searchsorted(starts, codes, side="right") - 1
        safe = np.maximum(pos, 0)
        hit = (pos >= 0) & (codes < ends[safe])
        return np.where(hit, order[safe], -1)

    def leaf_counts(self) -> np.ndarray:
        return np.array([self.noisy_counts[lvl - 1][code]
                         for lvl, code in self.leaves])


Release = Callable[[int, np.ndarray], np.ndarray]


def build_tree(exact: list[Mapping[int, int]], depth: int, threshold: float,
               noise: Optional[Callable[[int, int], np.ndarray]] = None, *,
               release: Optional[Release] = None) -> Tree:
    """Grows the tree from exact level counts, releasing only noisy ones.

    ``release(level, values)`` is the level mechanism of the ledger: one
    level's released count vector from its exact one (the product adds its
    noise exactly, and a test may force the released values). ``noise(level,
    size)``, the short form, gives just the Gaussian noise to add.
    """
    if release is None:
        def release(level: int, values: np.ndarray) -> np.ndarray:
            return values + noise(level, values.size)
    branching = [0]
    noisy: list[dict[int, float]] = []
    leaves: list[tuple[int, int]] = []
    for level in range(1, depth + 1):
        keys = sorted(2 * c + b for c in branching for b in (0, 1))
        values = np.array([exact[level - 1].get(k, 0) for k in keys], float)
        released = release(level, values)
        noisy.append(dict(zip(keys, released.tolist())))
        if level == depth:
            leaves += [(level, k) for k in keys]
            break
        branching = [k for k, v in zip(keys, released) if v >= threshold]
        leaves += [(level, k) for k, v in zip(keys, released) if v < threshold]
    return Tree(depth, noisy, leaves)
