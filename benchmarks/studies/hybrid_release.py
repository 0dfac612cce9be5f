"""A global matrix released beside the class matrices (issue 61, study only).

The last idea for letting the released statistics choose the covariance
structure: phase 2 releases BOTH the global second moment (share ``a`` of
the covariance part of mu^2) and every class's d x d second moment (share
1 - a), so one release holds what each menu structure needs, each at a
noisier sigma (sigma / sqrt(a) and sigma / sqrt(1 - a), sigma the
per-class mode's class-matrix sigma). Every record is in one class, so it
touches its class's matrix and the global one: the per-class mu^2 is the
same as every menu structure's (GDP), and the branches below are
post-processing of one release:

* ``shared``: every class gets the pooled within covariance W of the
  global matrix (the shared mode at a's sigma);
* ``subspace``: W outside its top-r eigenvectors P, each class's own
  block P^T C_c P inside (r = the rule's class rank). P^T E P of a
  symmetric Gaussian noise matrix E has the distribution of an r x r one
  of the same sigma, so at a = 0.5 (``subspace_share``) this is the
  subspace mode's release in distribution;
* ``raw`` / ``spiked``: each class's own matrix C_c, as released or
  ``adaptive.spiked_within`` at its noise edge (the per-class mode at
  1 - a's sigma).

Further branches (``--branches``): ``subspace@<r>`` (class rank r),
``subspace@risk[w][c]`` (ranks from ``rank_gains``), ``union:<a>+<b>``
(half the rows from each branch), ``subspace+js`` (each class block
shrunk towards the shared block by ``js_weight``), ``spiked+pooled`` and
``rank+pooled`` (class matrices over the pooled bulk; run them at
``--share 0.01``, the class matrices at about the per-class mode's
sigma).

``excess`` is the statistic a post-processing selector could use:
mean over classes of ||C_c - W||_F^2 / v_c - 1, v_c the noise energy of
C_c - W (``class_deviations.noise_energy`` of both matrices): an estimate of the
classes' true covariance differences in units of their noise. Phase 1,
the class sums and their share are the per-class mode's
(``covariance_sweep.run_one``'s noise seed 1000 + seed); the matrices'
noise is drawn here from numpy (``symmetric_noise``, seed [seed, 61]),
not by the product's keyed noise: this module changes no mechanism.

    nice -n 19 env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \\
        python -m benchmarks.studies.hybrid_release --shapes 20news \\
        --epsilons 1,2,4,8 --seeds 0,1,2
    python -m benchmarks.studies.hybrid_release --report

Runs append to benchmark-data/studies/hybrid_issue61.jsonl;
``--report`` writes hybrid_issue61.md against the sweep's menu means.
Fresh seeds (the report's last table): the same commands with
``--seeds 3,4,5``, and the menu structures by

    python -m benchmarks.studies.covariance_sweep --fresh --seeds 3,4,5 \
        --shapes <set> --modes shared,subspace,per-class,per-class+spiked
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
from collections import defaultdict
from typing import Optional

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.studies import class_deviations  # noqa: E402
from benchmarks.studies import covariance_sweep as sweep  # noqa: E402
from benchmarks.studies import goal_noise  # noqa: E402
from benchmarks.studies.study_data import (  # noqa: E402
    DATA, RESULTS, append_record, write_report)
from dpsynth.dp_ops import adaptive, clipping, covariance, generator, plan  # noqa: E402
from dpsynth.dp_ops.adaptive import postprocess  # noqa: E402
from dpsynth.dp_ops.config import GeneratorConfig  # noqa: E402
from dpsynth.dp_ops.noise import SeededNoise  # noqa: E402

LOG = os.path.join(DATA, "hybrid_issue61.jsonl")
REPORT = os.path.join(RESULTS, "hybrid_issue61.md")
BRANCHES = ("shared", "subspace", "raw", "spiked")
MENU_NAMES = ("shared", "subspace", "per-class", "spiked")
FIT_SEEDS = (0, 1, 2)
DEFAULT = "default"  # the current rule's pick, seed by seed
CONFIRM_SEEDS = (3, 4, 5)


def symmetric_noise(d: int, sigma: float, rng: np.random.Generator
                    ) -> np.ndarray:
    """The noise of a d x d second moment released as its isometric upper
    triangle with std sigma: diagonal std sigma, off-diagonal sigma /
    sqrt(2) (``covariance.upper`` scales those entries by sqrt(2))."""
    e = np.triu(rng.standard_normal((d, d)) * sigma / math.sqrt(2.0), 1)
    e = e + e.T
    e[np.diag_indices(d)] = rng.standard_normal(d) * sigma
    return e


@dataclasses.dataclass
class Release:
    """One hybrid release's DP values and the public numbers around it."""

    cfg: GeneratorConfig
    structure: adaptive.Structure
    class_rank: int
    noisy_n: np.ndarray
    n: np.ndarray
    means: np.ndarray
    centre: np.ndarray
    within: np.ndarray          # W, from the global matrix
    classes: list               # C_c, from each class's matrix
    sigma_global: float
    sigma_class: float


