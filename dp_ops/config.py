"""Public configuration of one generation run (everything here is public)."""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

from dpsynth.dp_ops.clipping import NORMALIZATIONS

# "per-class" needs large classes: it won on CIFAR-10 (5,000 rows a class)
# from epsilon 2 up and lost on the 140-row classes of the demo
# (benchmarks/results/studies/utility_study.md, README). Class sizes are private:
# "auto" (the CLI's default) spends a small budget on noisy class counts and
# lets a public rule choose (dp_ops/adaptive/; docs/method.md, "Covariance
# defaults").
# "subspace" (shared + class subspace) exists only in the two-phase plan.
COVARIANCE_MODES = ("auto", "shared", "subspace", "per-class")

# Default share of the privacy budget (of mu^2, see calibration.py) per stage.
DEFAULT_WEIGHTS = {"centre": 0.01, "tree": 0.1, "lloyd": 0.15,
                   "moments": 0.3, "covariance": 0.45, "vote": 0.10}


# Largest delta accepted without --allow-large-delta. delta must be far below
# 1/n (a mechanism may fail completely with probability delta, e.g. release
# one record in the clear), but n is private and unknown before the data is
# read, so the rule is a public constant: 1e-4 is already 1/n for n = 10,000
# records; larger values are almost always a typo (0.5 for 1e-5) or a
# misunderstanding. After the run, the manifest still warns when delta > 1/n
# for the noisy record count.
MAX_DELTA = 1e-4

# Largest finite epsilon. Far above any epsilon that protects anyone, and
# the accountants' grids grow without bound past it (the demo at 1e6 took
# over 23 GB before it was killed; at 1e300 exp(epsilon) overflowed); a run
# without noise is asked for by name: --epsilon inf (marked NOT private).
MAX_EPSILON = 1000.0
# Bounds of the scale flags: squares and sums of rows at these scales stay
# finite floats (--clip-norm 1e300 ended in NaN; --variance-floor 1e300 wrote
# rows of NaN), and --vote-oversample 1e300 ran the vote search for ever.
CLIP_NORM_RANGE = (1e-100, 1e100)
MAX_VARIANCE_FLOOR = 1e6
MAX_VOTE_OVERSAMPLE = 1000.0
# Counts: --num-classes 1e20 overflowed building the label tuple, and
# --samples-per-class 1e20 ran out of memory listing its shards, both as
# tracebacks (the second after the data was read).
MAX_CLASSES = 100_000
MAX_SAMPLES_PER_CLASS = 10**9


