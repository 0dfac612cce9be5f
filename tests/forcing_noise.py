"""Test-only noise sources for the post-processing tests (issue 54).

Every mechanism of a run releases through ``NoiseSource.add(exact, sigma,
key, grid)`` (``dpsynth.dp_ops.noise``), once per draw key whatever the
engine re-executes. Two sources built on that:

* ``RecordingNoise``: a real random key (``KeyedNoise``); each draw's exact
  input and released value are also saved under a folder;
* ``ForcingNoise``: releases, for each draw key, a value fixed in advance
  (its draw is target - exact), whatever the exact input, and saves the
  exact inputs it saw.

Both are picklable and write one file per draw key from whichever process
draws it (DirectRunner's multi_processing workers, Dask workers), so the
test reads every draw back after the run. This module is imported as
``tests.forcing_noise`` by the workers (the repository root is on their
path), never by the product.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import os
import tempfile
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from dpsynth.dp_ops.noise import KeyedNoise

Draws = dict[str, tuple[np.ndarray, np.ndarray]]  # key -> (exact, released)


class RecordingNoise(KeyedNoise):
    """A run's real keyed noise (``key``: a fresh random one by default);
    records each draw."""

    def __init__(self, folder: str, key: bytes | None = None) -> None:
        super().__init__(os.urandom(32) if key is None else key)
        self._folder = folder

    def add(self, value: np.ndarray, sigma: float, key: str,
            grid: float) -> np.ndarray:
        released = super().add(value, sigma, key, grid)
        save_draw(self._folder, key, np.asarray(value, np.float64), released)
        return released


class ForcingNoise:
    """Every draw key releases its target: the noise is target - exact."""

    def __init__(self, targets: Mapping[str, np.ndarray], folder: str) -> None:
        self._targets = {k: np.asarray(v, np.float64)
                         for k, v in targets.items()}
        self._folder = folder
        self._secret = os.urandom(32)  # the run's other secrets derive here

    def derived_key(self, purpose: str) -> bytes:
        """The run's secret for ``purpose`` (the writers' digest record),
        as ``KeyedNoise.derived_key`` gives one: this source has no key."""
        return hmac.new(self._secret, purpose.encode(), "sha256").digest()

    def __repr__(self) -> str:
        return f"ForcingNoise({len(self._targets)} draws)"

    def gaussian(self, sigma: float, shape: Sequence[int] | int, key: str,
                 grid=None) -> np.ndarray:
        raise AssertionError(f"draw {key}: noise drawn without its exact "
                             "input (every mechanism must release through "
                             "NoiseSource.add)")

    def add(self, value: np.ndarray, sigma: float, key: str,
            grid: float) -> np.ndarray:
        value = np.asarray(value, np.float64)
        if key not in self._targets:
            raise AssertionError(f"draw {key}: the recorded run never drew "
                                 "it (the plan depends on the exact data)")
        target = self._targets[key]
        if target.shape != value.shape:
            raise AssertionError(
                f"draw {key}: shape {value.shape}, recorded {target.shape} "
                "(the released structure depends on the exact data)")
        save_draw(self._folder, key, value, target)
        return target.copy()


def _path(folder: str, key: str) -> Path:
    return Path(folder) / (hashlib.sha256(key.encode()).hexdigest()[:40]
                           + ".npz")


def save_draw(folder: str, key: str, exact: np.ndarray,
              released: np.ndarray) -> None:
    """One file per draw key, written atomically; a re-executed step must
    draw exactly what it drew before."""
    path = _path(folder, key)
    if path.exists():
        old_exact, old_released = _read(path)[1:]
        if not (np.array_equal(old_exact, exact)
                and np.array_equal(old_released, released)):
            raise AssertionError(f"draw {key} made twice with other values")
        return
    buf = io.BytesIO()
    np.savez(buf, key=np.array(key), exact=exact, released=released)
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".part")
    with os.fdopen(fd, "wb") as f:
        f.write(buf.getvalue())
    os.replace(tmp, path)


def _read(path: Path) -> tuple[str, np.ndarray, np.ndarray]:
    with np.load(path) as z:
        return str(z["key"]), z["exact"], z["released"]


def load_draws(folder: str) -> Draws:
    """Every draw saved under ``folder``: key -> (exact, released)."""
    out = {}
    for path in sorted(Path(folder).glob("*.npz")):
        key, exact, released = _read(path)
        out[key] = (exact, released)
    return out
