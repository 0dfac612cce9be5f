"""Distribution metrics between real and synthetic embeddings (numpy/scipy).

These are *evaluation* tools: they read the real (private) data and their
values are NOT differentially private. Report them to the data owner, never
publish them alongside a release.

- ``frechet_distance``: ||mu_a - mu_b||^2 + Tr(S_a + S_b - 2 (S_a S_b)^1/2)
  between Gaussian fits of the two sets (the FID formula, Heusel et al. 2017).
- ``knn_precision_recall``: improved precision/recall of Kynkäänniemi et al.
  (2019): the real manifold is the union of balls around each real point with
  radius its distance to its k-th nearest real neighbour; precision is the
  share of synthetic points inside it, recall the share of real points inside
  the synthetic manifold built the same way.
- ``dcr``: distance from each query row to its closest record of a reference
  set. ``dcr_report`` compares synthetic-to-train distances with
  holdout-to-train distances: a generator that memorises its training
  records puts synthetic rows much closer to train than fresh real rows are.
"""

from __future__ import annotations

from typing import Optional

import numpy as np


def _as_2d(x: np.ndarray, name: str) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or len(x) == 0:
        raise ValueError(f"{name} must be a non-empty 2-D array, got shape "
                         f"{x.shape}")
    return x


def _same_dim(a: np.ndarray, b: np.ndarray) -> None:
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"dimension mismatch: {a.shape[1]} vs {b.shape[1]}")


def _subsample(x: np.ndarray, cap: Optional[int],
               rng: np.random.Generator) -> np.ndarray:
    if cap is None or len(x) <= cap:
        return x
    return x[np.sort(rng.choice(len(x), cap, replace=False))]


# ------------------------------------------------------------------ Fréchet

def _sqrt_psd(cov: np.ndarray) -> np.ndarray:
    from scipy import linalg  # here: `dpsynth --help` imports this module
    w, v = linalg.eigh(cov)
    return (v * np.sqrt(np.clip(w, 0.0, None))) @ v.T


def frechet_from_moments(mu_a: np.ndarray, cov_a: np.ndarray,
                         mu_b: np.ndarray, cov_b: np.ndarray) -> float:
    """Fréchet (2-Wasserstein squared) distance between two Gaussians.

    Tr((S_a S_b)^1/2) is computed as the sum of square roots of the
    eigenvalues of the symmetric PSD matrix S_a^1/2 S_b S_a^1/2 (same
    spectrum as S_a S_b), which is stable where ``sqrtm`` of the product
    returns complex noise.
    """
    from scipy import linalg
    root_a = _sqrt_psd(cov_a)
    middle = root_a @ cov_b @ root_a
    eig = linalg.eigvalsh((middle + middle.T) / 2)
    tr_sqrt = float(np.sqrt(np.clip(eig, 0.0, None)).sum())
    diff = np.asarray(mu_a) - np.asarray(mu_b)
    value = float(diff @ diff + np.trace(cov_a) + np.trace(cov_b)
                  - 2.0 * tr_sqrt)
    return max(value, 0.0)


