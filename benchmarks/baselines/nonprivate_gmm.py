"""nonprivate-gmm: the same generator with no noise (epsilon = inf).

A reference point, NOT a private method: it shows how much of the gap to
real data comes from the mixture model itself rather than from the noise.
Its ledger registers the same mechanisms with sigma 0, so it reports
epsilon = inf (neighbouring relation: add/remove one record, as for
``dpgmm``).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from benchmarks.baselines.base import MethodOutput
from benchmarks.baselines.dpgmm import DPGMM


class NonPrivateGMM(DPGMM):
    private = False

    def __init__(self, **overrides) -> None:
        super().__init__(vote_filter=False, **overrides)
        self.name = "nonprivate-gmm"
        self.display = "GMM, no noise (ε=∞, not private)"

    def fit(self, x: np.ndarray, y: np.ndarray, labels: Sequence[int],
            epsilon: float = math.inf, delta: float = 1e-5, seed: int = 0,
            noise_seed: Optional[int] = None) -> MethodOutput:
        """Ignores ``epsilon``: always runs at epsilon = inf."""
        return super().fit(x, y, labels, math.inf, delta, seed, noise_seed)