def parse_epsilon(text: str) -> float:
    """An --epsilon flag: a number in (0, MAX_EPSILON], or 'inf' written as
    such (a finite number too large for a float is refused, not read as
    inf). ValueError in one line."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"not a number: {text!r}") from None
    if math.isinf(value) and str(text).strip().lower().lstrip("+") not in (
            "inf", "infinity"):
        raise ValueError(f"{text} is too large for a float; write 'inf' for "
                         "a release without noise (NOT private)")
    check_epsilon(value)
    return value


def check_epsilon(epsilon: float) -> float:
    """``epsilon`` if it is in (0, MAX_EPSILON] or inf; ValueError else."""
    if math.isnan(epsilon) or not epsilon > 0:
        raise ValueError(f"--epsilon must be > 0 (or inf), got {epsilon}")
    if math.isfinite(epsilon) and epsilon > MAX_EPSILON:
        raise ValueError(f"--epsilon must be at most {MAX_EPSILON:g} (or "
                         f"'inf' for no noise, NOT private), got {epsilon:g}")
    return epsilon


def check_delta(delta: float, allow_large: bool = False) -> float:
    """Returns `delta` if it is in (0, 1) and, unless `allow_large`, at most
    MAX_DELTA; raises ValueError naming --delta otherwise."""
    if not (0 < delta < 1):  # also rejects NaN
        raise ValueError(f"--delta must be in (0, 1), got {delta}")
    if delta > MAX_DELTA and not allow_large:
        raise ValueError(f"--delta {delta:g} is larger than {MAX_DELTA:g}: "
                         f"delta must be far below 1/n (1e-5 or smaller is "
                         f"usual); pass --allow-large-delta to run anyway")
    return delta


@dataclasses.dataclass(frozen=True)
class GeneratorConfig:
    labels: tuple[int, ...]
    epsilon: float = 4.0
    delta: float = 1e-5
    # One component per class measured best once the covariance has factors
    # (CIFAR-10 and the demo); k-means components help diagonal mixtures.
    clusters: int = 1
    # Clip radius of the centred rows (measured best 0.5-0.7 for unit-norm
    # embeddings on CIFAR-10: unaccounted tuning, see utility_study.md).
    clip_norm: float = 0.7
    normalize: str = "unit"
    center: bool = True  # subtract a DP global mean before clipping
    cluster_dim: int = 32
    tree_depth: int = 8
    branch_threshold: Optional[float] = None  # None: 3 x tree count sigma
    lloyd_rounds: int = 2
    samples_per_class: Optional[int] = None  # None: the noisy class count
    variance_floor: float = 1e-6  # as a fraction of clip_norm^2 / d
    covariance_rank: int = 128  # 0: diagonal clusters; r: + rank-r factors
    # factors from one "shared" or "per-class" matrix; "auto": the adaptive
    # plan (dp_ops/adaptive/), run by dpsynth.pipelines.cli.generate
    covariance: str = "shared"
    vote_filter: bool = False
    # None: the release is drawn from the candidates in proportion to the
    # noisy votes; a number: the legacy filter (keep candidates
    # with at least that many noisy votes; fewer rows as epsilon grows)
    vote_threshold: Optional[float] = None
    vote_oversample: float = 6.0
    # Share of the run's mu^2 spent on the vote in the adaptive plan (None:
    # adaptive.VOTE_SHARE)
    vote_share: Optional[float] = None
    vote_max_candidates: Optional[int] = None  # public cap on candidates per class
    budget_weights: Optional[dict] = None
    accountant: str = "pld"
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.labels:
            raise ValueError("--labels/--num-classes: at least one class label")
        if len(set(self.labels)) != len(self.labels):
            raise ValueError(f"--labels has duplicates: {list(self.labels)}")
        check_epsilon(self.epsilon)
        if not (0 < self.delta < 1):
            raise ValueError(f"--delta must be in (0, 1), got {self.delta}")
        low, high = CLIP_NORM_RANGE
        if not low <= self.clip_norm <= high:  # also NaN
            raise ValueError(f"--clip-norm must be finite and > 0, in "
                             f"[{low:g}, {high:g}], got {self.clip_norm}")
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
        if self.samples_per_class is not None and not (
                1 <= self.samples_per_class <= MAX_SAMPLES_PER_CLASS):
            raise ValueError(f"--samples-per-class must be in [1, "
                             f"{MAX_SAMPLES_PER_CLASS:.0e}], got "
                             f"{self.samples_per_class}")
        if self.vote_max_candidates is not None and self.vote_max_candidates < 1:
            raise ValueError(f"--vote-max-candidates must be >= 1, got {self.vote_max_candidates}")
        if not 1 <= self.vote_oversample <= MAX_VOTE_OVERSAMPLE:
            raise ValueError(f"--vote-oversample must be in [1, "
                             f"{MAX_VOTE_OVERSAMPLE:g}], got "
                             f"{self.vote_oversample}")
        if self.vote_share is not None and not 0 < self.vote_share < 1:
            raise ValueError(f"--vote-share must be in (0, 1), got "
                             f"{self.vote_share}")
        if self.branch_threshold is not None and not self.branch_threshold > 0:
            raise ValueError("--branch-threshold must be > 0")
        if self.covariance_rank < 0:
            raise ValueError(f"--covariance-rank must be >= 0, got {self.covariance_rank}")
        if self.covariance not in COVARIANCE_MODES:
            raise ValueError(f"--covariance must be one of {COVARIANCE_MODES}, "
                             f"got {self.covariance!r}")
        if not 0 < self.variance_floor <= MAX_VARIANCE_FLOOR:
            raise ValueError(f"--variance-floor must be in (0, "
                             f"{MAX_VARIANCE_FLOOR:g}], got "
                             f"{self.variance_floor}")
        if self.seed < 0:  # numpy's generators take none (a traceback
            # after the data was read)
            raise ValueError(f"--seed must be >= 0, got {self.seed}")
        for name, value in (("--vote-threshold", self.vote_threshold),
                            ("--branch-threshold", self.branch_threshold)):
            if value is not None and not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got "
                                 f"{value}")

    @property
    def stages(self) -> list[str]:
        stages = ["centre"] if self.center else []
        stages.append("moments")
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
    def centre_bound(self) -> float:
        """L2 bound of a row for the centre's sum: 1 after unit
        normalisation, else rows are clipped to ``clip_norm`` for it."""
        return 1.0 if self.normalize == "unit" else self.clip_norm

    @property
    def sample_radius(self) -> float:
        """Synthetic rows are projected onto this sphere (unit rows: 1)."""
        if self.normalize != "unit":
            return math.inf
        return 1.0 if self.center else min(1.0, self.clip_norm)

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
        if len(labels) > MAX_CLASSES:
            raise ValueError(f"--labels: at most {MAX_CLASSES} labels, got "
                             f"{len(labels)}")
        return tuple(int(v) for v in labels)
    if num_classes is None:
        raise ValueError("the set of labels is public configuration: pass "
                         "--num-classes N or --labels 0,1,...")
    if not 1 <= num_classes <= MAX_CLASSES:
        raise ValueError(f"--num-classes must be >= 1 and at most "
                         f"{MAX_CLASSES}, got {num_classes}")
    return tuple(range(num_classes))
