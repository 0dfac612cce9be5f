"""Adaptive two-phase generator plan (issue 13): pure functions.

Why adaptive: no fixed covariance model wins on every dataset. A per-class
covariance pays off for large classes at moderate epsilon and loses on
small ones; the split of the budget between class means and covariance
should follow how noisy each is. Class sizes are private, so the plan
spends a small first budget on noisy class counts and derives everything
else from public inputs and those DP counts.

Phase 1 (read with the DP centre, one pass): per class, the noisy row count
(``class=<c>/count``, sensitivity 1); globally the DP centre
(``global/centre/sum``, sensitivity B = 1 for unit rows, and
``global/centre/count``, sensitivity 1). Its share of the budget is fixed.

Rule (``choose_structure``): a documented, public function of (epsilon,
delta, d, the noisy counts) and this module's constants; it fixes the
structure of phase 2 (see ``Structure``). Nothing in it reads private data.

Phase 2 (one pass over the centred, clipped rows given the structure):
exact per-class sums and per-class d x d second moments (the shared second
moment is their sum, computed before any noise). Mechanisms, all Gaussian,
add/remove one record, clip radius R, by mode (``Structure``):

- every mode: ``class=<c>/moments/sum``, the sum of the class's clipped
  rows, sensitivity R.
- "shared" and "subspace": ``global/covariance/second-moment``,
  sum_i x_i x_i^T over all rows, released as its isometric upper triangle
  (covariance.upper), sensitivity ||x x^T||_F = ||x||^2 <= R^2.
- "subspace" (rank r): ``class=<c>/covariance/subspace``,
  P^T (sum_{i in c} x_i x_i^T) P for the [d, r] orthonormal basis P of the
  top-r eigenvectors of the *noisy* shared within-class covariance
  (post-processing of the previous mechanism, so P is public by then);
  sensitivity ||P^T x||^2 <= ||x||^2 <= R^2 (isometric upper triangle).
- "per-class": ``class=<c>/covariance/second-moment``, the class's d x d
  second moment (isometric upper triangle), sensitivity R^2, and no
  global matrix (the issue-8 ``--covariance per-class`` mechanism).

Accounting: every mechanism is Gaussian, so one class (with the global
mechanisms) is mu-GDP with mu^2 = sum 1/z_i^2. Phase 1 takes the fixed
share PHASE1 of mu^2; phase 2 gets the rest, whatever the rule picks
(fully adaptive composition of Gaussian mechanisms with a fixed total
mu^2 is mu-GDP: Smith & Thakurta 2022, "Fully adaptive composition for
Gaussian differential privacy"). ``calibrate_mu`` additionally certifies
with dp_accounting that EVERY structure the rule can return (``menu``)
meets (epsilon, delta), shrinking mu until all do; the ledger lists
exactly the mechanisms that ran (phase 1 + the chosen phase 2).

Post-processing (free): class means from noisy sums and counts; the shared
within-class covariance W from the global matrix; in the subspace mode,
per class, the top-r block of W is replaced by the class's own DP block
(a hierarchy: per-class inside the subspace, shared outside), repaired to
be positive semi-definite; in the per-class mode each class's factors come
from its own matrix (as released, "spiked", or, opt-in, "shrunk": mixed
with the pooled matrix by a James-Stein weight computed from the released
matrices, the noisy counts and the ledger's sigma, ``shrinkage_weights``). Every class is released as factors [d, r'] + a
diagonal, so sampling stays two matrix products.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Iterable, Iterator, Optional, Sequence

import numpy as np

from dpsynth.dp_ops import clipping, covariance, generator, kmeans, moments, plan
from dpsynth.dp_ops.calibration import Slot, _mechanisms, gdp_mu, shrink_mu
from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.dp_ops.ledger import GLOBAL, Mechanism, PrivacyLedger, compose_epsilon

# Shares of mu^2 (each class, with the global mechanisms, sees all of them).
PHASE1 = {"centre": 0.0132, "count": 0.02}
CENTRE_SPLIT = {"sum": 0.8, "count": 0.2}  # inside the centre's share


MODES = ("shared", "subspace", "per-class")
DEVIATIONS = ("raw", "spectral")
CLASS_DEVIATIONS = DEVIATIONS + ("spiked", "shrunk")


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
    # precise as in the shared mode).
    class_sum_as_shared: bool = False
    # Covariance structure (``choose_mode``) from the per-class signal
    # s = n_typ mu / d^signal_dim_power (``class_signal``), the typical
    # class size n_typ and the number of classes K: shared + class
    # subspace from subspace_min_signal, one d x d matrix per class from
    # per_class_min_signal (the mode only gets richer as s grows, so as
    # epsilon grows); a class mode also needs K >= class_modes_min_classes
    # and n_typ >= per_class_min_rows x its matrix's dimension (d, or the
    # subspace rank). Fit on the issue-30 sweep
    # (benchmarks/studies/covariance_sweep.py, 28 shapes x 4 epsilons):
    # a class mode loses up to 10 (subspace) and 50 (per-class) points
    # where the classes share one covariance and its signal is low, and
    # whether they do is private, so the thresholds sit where the sweep
    # measured the richer mode within 0.5 points of the best on EVERY
    # shape: subspace from s = 1.35 (the sweep's nearest cells: 1.23
    # loses 0.95, 1.45 is within 0.4), per-class from 5.5 (5.2 loses 1.4,
    # 5.75 wins 1.3). The old s = n_typ mu / sqrt(d) >= 25 / 50 picked
    # per-class at 1,000-row classes, d = 384, eps = 8 (issue 30).
    subspace_min_signal: float = 1.35
    per_class_min_signal: float = 5.5
    # Per-class matrices (post-processed "spiked", ``class_deviation``)
    # also below per_class_min_signal (issue 53, fit on the real sets
    # first): from s = spiked_min_signal, n_typ >= spiked_min_rows x d and
    # mu >= spiked_min_mu (eps >= ~2.6 at delta 1e-5). Spiked class
    # matrices keep only the eigenvalues a class's noise cannot have made,
    # so where the classes share one covariance they lose far less than
    # raw ones, and where each class has its own they win. Measured on
    # the issue-30 sweep and the real sets (3 seeds, validation splits,
    # benchmarks/results/studies/covariance_rule_issue53.md): full
    # CIFAR-10 at eps 4 / 8 gains 0.8 / 1.7 points over the shared mode
    # (0.8 / 0.4 below raw per-class matrices); the sweep's largest gap
    # stays 7.29 (k6-n1500-d1280-own, outside the band). Without the mu
    # gate the band lost up to 11 points (k8-n2000-d256-t, heavy tails,
    # at eps 1).
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
    # Post-processing of a class's subspace block: "raw" keeps the noisy
    # estimate; "spectral" shrinks its deviation from the shared block by
    # the noise edge (spike_shrink). Raw measured better (the noise
    # regularises the downstream classifier).
    deviation: str = "raw"
    # Post-processing of the per-class mode's d x d class covariances C_c:
    # "raw" uses each noisy C_c as it is; "spectral" replaces it by
    # pooled + spike_shrink(C_c - pooled) at the class matrix's noise edge
    # (``shrink_class_deviations``; pooled = the count-weighted mean of
    # the noisy C_c), so class-specific noise patterns do not make the
    # classes separable by their covariances (issue 13, MLP transfer);
    # "spiked" replaces each noisy C_c by its spikes above the noise edge
    # and a flat bulk (``spiked_within``; issue 30: up to 15 points better
    # where classes have their own covariances, up to 18 worse where they
    # share one, which is private; benchmarks/results/studies/
    # covariance_sweep.md). Spiked is the default since issue 53: with
    # the rule's pick it is within 0.5 points of raw where raw is picked
    # (s >= 5.5) and far ahead in the spiked band; "raw" and "spectral"
    # are study options. "shrunk" (issue 61, opt-in): each C_c becomes
    # lambda_c pooled + (1 - lambda_c) C_c with a James-Stein weight
    # lambda_c from the released matrices and the ledger's sigma
    # (``shrinkage_weights``); measured below the best menu structure on
    # every real set and epsilon (results/studies/shrunk_issue61.md).
    class_deviation: str = "spiked"
    # A fixed mode (one of MODES) instead of the rule's pick: studies and
    # ablations only (the sum share still follows ``sum_share_rule``).
    force_mode: Optional[str] = None

    def __post_init__(self) -> None:
        for field, allowed in (("deviation", DEVIATIONS),
                               ("class_deviation", CLASS_DEVIATIONS)):
            if getattr(self, field) not in allowed:
                raise ValueError(f"{field} must be one of {allowed}, "
                                 f"got {getattr(self, field)!r}")
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
                     mu: Optional[float] = None) -> Structure:
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
    """
    k = constants or RuleConstants()
    if mu is None:  # as calibrate_mu: no noise at all at eps = inf
        mu = math.inf if math.isinf(epsilon) else gdp_mu(epsilon, delta)
    n_typ = typical_count(noisy_counts)
    signal = class_signal(n_typ, mu, d, k)
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


