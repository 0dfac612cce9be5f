"""Empirical privacy audit: a lower bound on epsilon from a canary attack.

An (epsilon, delta)-DP mechanism M bounds every test that tries to tell
whether one record (the canary) was in the input: for any rejection region,
TPR <= e^eps FPR + delta and (1 - FPR) <= e^eps (1 - TPR) + delta. Running
the generator many times with and without the canary and measuring a
threshold attack's TPR and FPR therefore gives

    eps_lb = max(log((TPR_lo - delta) / FPR_hi),
                 log((1 - FPR_hi - delta) / (1 - TPR_lo)))

where TPR_lo and FPR_hi are Clopper-Pearson bounds, so that eps_lb is a
lower confidence bound on the true epsilon. (The complement term must use
FPR_hi and TPR_lo too: 1 - FPR_lo over 1 - TPR_hi would be the optimistic
end of both intervals and could overstate the bound.) A correct implementation can
never give eps_lb above the claimed epsilon (except with probability alpha);
a broken one (wrong sensitivity, missing noise) shows up as eps_lb > eps.

The canary experiment (``canary_audit``) uses the in-memory reference
generator with a fresh ``SeededNoise`` per trial (the same algorithm as the
Beam pipeline). The canary is a record on the clip sphere along a coordinate
axis that no data record uses (worst case for the sum and the sum of
squares). The attack sees only the released mixture (weights, means,
variances) and the public configuration: it rebuilds the noisy count, sum
and sum of squares along the canary axis from the mixture and weighs each by
shift / sigma^2 (the likelihood-ratio direction for Gaussian noise). The
threshold is chosen on separate calibration trials.

Pure numpy/scipy (no Beam, no TF).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

import numpy as np
from scipy import optimize, stats

from dpsynth.dp_ops import clipping, plan
from benchmarks import reference
from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.dp_ops.generator import ClassMixture
from dpsynth.dp_ops.ledger import Mechanism, PrivacyLedger
from dpsynth.dp_ops.noise import SeededNoise


# ------------------------------------------------------------ statistics

def clopper_pearson(k: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """Exact two-sided (1 - alpha) interval for a binomial rate k / n."""
    if n <= 0 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n > 0, got k={k}, n={n}")
    lo = 0.0 if k == 0 else float(stats.beta.ppf(alpha / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(stats.beta.ppf(1 - alpha / 2, k + 1, n - k))
    return lo, hi


def epsilon_from_rates(tpr: float, fpr: float, delta: float = 0.0) -> float:
    """max(log((tpr - delta) / fpr), log((1 - fpr - delta) / (1 - tpr))), >= 0.

    Both inequalities of (eps, delta)-DP for the attack and for its
    complement. On raw rates this is the point estimate; on (tpr_lo,
    fpr_hi) it is the conservative bound (a lower TPR and a higher FPR make
    both terms smaller).
    """
    best = 0.0
    for num, den in ((tpr - delta, fpr), (1 - fpr - delta, 1 - tpr)):
        if num <= 0:
            continue
        best = max(best, math.inf if den <= 0 else math.log(num / den))
    return best


@dataclasses.dataclass(frozen=True)
class AuditBound:
    """Result of one threshold attack."""

    lower: float  # (1 - alpha) lower confidence bound on epsilon
    estimate: float  # the same formula on the raw rates
    tpr: float
    fpr: float
    tpr_ci: tuple[float, float]
    fpr_ci: tuple[float, float]
    trials_in: int
    trials_out: int
    alpha: float


def epsilon_lower_bound(true_pos: int, trials_in: int, false_pos: int,
                        trials_out: int, delta: float,
                        alpha: float = 0.05) -> AuditBound:
    """Lower confidence bound (level 1 - alpha) on epsilon from counts.

    Each rate gets a two-sided Clopper-Pearson interval at level
    1 - alpha/2, so both hold together with probability >= 1 - alpha.
    """
    tpr_ci = clopper_pearson(true_pos, trials_in, alpha / 2)
    fpr_ci = clopper_pearson(false_pos, trials_out, alpha / 2)
    tpr, fpr = true_pos / trials_in, false_pos / trials_out
    lower = epsilon_from_rates(tpr_ci[0], fpr_ci[1], delta)
    estimate = epsilon_from_rates(tpr, fpr, delta)
    return AuditBound(lower, estimate, tpr, fpr, tpr_ci, fpr_ci, trials_in,
                      trials_out, alpha)


def bound_at(scores_in: np.ndarray, scores_out: np.ndarray, threshold: float,
             delta: float, alpha: float = 0.05) -> AuditBound:
    """The attack 'canary present iff score >= threshold'."""
    scores_in, scores_out = np.asarray(scores_in), np.asarray(scores_out)
    return epsilon_lower_bound(int((scores_in >= threshold).sum()),
                               len(scores_in),
                               int((scores_out >= threshold).sum()),
                               len(scores_out), delta, alpha)


def choose_threshold(scores_in: np.ndarray, scores_out: np.ndarray,
                     delta: float, alpha: float = 0.05) -> float:
    """Threshold with the best lower bound on *calibration* scores.

    Reusing the same scores for the final bound would overfit the
    threshold; evaluate it on fresh trials with ``bound_at``.
    """
    candidates = np.unique(np.concatenate([scores_in, scores_out]))
    if len(candidates) > 400:  # quantiles are plenty and much faster
        candidates = np.unique(np.quantile(candidates,
                                           np.linspace(0, 1, 401)))
    best, best_t = -1.0, float(candidates[0])
    for t in candidates:
        b = bound_at(scores_in, scores_out, t, delta, alpha)
        key = b.lower if math.isfinite(b.lower) else 1e9
        if key > best:
            best, best_t = key, float(t)
    return best_t


# ------------------------------------------- the noise-scale bound

def gaussian_epsilon(mu: float, delta: float) -> float:
    """The epsilon at ``delta`` of a mu-GDP mechanism (one Gaussian of
    sensitivity / sigma = mu): the root of
    Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) = delta (the auditor's
    own, independent of dpsynth's calibration)."""
    if mu <= 0:
        return 0.0
    if math.isinf(mu):
        return math.inf

    def excess(eps: float) -> float:
        return (stats.norm.cdf(-eps / mu + mu / 2)
                - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2) - delta)
    if excess(0.0) <= 0:
        return 0.0
    hi = 1.0
    while excess(hi) > 0:
        hi *= 2
    return float(optimize.brentq(excess, 0.0, hi, xtol=1e-10))


