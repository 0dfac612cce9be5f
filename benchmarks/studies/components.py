"""A mixture per class on top of the adaptive plan (issue 74, opt-in study).

One Gaussian per class is the model's ceiling at high epsilon; DP k-means
(``--clusters``) costs more than its components return. This is the cheap
alternative: after the adaptive plan's phases 1-2 have released each
class's Gaussian, a third pass re-estimates k component means per class
around public candidate centres, and the class's released covariance is
shared by its components.

Pass 3, per class c (everything before the mechanisms is public):

- k_c = clip(floor(n_c mu_sum / (c sqrt(d))), 1, kmax) (``component_count``):
  a public function of the class's noisy count n_c, the pass's sum mu
  (a function of (epsilon, delta, d) and the share), d and two constants;
  each component's mean then carries noise of norm <= R / c on n_c / k_c
  rows.
- k_c candidate centres (``candidate_centres``): the class's DP mean plus
  / minus ``scale`` standard deviations along the top principal directions
  of the class's released covariance (its factors: post-processing).
- Nearest-centre assignment of the class's centred, clipped rows, then two
  Gaussian mechanisms (add/remove one record; the record is in one class
  and one component):
    ``class=<c>/components/sum``: the [k_c, d] per-component sums of the
    clipped rows, L2 sensitivity R (one row of norm <= R in one block);
    ``class=<c>/components/count``: the [k_c] per-component counts, L2
    sensitivity 1.
- Post-processing: component means (noisy sum / max(noisy count, 1),
  kept in the R-ball), weights max(noisy count, 0), and the class's
  covariance minus the released between-component scatter (PSD-repaired,
  ``subtract``) as the shared covariance of the components.

Accounting: the pass takes ``share`` of each class's mu^2 (phases 1-2 keep
1 - share, like the vote's ``vote_share``); ``calibrate`` certifies with
dp_accounting that every structure of the rule's menu plus the pass meets
(epsilon, delta); the ledger lists exactly the mechanisms that ran.
k_c is fixed before pass 3 reads a row, and the mechanisms' sigmas do not
depend on k_c (the sensitivities do not), so the data-dependent component
count costs nothing beyond the noisy counts it reads.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np

from dpsynth.dp_ops import clipping, covariance, generator, moments, plan
from dpsynth.dp_ops.calibration import Slot, _mechanisms, gdp_mu, shrink_mu
from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.dp_ops.ledger import PrivacyLedger
from dpsynth.dp_ops.adaptive import ledgers
from dpsynth.dp_ops.adaptive.rule import RuleConstants, menu

SUM_SPLIT = 0.8  # of the pass's mu^2: the sums; the counts get the rest


@dataclasses.dataclass(frozen=True)
class ComponentConstants:
    share: float = 0.25  # of the per-class mu^2
    c: float = 4.0       # component count divisor (``component_count``)
    kmax: int = 8
    scale: float = 1.0   # candidate offset, in standard deviations
    subtract: bool = True  # remove the between-component scatter
    # > 0: keep each component's offset from the class's phase-2 mean only
    # inside the top ``proj`` directions of the class covariance (drops the
    # sum noise outside them: post-processing); 0: the raw component means
    proj: int = 0
    # True: the class mean becomes the inverse-variance average of the
    # phase-2 class sum and the sum of the component sums (and likewise
    # the counts), and the components are shifted to average to it
    # (post-processing); with k_c = 1 the pass then only sharpens the mean
    pool: bool = False


def sum_name(label: int) -> str:
    return plan.name(label, "components", "sum")


def count_name(label: int) -> str:
    return plan.name(label, "components", "count")


def slots(cfg: GeneratorConfig) -> list[Slot]:
    """Per class: component sums (sensitivity R), counts (sensitivity 1)."""
    out = []
    for c in cfg.labels:
        out.append(Slot(sum_name(c), "components", plan.partition(c),
                        cfg.clip_norm, share=SUM_SPLIT))
        out.append(Slot(count_name(c), "components", plan.partition(c), 1.0,
                        share=1 - SUM_SPLIT))
    return out


def pass_mechanisms(cfg: GeneratorConfig, mu: float, share: float):
    return _mechanisms(slots(cfg), {"components": 1.0},
                       mu * math.sqrt(share))


def calibrate(cfg: GeneratorConfig, d: int, constants: RuleConstants,
              share: float) -> float:
    """Largest per-class total mu such that dp_accounting certifies
    (epsilon, delta) for every menu structure (at mu sqrt(1 - share)) plus
    the pass (at mu sqrt(share))."""
    if math.isinf(cfg.epsilon):
        return math.inf
    return ledgers.largest_mu(
        cfg, menu(d, constants), gdp_mu(cfg.epsilon, cfg.delta),
        lambda s, mu: (ledgers.mechanisms(cfg, s, mu * math.sqrt(1 - share))
                       + pass_mechanisms(cfg, mu, share)))


def component_count(noisy_n: float, sum_mu: float, d: int,
                    k: ComponentConstants) -> int:
    """k_c = clip(floor(n_c mu_sum / (c sqrt(d))), 1, kmax): public."""
    if math.isinf(sum_mu):
        return k.kmax
    raw = max(noisy_n, 0.0) * sum_mu / (k.c * math.sqrt(d))
    return int(np.clip(math.floor(raw), 1, k.kmax))


def class_directions(mix: generator.ClassMixture
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(standard deviations, unit directions [d, r]) of the class's
    released covariance's factor part, largest first (post-processing)."""
    f = mix.factors
    if f is None or not f.shape[1]:
        d = mix.means.shape[1]
        return np.zeros(0), np.zeros((d, 0))
    u, s, _ = np.linalg.svd(f, full_matrices=False)
    return s, u