# ------------------------------------------------------------ mechanisms

def count_name(label: int) -> str:
    return plan.name(label, "count")


def sum_name(label: int) -> str:
    return plan.name(label, "moments", "sum")


def class_matrix_name(label: int) -> str:
    return plan.name(label, "covariance", "subspace")


def phase1_slots(cfg: GeneratorConfig) -> list[Slot]:
    """Centre (global) and class counts. Sensitivities: the centre's sum of
    rows clipped to B = cfg.centre_bound: B; every count: 1."""
    slots = [Slot(plan.CENTRE_SUM, "centre", GLOBAL, cfg.centre_bound,
                  share=CENTRE_SPLIT["sum"]),
             Slot(plan.CENTRE_COUNT, "centre", GLOBAL, 1.0,
                  share=CENTRE_SPLIT["count"])]
    slots += [Slot(count_name(c), "count", plan.partition(c), 1.0)
              for c in cfg.labels]
    return slots


def phase2_slots(cfg: GeneratorConfig, s: Structure) -> list[Slot]:
    """Sums (R); the shared second moment (R^2) unless per-class; with a
    class subspace each class's r x r projected second moment (R^2); in
    the per-class mode each class's d x d second moment (R^2)."""
    r = cfg.clip_norm
    slots = [Slot(sum_name(c), "moments", plan.partition(c), r)
             for c in cfg.labels]
    if s.covariance_share:
        slots.append(Slot(plan.COVARIANCE, "covariance", GLOBAL, r * r))
    if s.mode == "subspace":
        slots += [Slot(class_matrix_name(c), "class-covariance",
                       plan.partition(c), r * r) for c in cfg.labels]
    if s.mode == "per-class":
        slots += [Slot(plan.class_covariance(c), "class-covariance",
                       plan.partition(c), r * r) for c in cfg.labels]
    return slots


