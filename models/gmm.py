"""The released DP Gaussian mixture: one diagonal mixture per class label.

Everything stored here is DP output (noisy weights, means, variances and the
noisy class count), so saving, loading and sampling it is post-processing.
"""

from __future__ import annotations

import dataclasses
import io
from typing import Iterable

import numpy as np

from dp_ops import sampling
from dp_ops.generator import ClassMixture


@dataclasses.dataclass
class MixtureRelease:
    mixtures: dict[int, ClassMixture]

    @classmethod
    def from_list(cls, mixtures: Iterable[ClassMixture]) -> "MixtureRelease":
        return cls({m.label: m for m in sorted(mixtures, key=lambda m: m.label)})

    def to_npz_bytes(self) -> bytes:
        arrays = {"labels": np.array(sorted(self.mixtures), dtype=np.int64)}
        for label, m in sorted(self.mixtures.items()):
            arrays[f"class_{label}_weights"] = m.weights
            arrays[f"class_{label}_means"] = m.means
            arrays[f"class_{label}_variances"] = m.variances
            arrays[f"class_{label}_noisy_count"] = np.array(m.noisy_count)
            if m.factors is not None:  # shared by all classes: store once
                arrays["shared_factors"] = m.factors
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        return buf.getvalue()

    @classmethod
    def from_npz(cls, data: bytes | str) -> "MixtureRelease":
        src = io.BytesIO(data) if isinstance(data, bytes) else data
        with np.load(src) as z:
            factors = z["shared_factors"] if "shared_factors" in z.files else None
            return cls({int(l): ClassMixture(
                int(l), z[f"class_{l}_weights"], z[f"class_{l}_means"],
                z[f"class_{l}_variances"], float(z[f"class_{l}_noisy_count"]),
                factors)
                for l in z["labels"]})

    def sample(self, per_class: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Fresh synthetic rows from the released mixture (post-processing)."""
        xs, ys = [], []
        for label, m in sorted(self.mixtures.items()):
            rng = np.random.default_rng([seed, label])
            x = sampling.sample_mixture(m.weights, m.means, m.variances,
                                        per_class, rng, m.factors)
            xs.append(x)
            ys.append(np.full(len(x), label, dtype=np.int64))
        return np.vstack(xs), np.concatenate(ys)
