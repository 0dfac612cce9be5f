"""Public configuration of one generation run (everything here is public)."""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

from dp_ops.clipping import NORMALIZATIONS

# Default share of the privacy budget (of mu^2, see calibration.py) per stage.
DEFAULT_WEIGHTS = {"tree": 0.1, "lloyd": 0.15, "moments": 0.45,
                   "covariance": 0.3, "vote": 0.10}


@dataclasses.dataclass(frozen=True)
class GeneratorConfig:
    labels: tuple[int, ...]
    epsilon: float = 4.0
    delta: float = 1e-5
    clusters: int = 8
    clip_norm: float = 1.0
    normalize: str = "unit"
    cluster_dim: int = 32
    tree_depth: int = 8
    branch_threshold: Optional[float] = None  # None: 3 x tree count sigma
    lloyd_rounds: int = 2
    samples_per_class: Optional[int] = None  # None: the noisy class count
    variance_floor: float = 1e-6  # as a fraction of clip_norm^2 / d
    covariance_rank: int = 128  # 0: diagonal clusters; r: + shared rank-r factors
    vote_filter: bool = False
    vote_threshold: float = 6.0
    vote_oversample: float = 6.0
    vote_max_candidates: Optional[int] = None  # public cap on candidates per class
    budget_weights: Optional[dict] = None
    accountant: str = "pld"
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.labels:
            raise ValueError("--labels/--num-classes: at least one class label")
        if len(set(self.labels)) != len(self.labels):
            raise ValueError(f"--labels has duplicates: {list(self.labels)}")
        if not (self.epsilon > 0) or math.isnan(self.epsilon):
            raise ValueError(f"--epsilon must be > 0 (or inf), got {self.epsilon}")
        if not (0 < self.delta < 1):
            raise ValueError(f"--delta must be in (0, 1), got {self.delta}")
        if not (self.clip_norm > 0) or math.isinf(self.clip_norm):
            raise ValueError(f"--clip-norm must be finite and > 0, got {self.clip_norm}")
        if self.clusters < 1:
            raise ValueError(f"--clusters must be >= 1, got {self.clusters}")
        if self.normalize not in NORMALIZATIONS:
            raise ValueError(f"--normalize must be one of {NORMALIZATIONS}")
        if not 1 <= self.tree_depth <= 30:
            raise ValueError(f"--tree-depth must be in [1, 30], got {self.tree_depth}")
        if self.cluster_dim < 1:
            raise ValueError(f"--cluster-dim must be >= 1, got {self.cluster_dim}")
        if self.lloyd_rounds < 0:
            raise ValueError(f"--lloyd-rounds must be >= 0, got {self.lloyd_rounds}")
        if self.samples_per_class is not None and self.samples_per_class < 1:
            raise ValueError("--samples-per-class must be >= 1")
        if self.vote_max_candidates is not None and self.vote_max_candidates < 1:
            raise ValueError(f"--vote-max-candidates must be >= 1, got {self.vote_max_candidates}")
        if self.vote_oversample < 1:
            raise ValueError("--vote-oversample must be >= 1")
        if self.branch_threshold is not None and not self.branch_threshold > 0:
            raise ValueError("--branch-threshold must be > 0")
        if self.covariance_rank < 0:
            raise ValueError(f"--covariance-rank must be >= 0, got {self.covariance_rank}")
        if not self.variance_floor > 0:
            raise ValueError("--variance-floor must be > 0")

    @property
    def stages(self) -> list[str]:
        stages = ["moments"]
        if self.clusters > 1:  # one cluster needs no clustering
            stages.append("tree")
            if self.lloyd_rounds:
                stages.append("lloyd")
        if self.covariance_rank:
            stages.append("covariance")
        if self.vote_filter:
            stages.append("vote")
        return stages

    def weights(self) -> dict[str, float]:
        """User weights as given, or the defaults renormalised to the stages."""
        if self.budget_weights is not None:
            return dict(self.budget_weights)
        raw = {s: DEFAULT_WEIGHTS[s] for s in self.stages}
        total = sum(raw.values())
        return {s: w / total for s, w in raw.items()}

    @property
    def noiseless(self) -> bool:
        return math.isinf(self.epsilon)


def parse_weights(text: str) -> dict[str, float]:
    """'tree=0.2,moments=0.8' -> {'tree': 0.2, 'moments': 0.8}."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"--budget-weights: expected stage=weight, got {part!r}")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            raise ValueError(f"--budget-weights: {value!r} is not a number") from None
    return out


def labels_from(num_classes: Optional[int],
                labels: Optional[Sequence[int]]) -> tuple[int, ...]:
    if labels:
        return tuple(int(v) for v in labels)
    if num_classes is None:
        raise ValueError("the set of labels is public configuration: pass "
                         "--num-classes N or --labels 0,1,...")
    if num_classes < 1:
        raise ValueError(f"--num-classes must be >= 1, got {num_classes}")
    return tuple(range(num_classes))
