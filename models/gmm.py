"""The released DP Gaussian mixture: one mixture per class label (diagonal,
or low-rank factors plus a diagonal; factors shared by all classes are
stored once).

Everything stored here is DP output (noisy weights, means, variances and the
noisy class count), so saving, loading and sampling it is post-processing.
"""

from __future__ import annotations

import dataclasses
import io
from typing import Iterable

import numpy as np

from dpsynth.dp_ops import sampling
from dpsynth.dp_ops.generator import ClassMixture


@dataclasses.dataclass
class MixtureRelease:
    mixtures: dict[int, ClassMixture]

    @classmethod
    def from_list(cls, mixtures: Iterable[ClassMixture]) -> "MixtureRelease":
        return cls({m.label: m for m in sorted(mixtures, key=lambda m: m.label)})

    def to_npz_bytes(self) -> bytes:
        arrays = {"labels": np.array(sorted(self.mixtures), dtype=np.int64)}
        shared = self._shared_factors()
        for label, m in sorted(self.mixtures.items()):
            arrays[f"class_{label}_weights"] = m.weights
            arrays[f"class_{label}_means"] = m.means
            arrays[f"class_{label}_variances"] = m.variances
            arrays[f"class_{label}_noisy_count"] = np.array(m.noisy_count)
            if m.factors is not None and shared is None:
                arrays[f"class_{label}_factors"] = m.factors
        if shared is not None:  # shared by all classes: store once
            arrays["shared_factors"] = shared
        centres = [m.centre for m in self.mixtures.values()
                   if m.centre is not None]
        if centres:  # the DP centre (means are stored with it added)
            arrays["centre"] = centres[0]
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        return buf.getvalue()

    def _shared_factors(self) -> np.ndarray | None:
        """The factors if every class has the same ones ("shared" mode)."""
        factors = [m.factors for m in self.mixtures.values()]
        if not factors or factors[0] is None:
            return None
        if all(f is not None and np.array_equal(f, factors[0])
               for f in factors[1:]):
            return factors[0]
        return None

    @classmethod
    def from_npz(cls, data: bytes | str) -> "MixtureRelease":
        src = io.BytesIO(data) if isinstance(data, bytes) else data
        with np.load(src) as z:
            shared = z["shared_factors"] if "shared_factors" in z.files else None
            centre = z["centre"] if "centre" in z.files else None

            def factors(label):
                key = f"class_{label}_factors"
                return z[key] if key in z.files else shared
            return cls({int(l): ClassMixture(
                int(l), z[f"class_{l}_weights"], z[f"class_{l}_means"],
                z[f"class_{l}_variances"], float(z[f"class_{l}_noisy_count"]),
                factors(l), centre)
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