def release(split, eps: float, seed: int, share: float) -> Release:
    """Phase 1 and the sums as the per-class mode's; then the global
    matrix at sigma / sqrt(share) and the class matrices at sigma /
    sqrt(1 - share)."""
    if not 0.0 < share < 1.0:
        raise ValueError(f"share must be in (0, 1), got {share}")
    cfg = GeneratorConfig(labels=tuple(range(split.classes)), epsilon=eps,
                          delta=sweep.DELTA, seed=seed)
    rc = adaptive.RuleConstants(force_mode="per-class",
                                class_deviation="raw")
    noise = SeededNoise(1000 + seed)
    labels = list(cfg.labels)
    xn = clipping.normalize_rows(np.asarray(split.x_fit, np.float64),
                                 cfg.normalize)
    d = xn.shape[1]
    mu = adaptive.calibrate_mu(cfg, d, rc)
    ledger = adaptive.phase1_ledger(cfg, mu)
    total, count = clipping.centre_sum(xn, "none", cfg.centre_bound)
    centre = generator.noisy_centre(total, count, cfg, ledger, noise)
    noisy_n = adaptive.noisy_counts(
        adaptive.exact_class_counts(split.y_fit, labels), labels, ledger,
        noise)
    st = adaptive.choose_structure(eps, cfg.delta, d, noisy_n, rc, mu)
    adaptive.add_phase2(ledger, cfg, st, mu)
    xc, _ = clipping.preprocess(xn, "none", cfg.clip_norm, centre)
    rows = [xc[split.y_fit == c] for c in labels]
    sums = np.stack([adaptive.block_class_sum(r, cfg.clip_norm)
                     for r in rows])
    n, means = adaptive.class_means(
        adaptive.noisy_class_sums(sums, labels, ledger, noise), noisy_n,
        cfg.clip_norm)
    sigma = ledger.get(plan.class_covariance(labels[0])).sigma
    sg, sc = sigma / math.sqrt(share), sigma / math.sqrt(1.0 - share)
    exact = [covariance.block_second_moment(r, cfg.clip_norm) for r in rows]
    rng = np.random.default_rng([seed, 61])
    w = adaptive.shared_within(sum(exact) + symmetric_noise(d, sg, rng),
                               n, means)
    classes = [covariance.within_covariance(
        m + symmetric_noise(d, sc, rng), [np.array([n[i]])],
        [means[i][None, :]]) for i, m in enumerate(exact)]
    return Release(cfg, st, rc.class_rank(d), noisy_n, n, means, centre, w,
                   classes, sg, sc)


def excess(rel: Release) -> float:
    """Mean over classes of ||C_c - W||_F^2 / v_c - 1 (see the module)."""
    d = rel.within.shape[0]
    total = float(rel.n.sum())
    out = []
    for i, c in enumerate(rel.classes):
        v = (class_deviations.noise_energy(rel.sigma_class, float(rel.n[i]), d)
             + class_deviations.noise_energy(rel.sigma_global, total, d))
        out.append(float(np.sum((c - rel.within) ** 2)) / v - 1.0)
    return float(np.mean(out))


def rank_gains(rel: Release, weighted: bool = False) -> np.ndarray:
    """[K, d + 1]: for each class and r = 0..d, the estimated drop in the
    squared Frobenius error of the class's covariance when its own block
    replaces W's in the top r x r corner of W's eigenbasis U (post-
    processing: released matrices and the ledger's sigma only).

    With A = U^T (C_c - W) U, D the true deviation, v_ij the variance of
    C_c's noise in entry ij (sigma_c^2 / n_c^2 on the diagonal, half that
    off it; U^T E U is distributed as E since U comes from W's
    independent noise), E[A_ij^2] = D_ij^2 + v_ij + (W's noise). Keeping
    W in entry ij costs D_ij^2 + (W's noise), keeping C_c costs v_ij, so
    the gain of entry ij is estimated by A_ij^2 - 2 v_ij, and the gain of
    rank r is its sum over the corner. ``weighted`` divides entry ij by
    lambda_i lambda_j (W's eigenvalues, floored): the error measured in
    W-whitened units."""
    d = rel.within.shape[0]
    vals, vecs = adaptive.eigen(rel.within)
    floor = adaptive.variance_floor(rel.cfg, d)
    scale = np.maximum(vals, floor)
    out = np.zeros((len(rel.classes), d + 1))
    for i, c in enumerate(rel.classes):
        a = vecs.T @ (c - rel.within) @ vecs
        v = np.full((d, d), rel.sigma_class ** 2 / (2 * rel.n[i] ** 2))
        v[np.diag_indices(d)] *= 2
        g = a * a - 2 * v
        if weighted:
            g = g / np.outer(scale, scale)
        out[i, 1:] = np.diagonal(np.cumsum(np.cumsum(g, 0), 1))
    return out


def chosen_ranks(rel: Release, how: str) -> list[int]:
    """Each class's rank for "risk" (one rank for all classes: the
    argmax of the summed gains), "riskc" (each class its own argmax) and
    their W-whitened forms "riskw" / "riskwc"."""
    gains = rank_gains(rel, weighted=how.startswith("riskw"))
    if how.endswith("c"):
        return [int(np.argmax(g)) for g in gains]
    return [int(np.argmax(gains.sum(0)))] * len(gains)


def branch_ranks(rel: Release, branch: str) -> list[int]:
    d = rel.within.shape[0]
    k = len(rel.classes)
    if "@" not in branch:  # "subspace", "subspace+js"
        return [rel.class_rank] * k
    tag = branch.split("@")[1]
    if tag.startswith("risk"):
        return chosen_ranks(rel, tag)
    return [min(int(tag), d)] * k


def spiked_pooled(within: np.ndarray, pooled: np.ndarray,
                  edge: float) -> np.ndarray:
    """The class's eigenpairs above its noise edge as debiased spikes (as
    ``adaptive.spiked_within``), and outside their span the pooled matrix
    instead of the bulk's mean: the bulk keeps the shared anisotropy."""
    vals, vecs = np.linalg.eigh((within + within.T) / 2)
    keep = vals > edge
    v = vecs[:, keep]
    spikes = (v * adaptive.spike_shrink(vals[keep], edge)) @ v.T
    out = np.eye(len(vals)) - v @ v.T
    return spikes + out @ pooled @ out


