"""The adaptive plan's rule: phase 2's structure (``Structure``) as a
public function of (epsilon, delta, d, the noisy class counts) and the
constants of ``RuleConstants``; nothing in it reads private data. How the
constants were fitted: docs/method.md, "The rule's constants"."""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

import numpy as np

from dpsynth.dp_ops.calibration import gdp_mu
from dpsynth.dp_ops.config import GeneratorConfig


# Shares of mu^2 (each class, with the global mechanisms, sees all of them).
PHASE1 = {"centre": 0.0132, "count": 0.02}
CENTRE_SPLIT = {"sum": 0.8, "count": 0.2}  # inside the centre's share


MODES = ("shared", "subspace", "per-class")
# Post-processing of the per-class mode's released class matrices
# (``Structure.class_deviation``): "spiked" (what the rule picks) or "raw"
# (as released; every other mode). Study-only ones (all-class "spectral" and
# "shrunk", the subspace blocks' "spectral") live in
# benchmarks/studies/class_deviations.py.
CLASS_DEVIATIONS = ("raw", "spiked")


@dataclasses.dataclass(frozen=True)
class RuleConstants:
    """Public constants of the rule (see ``choose_structure``)."""

    # Mean-versus-covariance split (``sum_share_rule``).
    mean_weight: float = 2.2
    sum_min: float = 0.4
    sum_max: float = 0.75
    sum_levels: int = 6
    # The class modes' sum share: False: their own split (the floor, see
    # ``sum_share_rule``); True: the shared mode's split (class means as
    # precise as in the shared mode). Study option, no CLI flag.
    class_sum_as_shared: bool = False
    # Covariance structure (``choose_mode``) from the per-class signal
    # s = n_typ mu / d^signal_dim_power (``class_signal``), the typical
    # class size n_typ and the number of classes K: shared + class
    # subspace from subspace_min_signal, one d x d matrix per class from
    # per_class_min_signal (the mode only gets richer as s grows, so as
    # epsilon grows); a class mode also needs K >= class_modes_min_classes
    # and n_typ >= per_class_min_rows x its matrix's dimension (d, or the
    # subspace rank). Why these values: a class mode loses where the
    # classes share one covariance at low signal, and whether they do is
    # private, so each threshold sits where the richer mode was within
    # 0.5 points of the best on every measured shape (docs/method.md,
    # "The rule's constants").
    subspace_min_signal: float = 1.35
    per_class_min_signal: float = 5.5
    # Per-class matrices (post-processed "spiked", ``class_deviation``)
    # also below per_class_min_signal: from s = spiked_min_signal,
    # n_typ >= spiked_min_rows x d and mu >= spiked_min_mu (eps >= ~2.6 at
    # delta 1e-5). Why: spiked class matrices keep only the eigenvalues a
    # class's noise cannot have made, so they lose far less than raw ones
    # where the classes share one covariance; the mu gate keeps heavy
    # tails at low epsilon out (docs/method.md, "The rule's constants").
    spiked_min_signal: float = 0.08
    spiked_min_rows: float = 3.0
    spiked_min_mu: float = 0.6
    class_modes_min_classes: int = 2
    signal_dim_power: float = 1.5
    # n_typ >= 4 x the matrix's dimension: at eps = inf (s infinite) a
    # class matrix from fewer rows is a poor sample covariance.
    per_class_min_rows: float = 4.0
    subspace_dim_fraction: int = 6  # rank min(subspace_rank, d // 6)
    subspace_rank: int = 128
    subspace_share: float = 0.5  # of the covariance part of phase 2
    shared_rank: int = 128
    # Post-processing of the per-class mode's d x d class covariances C_c:
    # "spiked" (the default) replaces each noisy C_c by its spikes above
    # the noise edge and a flat bulk (``spiked_within``): within 0.5
    # points of "raw" where raw per-class matrices are picked, far ahead
    # in the spiked band. "raw" (each noisy C_c as it is) is a study
    # option, no CLI flag; so are the all-class post-processings measured
    # below the default ("spectral", "shrunk": benchmarks/studies/
    # class_deviations.py; docs/method.md, "The rule's constants").
    class_deviation: str = "spiked"
    # A fixed mode (one of MODES) instead of the rule's pick: studies and
    # ablations only (the sum share still follows ``sum_share_rule``).
    force_mode: Optional[str] = None

    def __post_init__(self) -> None:
        if self.class_deviation not in CLASS_DEVIATIONS:
            raise ValueError(f"class_deviation must be one of "
                             f"{CLASS_DEVIATIONS}, got "
                             f"{self.class_deviation!r}")
        if self.force_mode is not None and self.force_mode not in MODES:
            raise ValueError(f"force_mode must be one of {MODES} or None, "
                             f"got {self.force_mode!r}")

    def class_rank(self, d: int) -> int:
        return max(1, min(self.subspace_rank, d // self.subspace_dim_fraction))


@dataclasses.dataclass(frozen=True)
class Structure:
    """What phase 2 runs. Shares are of the total mu^2 (with PHASE1 they
    sum to 1).

    mode "shared": class sums + the global second moment; "subspace": also
    each class's r x r matrix in the shared top-r subspace (``class_rank``
    r); "per-class": class sums + each class's d x d second moment, no
    global matrix (``covariance_share`` 0).
    """

    mode: str
    sum_share: float
    covariance_share: float
    class_share: float
    class_rank: int
    shared_rank: int
    # (name, value) pairs: the rule's inputs (not part of the structure)
    inputs: tuple = dataclasses.field(default=(), compare=False)
    # Post-processing of the per-class mode's released class matrices
    # (CLASS_DEVIATIONS; "raw" in the other modes). No mechanism depends
    # on it: it only says how the released matrices become factors.
    class_deviation: str = "raw"

    def __post_init__(self) -> None:
        total = sum(PHASE1.values()) + self.sum_share + \
            self.covariance_share + self.class_share
        if abs(total - 1.0) > 1e-9:
            raise ValueError(f"structure shares sum to {total}, not 1")
        if self.mode not in MODES:
            raise ValueError(f"unknown structure mode {self.mode!r}")
        if (self.mode == "subspace") != (self.class_rank > 0):
            raise ValueError("a class rank goes with the subspace mode")
        if (self.mode == "shared") != (self.class_share == 0):
            raise ValueError("only the shared mode has no class matrices")
        if (self.mode == "per-class") != (self.covariance_share == 0):
            raise ValueError("only the per-class mode has no global matrix")
        if self.class_deviation not in CLASS_DEVIATIONS:
            raise ValueError(f"unknown class deviation "
                             f"{self.class_deviation!r}")
        if self.class_deviation != "raw" and self.mode != "per-class":
            raise ValueError("a class deviation goes with the per-class mode")

    @property
    def name(self) -> str:
        if self.mode == "subspace":
            return f"shared + per-class subspace (rank {self.class_rank})"
        if self.class_deviation != "raw":
            return f"{self.mode} ({self.class_deviation})"
        return self.mode

    def weights(self) -> dict[str, float]:
        out = {"centre": PHASE1["centre"], "count": PHASE1["count"],
               "moments": self.sum_share}
        if self.covariance_share:
            out["covariance"] = self.covariance_share
        if self.class_share:
            out["class-covariance"] = self.class_share
        return out

    def to_manifest(self) -> dict:
        return {"structure": self.name, "mode": self.mode,
                "shares_of_mu2": self.weights(),
                "class_subspace_rank": self.class_rank,
                "class_matrices": self.class_deviation,
                "shared_rank": self.shared_rank,
                "rule_inputs": dict(self.inputs)}


# ------------------------------------------------------------------ rule

def typical_count(noisy_counts: Sequence[float]) -> float:
    """A robust class size from the DP counts: the lower quartile
    (small classes decide whether per-class matrices are affordable)."""
    return max(float(np.quantile(np.maximum(noisy_counts, 1.0), 0.25)), 1.0)


def class_signal(n_typ: float, mu: float, d: int,
                 k: Optional[RuleConstants] = None) -> float:
    """s = n_typ * mu / d^p (p = ``signal_dim_power``; public: the counts
    are DP). A class matrix's spectrum-edge noise is ~ sqrt(2 d) R^2 /
    (n_c mu_matrix); relative to the average eigenvalue R^2 / d that is
    d^1.5 / (n_c mu_matrix), so with p = 1.5 s is the inverse of the
    class matrix's noise-to-signal ratio up to its budget share."""
    p = (k or RuleConstants()).signal_dim_power
    return n_typ * mu / d ** p if math.isfinite(mu) else math.inf


def sum_share_rule(d: int, noisy_counts: Sequence[float],
                   k: RuleConstants, mode: str = "shared") -> float:
    """Phase-2 fraction for the class sums.

    A class mean's noise norm relative to the clip radius is
    sqrt(d) / (n_c mu_sum); a covariance matrix's noise edge relative to
    its average eigenvalue R^2 / d is ~ d^1.5 / (n mu_cov), n the rows it
    sums (N for the shared matrix, n_typ for a class's). Minimising
    w A / mu_sum^2 + B / mu_cov^2 at fixed mu_sum^2 + mu_cov^2 gives
    mu_sum^2 : mu_cov^2 = sqrt(w A) : sqrt(B); in these units the ratio is
    w' sqrt(d) / n_typ : d / n with ``mean_weight`` w' (how much more a
    unit of mean noise costs the classifier; 2.2 keeps CIFAR-10's shared
    split at the measured 0.38). With class matrices (n = n_typ) the
    ratio is w' : sqrt(d), i.e. the floor. Clipped to [sum_min,
    sum_max] and snapped to a grid of ``sum_levels`` values (a finite
    menu).
    """
    n_typ = typical_count(noisy_counts)
    total = max(float(np.sum(np.maximum(noisy_counts, 1.0))), 1.0)
    a = k.mean_weight * math.sqrt(d) / n_typ
    shared_split = mode == "shared" or k.class_sum_as_shared
    b = d / (total if shared_split else n_typ)
    share = float(np.clip(a / (a + b), k.sum_min, k.sum_max))
    grid = sum_grid(k)
    return float(grid[np.argmin(np.abs(grid - share))])


def sum_grid(k: RuleConstants) -> np.ndarray:
    return np.linspace(k.sum_min, k.sum_max, k.sum_levels)


def make_structure(mode: str, sum_fraction: float, d: int,
                   k: RuleConstants, inputs: tuple = (),
                   class_deviation: str = "raw") -> Structure:
    """Shares of one structure: the sums get ``sum_fraction`` of phase 2,
    the covariance the rest (split between global and class matrices in
    the subspace mode, all to the class matrices in the per-class mode).
    ``class_deviation``: the per-class mode's post-processing."""
    phase2 = 1.0 - sum(PHASE1.values())
    s = sum_fraction * phase2
    cov = phase2 - s
    shared_rank = min(k.shared_rank, d)
    if mode == "shared":
        return Structure(mode, s, cov, 0.0, 0, shared_rank, inputs,
                         class_deviation)
    if mode == "per-class":
        return Structure(mode, s, 0.0, cov, 0, shared_rank, inputs,
                         class_deviation)
    cls = cov * k.subspace_share
    return Structure(mode, s, cov - cls, cls, k.class_rank(d), shared_rank,
                     inputs, class_deviation)


def choose_mode(signal: float, classes: int, k: RuleConstants,
                n_typ: float = math.inf, d: int = 1) -> str:
    """The covariance mode: richer only where the per-class signal (which
    grows with epsilon) passes the mode's threshold and the typical class
    has enough rows for the mode's matrix (``RuleConstants``). For fixed
    counts the mode never gets poorer as epsilon grows: shared, then
    subspace, then per-class."""
    if k.force_mode is not None:
        return k.force_mode
    if classes < k.class_modes_min_classes:
        return "shared"
    if (signal >= k.per_class_min_signal
            and n_typ >= k.per_class_min_rows * d):
        return "per-class"
    if (signal >= k.subspace_min_signal
            and n_typ >= k.per_class_min_rows * k.class_rank(d)):
        return "subspace"
    return "shared"


def spiked_band(signal: float, classes: int, k: RuleConstants,
                n_typ: float, d: int, mu: float) -> bool:
    """Whether per-class matrices with the "spiked" post-processing replace
    a poorer pick of ``choose_mode`` (``RuleConstants.spiked_min_signal``):
    K >= 2, s >= 0.08, n_typ >= 3 d and mu >= 0.6. Every input grows with
    epsilon or is fixed, so once in the band a larger epsilon stays in it
    (or passes to raw per-class matrices)."""
    return (k.force_mode is None and classes >= k.class_modes_min_classes
            and signal >= k.spiked_min_signal
            and n_typ >= k.spiked_min_rows * d and mu >= k.spiked_min_mu)


def choose_structure(epsilon: float, delta: float, d: int,
                     noisy_counts: Sequence[float],
                     constants: Optional[RuleConstants] = None,
                     mu: Optional[float] = None,
                     mode: Optional[str] = None) -> Structure:
    """The public rule: phase 2's structure from (epsilon, delta, d, the
    noisy counts). ``mu`` (the calibrated GDP parameter of (epsilon,
    delta)) may be passed to avoid recomputing it.

    1. n_typ = lower quartile of the noisy counts; K = number of classes;
       s = n_typ mu / d^1.5 (``class_signal``: the inverse of a class
       matrix's noise-to-signal ratio).
    2. mode (``choose_mode``): "shared" if K < 2; else "per-class" if
       s >= 5.5 and n_typ >= 4 d; else "subspace" (rank r = min(128,
       d // 6)) if s >= 1.35 and n_typ >= 4 r; else "shared".
    3. Where step 2 did not pick "per-class": "per-class" if s >= 0.08,
       n_typ >= 3 d and mu >= 0.6 (``spiked_band``). s and mu grow with
       epsilon, so for fixed counts the mode never gets poorer as epsilon
       grows: shared, subspace, per-class. The per-class mode's class
       matrices are post-processed "spiked" (``spiked_within``).
    4. The sums get ``sum_share_rule`` of phase 2 (for the mode), the
       covariance the rest (``make_structure``).

    ``mode`` (``--covariance shared|subspace|per-class`` in this plan):
    the user's structure instead of steps 2-3; step 4 as for the rule.
    """
    k = constants or RuleConstants()
    if mu is None:  # as calibrate_mu: no noise at all at eps = inf
        mu = math.inf if math.isinf(epsilon) else gdp_mu(epsilon, delta)
    n_typ = typical_count(noisy_counts)
    signal = class_signal(n_typ, mu, d, k)
    if mode is None:
        mode = choose_mode(signal, len(noisy_counts), k, n_typ, d)
        if mode != "per-class" and spiked_band(signal, len(noisy_counts), k,
                                               n_typ, d, mu):
            mode = "per-class"
    deviation = k.class_deviation if mode == "per-class" else "raw"
    inputs = (("epsilon", epsilon), ("delta", delta), ("d", d),
              ("noisy_counts", [float(c) for c in noisy_counts]),
              ("typical_count", n_typ), ("mu", mu), ("signal", signal))
    return make_structure(mode, sum_share_rule(d, noisy_counts, k, mode), d,
                          k, inputs, deviation)


def menu(d: int, constants: Optional[RuleConstants] = None
         ) -> list[Structure]:
    """Every structure the rule can return for dimension d (each mode,
    each sum share of the grid), without the rule's inputs. All have the
    same total mu^2, so the GDP guarantee is identical; ``calibrate_mu``
    certifies each with dp_accounting (its discretisation differs with
    the mechanism list)."""
    k = constants or RuleConstants()
    return [make_structure(mode, frac, d, k, class_deviation=(
        k.class_deviation if mode == "per-class" else "raw"))
            for frac in sum_grid(k) for mode in MODES]


# ------------------------------------------------- when the plan runs

# --covariance values planned in two phases: "auto" (the rule picks the
# structure) and "subspace" (the structure is fixed, the rest as "auto").
TWO_PHASE = ("auto", "subspace")


def two_phase(cfg: GeneratorConfig) -> bool:
    """Whether the run is planned here rather than by ``plan.make_ledger``."""
    return cfg.covariance in TWO_PHASE


def applies(cfg: GeneratorConfig) -> bool:
    """Whether ``--covariance auto`` (or ``subspace``) runs the adaptive
    plan: one Gaussian per class with factors, the DP centre, the plan's
    own budget shares (a public function of the configuration; with
    ``--vote-filter`` the vote takes ``vote_share`` of them). Otherwise
    "auto" means the fixed "shared" plan, and "subspace" is refused."""
    return (two_phase(cfg) and cfg.clusters == 1
            and cfg.covariance_rank > 0 and cfg.center
            and cfg.budget_weights is None)


def constants_for(cfg: GeneratorConfig) -> RuleConstants:
    """The rule's constants with the factor rank of ``--covariance-rank``."""
    return RuleConstants(shared_rank=cfg.covariance_rank)
