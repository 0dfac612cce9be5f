"""Two honest DP-SGD comparators next to the tuned ``dpsgd`` (issue 13).

Privacy as in ``dpsgd`` (add/remove one record): Poisson-sampled Gaussian
steps on clipped per-example gradients, plus, for the private search, a
Gaussian noisy validation count (sensitivity 1) per trial.

``DPSGDLibraryDefaults``: DP-SGD with fixed, library-default
hyperparameters, i.e. what a user gets without tuning. We mirror the
TensorFlow Privacy Keras MNIST tutorial (``tutorials/mnist_dpsgd_tutorial_
keras.py`` in github.com/tensorflow/privacy): plain SGD (no momentum, no
learning-rate decay), learning rate 0.15, L2 clip 1.0, batch 250, 60
epochs; its noise multiplier (1.1 there) is instead calibrated to the
run's (epsilon, delta) like every method here. Rows are the public
unit-normalised embeddings, unscaled (input scale 1).

``DPSGDPrivateTuning``: DP-SGD whose hyperparameter search is paid for
in the ledger by Papernot & Steinke's random-stopping private selection
("Hyperparameter Tuning with Renyi Differential Privacy", ICLR 2022,
arXiv:2110.03620). The private rows are split by a public per-record rule
(a hash of the row's bytes) into a training part (90 %) and a validation
part. Each trial draws one candidate uniformly (public randomness), trains
DP-SGD on the training part and releases the validation correct-count plus
Gaussian noise (sensitivity 1). The number of trials K is drawn from a
truncated negative binomial distribution D_{eta,gamma}; the best trial
(highest noisy count) is returned, nothing else. Theorem 2 of the paper:
if one trial Q is (lambda, eps)-RDP and (lambda_hat, eps_hat)-RDP, the
whole selection is (lambda, eps')-RDP with

    eps' = eps + (1 + eta) (1 - 1/lambda_hat) eps_hat
               + (1 + eta) log(1/gamma) / lambda_hat + log(E[K]) / (lambda - 1).

``repeat_and_select_rdp`` implements this bound (minimised over
lambda_hat); accounting uses dp_accounting's own implementation
(``RepeatAndSelectDpEvent`` in its RDP accountant), which the tests check
equal to ours. All candidates share the batch size and epochs, so every
trial has the same privacy cost and one noise multiplier z (calibrated so
that the whole selection meets (epsilon, delta)) serves them all.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from typing import Optional, Sequence

import dp_accounting
import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant

from dpsynth.dp_ops.ledger import GLOBAL, Mechanism, PrivacyLedger
from benchmarks.baselines import dpsgd
from benchmarks.baselines.base import (MethodOutput, assert_within_budget,
                                   check_inputs, quiet_accountant,
                                   secret_seed)
from dpsynth.models.classifiers import Classifier, label_index

# TensorFlow Privacy, tutorials/mnist_dpsgd_tutorial_keras.py (flags).
LIBRARY_DEFAULTS = {"learning_rate": 0.15, "clip_norm": 1.0,
                    "batch_size": 250, "epochs": 60.0, "momentum": 0.0,
                    "cosine_decay": False, "input_scale": 1.0}
LIBRARY_NOTE = ("fixed library-default hyperparameters (TensorFlow Privacy "
                "Keras MNIST tutorial: SGD lr 0.15, clip 1.0, batch 250, 60 "
                "epochs), nothing tuned; noise multiplier calibrated to the "
                "target")


class DPSGDLibraryDefaults(dpsgd.DPSGD):
    """DP-SGD with the library tutorial's hyperparameters (see module)."""

    def __init__(self, linear: bool = False, **overrides) -> None:
        base = dpsgd.DPSGDConfig(hidden=0 if linear else 128,
                                 **LIBRARY_DEFAULTS)
        super().__init__(cfg=base, **overrides)
        self.name += "-default"
        self.display += ", library defaults"

    def fit(self, *args, **kwargs) -> MethodOutput:
        out = super().fit(*args, **kwargs)
        out.unaccounted = [u for u in out.unaccounted
                           if u != dpsgd.TUNING_NOTE]
        out.notes.append(LIBRARY_NOTE)
        return out


# ----------------------------------------------------- private selection

def repeat_and_select_rdp(orders: Sequence[float], rdp: Sequence[float],
                          mean: float, shape: float) -> np.ndarray:
    """Papernot-Steinke Theorem 2 (truncated negative binomial number of
    trials, shape eta = ``shape`` >= 0, mean E[K] = ``mean``): RDP of
    returning the best of K runs of a mechanism with RDP curve ``rdp``.

    gamma is the distribution's parameter for that mean; eps_hat and
    lambda_hat range over the given orders (the bound holds for each, we
    take the smallest); orders <= 1 get the bound of a larger order
    (RDP is non-decreasing in the order).
    """
    orders = np.asarray(orders, float)
    rdp = np.asarray(rdp, float)
    gamma = rdp_privacy_accountant._gamma_truncated_negative_binomial(
        shape, mean)
    const = (1 + shape) * np.min((1 - 1 / orders) * rdp
                                 - math.log(gamma) / orders)
    out = np.full_like(orders, np.inf)
    ok = orders > 1
    out[ok] = rdp[ok] + math.log(mean) / (orders[ok] - 1) + const
    # monotonicity in the order: a lower order is at most a higher one
    return np.minimum.accumulate(out[::-1])[::-1]


