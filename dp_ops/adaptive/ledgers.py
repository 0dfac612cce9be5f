"""The adaptive plan's mechanisms: the two phases' slots, the per-class
GDP mu certified for every structure of the rule's menu, the ledgers of
phase 1 and phase 2, and the mechanisms on exact aggregates shared by the
in-memory reference and the Beam job (transforms/two_phase.py): each takes
exact aggregates, adds its ledger mechanisms' keyed noise exactly
(generator.add_noise: the aggregates lie on public grids) and returns DP
outputs only."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, Iterator, Optional, Sequence

import numpy as np

from dpsynth.dp_ops import clipping, covariance, generator, kmeans, moments, plan
from dpsynth.dp_ops.calibration import Slot, _mechanisms, gdp_mu, shrink_mu
from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.dp_ops.ledger import GLOBAL, Mechanism, PrivacyLedger, compose_epsilon
from dpsynth.dp_ops.adaptive.postprocess import (
    SharedModel, class_block, shared_model, shared_within, variance_floor)
from dpsynth.dp_ops.adaptive.rule import (
    CENTRE_SPLIT, PHASE1, RuleConstants, Structure, menu, two_phase)


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


# The default share of mu^2 for the vote, kept small: with 6 candidates per
# row even noiseless votes were neutral for the probe on a validation split
# of the 20 Newsgroups train file, so the vote's cost is its share, taken
# from the mixture (docs/method.md, "The vote").
VOTE_SHARE = 0.05


# The vote runs only where its histogram can carry signal: if the mixture
# were right, a candidate would get 1 / (candidates per row) votes, and the
# vote runs when that is at least VOTE_MIN_SNR of its noise sigma. Below it
# the histogram is noise, the draw is no better than the mixture's own, and
# the vote's share stays with the mixture's moments. On both shared sets
# that is every epsilon up to a few hundred with 6 candidates per row
# (benchmarks/results/vote_resample.md: the vote scored at or below the
# plain release at epsilon 1-8, and noiseless votes were neutral).
VOTE_MIN_SNR = 1.0


def vote_gated(cfg: GeneratorConfig) -> bool:
    """Whether ``--vote-filter`` is subject to the signal rule: the
    adaptive plan's resampling vote at its default share. An explicit
    ``--vote-share`` or the legacy ``--vote-threshold`` runs as asked."""
    return (cfg.vote_filter and two_phase(cfg) and cfg.vote_share is None
            and cfg.vote_threshold is None and not math.isinf(cfg.epsilon))


def vote_signal(cfg: GeneratorConfig) -> float:
    """Votes a candidate expects if the mixture were right: 1 over the
    candidates per row (``--vote-oversample``; a ``--vote-max-candidates``
    cap only lowers it, so this is the smallest signal)."""
    return 1.0 / max(cfg.vote_oversample, 1.0)


def resolve_vote(cfg: GeneratorConfig, d: int,
                 constants: Optional[RuleConstants] = None
                 ) -> tuple[GeneratorConfig, Optional[dict]]:
    """The run's configuration after the signal rule, and the public note
    for the manifest (None where the rule does not apply). A public
    function of (epsilon, delta, d, the plan's shares, the candidates per
    row): no data is read and nothing is charged."""
    if not vote_gated(cfg):
        return cfg, None
    mu = calibrate_mu(cfg, d, constants)
    sigma = 1.0 / vote_mu(cfg, mu)
    signal = vote_signal(cfg)
    runs = signal >= VOTE_MIN_SNR * sigma
    note = {"asked": True, "ran": runs, "sigma": sigma,
            "votes_per_candidate": signal, "min_snr": VOTE_MIN_SNR,
            "rule": "the vote runs when a candidate's expected votes "
                    "(1 / candidates per row) reach min_snr noise sigmas; "
                    "otherwise its share stays with the mixture"}
    return (cfg if runs else dataclasses.replace(cfg, vote_filter=False)), note


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
    start = gdp_mu(cfg.epsilon, cfg.delta) * math.sqrt(1 - vote_share(cfg))
    return largest_mu(cfg, menu(d, constants), start,
                      lambda s, mu: mechanisms(cfg, s, mu))


def largest_mu(cfg: GeneratorConfig, structures: Sequence[Structure],
               mu: float,
               mechanisms_of: Callable[[Structure, float], list[Mechanism]]
               ) -> float:
    """Shrinks ``mu`` from its start until dp_accounting certifies
    (epsilon, delta) for the mechanisms of every structure."""
    todo = list(structures)
    for _ in range(80):
        # Shrink on the first failing structure only, then re-check all
        # (each check is one dp_accounting composition).
        failing = None
        for s in todo:
            spent = _worst_epsilon(mechanisms_of(s, mu), cfg.delta,
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


# ------------------------------------- mechanisms on exact aggregates

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
                      ledger: PrivacyLedger, noise) -> np.ndarray:
    """Mechanism ``class=<c>/covariance/subspace``: sum over class c of
    z z^T, z = P^T x (``projected_block_moment``; P public: the top
    eigenvectors of the noisy W), as its isometric upper triangle;
    ||z z^T||_F = ||z||^2 <= R^2: L2 sensitivity R^2 under add/remove one
    record. Then the class's block inside the subspace (post-processing)."""
    name = class_matrix_name(label)
    proj = generator.noisy_second_moment(exact_proj, ledger, noise, name)
    return class_block(proj, n_c, mean_c, shared.basis)


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