def vote_share(cfg: GeneratorConfig) -> float:
    """Share of the run's per-class mu^2 spent on the vote (0 without
    ``--vote-filter``): ``--vote-share``, or VOTE_SHARE."""
    if not cfg.vote_filter:
        return 0.0
    return VOTE_SHARE if cfg.vote_share is None else cfg.vote_share


# The default share of mu^2 for the vote: on validation splits of the 20
# Newsgroups train file (benchmarks/vote_resample.py, issue 74) every share
# tried (0.05-0.3, x 1/2/6 candidates per row) scored at or below the
# plain release at epsilon 1-8 on average, the smallest share with 6
# candidates per row the closest (-0.01 points). With 6 candidates per row
# even noiseless votes were neutral for the probe, so the vote's cost is
# its share, taken from the mixture: keep it small.
VOTE_SHARE = 0.05


def vote_slots(cfg: GeneratorConfig) -> list[Slot]:
    """The vote: each class's histogram of nearest candidates (one bin per
    candidate, dense). Add/remove one record changes one bin of its class
    by 1: L2 sensitivity 1."""
    return [Slot(plan.name(c, "vote", "histogram"), "vote",
                 plan.partition(c), 1.0) for c in cfg.labels]


def vote_mu(cfg: GeneratorConfig, mu: float) -> float:
    """The vote's per-class mu beside a plan of per-class ``mu``: the plan
    keeps 1 - v of the total mu^2 and the vote v (mu_vote^2 = mu^2 v /
    (1 - v))."""
    v = vote_share(cfg)
    return mu * math.sqrt(v / (1 - v)) if v else 0.0


def vote_mechanisms(cfg: GeneratorConfig, mu: float) -> list[Mechanism]:
    if not cfg.vote_filter:
        return []
    return _mechanisms(vote_slots(cfg), {"vote": 1.0}, vote_mu(cfg, mu))


def mechanisms(cfg: GeneratorConfig, s: Structure, mu: float
               ) -> list[Mechanism]:
    """Phase 1 + phase 2 mechanisms with sigmas for a per-class mu (and
    the vote's, with ``--vote-filter``)."""
    return (_mechanisms(phase1_slots(cfg) + phase2_slots(cfg, s),
                        s.weights(), mu) + vote_mechanisms(cfg, mu))


def _worst_epsilon(mechs: Sequence[Mechanism], delta: float,
                   accountant: str) -> float:
    """Max over classes of the epsilon of (class + global) mechanisms."""
    parts = ({m.partition for m in mechs} - {GLOBAL}) or {GLOBAL}
    signatures = {tuple(sorted((m.noise_multiplier, m.count,
                                m.sampling_probability) for m in mechs
                               if m.partition in (p, GLOBAL)))
                  for p in parts}
    return max(_composed_epsilon(sig, delta, accountant)
               for sig in signatures)


@functools.lru_cache(maxsize=4096)
def _composed_epsilon(signature: tuple, delta: float,
                      accountant: str) -> float:
    """dp_accounting's epsilon of Gaussian mechanisms given as (noise
    multiplier, count, sampling rate); cached: a composition costs ~1 s."""
    mechs = [Mechanism(f"m{i}", "any", "p", 1.0, z, count=c,
                       sampling_probability=q)
             for i, (z, c, q) in enumerate(signature)]
    return compose_epsilon(mechs, delta, accountant)