# The search grids of the unaccounted tuning (benchmarks/studies/dpsgd_bars.py).
LINEAR_LEARNING_RATES = (1.0, 4.0, 16.0)
MLP_LEARNING_RATES = (0.5, 2.0, 8.0)


@dataclasses.dataclass(frozen=True)
class TuningConfig:
    """The public search space and selection parameters."""

    learning_rates: tuple = LINEAR_LEARNING_RATES
    input_scales: tuple = (2.0, 4.0, 8.0)
    shape: float = 1.0            # eta: 1 = truncated geometric
    mean_trials: Optional[float] = None  # None: number of candidates
    validation_fraction: float = 0.1
    score_sigma_fraction: float = 0.01  # score noise, x public val size

    def candidates(self) -> list[dict]:
        return [{"learning_rate": lr, "input_scale": s}
                for lr in self.learning_rates for s in self.input_scales]


def validation_mask(x: np.ndarray, fraction: float) -> np.ndarray:
    """Public per-record rule: a row is in the validation part iff the
    hash of its bytes falls below ``fraction`` (adding or removing a record
    never moves another one between parts)."""
    out = np.empty(len(x), bool)
    for i, row in enumerate(np.ascontiguousarray(x, np.float64)):
        h = int.from_bytes(hashlib.sha256(row.tobytes()).digest()[:8], "big")
        out[i] = h < fraction * 2 ** 64
    return out


def trial_event(z: float, q: float, steps: int,
                score_z: float) -> dp_accounting.DpEvent:
    """One trial: DP-SGD on the training part, then the noisy validation
    correct-count (sensitivity 1, noise multiplier ``score_z``)."""
    return dp_accounting.ComposedDpEvent([
        dpsgd.sampled_gaussian_event(q, z, steps),
        dp_accounting.GaussianDpEvent(score_z)])


def selection_event(z: float, q: float, steps: int, score_z: float,
                    mean: float, shape: float) -> dp_accounting.DpEvent:
    return dp_accounting.dp_event.RepeatAndSelectDpEvent(
        trial_event(z, q, steps, score_z), mean, shape)


@functools.lru_cache(maxsize=64)
def calibrate_selection(epsilon: float, delta: float, q: float, steps: int,
                        score_z: float, mean: float, shape: float) -> float:
    """Smallest per-trial noise multiplier z for which dp_accounting's RDP
    accountant certifies the whole selection at (epsilon, delta)."""
    with quiet_accountant():
        return float(dp_accounting.calibrate_dp_mechanism(
            rdp_privacy_accountant.RdpAccountant,
            lambda z: selection_event(z, q, steps, score_z, mean, shape),
            epsilon, delta,
            bracket_interval=dp_accounting.ExplicitBracketInterval(0.05, 500.0),
            tol=1e-3))


class SelectionLedger(PrivacyLedger):
    """Ledger of a private selection: the per-trial mechanisms are
    registered for the record, the spent epsilon is that of the whole
    random-stopping selection (RDP accountant)."""

    def __init__(self, epsilon: float, delta: float, event_args: dict) -> None:
        super().__init__(epsilon, delta, "rdp")
        self.event_args = event_args

    def spent_epsilon(self, delta: float | None = None) -> float:
        delta = self.target_delta if delta is None else delta
        acc = rdp_privacy_accountant.RdpAccountant()
        with quiet_accountant():
            acc.compose(selection_event(**self.event_args))
            return float(acc.get_epsilon(delta))

    def to_manifest(self) -> dict:
        out = super().to_manifest()
        out["composition"] = ("random-stopping private selection "
                              "(Papernot & Steinke 2022, Theorem 2) over "
                              "trials of the mechanisms listed")
        out["selection"] = dict(self.event_args)
        return out


