"""Gaussian noise of the DP mechanisms: keyed, exact, recomputation-safe.

Every draw is a deterministic function of a per-run secret key and the
name of the draw (the ledger mechanism's name). A runner that executes a
step twice (Dataflow bundle retries, Dask recomputing a side-input branch)
therefore reproduces the same noise instead of releasing one statistic twice
with independent noise while the ledger counts it once.

* Key: 32 bytes from ``os.urandom`` for a normal run (``SecureNoise``),
  held in memory by the launcher and the workers' copies of the pipeline
  only: never written to the release, the manifest, the logs or the budget
  store. With ``--noise-seed`` (tests and audits) the key is derived from that
  secret seed, so the whole release is reproducible byte for byte.
* Random words: the AES-256-CTR keystream (``cryptography``, already a
  dependency of Beam) under the subkey HMAC-SHA-256(key, draw name): a
  cryptographically secure generator, one independent stream per draw.
* Distribution: the exact discrete Gaussian N_Z(0, s^2) of
  ``dpsynth.dp_ops.discrete_gaussian``, scaled by a power-of-two lattice step q:
  noise = q * K. ``add`` requires the value to lie on q Z already (dpsynth's
  aggregates are exact fixed-point sums on a public power-of-two grid, see
  ``moments.grid``), so value + q * K is computed exactly and its low-order
  bits reveal nothing (this is what makes it safe for floating point).

Accounting: q <= sigma * 2^-20, so s = sigma / q >= 2^20 lattice steps. The
discrete Gaussian with L2 sensitivity Delta / q (in lattice units) satisfies
the same concentrated-DP bound as the continuous Gaussian, and its
(epsilon, delta) curve exceeds the continuous one by at most a term of order
exp(-2 pi^2 s^2) (Canonne, Kamath, Steinke 2020, Thms. 14-15), far below
double precision at s >= 2^20. The ledger's continuous-Gaussian accounting
(dp_accounting) therefore applies to these draws.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
from typing import Optional, Protocol, Sequence

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from dpsynth.dp_ops.discrete_gaussian import discrete_gaussian

_LATTICE_BITS = 20  # q <= sigma * 2^-20
_SEED_DOMAIN = b"dpsynth/noise-seed/v1"


class NoiseSource(Protocol):
    def gaussian(self, sigma: float, shape: Sequence[int] | int, key: str,
                 grid: Optional[float] = None) -> np.ndarray:
        """N(0, sigma^2)-distributed noise of ``shape`` on a lattice no
        coarser than ``grid``; ``key`` names the draw."""

    def add(self, value: np.ndarray, sigma: float, key: str,
            grid: float) -> np.ndarray:
        """``value`` (an exact aggregate on the public lattice ``grid``)
        plus the draw ``key``: what the mechanism releases. Every mechanism
        of a run releases through this call (tests force it)."""

    def derived_key(self, purpose: str) -> bytes:
        """A secret for ``purpose`` (not noise) that the run's workers and
        launcher share: it reaches the workers exactly as the noise key
        does (see ``derived_key`` below)."""


class WordStream:
    """Uniform uint64 words: the AES-256-CTR keystream of a per-draw
    subkey (a stream cipher's keystream is a cryptographically secure
    generator; CTR mode makes the sequence independent of how it is
    consumed)."""

    def __init__(self, subkey: bytes) -> None:
        cipher = Cipher(algorithms.AES(subkey), modes.CTR(bytes(16)))
        self._encryptor = cipher.encryptor()

    def __call__(self, n: int) -> np.ndarray:
        data = self._encryptor.update(bytes(8 * int(n)))
        return np.frombuffer(data, dtype="<u8").astype(np.uint64, copy=False)


def lattice_step(sigma: float, grid: Optional[float] = None) -> float:
    """The power of two q that the noise is a multiple of: at most
    sigma * 2^-20 and at most ``grid`` (the aggregate's own grid)."""
    q = 2.0 ** (math.floor(math.log2(sigma)) - _LATTICE_BITS)
    if grid is not None:
        if not (grid > 0 and math.log2(grid).is_integer()):
            raise ValueError(f"grid must be a power of two, got {grid}")
        q = min(q, grid)
    return q


class KeyedNoise:
    """Noise as a deterministic function of (secret key, draw name)."""

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError("the noise key must have at least 16 bytes")
        self._key = bytes(key)

    def __repr__(self) -> str:  # never show the key
        return f"{type(self).__name__}(<secret>)"

    def export_key(self) -> bytes:
        """The secret key, for the launcher to hand to a restricted key
        store (``dpsynth.transforms.keyed_noise.StoredKeyNoise``); never log or write it
        anywhere else."""
        return self._key

    def _secret(self) -> bytes:
        return self._key

    def _stream(self, name: str) -> WordStream:
        return WordStream(hmac.new(self._secret(), name.encode(),
                                   "sha256").digest())

    def derived_key(self, purpose: str) -> bytes:
        """HMAC-SHA-256(key, NUL + purpose): a second secret of the run for
        ``purpose`` (the writers' file digest records, see
        ``dpsynth.transforms.digests``). Deriving it from the noise key
        makes it travel to the workers exactly as that key does (in the
        pickled graph, or as ``--noise-key-location``'s object) and vanish
        with it; one-way, so what it authenticates tells nothing about the
        noise. The NUL keeps it apart from every draw's subkey (draw names
        are printable)."""
        return hmac.new(self._secret(), b"\0" + purpose.encode(),
                        "sha256").digest()

    def lattice_draw(self, sigma: float, size: int, key: str,
                     grid: Optional[float] = None) -> tuple[float, np.ndarray]:
        """(q, K): the lattice step and ``size`` integer draws of N_Z(0, s^2)
        with s = sigma / q; the noise is q * K."""
        q = lattice_step(sigma, grid)
        return q, discrete_gaussian(size, sigma / q, self._stream(key))

    def gaussian(self, sigma: float, shape: Sequence[int] | int, key: str,
                 grid: Optional[float] = None) -> np.ndarray:
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        if sigma == 0:
            return np.zeros(shape)
        size = int(np.prod(shape, dtype=np.int64))
        q, k = self.lattice_draw(sigma, size, key, grid)
        return (k.astype(np.float64) * q).reshape(shape)

    def add(self, value: np.ndarray, sigma: float, key: str,
            grid: float) -> np.ndarray:
        """value + noise, exactly: ``value`` must lie on the lattice ``grid``
        Z (a public power of two), so the sum is exact in float64."""
        value = np.asarray(value, np.float64)
        if sigma == 0:
            return value.copy()
        q, k = self.lattice_draw(sigma, value.size, key, grid)
        steps = value.reshape(-1) / q
        if not np.array_equal(steps, np.round(steps)):
            raise AssertionError(f"{key}: the aggregate is not on its grid "
                                 f"{grid}: refusing to add lattice noise")
        total = steps + k.astype(np.float64)
        if np.abs(steps).max(initial=0) + np.abs(k).max(initial=0) >= 2.0 ** 53:
            raise OverflowError(f"{key}: aggregate too large for exact noise")
        return (total * q).reshape(value.shape)


class SeededNoise(KeyedNoise):
    """Reproducible noise from a SECRET seed (tests, audits)."""

    def __init__(self, seed: int) -> None:
        super().__init__(hashlib.sha256(
            _SEED_DOMAIN + str(int(seed)).encode()).digest())


class SecureNoise(KeyedNoise):
    """A normal run's noise: a fresh 32-byte key from ``os.urandom``."""

    def __init__(self) -> None:
        super().__init__(os.urandom(32))


def make_noise_source(noise_seed: Optional[int]) -> KeyedNoise:
    """Secure keyed noise, or seeded noise for tests and audits."""
    return SecureNoise() if noise_seed is None else SeededNoise(noise_seed)