def calibrate_mu(cfg: GeneratorConfig, d: int,
                 constants: Optional[RuleConstants] = None) -> float:
    """Largest per-class mu (GDP) such that dp_accounting certifies
    (epsilon, delta) for every structure in ``menu`` (phase 1 + phase 2)."""
    if math.isinf(cfg.epsilon):
        return math.inf
    # the plan's part of the total (the vote's mechanisms are in the check)
    mu = gdp_mu(cfg.epsilon, cfg.delta) * math.sqrt(1 - vote_share(cfg))
    todo = menu(d, constants)
    for _ in range(80):
        # Shrink on the first failing structure only, then re-check all
        # (each check is one dp_accounting composition).
        failing = None
        for s in todo:
            spent = _worst_epsilon(mechanisms(cfg, s, mu), cfg.delta,
                                   cfg.accountant)
            if spent > cfg.epsilon:
                failing = s
                break
        if failing is None:
            return mu
        todo = [failing] + [s for s in todo if s is not failing]
        mu = shrink_mu(mu, spent, cfg.epsilon)
    raise ValueError("adaptive calibration did not converge")


def phase1_ledger(cfg: GeneratorConfig, mu: float) -> PrivacyLedger:
    """Ledger holding the phase-1 mechanisms (sigmas fixed by mu)."""
    ledger = PrivacyLedger(cfg.epsilon, cfg.delta, cfg.accountant)
    weights = {"centre": PHASE1["centre"], "count": PHASE1["count"]}
    for m in _mechanisms(phase1_slots(cfg), weights, mu):
        ledger.register(m)
    return ledger


def add_phase2(ledger: PrivacyLedger, cfg: GeneratorConfig, s: Structure,
               mu: float) -> PrivacyLedger:
    """Registers the chosen structure's phase-2 mechanisms."""
    slots = phase2_slots(cfg, s)
    weights = {k: v for k, v in s.weights().items()
               if k not in ("centre", "count")}
    # _mechanisms splits a stage's weight among its slots per partition;
    # phase-1 stages are not in these slots, so pass only phase-2 weights.
    for m in _mechanisms(slots, weights, mu) + vote_mechanisms(cfg, mu):
        ledger.register(m)
    if not math.isinf(cfg.epsilon):
        spent = _worst_epsilon(ledger.mechanisms, cfg.delta, cfg.accountant)
        if spent > cfg.epsilon * (1 + 1e-9):
            raise AssertionError(f"adaptive plan overspends: {spent}")
    return ledger


# ------------------------------------------------------ post-processing

def class_means(noisy_sums: np.ndarray, noisy_counts: np.ndarray,
                clip_norm: float) -> tuple[np.ndarray, np.ndarray]:
    """(counts >= 1, means in the clip ball) from the DP sums and counts."""
    n = np.maximum(np.asarray(noisy_counts, float), 1.0)
    means = noisy_sums / n[:, None]
    norms = np.linalg.norm(means, axis=1, keepdims=True)
    return n, means * np.minimum(1.0, clip_norm / np.maximum(norms, 1e-300))


def shared_within(noisy_m: np.ndarray, n: np.ndarray,
                  means: np.ndarray) -> np.ndarray:
    """Pooled within-class covariance (M - sum_c n_c mu_c mu_c^T) / N."""
    between = (means * n[:, None]).T @ means
    w = (noisy_m - between) / n.sum()
    return (w + w.T) / 2