@dataclasses.dataclass(frozen=True)
class NoiseBound:
    """What the measured noise of the released statistics implies."""

    lower: float  # epsilon of mu_lower-GDP at the audit's delta
    mu_lower: float  # (1 - alpha) lower confidence bound on mu
    sigma_upper: dict  # per statistic, (1 - alpha) upper bound on its sigma
    samples: int


def noise_bound(noise: dict[str, np.ndarray], shifts: dict[str, float],
                delta: float, alpha: float = 0.05,
                means_fitted: int = 1) -> NoiseBound:
    """Lower confidence bound on epsilon from the noise that released
    statistics carry, for errors too small for the threshold attack.

    ``noise[f]``: samples of statistic f's noise (released minus the exact
    value the auditor knows, over independent runs); ``shifts[f]``: how
    much the canary moves f (its sensitivity, met exactly by the canary);
    ``means_fitted``: how many group means were subtracted from the samples.
    Releasing the statistics with independent Gaussian noise of these
    sigmas is exactly mu-GDP against adding the canary, mu^2 = sum of
    (shift / sigma)^2, so the true epsilon is at least that of mu-GDP.
    Each sigma gets a chi-square upper bound (level 1 - alpha / k, k
    statistics), so the bound holds with probability >= 1 - alpha when the
    noise is Gaussian (the mechanisms' distribution; its scale is what is
    tested). A run with half the claimed sigma shows at 2x the mu.
    """
    uppers, mu2, n = {}, 0.0, None
    for field, values in noise.items():
        values = np.asarray(values, np.float64)
        n = len(values)
        dof = n - means_fitted
        spread = float(np.sum((values - values.mean()) ** 2))
        chi = stats.chi2.ppf(alpha / len(noise), dof)
        uppers[field] = math.sqrt(spread / chi)
        mu2 += (math.inf if uppers[field] == 0
                else (shifts[field] / uppers[field]) ** 2)
    mu = math.sqrt(mu2)
    return NoiseBound(gaussian_epsilon(mu, delta), mu, uppers, n or 0)