def frechet_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Fréchet distance between Gaussian fits of row sets ``a`` and ``b``."""
    a, b = _as_2d(a, "a"), _as_2d(b, "b")
    _same_dim(a, b)
    if len(a) < 2 or len(b) < 2:
        raise ValueError("Fréchet distance needs at least 2 rows per set")
    return frechet_from_moments(a.mean(0), np.cov(a, rowvar=False),
                                b.mean(0), np.cov(b, rowvar=False))


# ---------------------------------------------------------- distances, k-NN

def _sq_norms(x: np.ndarray) -> np.ndarray:
    return np.einsum("ij,ij->i", x, x)


def pairwise_sq_distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """||a_i - b_j||^2 [len(a), len(b)], clipped at 0 (rounding)."""
    d2 = _sq_norms(a)[:, None] + _sq_norms(b)[None, :] - 2.0 * (a @ b.T)
    return np.maximum(d2, 0.0)


def nearest_distances(query: np.ndarray, ref: np.ndarray, k: int = 1,
                      exclude_self: bool = False,
                      chunk: int = 2048) -> np.ndarray:
    """Distance from each query row to its k-th nearest row of ``ref``.

    ``exclude_self``: query and ref are the same set; a row is not its own
    neighbour (the diagonal is skipped, duplicates elsewhere still count).
    """
    query, ref = _as_2d(query, "query"), _as_2d(ref, "reference")
    _same_dim(query, ref)
    limit = len(ref) - (1 if exclude_self else 0)
    if not 1 <= k <= limit:
        raise ValueError(f"k={k} needs at least {k + exclude_self} reference rows"
                         f", got {len(ref)}")
    out = np.empty(len(query))
    for start in range(0, len(query), chunk):
        d2 = pairwise_sq_distances(query[start:start + chunk], ref)
        if exclude_self:
            rows = np.arange(d2.shape[0])
            d2[rows, start + rows] = np.inf
        out[start:start + chunk] = np.partition(d2, k - 1, axis=1)[:, k - 1]
    return np.sqrt(out)


def _coverage(points: np.ndarray, centres: np.ndarray, radii: np.ndarray,
              chunk: int = 2048) -> float:
    """Share of ``points`` inside at least one ball (centres, radii)."""
    inside = np.zeros(len(points), dtype=bool)
    r2 = radii ** 2
    for start in range(0, len(points), chunk):
        d2 = pairwise_sq_distances(points[start:start + chunk], centres)
        # Tiny relative tolerance: a copied point sits exactly on the edge.
        inside[start:start + chunk] = np.any(
            d2 <= r2[None, :] * (1 + 1e-9) + 1e-12, axis=1)
    return float(inside.mean())


def knn_precision_recall(real: np.ndarray, synthetic: np.ndarray, k: int = 3,
                         max_rows: Optional[int] = 5000,
                         seed: int = 0) -> dict[str, float]:
    """Improved precision and recall (Kynkäänniemi et al., 2019).

    Each set is subsampled to ``max_rows`` (public seed) so that the cost
    stays O(max_rows^2).
    """
    real, synthetic = _as_2d(real, "real"), _as_2d(synthetic, "synthetic")
    _same_dim(real, synthetic)
    rng = np.random.default_rng(seed)
    real = _subsample(real, max_rows, rng)
    synthetic = _subsample(synthetic, max_rows, rng)
    real_r = nearest_distances(real, real, k, exclude_self=True)
    syn_r = nearest_distances(synthetic, synthetic, k, exclude_self=True)
    return {"precision": _coverage(synthetic, real, real_r),
            "recall": _coverage(real, synthetic, syn_r),
            "k": k, "rows_real": len(real), "rows_synthetic": len(synthetic)}


# ----------------------------------------------------- memorisation (DCR)

def dcr(query: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Distance to closest record: min_j ||query_i - reference_j||."""
    return nearest_distances(query, reference, k=1)


QUANTILES = (0.01, 0.05, 0.25, 0.5)