def eigen(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenpairs, largest first."""
    vals, vecs = np.linalg.eigh((matrix + matrix.T) / 2)
    order = np.argsort(vals)[::-1]
    return vals[order], vecs[:, order]


@dataclasses.dataclass
class SharedModel:
    """W's top eigenvalues, its top ``rank_in`` eigenvectors (the class
    subspace) and its parts outside the class subspace."""

    vals: np.ndarray
    vecs: np.ndarray  # [d, rank_in]
    outside_factors: np.ndarray  # [d, r_out]
    residual: np.ndarray         # [d] diagonal
    rank_in: int

    @property
    def basis(self) -> np.ndarray:
        return self.vecs[:, :self.rank_in]


def shared_model(w: np.ndarray, rank_in: int, shared_rank: int,
                 floor: float) -> SharedModel:
    """W = (top rank_in block) + (components rank_in..shared_rank as
    factors) + diagonal residual max(diag(W) - diag(factors), floor)."""
    vals, vecs = eigen(w)
    idx = np.arange(rank_in, max(shared_rank, rank_in))
    idx = idx[vals[idx] > 0]
    f_out = vecs[:, idx] * np.sqrt(vals[idx])
    inside = (vecs[:, :rank_in] ** 2) @ np.maximum(vals[:rank_in], 0)
    resid = np.maximum(np.diag(w) - inside - (f_out ** 2).sum(1), floor)
    # keep only what sampling needs: it travels as a side input
    keep = max(rank_in, shared_rank)
    return SharedModel(vals[:keep], vecs[:, :rank_in].copy(), f_out, resid,
                       rank_in)


def class_factors(shared: SharedModel, class_block: Optional[np.ndarray]
                  ) -> np.ndarray:
    """Factors [d, rank_in + r_out] of one class: inside the subspace the
    class's block (the shared block if None), PSD-repaired by clipping
    negative eigenvalues; outside, the shared factors."""
    r = shared.rank_in
    if r == 0:
        return shared.outside_factors
    block = (np.diag(shared.vals[:r]) if class_block is None
             else (class_block + class_block.T) / 2)
    bv, bu = np.linalg.eigh(block)
    f_in = shared.basis @ (bu * np.sqrt(np.maximum(bv, 0.0)))
    return np.hstack([f_in, shared.outside_factors])


def spike_shrink(vals: np.ndarray, edge: float) -> np.ndarray:
    """Eigenvalues of (signal + symmetric Gaussian noise with spectrum
    edge ``edge``): an outlier lambda > edge comes from a spike theta =
    (lambda + sqrt(lambda^2 - edge^2)) / 2 (rank-one perturbation of a
    Wigner matrix); bulk eigenvalues carry no detectable signal: 0."""
    a = np.abs(vals)
    theta = np.where(a > edge,
                     (a + np.sqrt(np.maximum(a * a - edge * edge, 0))) / 2, 0)
    return np.sign(vals) * theta


def noise_edge(sigma: float, n: float, dim: int) -> float:
    """Spectrum edge of (isometric-upper Gaussian noise of std sigma) / n
    on a dim x dim matrix: off-diagonal std sigma / sqrt(2) / n, edge
    2 sqrt(dim) times that."""
    return math.sqrt(2.0 * dim) * sigma / max(n, 1.0)


def shrink_deviation(block: np.ndarray, shared_block: np.ndarray,
                     edge: float) -> np.ndarray:
    """shared + spectrally shrunk (block - shared) (the "spectral" option)."""
    dv, du = np.linalg.eigh((block - shared_block + (block - shared_block).T)
                            / 2)
    return shared_block + (du * spike_shrink(dv, edge)) @ du.T


def class_block(noisy_projected: np.ndarray, n_c: float,
                mean_c: np.ndarray, basis: np.ndarray) -> np.ndarray:
    """The class's own covariance inside the subspace: P^T M_c P / n_c -
    (P^T mu_c)(P^T mu_c)^T (a raw, noisy estimate; the noise is kept: it
    was measured to regularise the downstream classifier, see
    benchmarks/results/studies/utility_study-issue13.md)."""
    m = basis.T @ mean_c
    return noisy_projected / n_c - np.outer(m, m)


# ------------------------------------- mechanisms on exact aggregates
# Shared by the in-memory reference and the Beam job (transforms/adaptive.py):
# each takes exact aggregates, adds its ledger mechanisms' keyed noise
# exactly (generator.add_noise: the aggregates lie on public grids) and
# returns DP outputs only.

def applies(cfg: GeneratorConfig) -> bool:
    """Whether ``--covariance auto`` runs the adaptive plan: one Gaussian
    per class with factors, the DP centre, the plan's own budget shares
    (a public function of the configuration; with ``--vote-filter`` the
    vote takes ``vote_share`` of them). Otherwise "auto" means the
    fixed "shared" plan."""
    return (cfg.covariance == "auto" and cfg.clusters == 1
            and cfg.covariance_rank > 0 and cfg.center
            and cfg.budget_weights is None)


def constants_for(cfg: GeneratorConfig) -> RuleConstants:
    """The rule's constants with the factor rank of ``--covariance-rank``."""
    return RuleConstants(shared_rank=cfg.covariance_rank)


def reserved_mechanisms(cfg: GeneratorConfig, mu: float,
                        constants: Optional[RuleConstants] = None
                        ) -> list[Mechanism]:
    """What the lifetime budget store is charged before any data is read:
    phase 1 + the menu structure that dp_accounting finds most expensive.
    Data-independent (a retry reserves the same list). Every structure has
    the same per-class mu^2, so under GDP they all cost the same; this
    takes the accountant's worst case."""
    worst, spent = None, -1.0
    for s in menu(1, constants):  # the mechanism list does not depend on d
        mechs = mechanisms(cfg, s, mu)
        eps = (0.0 if math.isinf(mu) else
               _worst_epsilon(mechs, cfg.delta, cfg.accountant))
        if eps > spent:
            worst, spent = mechs, eps
    return worst


def exact_class_counts(y: np.ndarray, labels: Sequence[int]) -> np.ndarray:
    """Rows per configured label (float, exact integers)."""
    return np.array([float(np.sum(y == c)) for c in labels])


def noisy_counts(exact: np.ndarray, labels: Sequence[int],
                 ledger: PrivacyLedger, noise) -> np.ndarray:
    """Phase 1's class counts. Mechanism ``class=<c>/count``: the number
    of rows of class c, L2 sensitivity 1 under add/remove one record (the
    record is in one class; classes compose in parallel)."""
    return np.array([generator.add_noise(ledger, noise, count_name(c),
                                         np.array([exact[i]]))[0]
                     for i, c in enumerate(labels)])


def block_class_sum(x: np.ndarray, clip_norm: float) -> np.ndarray:
    """Exact sum of a class's clipped rows on the sums' grid (truncation
    towards zero keeps every row's norm <= R: sensitivity R)."""
    return moments.quantize(x, clip_norm).sum(axis=0)