# --------------------------------------------------- the canary experiment

LABEL = 0


def audit_data(n: int, dim: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Unit-norm records with x[:, 0] == 0 and the canary R e_0 (R = 1).

    The data form a few clusters in the coordinates 1..dim-1; no record has
    any mass on axis 0, where the canary lies on the clip sphere.
    """
    rng = np.random.default_rng([seed, 0xA0D17])
    centres = rng.normal(size=(3, dim))
    centres[:, 0] = 0.0
    x = centres[rng.integers(0, 3, n)] + 0.5 * rng.normal(size=(n, dim))
    x[:, 0] = 0.0
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    canary = np.zeros((1, dim))
    canary[0, 0] = 1.0
    return x, canary


def tight_config(epsilon: float, delta: float = 1e-5,
                 clusters: int = 1) -> GeneratorConfig:
    """A configuration whose released mixture carries (almost) the whole
    budget: no Lloyd rounds and 99 % (or all) of it on the moments."""
    cfg = GeneratorConfig(labels=(LABEL,), epsilon=epsilon, delta=delta,
                          clusters=clusters, clip_norm=1.0, normalize="unit",
                          tree_depth=4, lloyd_rounds=0, samples_per_class=1,
                          covariance_rank=0, center=False, accountant="pld")
    others = [s for s in cfg.stages if s != "moments"]
    weights = {"moments": 1.0 if not others else 0.99}
    weights.update({s: 0.01 / len(others) for s in others})
    return dataclasses.replace(cfg, budget_weights=weights)


def default_config(epsilon: float, delta: float = 1e-5,
                   clusters: int = 4) -> GeneratorConfig:
    """The shipped clustering defaults (tree + 2 Lloyd rounds + moments;
    the covariance mechanisms are audited by the mechanism tests instead:
    the canary attack reads the per-cluster moments)."""
    return GeneratorConfig(labels=(LABEL,), epsilon=epsilon, delta=delta,
                           clusters=clusters, clip_norm=1.0, normalize="unit",
                           samples_per_class=1, covariance_rank=0,
                           center=False, accountant="pld")


def released_totals(mix: ClassMixture) -> dict[str, float]:
    """The noisy count, sum and sum of squares along the canary's axis,
    read back from a released mixture (see ``canary_score``)."""
    n = np.maximum(mix.weights, 1.0)
    return {"count": float(n.sum()),
            "sum": float((n * mix.means[:, 0]).sum()),
            "sumsq": float((n * (mix.variances[:, 0]
                                 + mix.means[:, 0] ** 2)).sum())}


def canary_score(mix: ClassMixture, cfg: GeneratorConfig,
                 ledger: PrivacyLedger) -> float:
    """Evidence for the canary R e_0 from the released mixture alone.

    Per component j the noisy count is max(w_j, 1) (weights are the noisy
    counts, zeroed below 1; the generator divides by max(count, 1)), so
    n_j * mean_j and n_j * (var_j + mean_j^2) give back the noisy sum and
    sum of squares (up to the public clipping/flooring). Summed over
    components, each is the exact total (public to the auditor, who knows
    the other records) plus Gaussian noise; the canary adds 1, R and R^2.
    """
    r = cfg.clip_norm
    total = released_totals(mix)
    shift = {"count": 1.0, "sum": r, "sumsq": r * r}
    score = 0.0
    for field, value in total.items():
        sigma = ledger.get(plan.name(LABEL, "moments", field)).sigma
        score += value * shift[field] / (sigma ** 2 if sigma > 0 else 1.0)
    return score


# What the noise-scale bound reads of each run: the count and the sum are
# read back exactly from the mixture; the sum of squares is not (the
# variances are floored), so it is left out (a lower bound either way).
NOISE_FIELDS = ("count", "sum")


def run_trials(x: np.ndarray, cfg: GeneratorConfig, ledger: PrivacyLedger,
               seeds: Sequence[int]) -> tuple[np.ndarray, dict]:
    """Canary scores of len(seeds) independent runs on the records x, and
    each run's released totals (``NOISE_FIELDS``)."""
    xc, _ = clipping.preprocess(x, cfg.normalize, cfg.clip_norm)
    scores = np.empty(len(seeds))
    totals = {f: np.empty(len(seeds)) for f in NOISE_FIELDS}
    for i, seed in enumerate(seeds):
        mix, _ = reference.generate_class(xc, LABEL, cfg, ledger,
                                          SeededNoise(seed))
        scores[i] = canary_score(mix, cfg, ledger)
        released = released_totals(mix)
        for f in NOISE_FIELDS:
            totals[f][i] = released[f]
    return scores, totals


@dataclasses.dataclass(frozen=True)
class CanaryAuditResult:
    claimed_epsilon: float
    delta: float
    bound: AuditBound
    threshold: float
    calibration_trials: int  # per arm
    records: int
    noise: NoiseBound  # from the spread of the released count and sum


def canary_audit(cfg: GeneratorConfig, trials: int, calibration_trials: int,
                 records: int = 200, dim: int = 8, seed: int = 0,
                 alpha: float = 0.05,
                 ledger: Optional[PrivacyLedger] = None) -> CanaryAuditResult:
    """Runs 2 x (calibration_trials + trials) generations and the attack.

    Arms: D (``records`` rows) and D + canary. Noise seeds are distinct
    for every run, so all trials are independent.
    """
    ledger = ledger or plan.make_ledger(cfg)
    x, canary = audit_data(records, dim, seed)
    with_canary = np.vstack([x, canary])
    base = 1_000_003 * (seed + 1)
    per_arm = calibration_trials + trials
    seeds_out = range(base, base + per_arm)
    seeds_in = range(base + per_arm, base + 2 * per_arm)
    s_out, t_out = run_trials(x, cfg, ledger, seeds_out)
    s_in, t_in = run_trials(with_canary, cfg, ledger, seeds_in)
    c = calibration_trials
    threshold = choose_threshold(s_in[:c], s_out[:c], cfg.delta, alpha)
    bound = bound_at(s_in[c:], s_out[c:], threshold, cfg.delta, alpha)
    # each arm's runs share their exact totals: the spread is the noise
    noise = {f: np.concatenate([t_out[f] - t_out[f].mean(),
                                t_in[f] - t_in[f].mean()])
             for f in NOISE_FIELDS}
    return CanaryAuditResult(cfg.epsilon, cfg.delta, bound, threshold, c,
                             records, noise_bound(
                                 noise, {"count": 1.0, "sum": cfg.clip_norm},
                                 cfg.delta, alpha, means_fitted=2))


# ------------------------------------- the Beam arm: classes as trials

def multiclass_audit_data(classes: int, per_class: int, dim: int, seed: int,
                          canaries: Sequence[int]
                          ) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) for the Beam arm: ``classes`` classes of unit-norm records
    with x[:, 0] == 0, in +/- pairs (so the data's mean is 0 and the DP
    centre is noise only); the classes in ``canaries`` also hold the canary
    e_0 (unit norm, on the clip sphere once centred and clipped)."""
    rng = np.random.default_rng([seed, 0xBEA3])
    half = rng.normal(size=(classes, per_class // 2, dim))
    half[..., 0] = 0.0
    rows = np.concatenate([half, -half], axis=1)
    rows /= np.linalg.norm(rows, axis=2, keepdims=True)
    x = rows.reshape(-1, dim)
    y = np.repeat(np.arange(classes), rows.shape[1])
    extra = np.zeros((len(canaries), dim))
    extra[:, 0] = 1.0
    return (np.vstack([x, extra]),
            np.concatenate([y, np.asarray(canaries, np.int64)]).astype(np.int64))


def ledger_from_manifest(privacy: dict) -> PrivacyLedger:
    """The run's ledger as its release publishes it (manifest "privacy"):
    every mechanism that ran, with its sigma and sensitivity. The adaptive
    plan picks its phase-2 mechanisms from the noisy counts, so an auditor
    reads them from the release rather than re-planning from the config."""
    ledger = PrivacyLedger(privacy["target"]["epsilon"],
                           privacy["target"]["delta"], privacy["accountant"])
    fields = {f.name for f in dataclasses.fields(Mechanism)}
    for m in privacy["mechanisms"]:
        ledger.register(Mechanism(**{k: v for k, v in m.items()
                                     if k in fields}))
    return ledger


def class_moment_mechanisms(ledger: PrivacyLedger,
                            label: int) -> list[Mechanism]:
    """What ``release_canary_scores`` reads of one class: its noisy count
    and its noisy sum."""
    return [ledger.get(plan.class_count_name(ledger, label)),
            ledger.get(plan.name(label, "moments", "sum"))]


def release_canary_scores(mixtures: dict, centre: np.ndarray,
                          x: np.ndarray, y: np.ndarray,
                          cfg: GeneratorConfig, ledger: PrivacyLedger
                          ) -> dict[int, float]:
    """Per class: the likelihood-ratio score for "the canary is in this
    class", from the release (noisy count and mean of the class, the DP
    centre) and what the auditor knows (the other records x, y).

    The released mean times the noisy count gives back the noisy sum (up to
    the public clipping of the mean); along axis 0 it is the exact sum of the
    class's known records (centred and clipped as the pipeline does, with
    the released centre) plus Gaussian noise, plus the canary's clipped
    coordinate if present. Count likewise. Scores weigh each residual by
    shift / sigma^2 (sigmas from ``ledger``: the release's own, see
    ``ledger_from_manifest``)."""
    def weight(name: str) -> float:
        sigma = ledger.get(name).sigma
        return 1.0 / sigma ** 2 if sigma > 0 else 1.0

    residuals, shift_sum = release_residuals(mixtures, centre, x, y, cfg)
    return {label: (res["sum"] * shift_sum
                    * weight(plan.name(label, "moments", "sum"))
                    + res["count"]
                    * weight(plan.class_count_name(ledger, label)))
            for label, res in residuals.items()}


def release_residuals(mixtures: dict, centre: np.ndarray, x: np.ndarray,
                      y: np.ndarray, cfg: GeneratorConfig
                      ) -> tuple[dict[int, dict[str, float]], float]:
    """Per class, the released count and axis-0 sum minus what the known
    records x, y give (noise, plus the canary's 1 and shift if present),
    and the canary's shift of the sum (its clipped, centred coordinate)."""
    xc, _ = clipping.preprocess(x, cfg.normalize, cfg.clip_norm, centre)
    canary = np.zeros((1, x.shape[1]))
    canary[0, 0] = 1.0
    shift_sum = float(clipping.preprocess(canary, cfg.normalize,
                                          cfg.clip_norm, centre)[0][0, 0])
    out = {}
    for label, mix in mixtures.items():
        known = y == label
        n = max(mix.noisy_count, 1.0)  # the divisor of the released mean
        noisy_sum = n * float(mix.means[0, 0] - centre[0])
        out[label] = {"count": mix.noisy_count - float(known.sum()),
                      "sum": noisy_sum - float(xc[known, 0].sum())}
    return out, shift_sum