def pooled_rank(within: np.ndarray, pooled: np.ndarray, edge: float
                ) -> np.ndarray:
    """The class's own block inside the top r eigenvectors of the pooled
    matrix, r = how many of its eigenvalues clear the class's noise edge;
    the pooled matrix elsewhere (a subspace branch without W)."""
    vals, vecs = adaptive.eigen(pooled)
    u = vecs[:, :int(np.sum(vals > edge))]
    inside = u @ (u.T @ within @ u) @ u.T
    out = np.eye(len(vals)) - u @ u.T
    return inside + out @ pooled @ out


def js_weight(deviation: np.ndarray, sigma: float, n: float) -> float:
    """lambda = clip(v / ||D||_F^2, 0, 1) for a class block's deviation D
    from the shared block, v = ``class_deviations.noise_energy`` of an r x r block
    at the class matrix's sigma and noisy count (an r x r block of the
    isometric noise is an r x r release, see ``symmetric_noise``): the
    James-Stein plug-in of ``class_deviations.shrinkage_weights`` with the shared
    block's weight w_c taken as 0 (it comes from the global matrix).
    Post-processing: released matrices, DP counts, the ledger's sigma."""
    energy = float(np.sum(deviation * deviation))
    v = class_deviations.noise_energy(sigma, n, deviation.shape[0])
    return 1.0 if energy <= 0 else float(np.clip(v / energy, 0.0, 1.0))


def js_block(block: np.ndarray, shared_vals: np.ndarray, sigma: float,
             n: float) -> np.ndarray:
    """The "subspace+js" branch's class block: shared + (1 - lambda)
    (block - shared), shared = diag(W's top eigenvalues) (the basis is W's
    top eigenvectors), lambda = ``js_weight``: near 1 where the class's
    block differs from the shared one by no more than its noise."""
    shared = np.diag(shared_vals)
    dev = (block + block.T) / 2 - shared
    return shared + (1.0 - js_weight(dev, sigma, n)) * dev


def branch_mixtures(rel: Release, branch: str) -> dict:
    """One Gaussian per class for ``branch`` (BRANCHES, "subspace@<r>":
    the subspace branch with class rank r instead of the rule's, or
    "subspace@risk[w][c]": ranks from ``chosen_ranks``)."""
    d = rel.within.shape[0]
    floor = adaptive.variance_floor(rel.cfg, d)
    labels = list(rel.cfg.labels)
    if branch.startswith("subspace"):
        models = {}
        out = {}
        for i, (c, rank) in enumerate(zip(labels, branch_ranks(rel, branch))):
            if rank not in models:
                models[rank] = adaptive.shared_model(
                    rel.within, rank, rel.structure.shared_rank, floor)
            sm = models[rank]
            block = sm.basis.T @ rel.classes[i] @ sm.basis
            if branch.startswith("subspace+js"):
                block = js_block(block, sm.vals[:rank], rel.sigma_class,
                                 float(rel.n[i]))
            out[c] = postprocess._mixture(
                c, rel.noisy_n[i], rel.means[i], sm.residual,
                adaptive.class_factors(sm, block), rel.centre)
        return out
    if branch == "shared":
        withins = [rel.within] * len(labels)
    elif branch == "raw":
        withins = rel.classes
    elif branch in ("spiked+pooled", "rank+pooled"):
        pooled = class_deviations.pooled_within(rel.classes, rel.n)
        post = spiked_pooled if branch == "spiked+pooled" else pooled_rank
        withins = [post(c, pooled, adaptive.noise_edge(
            rel.sigma_class, float(rel.n[i]), d))
            for i, c in enumerate(rel.classes)]
    elif branch == "spiked":
        withins = [adaptive.spiked_within(c, adaptive.noise_edge(
            rel.sigma_class, float(rel.n[i]), d))
            for i, c in enumerate(rel.classes)]
    else:
        raise ValueError(f"unknown branch {branch!r}")
    return {c: adaptive.within_mixture(c, withins[i], rel.noisy_n[i],
                                       rel.means[i], rel.centre,
                                       rel.structure, rel.cfg)
            for i, c in enumerate(labels)}


def synthetic_rows(rel: Release, branch: str) -> list[np.ndarray]:
    """Each class's synthetic rows for ``branch``; "union:<a>+<b>" draws
    half of them from branch a's mixture and half from b's (independent
    streams), so the rows' covariance is the two branches' average."""
    if not branch.startswith("union:"):
        mixes = branch_mixtures(rel, branch)
        return [generator.sample(mixes[c], rel.cfg) for c in rel.cfg.labels]
    parts = []
    for j, b in enumerate(branch[len("union:"):].split("+")):
        cfg = dataclasses.replace(rel.cfg, seed=rel.cfg.seed + 7919 * j)
        mixes = branch_mixtures(rel, b)
        parts.append([generator.sample(mixes[c], cfg, oversample=0.5)
                      for c in rel.cfg.labels])
    return [np.vstack(rows) for rows in zip(*parts)]


def probe(split, rel: Release, branch: str) -> float:
    from benchmarks.studies import fast_probe
    xs = synthetic_rows(rel, branch)
    ys = [np.full(len(x), i) for i, x in enumerate(xs)]
    return fast_probe.accuracy(np.vstack(xs), np.concatenate(ys),
                               split.x_val, split.y_val, split.classes,
                               warm=f"{split.name}/hybrid")