def noisy_class_sums(exact: np.ndarray, labels: Sequence[int],
                     ledger: PrivacyLedger, noise) -> np.ndarray:
    """Mechanism ``class=<c>/moments/sum``: the sum of class c's centred
    rows clipped to R, L2 sensitivity R (add/remove one record)."""
    return np.stack([generator.add_noise(ledger, noise, sum_name(c),
                                         exact[i])
                     for i, c in enumerate(labels)])


@kmeans.one_blas_thread
def shared_stage(exact_m: np.ndarray, n: np.ndarray, means: np.ndarray,
                 structure: Structure, cfg: GeneratorConfig,
                 ledger: PrivacyLedger, noise) -> SharedModel:
    """Mechanism ``global/covariance/second-moment`` (sum_i x_i x_i^T of
    all clipped rows, isometric upper triangle, sensitivity R^2), then
    W and its split inside / outside the class subspace (post-processing)."""
    noisy_m = generator.noisy_second_moment(exact_m, ledger, noise,
                                            plan.COVARIANCE)
    w = shared_within(noisy_m, n, means)
    return shared_model(w, structure.class_rank, structure.shared_rank,
                        variance_floor(cfg, means.shape[1]))


def variance_floor(cfg: GeneratorConfig, d: int) -> float:
    return cfg.variance_floor * cfg.clip_norm ** 2 / d


def projected_block_moment(x: np.ndarray, basis: np.ndarray,
                           clip_norm: float) -> np.ndarray:
    """Exact sum_i z_i z_i^T [r, r] of one block, z_i = P^T x_i clipped to
    R (guards against rounding above ||x_i|| <= R) and truncated onto the
    second moment's grid, so the sum is exact and order-independent."""
    z, _ = clipping.clip_rows(x @ basis, clip_norm)
    zq = moments.quantize(z, clip_norm, covariance.COV_GRID_BITS)
    return zq.T @ zq


@kmeans.one_blas_thread
def noisy_class_block(exact_proj: np.ndarray, label: int, n_c: float,
                      mean_c: np.ndarray, shared: SharedModel,
                      ledger: PrivacyLedger, noise,
                      deviation: str = "raw") -> np.ndarray:
    """Mechanism ``class=<c>/covariance/subspace``: sum over class c of
    z z^T, z = P^T x (``projected_block_moment``; P public: the top
    eigenvectors of the noisy W), as its isometric upper triangle;
    ||z z^T||_F = ||z||^2 <= R^2: L2 sensitivity R^2 under add/remove one
    record. Then the class's block inside the subspace (post-processing)."""
    name = class_matrix_name(label)
    proj = generator.noisy_second_moment(exact_proj, ledger, noise, name)
    block = class_block(proj, n_c, mean_c, shared.basis)
    if deviation == "spectral":
        r = shared.rank_in
        block = shrink_deviation(block, np.diag(shared.vals[:r]),
                                 noise_edge(ledger.get(name).sigma, n_c, r))
    return block


def _mixture(label: int, count: float, mean: np.ndarray,
             residual: np.ndarray, factors: np.ndarray,
             centre: np.ndarray) -> generator.ClassMixture:
    mix = generator.ClassMixture(
        label=label, weights=np.array([max(count, 0.0)]),
        means=mean[None, :], variances=residual[None, :].copy(),
        noisy_count=float(max(count, 0.0)), factors=factors)
    return generator.with_centre(mix, centre)


@kmeans.one_blas_thread
def shared_mixtures(noisy_n: np.ndarray, n: np.ndarray, means: np.ndarray,
                    shared: SharedModel, blocks: Optional[Sequence],
                    centre: np.ndarray, cfg: GeneratorConfig) -> dict:
    """Shared and subspace modes: one Gaussian per class (factors +
    diagonal), the class's own block inside the subspace if given."""
    return {c: _mixture(c, noisy_n[i], means[i], shared.residual,
                        class_factors(shared, None if blocks is None
                                      else blocks[i]), centre)
            for i, c in enumerate(cfg.labels)}


def spiked_within(within: np.ndarray, edge: float) -> np.ndarray:
    """The "spiked" class deviation (post-processing of one class's noisy
    within covariance C_c; no other class needed): eigenvalues above the
    noise edge ``edge`` (``noise_edge`` of its mechanism) are signal
    spikes, debiased by ``spike_shrink``; the rest (the bulk, where the
    noise hides any signal) are replaced by their mean, kept >= 0. The
    noise matrix has zero trace in expectation, so the bulk's mean keeps
    the class's variance outside the spikes, spread evenly instead of
    along noise directions. With no noise (edge 0) C_c is unchanged."""
    if edge <= 0:
        return within
    vals, vecs = np.linalg.eigh((within + within.T) / 2)
    bulk = vals <= edge
    out = spike_shrink(vals, edge)
    if bulk.any():
        out[bulk] = max(float(vals[bulk].mean()), 0.0)
    return (vecs * out) @ vecs.T