def dcr_report(synthetic: np.ndarray, train: np.ndarray,
               holdout: np.ndarray, max_rows: Optional[int] = 5000,
               seed: int = 0) -> dict:
    """Memorisation check: synthetic->train DCR against holdout->train DCR.

    Distances go to the whole ``train`` set (capped at ``max_rows``):
    ``synthetic_to_train`` and ``holdout_to_train`` quantiles, the number of
    exact copies, and ``share_below_holdout_p05``: the share of synthetic
    rows closer to train than the 5th percentile of holdout->train distances
    (0.05 expected when the generator does not copy; 1 for copies).
    ``share_closer_to_train``: with train subsampled to the holdout size, the
    share of synthetic rows nearer to that train subsample than to the
    holdout; 0.5 expected, 1 only if every copied record was subsampled (it
    is diluted by holdout/train size: read it with the other two).
    """
    synthetic = _as_2d(synthetic, "synthetic")
    train, holdout = _as_2d(train, "train"), _as_2d(holdout, "holdout")
    _same_dim(synthetic, train)
    _same_dim(holdout, train)
    rng = np.random.default_rng(seed)
    train = _subsample(train, max_rows, rng)
    holdout = _subsample(holdout, max_rows, rng)
    synthetic = _subsample(synthetic, max_rows, rng)
    syn_train = dcr(synthetic, train)
    hold_train = dcr(holdout, train)
    p05 = float(np.quantile(hold_train, 0.05))
    # Equal sizes for the closer-to-which comparison.
    size = min(len(train), len(holdout))
    syn_sub_train = dcr(synthetic, _subsample(train, size, rng))
    syn_hold = dcr(synthetic, _subsample(holdout, size, rng))
    return {
        "synthetic_to_train": _quantiles(syn_train),
        "holdout_to_train": _quantiles(hold_train),
        "share_closer_to_train": float(np.mean(syn_sub_train < syn_hold)
                                       + 0.5 * np.mean(syn_sub_train == syn_hold)),
        "share_below_holdout_p05": float(np.mean(syn_train < p05)),
        # Distances come from the ||a||^2 + ||b||^2 - 2ab expansion, whose
        # rounding leaves ~1e-7 x the norm on exact copies.
        "exact_copies": int(np.sum(syn_train <= 1e-6 * _scale(train))),
        "rows": {"synthetic": len(synthetic), "train": len(train),
                 "holdout": len(holdout)},
    }


def _scale(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(_sq_norms(x)))) or 1.0


def _quantiles(values: np.ndarray) -> dict[str, float]:
    return {f"p{int(q * 100):02d}": float(np.quantile(values, q))
            for q in QUANTILES} | {"mean": float(values.mean())}


# ------------------------------------------------------------ per class

def per_class_report(x_real: np.ndarray, y_real: np.ndarray,
                     x_syn: np.ndarray, y_syn: np.ndarray,
                     x_holdout: np.ndarray, y_holdout: np.ndarray,
                     k: int = 3, max_rows: Optional[int] = 2000,
                     seed: int = 0) -> dict:
    """Fréchet, k-NN precision/recall and DCR, per class and averaged.

    Classes with fewer than ``k + 1`` rows in a set are reported as missing.
    """
    out, labels = {}, sorted(set(np.unique(y_real).tolist()))
    rng = np.random.default_rng(seed)
    for label in labels:
        real = _subsample(x_real[y_real == label], max_rows, rng)
        syn = _subsample(x_syn[y_syn == label], max_rows, rng)
        hold = x_holdout[y_holdout == label]
        if len(syn) < k + 1 or len(real) < k + 1:
            out[str(label)] = {"missing": f"{len(syn)} synthetic rows"}
            continue
        entry = {"frechet": frechet_distance(real, syn)}
        pr = knn_precision_recall(real, syn, k, None, seed)
        entry.update(precision=pr["precision"], recall=pr["recall"])
        if len(hold) >= 1:
            entry["dcr"] = dcr_report(syn, real, hold, max_rows, seed)
        out[str(label)] = entry
    done = [v for v in out.values() if "frechet" in v]
    mean = {key: float(np.mean([v[key] for v in done])) if done else None
            for key in ("frechet", "precision", "recall")}
    with_dcr = [v["dcr"] for v in done if "dcr" in v]
    mean["dcr_share_closer_to_train"] = (
        float(np.mean([d["share_closer_to_train"] for d in with_dcr]))
        if with_dcr else None)
    mean["dcr_share_below_holdout_p05"] = (
        float(np.mean([d["share_below_holdout_p05"] for d in with_dcr]))
        if with_dcr else None)
    mean["dcr_exact_copies"] = int(sum(d["exact_copies"] for d in with_dcr))
    return {"per_class": out, "mean": mean, "k": k, "max_rows": max_rows,
            "note": "computed on the real (private) data: NOT differentially "
                    "private; do not publish"}