def measure(names, epsilons, seeds, share: float,
            branches: tuple = BRANCHES) -> None:
    done = {(r["shape"], r["epsilon"], r["seed"], r["share"], r["branch"])
            for r in sweep.load_log(LOG)}
    for name in names:
        split = sweep.load_shape(name)
        for eps in epsilons:
            for seed in seeds:
                todo = [b for b in branches
                        if (name, eps, seed, share, b) not in done]
                if not todo:
                    continue
                rel = release(split, eps, seed, share)
                stat = round(excess(rel), 4)
                for b in todo:
                    t = time.time()
                    rec = {"shape": name, "epsilon": eps, "seed": seed,
                           "share": share, "branch": b,
                           "accuracy": probe(split, rel, b),
                           "excess": stat,
                           "seconds": round(time.time() - t, 1)}
                    if "@risk" in b:
                        rec["ranks"] = branch_ranks(rel, b)
                    append_record(LOG, rec)


def hybrid_cells(records: list[dict], share: float) -> dict:
    """(set, epsilon) -> ({branch: 3-seed mean %}, mean excess), for the
    cells with every branch on the same 3 seeds."""
    acc: dict = defaultdict(lambda: defaultdict(dict))
    stat: dict = defaultdict(list)
    for r in records:
        if r["share"] == share and r["branch"] in BRANCHES:
            key = (r["shape"], float(r["epsilon"]))
            acc[key][r["branch"]][r["seed"]] = 100 * r["accuracy"]
            stat[key].append(r["excess"])
    out = {}
    for key, by in acc.items():
        if len(by) == len(BRANCHES) and all(len(v) >= 3 for v in by.values()):
            out[key] = ({b: float(np.mean(list(by[b].values())))
                         for b in BRANCHES}, float(np.mean(stat[key])))
    return out


def best_threshold(cells: dict, best_menu: dict):
    """The selector "raw if excess >= t, else subspace" with the t (one of
    the cells' own excess values, or above all) that maximises the mean
    gap to the best menu structure, fitted on the cells themselves (an
    optimistic bound): (t, mean gap, worst gap), None without cells."""
    if not cells:
        return None
    options = sorted({stat for _, stat in cells.values()}) + [math.inf]
    result = None
    for t in options:
        gaps = [(b["raw"] if stat >= t else b["subspace"]) - best_menu[k]
                for k, (b, stat) in cells.items()]
        if result is None or np.mean(gaps) > result[1]:
            result = (t, float(np.mean(gaps)), float(min(gaps)))
    return result


def fixed_rank(branch: str) -> bool:
    """True for "subspace@<r>" with a number r (not a rank from the
    release, "subspace@risk...")."""
    return branch.startswith("subspace@") and branch.split("@")[1].isdigit()


def in_family(branch: str) -> bool:
    """The share x rank family: the shared branch and fixed ranks."""
    return branch == "shared" or fixed_rank(branch)


def rank_rows(records: list[dict], share: float) -> list[str]:
    """Table rows of the subspace@<r> branches' 3-seed means per cell."""
    acc: dict = defaultdict(lambda: defaultdict(dict))
    for r in records:
        if r["share"] == share and fixed_rank(r["branch"]):
            key = (r["shape"], float(r["epsilon"]))
            acc[key][int(r["branch"].split("@")[1])][r["seed"]] = \
                100 * r["accuracy"]
    rows = []
    for (shape, eps), by in sorted(acc.items()):
        ranks = [f"{r}: {np.mean(list(v.values())):.2f}"
                 for r, v in sorted(by.items()) if len(v) >= 3]
        if ranks:
            rows.append(f"| {shape} | {eps:g} | {', '.join(ranks)} |")
    return rows


def risk_rows(records: list[dict], share: float) -> list[str]:
    """Table rows of the subspace@risk* branches: 3-seed mean and the
    median of the ranks they chose (every class, every seed)."""
    acc: dict = defaultdict(lambda: defaultdict(dict))
    ranks: dict = defaultdict(list)
    for r in records:
        if r["share"] == share and "@risk" in r["branch"]:
            key = (r["shape"], float(r["epsilon"]))
            acc[key][r["branch"]][r["seed"]] = 100 * r["accuracy"]
            ranks[key, r["branch"]] += r["ranks"]
    rows = []
    for (shape, eps), by in sorted(acc.items()):
        cells = [f"{b}: {np.mean(list(v.values())):.2f} (median rank "
                 f"{np.median(ranks[(shape, eps), b]):g})"
                 for b, v in sorted(by.items()) if len(v) >= 3]
        if cells:
            rows.append(f"| {shape} | {eps:g} | {', '.join(cells)} |")
    return rows


def branch_gaps(records: list[dict], share: float, best: dict) -> dict:
    """branch -> {(set, epsilon): its 3-seed mean minus the best menu
    structure's}, over the cells where the branch has 3 seeds."""
    acc: dict = defaultdict(lambda: defaultdict(dict))
    for r in records:
        if r["share"] == share:
            key = (r["shape"], float(r["epsilon"]))
            acc[r["branch"]][key][r["seed"]] = 100 * r["accuracy"]
    return {b: {k: float(np.mean(list(v.values()))) - best[k]
                for k, v in cells.items() if len(v) >= 3 and k in best}
            for b, cells in acc.items()}


def gap_rows(records: list[dict], share: float, best: dict) -> list[str]:
    """One row per branch at ``share``: cells, mean and worst gap to the
    best menu structure, cells within the goal's tolerance."""
    rows = []
    def order(b: str) -> tuple:
        tag = b.split("@")[-1]
        return (b.split("@")[0], int(tag) if tag.isdigit() else 1 << 30, b)

    for b, gaps in sorted(branch_gaps(records, share, best).items(),
                          key=lambda kv: order(kv[0])):
        if gaps:
            g = np.array(list(gaps.values()))
            rows.append(f"| {share:g} | {b} | {len(g)} | {g.mean():+.2f} | "
                        f"{g.min():+.2f} | "
                        f"{int(np.sum(g >= -goal_noise.TOLERANCE))} |")
    return rows


