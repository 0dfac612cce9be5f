"""Common interface of the methods compared by the privacy-utility benchmark.

Every method reads the private training set once and returns its output
(synthetic rows, or a DP-trained classifier) with the ONE ledger that
accounts for it (``dpsynth.dp_ops.ledger.PrivacyLedger`` of ``Mechanism``s composed
with dp_accounting). Neighbouring relation everywhere: add/remove one record.

Public inputs: the label set, (epsilon, delta), the public ``seed`` (model
initialisation, public randomness) and each method's hyperparameters, which
are fixed in advance. ``noise_seed`` is secret: it seeds the noise and the
Poisson sampling and must never be written anywhere; None draws a fresh one
from the OS. Hyperparameters that were chosen by looking at (a split of) the
private training data are listed in ``MethodOutput.unaccounted``.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import logging
import math
import secrets
from typing import Any, Optional, Sequence

import numpy as np

from dpsynth.dp_ops.clipping import normalize_rows
from dpsynth.dp_ops.ledger import ADD_REMOVE, PrivacyLedger
from dpsynth.dp_ops.noise import SeededNoise


@dataclasses.dataclass
class MethodOutput:
    """What a method releases, and the ledger that pays for it.

    Exactly one of (x_syn, y_syn) or ``classifier`` is set. ``classifier``
    has ``predict(x)`` on preprocessed rows and ``model`` names the column
    it is reported in (``mlp`` or ``logreg``).
    """

    ledger: PrivacyLedger
    x_syn: Optional[np.ndarray] = None
    y_syn: Optional[np.ndarray] = None
    classifier: Any = None
    model: Optional[str] = None
    notes: list[str] = dataclasses.field(default_factory=list)
    unaccounted: list[str] = dataclasses.field(default_factory=list)
    info: dict = dataclasses.field(default_factory=dict)

    @property
    def spent_epsilon(self) -> float:
        return self.ledger.spent_epsilon()


class Method(abc.ABC):
    """A DP method under test (or a labelled non-private reference)."""

    name: str = ""
    display: str = ""
    kind: str = "generator"  # or "classifier"
    neighbouring: str = ADD_REMOVE
    private: bool = True
    # Public per-record transform applied to real rows before the method
    # reads them and before its output is scored ('unit' = L2-normalise).
    normalize: str = "unit"

    def preprocess(self, x: np.ndarray) -> np.ndarray:
        return normalize_rows(np.asarray(x, np.float64), self.normalize)

    @abc.abstractmethod
    def fit(self, x: np.ndarray, y: np.ndarray, labels: Sequence[int],
            epsilon: float, delta: float, seed: int = 0,
            noise_seed: Optional[int] = None) -> MethodOutput:
        """Runs the method on raw private rows ``x`` with labels ``y``."""

    def describe(self) -> dict:
        return {"name": self.name, "display": self.display, "kind": self.kind,
                "neighbouring": self.neighbouring, "private": self.private,
                "normalize": self.normalize}


class Generator(Method):
    """A method whose output is a labelled synthetic dataset."""

    kind = "generator"

    def fit_generate(self, x: np.ndarray, y: np.ndarray,
                     labels: Sequence[int], epsilon: float, delta: float,
                     seed: int = 0, noise_seed: Optional[int] = None
                     ) -> tuple[np.ndarray, np.ndarray, PrivacyLedger]:
        out = self.fit(x, y, labels, epsilon, delta, seed, noise_seed)
        return out.x_syn, out.y_syn, out.ledger


# ------------------------------------------------------------------ helpers

def check_inputs(x: np.ndarray, y: np.ndarray, labels: Sequence[int],
                 epsilon: float, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """Validates the run's public target and the shape of the private rows."""
    if not labels:
        raise ValueError("labels: the public label set must not be empty")
    if not (epsilon > 0) or math.isnan(epsilon):
        raise ValueError(f"epsilon must be > 0 (or inf), got {epsilon}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    x = np.asarray(x, np.float64)
    y = np.asarray(y)
    if x.ndim != 2 or len(x) != len(y):
        raise ValueError(f"x must be [n, d] with one label per row; got x "
                         f"{x.shape}, y {y.shape}")
    unknown = np.setdiff1d(np.unique(y), np.asarray(labels))
    if unknown.size:
        raise ValueError(f"labels {unknown.tolist()} are not in the public "
                         f"label set {list(labels)}")
    if not np.isfinite(x).all():
        raise ValueError("x has NaN or infinite values")
    return x, y.astype(np.int64)


def secret_seed(noise_seed: Optional[int]) -> int:
    """The secret noise seed, or a fresh one from the OS (never logged)."""
    return int(noise_seed) if noise_seed is not None else secrets.randbits(63)


def noise_and_sampler(noise_seed: Optional[int]
                      ) -> tuple[SeededNoise, np.random.Generator]:
    """Gaussian noise keyed per draw, and a secret generator for sampling.

    Both come from numpy's Philox/PCG streams under a secret seed: fast
    enough for millions of DP-SGD noise draws, but not a side-channel
    hardened sampler (the product's releases use ``dp_ops`` SecureNoise).
    """
    secret = secret_seed(noise_seed)
    return SeededNoise(secret), np.random.default_rng([secret, 0x5A3])


@contextlib.contextmanager
def quiet_accountant():
    """dp_accounting's RDP accountant logs (through absl) every low order it
    cannot evaluate and then skips; that is expected for small q, not news."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def assert_within_budget(ledger: PrivacyLedger, epsilon: float) -> float:
    """The ledger's own accountant must certify the target."""
    with quiet_accountant():
        spent = ledger.spent_epsilon()
    if not math.isinf(epsilon) and spent > epsilon * (1 + 1e-6):
        raise AssertionError(f"privacy overspent: {spent:.4f} > {epsilon}")
    return spent


def labels_tuple(labels: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(v) for v in labels)
