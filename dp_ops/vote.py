"""DP vote filter (one round of Private Evolution's nearest-neighbour vote).

Every real record votes for its nearest synthetic candidate. The histogram is
dense over all candidate ids (zeros included; the candidate set is public
post-processing), so adding or removing one record changes one bin by one:
L2 sensitivity 1 (add/remove one record).
"""

from __future__ import annotations

import numpy as np

from dp_ops.kmeans import nearest


def block_votes(x: np.ndarray, candidates: np.ndarray,
                chunk: int = 4096) -> np.ndarray:
    """Exact vote histogram [len(candidates)] of one block of real rows."""
    hist = np.zeros(len(candidates))
    if len(candidates) == 0:
        return hist
    for start in range(0, len(x), chunk):
        idx = nearest(x[start:start + chunk], candidates)
        hist += np.bincount(idx, minlength=len(candidates))
    return hist


def keep_mask(noisy_votes: np.ndarray, threshold: float) -> np.ndarray:
    return noisy_votes >= threshold