class DPSGDPrivateTuning(dpsgd.DPSGD):
    """DP-SGD with its hyperparameter search inside the privacy budget."""

    def __init__(self, linear: bool = False,
                 tuning: Optional[TuningConfig] = None, **overrides) -> None:
        super().__init__(linear=linear, **overrides)
        self.tuning = tuning or TuningConfig(
            learning_rates=(LINEAR_LEARNING_RATES if self.cfg.hidden == 0
                            else MLP_LEARNING_RATES))
        self.name += "-private-tuning"
        self.display += ", privately tuned"

    def plan(self, n: int, epsilon: float, delta: float
             ) -> tuple[SelectionLedger, float, float, int, float]:
        t = self.tuning
        q, steps = self.schedule(self.train_size(n))
        score_sigma = max(5.0, t.score_sigma_fraction * n * t.validation_fraction)
        mean = t.mean_trials or float(len(t.candidates()))
        args = {"q": q, "steps": steps, "score_z": score_sigma,
                "mean": mean, "shape": t.shape}
        z = (0.0 if math.isinf(epsilon) else
             calibrate_selection(epsilon, delta, **args))
        ledger = SelectionLedger(epsilon, delta, {"z": z, **args})
        ledger.register(Mechanism(
            name="dpsgd/trial/clipped-gradient-sum", stage="dpsgd",
            partition=GLOBAL, sensitivity=self.cfg.clip_norm,
            sigma=z * self.cfg.clip_norm, count=steps,
            sampling_probability=q))
        ledger.register(Mechanism(
            name="dpsgd/trial/validation-correct-count", stage="selection",
            partition=GLOBAL, sensitivity=1.0, sigma=score_sigma))
        return ledger, z, q, steps, score_sigma

    def train_size(self, n: int) -> int:
        """Public size of the training part (n is public here)."""
        return max(1, int(round(n * (1 - self.tuning.validation_fraction))))

    def fit(self, x: np.ndarray, y: np.ndarray, labels: Sequence[int],
            epsilon: float, delta: float, seed: int = 0,
            noise_seed: Optional[int] = None) -> MethodOutput:
        x, y = check_inputs(x, y, labels, epsilon, delta)
        n_public = self.cfg.public_n or len(x)
        ledger, z, q, steps, score_sigma = self.plan(n_public, epsilon, delta)
        secret = secret_seed(noise_seed)
        rng = np.random.default_rng([secret, 0x7E])
        val = validation_mask(self.preprocess(x), self.tuning.validation_fraction)
        xt, yt, xv, yv = x[~val], y[~val], x[val], y[val]
        k = draw_trials(rng, self.tuning, len(self.tuning.candidates()))
        cands = self.tuning.candidates()
        best, best_score, tried = None, -math.inf, []
        for trial in range(k):
            hp = cands[int(rng.integers(len(cands)))]
            clf = self._train(xt, yt, labels, z * self.cfg.clip_norm, q,
                              steps, q * self.train_size(n_public), hp, seed,
                              int(rng.integers(2 ** 62)))
            correct = float(np.sum(clf.predict(self.preprocess(xv)) == yv))
            score = correct + rng.normal(0.0, score_sigma)
            tried.append(hp)
            if score > best_score:
                best, best_score = (clf, hp), score
        spent = assert_within_budget(ledger, epsilon)
        notes = [f"private selection: {k} trials (truncated negative "
                 f"binomial, eta={self.tuning.shape}, mean "
                 f"{ledger.event_args['mean']:g}), per-trial noise multiplier "
                 f"z={z:.4f}, q={q:.5f}, {steps} steps; chosen "
                 f"{best[1]}"]
        return MethodOutput(ledger, classifier=best[0],
                            model=self.model_column, notes=notes,
                            unaccounted=[] if self.cfg.public_n else [
                                "dataset size n treated as public to set "
                                "q = batch/n (standard in DP-SGD papers)"],
                            info={"trials": k, "chosen": best[1],
                                  "noise_multiplier": z, "spent_epsilon": spent})

    def _train(self, x, y, labels, sigma, q, steps, denominator, hp, seed,
               noise_seed) -> Classifier:
        """One trial: DP-SGD with hyperparameters ``hp`` on (x, y)."""
        cfg = dataclasses.replace(self.cfg, **hp)
        noise, sampler = dpsgd.noise_and_sampler(noise_seed)
        xp = self.preprocess(x) * cfg.input_scale
        y_idx = label_index(y, labels)
        params = dpsgd.init_params(x.shape[1], cfg.hidden, len(labels),
                                   np.random.default_rng([seed, 0xD5]),
                                   cfg.input_scale)
        dpsgd.train_loop(params, xp, y_idx, cfg, sigma, q, steps,
                         denominator, noise, sampler)
        scale = cfg.input_scale
        return Classifier(labels, lambda a: np.argmax(
            dpsgd.logits(params, a * scale), 1))


def draw_trials(rng: np.random.Generator, tuning: TuningConfig,
                candidates: int) -> int:
    """K ~ truncated negative binomial D_{eta, gamma} (K >= 1): a
    NegativeBinomial(eta, gamma) draw conditioned on K > 0 (geometric for
    eta = 1); secret randomness."""
    mean = tuning.mean_trials or float(candidates)
    gamma = rdp_privacy_accountant._gamma_truncated_negative_binomial(
        tuning.shape, mean)
    if tuning.shape == 0:  # logarithmic distribution
        return int(rng.logseries(1 - gamma))
    while True:
        k = int(rng.negative_binomial(tuning.shape, gamma))
        if k > 0:
            return k