def family_means(records: list[dict]) -> dict:
    """(set, epsilon) -> {(share, branch): 3-seed mean %} for the shared
    branch and the subspace branch at fixed ranks, every share."""
    acc: dict = defaultdict(lambda: defaultdict(dict))
    for r in records:
        if in_family(r["branch"]):
            acc[(r["shape"], float(r["epsilon"]))][r["share"], r["branch"]][
                r["seed"]] = 100 * r["accuracy"]
    return {k: {c: float(np.mean(list(v.values())))
                for c, v in by.items() if len(v) >= 3}
            for k, by in acc.items()}


def held_out_pick(cells: dict, best: dict, dims: dict, key: tuple):
    """The (share, branch) a public rule on (d, epsilon) would pick for
    ``key``'s set: the best mean gap over the OTHER sets of the same d at
    the same epsilon (leave one set out); None without such sets."""
    others = [k for k in cells if k[1] == key[1] and k[0] != key[0]
              and dims[k[0]] == dims[key[0]] and k in best]
    if not others:
        return None
    shared = set(cells[key]).intersection(*(cells[k] for k in others))
    if not shared:
        return None
    return max(sorted(shared), key=lambda c: np.mean(
        [cells[k][c] - best[k] for k in others]))


def family_rows(records: list[dict], best: dict, dims: dict) -> list[str]:
    """Per cell: the in-sample best (share, branch) of the family and a
    leave-one-set-out pick on public (d, epsilon), both against the best
    menu structure; then their summaries."""
    cells = {k: v for k, v in family_means(records).items()
             if k in best and v}
    rows, oracle, held = [], [], []
    for key in sorted(cells):
        by = cells[key]
        top = max(sorted(by), key=by.get)
        pick = held_out_pick(cells, best, dims, key)
        oracle.append(by[top] - best[key])
        cell = (f"| {key[0]} | {key[1]:g} | {len(by)} | {top[0]:g} / "
                f"{top[1]} | {by[top] - best[key]:+.2f} | ")
        if pick is None:
            rows.append(cell + "- | - |")
            continue
        held.append(by[pick] - best[key])
        rows.append(cell + f"{pick[0]:g} / {pick[1]} | "
                    f"{by[pick] - best[key]:+.2f} |")
    for name, g in (("in-sample best per cell", oracle),
                    ("leave-one-set-out pick on (d, eps)", held)):
        if g:
            g = np.array(g)
            rows.append(f"| {name} | | {len(g)} cells | | mean "
                        f"{g.mean():+.2f}, worst {g.min():+.2f} | | within "
                        f"{goal_noise.TOLERANCE}: "
                        f"{int(np.sum(g >= -goal_noise.TOLERANCE))} |")
    return rows


def seed_means(by_seed: dict, seeds: tuple) -> Optional[float]:
    if not all(s in by_seed for s in seeds):
        return None
    return float(np.mean([by_seed[s] for s in seeds]))


def fresh_options(shape: str, menu_runs: list[dict],
                  hybrid_runs: list[dict]) -> dict:
    """epsilon -> {option: {seed: accuracy %}} for one set, every seed:
    the menu structures (``menu_runs``: covariance_sweep's log and its
    fresh log), DEFAULT (the rule's pick from each run's public inputs)
    and the family's options ("<share>/<branch>", ``in_family``)."""
    acc: dict = defaultdict(lambda: defaultdict(dict))
    mine = [r for r in menu_runs if r.get("shape") == shape
            and r.get("mode") in goal_noise.MENU]
    for r in mine:
        acc[float(r["epsilon"])][r["mode"]][r["seed"]] = 100 * r["accuracy"]
    for r in mine:
        if r["mode"] == "shared":
            eps = float(r["epsilon"])
            pick = acc[eps][sweep.rule_mode(r)]
            if r["seed"] in pick:
                acc[eps][DEFAULT][r["seed"]] = pick[r["seed"]]
    for r in hybrid_runs:
        if r["shape"] == shape and in_family(r["branch"]):
            acc[float(r["epsilon"])][f"{r['share']:g}/{r['branch']}"][
                r["seed"]] = 100 * r["accuracy"]
    return acc


def confirm_rows(shapes, fresh: tuple) -> list[str]:
    """Fresh seeds: per set and epsilon, the menu structure and the
    family option with the best mean on FIT_SEEDS, each scored on the
    ``fresh`` seeds against the best menu structure's fresh mean (an
    honest score for a pick made on noisy means); then the summaries."""
    rows, gaps = [], defaultdict(list)
    menu_runs = sweep.load_log() + sweep.load_log(sweep.FRESH_LOG)
    hybrid_runs = sweep.load_log(LOG)
    for shape in shapes:
        for eps, by in sorted(fresh_options(shape, menu_runs,
                                            hybrid_runs).items()):
            fit = {o: seed_means(v, FIT_SEEDS) for o, v in by.items()}
            new = {o: seed_means(v, fresh) for o, v in by.items()}
            opts = [o for o in by if fit[o] is not None
                    and new[o] is not None]
            menu = [o for o in opts if o in goal_noise.MENU]
            family = [o for o in opts
                      if o not in goal_noise.MENU and o != DEFAULT]
            if len(menu) < len(goal_noise.MENU) or not family:
                continue
            top = max(new[o] for o in menu)
            top_fit = max(fit[o] for o in menu)
            pick_menu = max(menu, key=fit.get)
            pick = max(family, key=fit.get)
            gaps["menu"].append(new[pick_menu] - top)
            gaps["family"].append(new[pick] - top)
            rule = new.get(DEFAULT)
            if rule is not None:
                gaps[DEFAULT].append(rule - top)
            rows.append(f"| {shape} | {eps:g} | {len(family)} | "
                        f"{max(menu, key=new.get)} {top:.2f} | "
                        + ("-" if rule is None else f"{rule - top:+.2f}")
                        + " | "
                        f"{pick_menu}: {new[pick_menu] - top:+.2f} | "
                        f"{pick}: {fit[pick] - top_fit:+.2f} / "
                        f"{new[pick] - top:+.2f} |")
    for name, label in ((DEFAULT, "the current default"),
                        ("menu", "the best menu structure of seeds 0-2"),
                        ("family", "the best family option of seeds 0-2")):
        if gaps[name]:
            g = np.array(gaps[name])
            rows.append(f"| {label} | | {len(g)} cells | | | | mean "
                        f"{g.mean():+.2f}, worst {g.min():+.2f}, within "
                        f"{goal_noise.TOLERANCE}: "
                        f"{int(np.sum(g >= -goal_noise.TOLERANCE))} |")
    return rows