def shrink_class_deviations(withins: Sequence[np.ndarray], n: np.ndarray,
                            edges: Sequence[float]) -> list[np.ndarray]:
    """The "spectral" class deviation (post-processing of DP outputs
    only): pooled = sum_c n_c C_c / sum_c n_c of the noisy class
    covariances C_c (n_c the noisy counts); each C_c becomes pooled +
    spike_shrink(C_c - pooled) at ``edges[c]``, the spectrum edge of its
    own second-moment mechanism's noise divided by n_c (``noise_edge``).
    With zero noise (edges 0) every C_c is returned unchanged."""
    pooled = pooled_within(withins, n)
    return [shrink_deviation(c, pooled, e) for c, e in zip(withins, edges)]


def noise_energy(sigma: float, n_c: float, d: int) -> float:
    """E ||E_c / n_c||_F^2 for the noise E_c of a class's second moment
    (isometric upper triangle: d (d + 1) / 2 entries of std sigma, so the
    Frobenius norm's square has that many sigma^2 terms), divided by the
    class's noisy count n_c (>= 1): the noise energy of its within
    covariance. Public: sigma is the ledger's, n_c a DP count."""
    return sigma * sigma * d * (d + 1) / 2.0 / (n_c * n_c)


def shrinkage_weights(withins: Sequence[np.ndarray], n: np.ndarray,
                      sigmas: Sequence[float]) -> np.ndarray:
    """The "shrunk" class deviation's weights lambda_c in [0, 1]
    (post-processing: released matrices, DP counts, the ledger's sigmas).

    C~_c = C_c + N_c (N_c = E_c / n_c, energy v_c = ``noise_energy``,
    independent across classes, zero mean); pooled P~ = sum_j w_j C~_j,
    w_j = n_j / N. With weight lambda the estimate's error is
    lambda P~ + (1 - lambda) C~_c - C_c = N_c - lambda D~_c, D~_c =
    C~_c - P~, whose noise part is (1 - w_c) N_c - sum_{j != c} w_j N_j.
    So E ||error||^2 = lambda^2 E||D~_c||^2 - 2 lambda (1 - w_c) v_c + v_c,
    minimal at lambda* = (1 - w_c) v_c / E||D~_c||^2; E||D~_c||^2 is
    estimated by the observed ||D~_c||_F^2 (James-Stein plug-in), and
    lambda_c = clip((1 - w_c) v_c / ||D~_c||^2, 0, 1). Where the classes
    share a covariance, E||D~_c||^2 = (1 - 2 w_c) v_c + sum_j w_j^2 v_j,
    which is (1 - w_c) v_c for equal classes: lambda -> 1; where they
    differ by far more than the noise, lambda -> 0; with no noise
    (sigma 0) lambda = 0 (the raw matrices). (The class mean's noise
    also enters C~_c; its energy is ~ 4 |mu_c|^2 sigma_sum^2 / (d sigma^2)
    of v_c, small at d >> 1, and is left out.)"""
    w_n = np.asarray(n, np.float64)
    w = w_n / w_n.sum()
    d = withins[0].shape[0]
    pooled = pooled_within(withins, w_n)
    out = np.zeros(len(withins))
    for i, c in enumerate(withins):
        v = noise_energy(float(sigmas[i]), float(w_n[i]), d)
        part = (1.0 - w[i]) * v
        dist = float(np.sum((c - pooled) ** 2))
        if part <= 0.0:
            out[i] = 0.0
        elif dist <= 0.0:
            out[i] = 1.0
        else:
            out[i] = min(max(part / dist, 0.0), 1.0)
    return out


def pooled_within(withins: Sequence[np.ndarray], n: np.ndarray
                  ) -> np.ndarray:
    """sum_c n_c C_c / sum_c n_c (symmetrised): the pooled within
    covariance of the released class matrices (post-processing)."""
    w = np.asarray(n, np.float64)
    pooled = sum(wi * ci for wi, ci in zip(w, withins)) / w.sum()
    return (pooled + pooled.T) / 2


def shrink_towards_pooled(withins: Sequence[np.ndarray], n: np.ndarray,
                          sigmas: Sequence[float]) -> list[np.ndarray]:
    """The "shrunk" class deviation: lambda_c pooled + (1 - lambda_c) C_c
    with ``shrinkage_weights``; a convex mix of symmetric matrices (the
    factors keep its positive eigenpairs: the PSD repair of every mode)."""
    lam = shrinkage_weights(withins, n, sigmas)
    pooled = pooled_within(withins, n)
    return [lam[i] * pooled + (1.0 - lam[i]) * c
            for i, c in enumerate(withins)]