def candidate_centres(mean: np.ndarray, sds: np.ndarray, dirs: np.ndarray,
                      kc: int, scale: float) -> np.ndarray:
    """kc public centres: the mean (if kc is odd) and mean +/- scale sd_j
    u_j for the top kc // 2 directions."""
    out = [mean] if kc % 2 else []
    for j in range(min(kc // 2, len(sds))):
        step = scale * sds[j] * dirs[:, j]
        out += [mean + step, mean - step]
    return np.array(out) if out else mean[None, :]


def exact_component_aggregates(x: np.ndarray, centres: np.ndarray,
                               clip_norm: float
                               ) -> tuple[np.ndarray, np.ndarray]:
    """(counts [k], sums [k, d]) of the class's clipped rows by nearest
    centre (sums on the sums' grid, as ``block_class_sum``)."""
    d2 = ((x * x).sum(1)[:, None] - 2 * x @ centres.T
          + (centres * centres).sum(1)[None, :])
    near = np.argmin(d2, axis=1)
    k = len(centres)
    counts = np.bincount(near, minlength=k).astype(np.float64)
    q = moments.quantize(x, clip_norm)
    sums = np.zeros((k, x.shape[1]))
    np.add.at(sums, near, q)
    return counts, sums


def noisy_components(counts: np.ndarray, sums: np.ndarray, label: int,
                     ledger: PrivacyLedger, noise
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Mechanisms ``class=<c>/components/count`` (sensitivity 1) and
    ``class=<c>/components/sum`` (sensitivity R): one record adds 1 to one
    count and a row of norm <= R to one sum."""
    k, d = sums.shape
    nc = generator.add_noise(ledger, noise, count_name(label), counts)
    ns = generator.add_noise(ledger, noise, sum_name(label),
                             sums.reshape(-1)).reshape(k, d)
    return nc, ns


def component_mixture(mix: generator.ClassMixture, centre: np.ndarray,
                      noisy_counts: np.ndarray, noisy_sums: np.ndarray,
                      clip_norm: float, subtract: bool, floor: float,
                      proj_dirs: Optional[np.ndarray] = None,
                      anchor: Optional[np.ndarray] = None
                      ) -> generator.ClassMixture:
    """Post-processing: the class's components sharing its covariance.
    ``anchor``: a class mean (centred space) the components average to."""
    w = np.maximum(noisy_counts, 0.0)
    if anchor is not None and (w.sum() <= 0 or len(w) == 1):
        return dataclasses.replace(mix, means=(anchor + centre)[None, :])
    if w.sum() <= 0 or len(w) == 1:
        return mix
    n = np.maximum(noisy_counts, 1.0)
    means = noisy_sums / n[:, None]
    norms = np.linalg.norm(means, axis=1, keepdims=True)
    means = means * np.minimum(1.0, clip_norm / np.maximum(norms, 1e-300))
    if proj_dirs is not None and proj_dirs.shape[1]:
        p = w / w.sum()
        dev = (means - p @ means) @ proj_dirs
        base = mix.means[0] - centre if anchor is None else anchor
        means = base[None, :] + dev @ proj_dirs.T
    elif anchor is not None:
        means = means - (w / w.sum()) @ means + anchor[None, :]
    factors, var = mix.factors, mix.variances[0]
    if subtract:
        p = w / w.sum()
        m = p @ means
        dev = (means - m) * np.sqrt(p)[:, None]
        cov = factors @ factors.T + np.diag(var) - dev.T @ dev
        vals, vecs = np.linalg.eigh((cov + cov.T) / 2)
        order = np.argsort(vals)[::-1][:factors.shape[1]]
        vals, vecs = np.maximum(vals[order], 0.0), vecs[:, order]
        factors = vecs * np.sqrt(vals)
        var = np.maximum(np.diag(cov) - (factors ** 2).sum(1), floor)
    return dataclasses.replace(
        mix, weights=w, means=means + centre[None, :],
        variances=np.repeat(var[None, :], len(w), axis=0), factors=factors)


def pooled_mean(mean2: np.ndarray, n1: float, nc: np.ndarray,
                ns: np.ndarray, label: int, ledger: PrivacyLedger,
                clip_norm: float) -> np.ndarray:
    """Post-processing: the class mean from two independent DP estimates
    of its sum (phase 2's, recovered as mean x count, and the sum of the
    component sums) and of its count (phase 1's and the component
    counts'), each pair averaged with inverse-variance weights (sigmas
    from the ledger). Kept in the R-ball."""
    from dpsynth.dp_ops import adaptive
    k = len(nc)
    s2 = ledger.get(adaptive.sum_name(label)).sigma
    s3 = ledger.get(sum_name(label)).sigma
    c1 = ledger.get(adaptive.count_name(label)).sigma
    c3 = ledger.get(count_name(label)).sigma
    n1 = max(n1, 1.0)
    if s2 == 0 or s3 == 0:
        return mean2
    w2, w3 = 1 / s2 ** 2, 1 / (k * s3 ** 2)
    total = (mean2 * n1 * w2 + ns.sum(0) * w3) / (w2 + w3)
    v1, v3 = 1 / c1 ** 2, 1 / (k * c3 ** 2)
    n = max((n1 * v1 + nc.sum() * v3) / (v1 + v3), 1.0)
    m = total / n
    return m * min(1.0, clip_norm / max(np.linalg.norm(m), 1e-300))


def generate(x: np.ndarray, y: np.ndarray, cfg: GeneratorConfig, noise,
             k: ComponentConstants = ComponentConstants()):
    """The adaptive plan (no vote) + pass 3, in memory. Returns (mixtures,
    synthetic x, synthetic y, ledger, structure, component counts)."""
    from dpsynth.dp_ops import adaptive  # the package (avoid a cycle)
    if cfg.vote_filter:
        raise ValueError("components study: no vote")
    labels = list(cfg.labels)
    constants = adaptive.constants_for(cfg)
    xn = clipping.normalize_rows(np.asarray(x, np.float64), cfg.normalize)
    d = xn.shape[1]
    mu = calibrate(cfg, d, constants, k.share)
    mu_plan = mu * math.sqrt(1 - k.share)
    ledger = adaptive.phase1_ledger(cfg, mu_plan)
    total, count = clipping.centre_sum(xn, "none", cfg.centre_bound)
    centre = generator.noisy_centre(total, count, cfg, ledger, noise)
    noisy_n = adaptive.noisy_counts(adaptive.exact_class_counts(y, labels),
                                    labels, ledger, noise)
    structure = adaptive.choose_structure(
        cfg.epsilon, cfg.delta, d, noisy_n, constants, mu_plan)
    adaptive.add_phase2(ledger, cfg, structure, mu_plan)
    for m in pass_mechanisms(cfg, mu, k.share):
        ledger.register(m)
    if not math.isinf(cfg.epsilon):
        spent = ledgers._worst_epsilon(ledger.mechanisms, cfg.delta,
                                       cfg.accountant)
        assert spent <= cfg.epsilon * (1 + 1e-9), spent
    xc, _ = clipping.preprocess(xn, "none", cfg.clip_norm, centre)
    rows = [xc[y == c] for c in labels]
    sums = np.stack([adaptive.block_class_sum(r, cfg.clip_norm)
                     for r in rows])
    if structure.mode == "per-class":
        exact_m = np.stack([covariance.block_second_moment(r, cfg.clip_norm)
                            for r in rows])
    else:
        exact_m = covariance.block_second_moment(xc, cfg.clip_norm)
    from benchmarks.reference import _adaptive_mixtures
    mixes = _adaptive_mixtures(rows, sums, exact_m, noisy_n, centre,
                               structure, cfg, ledger, noise)
    sum_mu = (math.inf if math.isinf(mu) else
              cfg.clip_norm / ledger.get(sum_name(labels[0])).sigma)
    floor = adaptive.variance_floor(cfg, d)
    ks, xs, ys = [], [], []
    for i, c in enumerate(labels):  # pass 3
        kc = component_count(noisy_n[i], sum_mu, d, k)
        sds, dirs = class_directions(mixes[c])
        cands = candidate_centres(mixes[c].means[0] - centre, sds, dirs,
                                  kc, k.scale)
        counts, csums = exact_component_aggregates(rows[i], cands,
                                                   cfg.clip_norm)
        nc, ns = noisy_components(counts, csums, c, ledger, noise)
        anchor = (pooled_mean(mixes[c].means[0] - centre, noisy_n[i], nc,
                              ns, c, ledger, cfg.clip_norm)
                  if k.pool else None)
        mixes[c] = component_mixture(mixes[c], centre, nc, ns,
                                     cfg.clip_norm, k.subtract, floor,
                                     dirs[:, :k.proj] if k.proj else None,
                                     anchor)
        ks.append(len(cands))
        synth = generator.candidates(mixes[c], cfg)
        xs.append(synth)
        ys.append(np.full(len(synth), c, dtype=np.int64))
    return mixes, np.vstack(xs), np.concatenate(ys), ledger, structure, ks