def fit_records() -> list[dict]:
    """The log's runs on the 3 seeds every table compares (FIT_SEEDS);
    later seeds only confirm (``confirm_rows``)."""
    return [r for r in sweep.load_log(LOG) if r["seed"] in FIT_SEEDS]


def report(share: float = 0.5) -> str:
    sweep_log = sweep.load_log()
    menu = goal_noise.menu_cells(sweep_log)
    records = fit_records()
    mine = hybrid_cells(records, share)
    head = ("| set | eps | " + " | ".join(MENU_NAMES)
            + " | hybrid " + " | hybrid ".join(BRANCHES)
            + " | best hybrid - best menu | excess |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    gaps = []
    for key in sorted(set(menu) & set(mine)):
        means = menu[key].mean(axis=1)
        branches, stat = mine[key]
        gap = max(branches.values()) - means.max()
        gaps.append(gap)
        lines.append(f"| {key[0]} | {key[1]:g} | "
                     + " | ".join(f"{m:.2f}" for m in means) + " | "
                     + " | ".join(f"{branches[b]:.2f}" for b in BRANCHES)
                     + f" | {gap:+.2f} | {stat:.4f} |")
    if gaps:
        lines.append("")
        lines.append(f"Share a = {share:g}, {len(gaps)} cells: the best "
                     f"hybrid branch (an oracle's pick) minus the best menu "
                     f"structure is {np.mean(gaps):+.2f} points on average, "
                     f"{min(gaps):+.2f} at worst; within "
                     f"{goal_noise.TOLERANCE} on "
                     f"{sum(g >= -goal_noise.TOLERANCE for g in gaps)}.")
        rule = best_threshold({k: mine[k] for k in menu if k in mine},
                              {k: menu[k].mean(axis=1).max() for k in menu})
        t, mean_gap, worst = rule
        lines.append("")
        lines.append(f"Best in-sample selector of the form \"raw if excess "
                     f">= t, else subspace\": t = {t:.4f}, gap "
                     f"{mean_gap:+.2f} on average, {worst:+.2f} at worst "
                     f"(t = inf: always the subspace branch).")
    ranks = rank_rows(records, share)
    if ranks:
        lines += ["", "The subspace branch at other class ranks "
                  "(``--ranks``; the rule's rank, min(128, d // 6), is the "
                  "hybrid subspace column above):", "",
                  "| set | eps | rank: 3-seed mean |", "|---|---|---|"] + ranks
    risks = risk_rows(records, share)
    if risks:
        lines += ["", "Class ranks chosen from the release "
                  "(``rank_gains``: the estimated Frobenius gain):", "",
                  "| set | eps | branch: 3-seed mean (median rank) |",
                  "|---|---|---|"] + risks
    best = {k: float(v.mean(axis=1).max()) for k, v in menu.items()}
    rows = [r for a in sorted({r["share"] for r in records})
            for r in gap_rows(records, a, best)]
    lines += ["", "Every branch against the best menu structure (3-seed "
              "means; share 0.01: the class matrices at about the per-class "
              "mode's sigma, x 1.005):", "",
              "| share | branch | cells | mean gap | worst gap | within "
              f"{goal_noise.TOLERANCE} |", "|---|---|---|---|---|---|"] + rows
    dims = {r["shape"]: r["d"] for r in sweep_log if "d" in r}
    lines += ["", "The global matrix's share and the class rank together "
              "(the shared branch and subspace@<r> at every share measured; "
              "columns: options with 3 seeds, the in-sample best share / "
              "branch and its gap, then the pick of a public rule on (d, "
              "eps) fitted on the other sets of the same d, and its gap):",
              "", "| set | eps | options | best share / branch | gap | "
              "held-out pick | gap |", "|---|---|---|---|---|---|---|"
              ] + family_rows(records, best, dims)
    confirm = confirm_rows(goal_noise.SETS, CONFIRM_SEEDS)
    if confirm:
        lines += ["", "Fresh seeds (3-5; the menu's from covariance_sweep_fresh.jsonl): "
                  "per cell, the best menu structure on seeds 3-5, the current "
                  "default (the rule's pick on each seed) against it, then the "
                  "menu structure and the family option (share / branch) "
                  "with the best mean on seeds 0-2, scored on 3-5 against "
                  "it (for the family option: its seeds 0-2 gap / its "
                  "seeds 3-5 gap; selection on noise shows as a drop):", "",
                  "| set | eps | family options | best menu, 3-5 | default "
                  "| menu pick | family pick |", "|---|---|---|---|---|---|---|"
                  ] + confirm
    return "\n".join(lines) + "\n"


NOTES = """\
## Findings (issue 61)

Six fitting sets (20 Newsgroups, its binary and 4-topic relabellings,
CIFAR-10 at 1,500 rows a class, full, and its 4 vehicle classes), eps 1-8,
3 seeds, share a = 0.5 of the covariance part for the global matrix:

* The subspace branch is the subspace mode again: its sigmas are the
  subspace mode's (tests/test_hybrid_release.py), and its means are
  close to the menu's subspace column (-0.27 to +0.51; the menu's
  per-seed sd is 0.2-0.8).
* Every other branch pays for the split. The shared branch (W at
  sigma sqrt 2, and the class modes' sum share) is 0.1 above to 0.8
  below the shared mode where that is best (20news-topics eps 1 / 2:
  -0.74 / -0.78); the raw branch is 0.38 / 0.66 below raw per-class matrices on
  full CIFAR-10 at eps 8 / 4, where those are best.
* So even an oracle that picks the best branch per cell (it knows the
  test accuracy) is -0.22 points from the best menu structure on average
  and -0.75 at worst, within 0.3 on 14 of 24 cells. The current rule
  (covariance_rule_issue53.md), which needs no test accuracy, is -0.29
  on average and -1.05 at worst, also within 0.3 on 14: the split costs
  about what perfect selection would gain.
* The released statistics do not tell the cells apart. The one cell
  where class matrices win clearly (full CIFAR-10, eps 8: raw 78.36
  against the subspace branch's 77.13) has an excess of 0.096; cells
  where they lose or tie have 0.10 (vehicles, eps 2), 0.12 (binary, eps
  4), 0.27 (topics, eps 8), 0.37 (binary, eps 8) and 1.11 (vehicles, eps
  8). The best threshold on it, fitted on these very cells, is "never
  raw": the subspace branch everywhere (-0.30 on average, -1.61 at
  worst).

With goal_noise_issue61.md (an oracle selector over the four menu
structures misses the goal too), this closes the selection route: the
issue's goal needs a covariance estimator that is better than each menu
structure where that structure is best. Shrunk class matrices
(shrunk_issue61.md), paid selection (paid_selection.md), heterogeneity
thresholds (heterogeneity_signal.md) and this hybrid release are not.
Nothing in the product changed.

The class rank (``--ranks``, every set and eps, 3 seeds, the same
releases). How many directions a class keeps of its own moves the probe
most on full CIFAR-10, where the best rank grows with eps: 256 at eps 1
and 2 (+0.06 / +0.73 over the best menu structure), 384 at eps 4
(+0.03), 512 at eps 8 (-0.36; raw per-class matrices at the full budget
stay best there). Elsewhere the curve is flat within the seeds' spread
around the rule's rank: 32-96 on 20 Newsgroups (64 within 0.3 of the
best rank at every eps), 64-192 on CIFAR-10 1.5k, 64-384 on the vehicles
and 16-256 on the text relabellings (neighbouring ranks mostly within
the seeds' spread); on those relabellings no rank reaches shared at eps
1 and 2 (-0.43 / -0.55 binary, -0.41 / -0.55 topics). Even the best rank
per cell, picked in-sample from 8-9 ranks (a bias in its favour), is
-0.08 below the best menu structure on average and -0.55 at worst,
within 0.3 on 18 of 24. Fixed rank 64 everywhere: -0.25 on average,
-1.29 at worst (full CIFAR-10, eps 8), within 0.3 on 15 of 24 (the
rule's rank: -0.30, 14).

A rank chosen from the release (``rank_gains``: each class's own block
replaces W's in the top r x r corner of W's eigenbasis where that lowers
the estimated squared Frobenius error, an unbiased estimate from the
released matrices and the ledger's sigma, tested) does not track the
probe: -0.37 on average, 11 of 24 within 0.3. It keeps 0-12 directions on
20 Newsgroups (rank 64 is best there) and 24-114 on full CIFAR-10 (256-512
best). Per-class ranks (riskc) and the error in W-whitened units (riskw)
do no better (-0.42 / -0.43); per-class whitened ranks lose up to 15
points (cifar10-sub, eps 1). Like the James-Stein weight of
shrunk_issue61.md, a Frobenius risk of the class matrix is not the
probe's objective: the probe gains from class directions whose
Frobenius error says they are noise.

Combining instead of choosing: half the rows from one branch and half
from another (``union:a+b``, whose rows' covariance is the two branches'
average) is -0.36 to -0.72 below the best menu structure on average over
the 12 text cells, no better than the subspace branch alone there
(-0.32), and class matrices whose bulk below the noise edge is the
pooled matrix instead of a flat mean (``spiked+pooled``,
``rank+pooled``, at about the per-class mode's sigma, share 0.01) are
above spiked ones from the same releases on average (-0.60 against -0.83
to the best menu structure over 24 cells; up to 1.0 better on 20
Newsgroups and CIFAR-10 1.5k, up to 0.86 worse on the binary
relabelling, and -0.83 against -0.47 on full CIFAR-10 at eps 8) and
below the best menu structure on all but two cells (within 0.3 on 6 of
24); the pooled-rank form, -0.98.

So, for the next estimator: the rank is the lever, its best value grows
with the class's signal on CIFAR-10 and not on the 384-d text sets, and
neither a Frobenius risk nor any fixed rank reaches the goal; nothing
measured here beats the best menu structure on average, and the issue's
goal asks for that (goal_noise_issue61.md: the best of four 3-seed means
is itself biased up by the seeds' spread). Nothing in the product
changed.

The global matrix's share as a second knob (stop 67; ``--share 0.25 /
0.75 / 0.9``, the shared branch and subspace@<r>, 16-19 options a
cell). Picked per cell on the very seeds it is scored on, the best
option is +0.03 above the best menu structure on average (22 of 24
within 0.3); a public rule on (d, eps) that takes, for each set, the
option best on the other sets of the same d is -0.31 (12 of 24), no
better than the current rule (-0.29). So the in-sample figure is the
seeds' noise, selected.

Fresh seeds (3-5 for every menu structure and the options above; the
menu runs are covariance_sweep's product path, kept apart in
covariance_sweep_fresh.jsonl so every fit and table on the sweep's log
stays on seeds 0-2) say the same, and
where the one real lever is:
* the current default, scored on seeds 3-5 against the best of the four
  structures there: -0.27 on average, -1.22 at worst (20 Newsgroups, eps
  8), within 0.3 on 15 of 24 (on seeds 0-2: -0.29, 14);
* the menu structure best on seeds 0-2 (an oracle selector with 3
  seeds of hindsight): -0.08, 21 of 24; the best family option of seeds
  0-2: -0.10, 18 of 24. On the text sets its in-sample edge vanishes
  (20 Newsgroups eps 1: +0.01 on seeds 0-2, -1.06 on 3-5);
* full CIFAR-10 is the exception: the ranks seeds 0-2 pick (256, 256,
  384, 512 at eps 1, 2, 4, 8) score +0.21, +0.27, +0.13, -0.23 on seeds
  3-5, where the default scores -0.42, -0.61, -0.27, -0.09. On
  CIFAR-10 1.5k the default (shared at every eps there) is -0.71 / -0.69
  at eps 4 / 8, where the subspace mode is best on both seed sets.

So the goal as written (above the best of four 3-seed means on average)
is below what 3 seeds resolve: even the oracle selector with hindsight
is below it on fresh seeds. What the fresh seeds do resolve is a gain
for the default of about 0.3-0.9 points where it now picks shared or
spiked and a class subspace of a larger rank wins (full CIFAR-10 eps
1-2, CIFAR-10 1.5k eps 4-8, 20 Newsgroups eps 8). Taking it needs the
subspace mode's threshold and a rank that grows with the class signal,
refitted on the issue-30 simulated sweep, whose shapes lose up to 10
points to a class subspace at low signal. (The class sums' share is not
what the text relabellings lack: the subspace mode with the shared
mode's split, covariance_sweep's "subspace+ss", gets the same share and
the same accuracy on every binary and 4-topic cell; on 20 Newsgroups it
is -0.32 / -0.47 / -0.25 / -0.40 against the subspace mode's -0.60 /
-0.29 / 0.00 / 0.00 at eps 1 / 2 / 4 / 8.) Nothing in the product changed.

Shrinking the subspace branch's class blocks instead of choosing (stop
68, ``subspace+js``: each class's r x r block becomes the shared block
plus (1 - lambda) of its deviation, lambda = ``js_weight``, the
James-Stein plug-in from the block's noise energy at the ledger's sigma;
share 0.5, seeds 0-2, the same releases as the subspace branch). On the
24 fitting cells it is -0.40 below the best menu structure on average
(the plain subspace branch: -0.30), above that branch on 11 cells and
below it on 13; on four simulated shapes where the subspace mode loses
to shared (k16-n1000-d384-class / -shared, k30-n300-d128-t,
k10-n2000-d256-t-unequal, 16 cells) it recovers a third of that loss
(-3.18 against the subspace branch's -4.85; shared is best on all 16).
So the noise the weight removes is part of what the probe gains from on
the real sets, and what remains on the simulated ones is far from the
shared mode: shrinkage is not the interpolation the rule needs. The
public thresholds cannot trade it either (rule_frontier_issue61.md: the
best of 96 rules moves the fitting sets' fresh-seed gap from -0.27 to
-0.17 and takes the simulated cells more than 0.5 below their best from
32 to 55). Nothing in the product changed.
"""


def branch_list(ranks: str, branches: str) -> tuple:
    """The branches a run measures: ``--branches`` as given, else the
    subspace branch at each of ``--ranks``, else BRANCHES."""
    if branches:
        return tuple(branches.split(","))
    if ranks:
        return tuple(f"subspace@{r}" for r in ranks.split(","))
    return BRANCHES


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="20news")
    ap.add_argument("--epsilons", default="1,2,4,8")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--share", type=float, default=0.5,
                    help="the global matrix's share of the covariance part")
    ap.add_argument("--ranks", default="",
                    help="comma-separated class ranks: run only subspace "
                         "branches of these ranks (subspace@<r>)")
    ap.add_argument("--branches", default="",
                    help="comma-separated branches to run instead (e.g. "
                         "subspace@risk, union:shared+subspace)")
    ap.add_argument("--report", action="store_true")
    args = ap.parse_args()
    if args.report:
        text = ("# A global matrix beside the class matrices (issue 61)\n\n"
                "Generated by `python -m benchmarks.studies.hybrid_release "
                "--report` (linear probe, %, 3-seed means on the validation "
                "splits; menu columns: covariance_sweep.jsonl; hybrid "
                "columns: hybrid_issue61.jsonl, every branch from the same "
                "release per seed).\n\n" + report(args.share) + "\n" + NOTES)
        write_report(REPORT, text)
        return 0
    measure(args.shapes.split(","), [float(e) for e in
                                      args.epsilons.split(",")],
            [int(s) for s in args.seeds.split(",")], args.share,
            branch_list(args.ranks, args.branches))
    return 0


if __name__ == "__main__":
    sys.exit(main())