def noisy_class_second_moments(exact_m: np.ndarray, labels: Sequence[int],
                               ledger: PrivacyLedger, noise
                               ) -> Iterator[np.ndarray]:
    """Mechanism ``class=<c>/covariance/second-moment``: class c's d x d
    second moment sum_{i in c} x_i x_i^T of its clipped rows (isometric
    upper triangle), L2 sensitivity ||x x^T||_F = ||x||^2 <= R^2 under
    add/remove one record; one class at a time (K d x d matrices at once
    would be K x 13 MB at d = 1280)."""
    for i, c in enumerate(labels):
        yield generator.noisy_second_moment(exact_m[i], ledger, noise,
                                            plan.class_covariance(c))


@kmeans.one_blas_thread
def per_class_mixtures(noisy_m: Iterable[np.ndarray], noisy_n: np.ndarray,
                       n: np.ndarray, means: np.ndarray, centre: np.ndarray,
                       structure: Structure, cfg: GeneratorConfig,
                       ledger: PrivacyLedger,
                       class_deviation: str = "raw") -> dict:
    """Per-class mode, post-processing of the released class second
    moments ``noisy_m`` (label order; ``noisy_class_second_moments`` or the
    Beam job's PipelineDP aggregation): each class's within covariance C_c
    (optionally, by ``class_deviation`` at the noise edge of the ledger's
    sigma: "spectral", shrunk towards the pooled one,
    ``shrink_class_deviations``; "spiked", ``spiked_within``; "shrunk",
    mixed with the pooled one by ``shrinkage_weights``), then factors (top
    ``shared_rank`` eigenpairs) and the diagonal residual."""
    if class_deviation not in CLASS_DEVIATIONS:
        raise ValueError(f"unknown class deviation {class_deviation!r}")
    d = means.shape[1]
    floor = variance_floor(cfg, d)
    labelled = list(zip(enumerate(cfg.labels), noisy_m))

    def sigma(c: int) -> float:
        return ledger.get(plan.class_covariance(c)).sigma

    # "raw" and "spiked" form one class's d x d within matrix at a time;
    # "spectral" and "shrunk" need them all (pooled).
    if class_deviation == "spectral":
        withins = shrink_class_deviations(
            [_class_within(m, n[i], means[i], "raw", 0.0)
             for (i, _), m in labelled], n,
            [noise_edge(sigma(c), n[i], d) for (i, c), _ in labelled])
    elif class_deviation == "shrunk":
        withins = shrink_towards_pooled(
            [_class_within(m, n[i], means[i], "raw", 0.0)
             for (i, _), m in labelled], n,
            [sigma(c) for c in cfg.labels])
    else:
        withins = (_class_within(m, n[i], means[i], class_deviation,
                                 sigma(c)) for (i, c), m in labelled)
    return {c: _within_mixture(c, w, noisy_n[i], means[i], centre,
                               structure, floor)
            for (i, c), w in zip(enumerate(cfg.labels), withins)}


@kmeans.one_blas_thread
def per_class_mixture(label: int, noisy_m: np.ndarray, noisy_count: float,
                      n_and_mean: tuple[float, np.ndarray],
                      centre: np.ndarray, structure: Structure,
                      cfg: GeneratorConfig, sigma: float = 0.0
                      ) -> generator.ClassMixture:
    """One class of ``per_class_mixtures`` with the structure's "raw" or
    "spiked" deviation: neither needs another class, so the classes'
    mixtures are formed where their released moments are
    (post-processing). ``n_and_mean``: the class's (n >= 1, mean) of
    ``class_means``; ``sigma``: the ledger's sigma of the class's
    second-moment mechanism (for the spiked deviation's noise edge)."""
    n_c, mean = n_and_mean
    if structure.class_deviation not in ("raw", "spiked"):
        raise ValueError(f"class deviation {structure.class_deviation!r} "
                         "needs every class (per_class_mixtures)")
    w = _class_within(noisy_m, n_c, mean, structure.class_deviation, sigma)
    return _within_mixture(label, w, noisy_count, mean, centre, structure,
                           variance_floor(cfg, mean.shape[0]))


def _class_within(noisy_m: np.ndarray, n_c: float, mean: np.ndarray,
                  deviation: str, sigma: float) -> np.ndarray:
    """One class's within covariance from its released second moment
    (n_c >= 1, so it always exists), "spiked" at its mechanism's noise
    edge (``sigma``: the ledger's) or "raw"."""
    w = covariance.within_covariance(noisy_m, [np.array([n_c])],
                                     [mean[None, :]])
    if deviation == "spiked":
        return spiked_within(w, noise_edge(sigma, n_c, mean.shape[0]))
    return w


def _within_mixture(label: int, within: np.ndarray, count: float,
                    mean: np.ndarray, centre: np.ndarray,
                    structure: Structure,
                    floor: float) -> generator.ClassMixture:
    factors, residual = covariance.factors_from_within(
        within, structure.shared_rank, floor)
    if residual is None:
        residual = np.full(mean.shape[0], floor)
    return _mixture(label, count, mean, residual, factors, centre)
