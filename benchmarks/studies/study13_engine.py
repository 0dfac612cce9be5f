"""Exploration engine of the issue-13 utility study (numpy, DP, accounted
with the GDP identity mu^2 = sum 1/z^2 as in dp_ops/calibration.py).

One "recipe" = a budget split over the mechanisms (each a Gaussian
mechanism, add/remove one record) + a post-processing of their outputs.
Noise is drawn by SeededNoise with one key per mechanism, so recipes with
different sigmas share the same standard-normal draws (paired comparisons).
Exact aggregates per (epsilon, seed) are cached: they depend on the recipe
only through the DP centre and the clip radius.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Optional

import numpy as np

from benchmarks.studies.study_data import Split, probe
from dpsynth.dp_ops import covariance
from dpsynth.dp_ops.calibration import gdp_mu
from dpsynth.dp_ops.clipping import clip_rows, normalize_rows
from dpsynth.dp_ops.noise import SeededNoise

DELTA = 1e-5
MU_SLACK = 0.99  # dp_accounting's PLD re-check costs ~1 % of mu


@dataclasses.dataclass(frozen=True)
class Recipe:
    clip: float = 0.7
    # shares of mu^2 (each class sees all of them; they sum to 1)
    centre: float = 0.0132
    count: float = 0.02
    sum: float = 0.37
    cov_global: float = 0.5968
    cov_class: float = 0.0
    # post-processing
    shared_from: str = "global"  # global | pooled | combined
    per_class: str = "none"      # none | raw | js | fixed:<w>
    form: str = "lowrank"        # lowrank | full
    rank: int = 128
    ridge: float = 0.0           # full form: + ridge * noise edge of W
    eig_floor: float = 0.0       # full form: eigenvalues floored here (x edge)
    mean_shrink: bool = False
    inflate: float = 0.0         # + inflate * (mean noise var) * I
    ridge_trace: float = 0.0     # + ridge_trace * tr(W)/d * I (isotropic)
    pe_rounds: int = 0           # Private-Evolution rounds on top
    pe_share: float = 0.0        # of mu^2, taken from cov_global
    pe_candidates: int = 64      # per class and round
    pe_variation: float = 0.5    # variation ~ N(0, a * class covariance)
    mean_denoise: str = "none"   # none | eb (empirical Bayes, shared eigenbasis)
    subspace: int = 0            # r > 0: per-class r x r matrices in the
                                 # top-r eigen-subspace of the shared W
    dev_shrink: str = "spectral"  # raw | spectral (per-class deviation)
    exact: str = ""              # study only: noiseless parts (count,sum,cov)

    def check(self) -> None:
        total = (self.centre + self.count + self.sum + self.cov_global
                 + self.cov_class + self.pe_share)
        assert abs(total - 1) < 1e-6, total


@dataclasses.dataclass
class Exact:
    centre: np.ndarray
    counts: np.ndarray
    sums: np.ndarray
    moments: np.ndarray  # [K, d, d]


@dataclasses.dataclass
class Noisy:
    basis = None  # [d, r] shared subspace (DP post-processing) if any

    centre: np.ndarray
    counts: np.ndarray
    sums: np.ndarray
    m_global: Optional[np.ndarray]
    m_class: Optional[np.ndarray]
    sigma: dict


def mu_total(eps: float) -> float:
    return gdp_mu(eps, DELTA) * MU_SLACK


def sigma_of(share: float, mu: float, sensitivity: float) -> float:
    return sensitivity / (mu * math.sqrt(share)) if share > 0 else 0.0


class Engine:
    def __init__(self, split: Split):
        self.split = split
        self._cache: dict = {}

    def exact(self, eps: float, seed: int, r: Recipe) -> Exact:
        key = (eps, seed, r.clip, r.centre)
        if key in self._cache:
            return self._cache[key]
        self._cache.clear()  # one at a time: [K, d, d] is large
        x, y, k = self.split.x_fit, self.split.y_fit, self.split.classes
        noise = SeededNoise(1000 + seed)
        mu = mu_total(eps)
        s_sum = sigma_of(0.8 * r.centre, mu, 1.0)
        s_cnt = sigma_of(0.2 * r.centre, mu, 1.0)
        total = x.sum(axis=0) + noise.gaussian(s_sum, x.shape[1], "centre/sum")
        count = len(x) + noise.gaussian(s_cnt, 1, "centre/count")[0]
        centre = total / max(count, 1.0)
        centre *= min(1.0, 1.0 / max(np.linalg.norm(centre), 1e-300))
        xc, _ = clip_rows(x - centre, r.clip)
        d = x.shape[1]
        counts = np.zeros(k)
        sums = np.zeros((k, d))
        moments = np.zeros((k, d, d))
        for c in range(k):
            rows = xc[y == c]
            counts[c] = len(rows)
            sums[c] = rows.sum(axis=0)
            moments[c] = rows.T @ rows
        out = Exact(centre, counts, sums, moments)
        self._cache[key] = out
        return out

    def release(self, eps: float, seed: int, r: Recipe) -> Noisy:
        r.check()
        ex = self.exact(eps, seed, r)
        noise = SeededNoise(1000 + seed)
        mu = mu_total(eps)
        k, d = ex.sums.shape
        sig = {"count": sigma_of(r.count, mu, 1.0),
               "sum": sigma_of(r.sum, mu, r.clip),
               "cov_global": sigma_of(r.cov_global, mu, r.clip ** 2),
               "cov_class": sigma_of(r.cov_class, mu, r.clip ** 2)}
        if "count" in r.exact:
            sig["count"] = 0.0
        if "sum" in r.exact:
            sig["sum"] = 0.0
        if "cov" in r.exact:
            sig["cov_global"] = sig["cov_class"] = 0.0
        counts = ex.counts + np.array([noise.gaussian(sig["count"], 1, f"class={c}/count")[0]
                                       for c in range(k)])
        sums = ex.sums + np.stack([noise.gaussian(sig["sum"], d, f"class={c}/sum")
                                   for c in range(k)])
        m_global = m_class = None
        if r.cov_global > 0:
            m_global = noisy_matrix(ex.moments.sum(axis=0), sig["cov_global"],
                                    noise, "global/cov")
        basis = None
        if r.cov_class > 0 and r.subspace > 0:
            basis = shared_basis(m_global, counts, sums, r)
            m_class = np.stack([noisy_matrix(basis.T @ ex.moments[c] @ basis,
                                             sig["cov_class"], noise,
                                             f"class={c}/cov-sub")
                                for c in range(k)])
        elif r.cov_class > 0:
            m_class = np.stack([noisy_matrix(ex.moments[c], sig["cov_class"],
                                             noise, f"class={c}/cov")
                                for c in range(k)])
        out = Noisy(ex.centre, counts, sums, m_global, m_class, sig)
        out.basis = basis
        return out

    def evolve(self, xs, ys, model, noisy, eps, seed, r: Recipe):
        """PE rounds per class: candidates drawn from the current synthetic
        rows, real rows vote for their nearest candidate (histogram,
        sensitivity 1 per round, Gaussian noise from pe_share / rounds),
        the next population is drawn by noisy vote and varied with
        N(0, a * (class covariance)) noise (its factor matrix)."""
        ex = self.exact(eps, seed, r)
        mu = mu_total(eps)
        sig = sigma_of(r.pe_share / r.pe_rounds, mu, 1.0)
        noise = SeededNoise(1000 + seed)
        rng = np.random.default_rng([seed, 99])
        x, y = self.split.x_fit, self.split.y_fit
        xc, _ = clip_rows(x - ex.centre, r.clip)
        out_x, out_y = [], []
        for c in range(self.split.classes):
            real = xc[y == c]
            pop = xs[ys == c] - ex.centre  # approx. centred space
            m = len(pop)
            if m == 0:
                continue
            kind, f, diag = model["factors"][c]
            for rnd in range(r.pe_rounds):
                cand = pop[rng.choice(m, min(r.pe_candidates, m), replace=False)]
                d2 = ((real ** 2).sum(1)[:, None] - 2 * real @ cand.T
                      + (cand ** 2).sum(1)[None, :])
                votes = np.bincount(np.argmin(d2, 1), minlength=len(cand))
                votes = votes + noise.gaussian(sig, len(cand), f"class={c}/pe-{rnd}")
                w = np.maximum(votes, 0)
                if w.sum() <= 0:
                    w = np.ones(len(cand))
                pick = cand[rng.choice(len(cand), m, p=w / w.sum())]
                z = rng.standard_normal((m, f.shape[1])) @ f.T
                if diag is not None:
                    z += rng.standard_normal((m, len(diag))) * diag
                pop = pick + math.sqrt(r.pe_variation) * z
            out_x.append(normalize_rows(pop + ex.centre, "unit"))
            out_y.append(np.full(m, c))
        return np.vstack(out_x), np.concatenate(out_y)

    def run(self, eps: float, seed: int, r: Recipe) -> dict:
        t = time.time()
        noisy = self.release(eps, seed, r)
        model = (build_subspace_model(noisy, r) if r.subspace
                 else build_model(noisy, r))
        xs, ys = sample(model, noisy, seed)
        if r.pe_rounds:
            xs, ys = self.evolve(xs, ys, model, noisy, eps, seed, r)
        acc = probe(xs, ys, self.split)
        return {"accuracy": acc, "seconds": round(time.time() - t, 1),
                "info": model["info"]}


def noisy_matrix(exact: np.ndarray, sigma: float, noise: SeededNoise,
                 key: str) -> np.ndarray:
    d = exact.shape[0]
    up = covariance.upper(exact)
    up = up + noise.gaussian(sigma, up.shape, key)
    return covariance.symmetric_from_upper(up, d)


def matrix_noise_fro2(sigma: float, n: float, d: int) -> float:
    """E ||noise / n||_F^2 of a noisy second-moment matrix (isometric)."""
    return d * (d + 1) / 2 * sigma ** 2 / max(n, 1.0) ** 2


def edge(sigma: float, n: float, d: int) -> float:
    """Spectral edge of the noise of M / n: off-diagonal std sigma/sqrt2."""
    return 2 * math.sqrt(d) * sigma / math.sqrt(2) / max(n, 1.0)


def build_model(noisy: Noisy, r: Recipe) -> dict:
    k, d = noisy.sums.shape
    n = np.maximum(noisy.counts, 1.0)
    means = noisy.sums / n[:, None]
    norms = np.linalg.norm(means, axis=1, keepdims=True)
    means *= np.minimum(1.0, r.clip / np.maximum(norms, 1e-300))
    info = {}
    # shared within-class covariance
    between = sum(n[c] * np.outer(means[c], means[c]) for c in range(k))
    sources = []
    if noisy.m_global is not None and r.shared_from in ("global", "combined"):
        sources.append((noisy.m_global, noisy.sigma["cov_global"] ** 2))
    if noisy.m_class is not None and r.shared_from in ("pooled", "combined"):
        sources.append((noisy.m_class.sum(axis=0), k * noisy.sigma["cov_class"] ** 2))
    prec = [1 / max(v, 1e-30) for _, v in sources]
    m_shared = sum(p * m for p, (m, _) in zip(prec, sources)) / sum(prec)
    var_shared = 1 / sum(prec)
    total = n.sum()
    if r.mean_denoise == "eb":
        s_mean = noisy.sigma["sum"] / n
        means, info["tau_dims"] = eb_means(means, s_mean, m_shared / total, n)
    elif r.mean_denoise == "svd":
        means, info["mean_rank"] = svd_means(means, noisy.sigma["sum"] / n, n)
    shared = (m_shared - between) / total
    shared = (shared + shared.T) / 2
    sig_shared = math.sqrt(var_shared)
    covs = []
    lams = []
    for c in range(k):
        if r.per_class == "none" or noisy.m_class is None:
            covs.append(shared)
            continue
        own = noisy.m_class[c] / n[c] - np.outer(means[c], means[c])
        if r.per_class == "raw":
            lam = 1.0
        elif r.per_class.startswith("fixed:"):
            lam = float(r.per_class.split(":")[1])
        else:  # js: positive-part James-Stein towards the shared matrix
            diff2 = float(((own - shared) ** 2).sum())
            noise2 = (matrix_noise_fro2(noisy.sigma["cov_class"], n[c], d)
                      + matrix_noise_fro2(sig_shared, total, d))
            lam = max(0.0, 1.0 - noise2 / max(diff2, 1e-300))
        lams.append(lam)
        covs.append(shared + lam * (own - shared))
    info["lambda"] = [round(v, 3) for v in lams]
    floor = 1e-6 * r.clip ** 2 / d
    factors = []
    edges = []
    s2 = (noisy.sigma["sum"] / n) ** 2
    for c in range(k):
        cov = covs[c]
        if r.inflate:
            cov = cov + r.inflate * s2[c] * np.eye(d)
        if r.ridge_trace:
            cov = cov + r.ridge_trace * np.trace(covs[0]) / d * np.eye(d)
        vals, vecs = np.linalg.eigh(cov.astype(np.float32))
        vals, vecs = vals.astype(np.float64), vecs.astype(np.float64)
        if r.per_class == "none":
            e = edge(sig_shared, total, d)
        else:
            e = edge(noisy.sigma["cov_class"], n[c], d)
        edges.append(e)
        if r.form == "lowrank":
            top = np.argsort(vals)[::-1][:r.rank]
            top = top[vals[top] > 0]
            f = vecs[:, top] * np.sqrt(vals[top])
            resid = np.maximum(np.diag(cov) - (f ** 2).sum(1), floor)
            factors.append(("lowrank", f, np.sqrt(resid)))
        else:
            lam = np.maximum(vals, r.eig_floor * e) + r.ridge * e
            lam = np.maximum(lam, 0.0)
            factors.append(("full", vecs * np.sqrt(lam), None))
        if r.per_class == "none" and not r.inflate:  # shared: compute once
            # (ridge_trace uses the shared trace: same for every class)
            factors = factors * k
            edges = edges * k
            break
    info["edge"] = float(np.mean(edges))
    return {"means": means, "factors": factors, "counts": noisy.counts,
            "info": info, "centre": noisy.centre}


def class_means(noisy: Noisy, r: Recipe) -> tuple[np.ndarray, np.ndarray]:
    n = np.maximum(noisy.counts, 1.0)
    means = noisy.sums / n[:, None]
    norms = np.linalg.norm(means, axis=1, keepdims=True)
    return n, means * np.minimum(1.0, r.clip / np.maximum(norms, 1e-300))


def shared_within(m_global: np.ndarray, n: np.ndarray,
                  means: np.ndarray) -> np.ndarray:
    between = (means * n[:, None]).T @ means
    w = (m_global - between) / n.sum()
    return (w + w.T) / 2


def shared_basis(m_global, counts, sums, r: Recipe) -> np.ndarray:
    """Top-r eigenvectors of the noisy shared within-class covariance:
    post-processing of DP outputs, fixed before the per-class mechanisms."""
    noisy = Noisy(None, counts, sums, None, None, {})
    n, means = class_means(noisy, r)
    vals, vecs = np.linalg.eigh(shared_within(m_global, n, means))
    return vecs[:, np.argsort(vals)[::-1][:r.subspace]]


def spike_shrink(vals: np.ndarray, e: float) -> np.ndarray:
    """Eigenvalues of signal + symmetric Gaussian noise whose spectrum edge
    is e: outliers lambda > e come from spikes theta = (lambda +
    sqrt(lambda^2 - e^2)) / 2 (rank-one perturbation of a Wigner matrix);
    bulk eigenvalues carry no detectable signal and become 0."""
    a = np.abs(vals)
    theta = np.where(a > e, (a + np.sqrt(np.maximum(a * a - e * e, 0))) / 2, 0.0)
    return np.sign(vals) * theta


def build_subspace_model(noisy: Noisy, r: Recipe) -> dict:
    """Shared W (rank-`rank` factors + diagonal outside), with the top-r
    eigen-block replaced per class by shared block + shrunk DP deviation."""
    k, d = noisy.sums.shape
    n, means = class_means(noisy, r)
    w = shared_within(noisy.m_global, n, means)
    vals, vecs = np.linalg.eigh(w)
    order = np.argsort(vals)[::-1]
    vals, vecs = vals[order], vecs[:, order]
    p = noisy.basis  # == vecs[:, :r] up to sign (same matrix, same eigh)
    rs = r.subspace
    lam_in = vals[:rs]
    # outside the subspace: components rs..rank as factors + diagonal
    out_idx = np.arange(rs, max(r.rank, rs))
    out_idx = out_idx[vals[out_idx] > 0]
    f_out = vecs[:, out_idx] * np.sqrt(vals[out_idx])
    floor = 1e-6 * r.clip ** 2 / d
    inside_diag = (p ** 2) @ np.maximum(lam_in, 0)
    resid = np.maximum(np.diag(w) - inside_diag - (f_out ** 2).sum(1), floor)
    shared_block = p.T @ w @ p
    factors, lams = [], []
    for c in range(k):
        mc = p.T @ means[c]
        own = noisy.m_class[c] / n[c] - np.outer(mc, mc)
        dev = own - shared_block
        if r.dev_shrink == "spectral":
            e = edge(noisy.sigma["cov_class"], n[c], rs)
            dv, du = np.linalg.eigh((dev + dev.T) / 2)
            dv = spike_shrink(dv, e)
            dev = (du * dv) @ du.T
            lams.append(int((dv != 0).sum()))
        block = shared_block + dev
        bv, bu = np.linalg.eigh((block + block.T) / 2)
        f_in = p @ (bu * np.sqrt(np.maximum(bv, 0)))
        factors.append(("lowrank", np.hstack([f_in, f_out]), np.sqrt(resid)))
    info = {"spikes": lams}
    return {"means": means, "factors": factors, "counts": noisy.counts,
            "info": info, "centre": noisy.centre}


def eb_means(means: np.ndarray, s: np.ndarray, total_moment: np.ndarray,
             n: np.ndarray) -> tuple[np.ndarray, int]:
    """Empirical-Bayes shrinkage of noisy class means in the eigenbasis of
    the (noisy) total second moment: prior N(0, tau_j^2) per direction,
    tau_j^2 from the noisy means themselves (isotonic in the eigenvalue
    rank), posterior mean a * tau^2 / (tau^2 + s_c^2)."""
    from sklearn.isotonic import IsotonicRegression
    vals, vecs = np.linalg.eigh(total_moment)
    order = np.argsort(vals)[::-1]
    u = vecs[:, order]
    a = means @ u  # [K, d]
    w = n / n.sum()
    raw = (w[:, None] * (a ** 2 - s[:, None] ** 2)).sum(0)
    iso = IsotonicRegression(increasing=False).fit(np.arange(len(raw)), raw)
    tau2 = np.maximum(iso.predict(np.arange(len(raw))), 0.0)
    shrunk = a * (tau2[None, :] / (tau2[None, :] + s[:, None] ** 2))
    return shrunk @ u.T, int((tau2 > 0).sum())


def svd_means(means: np.ndarray, s: np.ndarray,
              n: np.ndarray) -> tuple[np.ndarray, int]:
    """Low-rank denoising of the K x d matrix of noisy class means: the
    deviations from their weighted average, scaled to unit noise per entry
    (row c by 1 / s_c), keep the singular values above the noise edge
    1 + sqrt(K/d) (in units of sqrt(d)), shrunk by the Frobenius-optimal
    rule of Gavish & Donoho (2017); post-processing of DP outputs."""
    w = n / n.sum()
    centre = w @ means
    y = (means - centre) / s[:, None]
    k, d = y.shape
    big = max(k, d)
    beta = min(k, d) / big
    u, sv, vt = np.linalg.svd(y, full_matrices=False)
    z = sv / math.sqrt(big)
    keep = z > 1 + math.sqrt(beta)
    eta = np.where(keep, np.sqrt(np.maximum((z * z - beta - 1) ** 2 - 4 * beta, 0))
                   / np.maximum(z, 1e-300), 0.0)
    den = (u * (eta * math.sqrt(big))) @ vt
    return centre + den * s[:, None], int(keep.sum())


def sample(model: dict, noisy: Noisy, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([seed, 77])
    xs, ys = [], []
    for c, (kind, f, diag) in enumerate(model["factors"]):
        m = int(round(max(model["counts"][c], 0)))
        if m == 0:
            continue
        z = rng.standard_normal((m, f.shape[1])).astype(np.float32) @ f.T.astype(np.float32)
        if diag is not None:
            z += rng.standard_normal((m, len(diag))) * diag
        xs.append(model["means"][c] + z + model["centre"])
        ys.append(np.full(m, c))
    return normalize_rows(np.vstack(xs), "unit"), np.concatenate(ys)
