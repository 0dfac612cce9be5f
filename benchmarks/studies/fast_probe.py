"""A faster solver for the shared README's logistic probe (study use only).

The probe is StandardScaler + LogisticRegression(C) (multinomial, L2 on the
weights, intercept unpenalised) on unit-normalised rows. scikit-learn's
L-BFGS needs hundreds of iterations on 1280-d embeddings (the Hessian is
ill-conditioned: correlated features), ~2 min per fit on this shared 2-core
machine. This module minimises the SAME objective,

    (1/n) sum_i CE(z_i W + b, y_i) + ||W||^2 / (2 C n),

with L-BFGS in a preconditioned variable W = L^{-T} U, L the Cholesky factor
of a/K * Z^T Z / n + I / (C n) (a Hessian approximation from a row
subsample; the substitution changes the path, not the optimum) and float32
products. Its optimum is the probe's; benchmarks/studies/utility_study13.py checks
the two agree on both shared datasets (``--check-probe``). Final tables use
scikit-learn itself.
"""

from __future__ import annotations

import numpy as np
from scipy import linalg, optimize

from dpsynth.dp_ops.clipping import normalize_rows


def _standardize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean, std = x.mean(axis=0), x.std(axis=0)
    return mean, np.where(std > 0, std, 1.0)


_WARM: dict = {}  # key -> last solution (W, b): a start point only


def fit(x: np.ndarray, y: np.ndarray, classes: int, c: float = 1e-3,
        tol: float = 1e-6, max_iter: int = 500, warm: str | None = None
        ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Returns (mean, std, W, b) of the probe fitted on (x, y).

    ``warm`` names a start point: the previous solution under that key
    (the objective is strictly convex, so the optimum does not depend on
    the start; only the number of iterations does)."""
    xn = normalize_rows(np.asarray(x, np.float64), "unit")
    mean, std = _standardize(xn)
    z = ((xn - mean) / std).astype(np.float32)
    n, d = z.shape
    onehot = np.zeros((n, classes), np.float32)
    onehot[np.arange(n), y] = 1.0
    # scikit-learn fits ONE weight vector for two classes (binary logistic
    # loss): class 0's logit is fixed at 0 and only class 1's is learnt.
    binary = classes == 2
    cols = 1 if binary else classes
    sub = z[np.random.default_rng(0).permutation(n)[:8000]].astype(np.float64)
    reg = 1.0 / (c * n)
    h = (0.5 / classes) * (sub.T @ sub) / len(sub) + reg * np.eye(d)
    chol = linalg.cholesky(h, lower=True)

    def unpack(p):
        u = p[:d * cols].reshape(d, cols)
        w = linalg.solve_triangular(chol, u, lower=True, trans="T")
        return w, p[d * cols:]

    def full_logits(w, b):
        out = z @ w.astype(np.float32) + b.astype(np.float32)
        if binary:
            out = np.hstack([np.zeros((n, 1), np.float32), out])
        return out

    def objective(p):
        w, b = unpack(p)
        logits = full_logits(w, b)
        logits -= logits.max(axis=1, keepdims=True)
        e = np.exp(logits)
        s = e.sum(axis=1, keepdims=True)
        loss = float(np.mean(np.log(s[:, 0]) - (logits * onehot).sum(1)))
        g = (e / s - onehot) / n
        if binary:
            g = g[:, 1:]
        gw = (z.T @ g).astype(np.float64) + reg * w
        gb = g.sum(0).astype(np.float64)
        loss += 0.5 * reg * float((w * w).sum())
        gu = linalg.solve_triangular(chol, gw, lower=True)
        return loss, np.concatenate([gu.ravel(), gb])

    p0 = np.zeros(d * cols + cols)
    if warm in _WARM and _WARM[warm][0].shape == (d, cols):
        w0, b0 = _WARM[warm]
        # in the standardised space of THIS data: rescale by std ratio
        p0 = np.concatenate([(chol.T @ w0).ravel(), b0])
    res = optimize.minimize(objective, p0, jac=True, method="L-BFGS-B",
                            options={"maxiter": max_iter, "ftol": tol,
                                     "gtol": 1e-9, "maxcor": 20})
    w, b = unpack(res.x)
    if warm is not None:
        _WARM[warm] = (w, b)
    if binary:  # as class scores [0, z w + b]
        w = np.hstack([np.zeros((d, 1)), w])
        b = np.concatenate([[0.0], b])
    return mean, std, w, b


def accuracy(x: np.ndarray, y: np.ndarray, xe: np.ndarray, ye: np.ndarray,
             classes: int, c: float = 1e-3, warm: str | None = None) -> float:
    """Probe trained on (x, y), scored on (xe, ye); labels are 0..K-1."""
    mean, std, w, b = fit(x, y, classes, c, warm=warm)
    ze = (normalize_rows(np.asarray(xe, np.float64), "unit") - mean) / std
    return float(np.mean(np.argmax(ze @ w + b, axis=1) == ye))
