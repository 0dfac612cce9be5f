"""Gaussian noise sources.

``SecureNoise`` (the default) draws from PyDP's secure Gaussian sampler, the
same one PipelineDP uses; it cannot be replayed. ``SeededNoise`` derives the
noise of each (mechanism, key) from a secret seed so that a run can be
reproduced byte for byte regardless of worker count or bundle order. The noise
seed must stay secret: anyone who knows it can subtract the noise. It is never
written to the manifest or the logs.
"""

from __future__ import annotations

import hashlib
from typing import Protocol, Sequence

import numpy as np


class NoiseSource(Protocol):
    def gaussian(self, sigma: float, shape: Sequence[int] | int,
                 key: str) -> np.ndarray:
        """N(0, sigma^2) noise of ``shape``; ``key`` names the draw."""


class SecureNoise:
    """Noise from PyDP's secure Gaussian mechanism (not reproducible)."""

    def gaussian(self, sigma: float, shape: Sequence[int] | int,
                 key: str) -> np.ndarray:
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        if sigma == 0:
            return np.zeros(shape)
        from pydp.algorithms import numerical_mechanisms
        mech = numerical_mechanisms.GaussianMechanism.create_from_standard_deviation(
            float(sigma))
        size = int(np.prod(shape))
        return np.array([mech.add_noise(0.0) for _ in range(size)],
                        dtype=np.float64).reshape(shape)


class SeededNoise:
    """Reproducible noise: one Philox stream per (secret seed, key)."""

    def __init__(self, seed: int) -> None:
        self._seed = int(seed)

    def gaussian(self, sigma: float, shape: Sequence[int] | int,
                 key: str) -> np.ndarray:
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        if sigma == 0:
            return np.zeros(shape)
        digest = hashlib.sha256(f"{self._seed}|{key}".encode()).digest()
        words = np.frombuffer(digest[:16], dtype=np.uint64)
        rng = np.random.Generator(np.random.Philox(key=words))
        return rng.normal(0.0, sigma, size=shape)


def make_noise_source(noise_seed: int | None) -> NoiseSource:
    return SecureNoise() if noise_seed is None else SeededNoise(noise_seed)
