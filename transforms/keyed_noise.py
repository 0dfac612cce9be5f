"""Adding a ledger mechanism's noise to keyed exact aggregates in Beam.

The sigma of every draw comes from the run's one ``PrivacyLedger``; the
draw itself from the run's keyed noise source (``dpsynth.dp_ops.noise``): a
deterministic function of the run's secret key and the mechanism's name.
So a runner that executes this step twice (a retried bundle, a recomputed
side-input branch) adds the same noise both times: the statistic is
released once, as the ledger counts it.

(PipelineDP's ``DPEngine.add_dp_noise`` served here before; its PyDP
sampler reads the OS random source and cannot be keyed, so a recomputed
step would redraw the noise.)
"""

from __future__ import annotations

import logging
import os
import stat
from typing import Callable, Hashable

import apache_beam as beam
import numpy as np

from dpsynth.dp_ops import generator
from dpsynth.dp_ops.ledger import PrivacyLedger
from dpsynth.dp_ops.noise import KeyedNoise, NoiseSource


class AddNoise(beam.PTransform):
    """(key, exact array) -> (key, array + its mechanism's noise).

    ``name_of(key)`` gives the ledger mechanism of that key's value (one
    mechanism per key, e.g. per class label).
    """

    def __init__(self, ledger: PrivacyLedger,
                 name_of: Callable[[Hashable], str],
                 noise: NoiseSource) -> None:
        super().__init__()
        self._ledger, self._name_of, self._noise = ledger, name_of, noise

    def expand(self, pcoll):
        ledger, name_of, noise = self._ledger, self._name_of, self._noise

        def add(kv):
            key, value = kv
            return key, generator.add_noise(
                ledger, noise, name_of(key), np.asarray(value, np.float64))
        return pcoll | "AddNoise" >> beam.Map(add)


class StoredKeyNoise(KeyedNoise):
    """Keyed noise whose secret key stays out of the job graph.

    On a service that keeps the job description (Dataflow stores the
    pipeline in the staging location and in the job's metadata, readable by
    whoever may view the project's jobs), a key pickled into the DoFns
    would let those readers subtract the noise from the release. Here the
    launcher writes the key to one object at a location the operator
    restricts to the job's service account (``--noise-key-location``); only
    that object's URI is pickled, each worker reads the key on first use,
    and the launcher deletes the object when the run ends. Draws are the
    same as ``KeyedNoise``'s for the same key.
    """

    def __init__(self, uri: str, key: bytes) -> None:
        super().__init__(key)
        self._uri = uri

    def __getstate__(self) -> dict:
        return {"uri": self._uri}  # never the key

    def __setstate__(self, state: dict) -> None:
        self._uri = state["uri"]
        self._key = None

    def _secret(self) -> bytes:
        if self._key is None:
            self._key = read_key(self._uri)
        return self._key


def key_uri(location: str, run_id: str, owner: str) -> str:
    """Where one attempt's key object lives under the operator's location."""
    return f"{location.rstrip('/')}/dpsynth-noise-key-{run_id}-{owner}"


class KeyLocationError(ValueError):
    """A local --noise-key-location that others could read or write."""


def local_path(location: str):
    """The local path of ``location`` (a path or file://), else None
    (an object store, whose access the operator restricts with IAM)."""
    if location.startswith("file://"):
        return location[len("file://"):]
    return None if "://" in location else location


def check_key_folder(location: str) -> None:
    """Makes a missing local key folder (0700) and refuses, in one line, one
    that is not this user's or that others may read or write: whoever reads
    the run's key removes its noise (a reviewer copied one mid-run and got
    back every exact class count), and whoever writes there can plant one.
    Object stores are left to their access control."""
    folder = local_path(location)
    if folder is None:
        return
    folder = folder or "."
    if not os.path.lexists(folder):
        os.makedirs(folder, mode=0o700)
        os.chmod(folder, 0o700)  # makedirs' mode is filtered by the umask
    try:
        info = os.stat(folder)  # a link is judged by what it points at
    except OSError as err:
        raise KeyLocationError(f"--noise-key-location {location}: "
                               f"{err.strerror}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise KeyLocationError(f"--noise-key-location {location} is not a "
                               "folder")
    if info.st_uid != os.geteuid():
        raise KeyLocationError(
            f"--noise-key-location {location} belongs to another user (uid "
            f"{info.st_uid}), who could read the run's noise key and remove "
            "its noise: use a folder of your own with mode 0700")
    if info.st_mode & 0o066:
        raise KeyLocationError(
            f"--noise-key-location {location} has mode "
            f"{stat.S_IMODE(info.st_mode):04o}: others may read or write "
            "there, and whoever reads the run's noise key removes its noise; "
            f"chmod 700 {folder} (or use a folder only you can open)")


def write_key(uri: str, key: bytes) -> None:
    """Writes one attempt's key: a local file is created new (never an
    existing one, never through a link) with mode 0600."""
    path = local_path(uri)
    if path is not None:
        check_key_folder(os.path.dirname(path) or ".")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                     | getattr(os, "O_NOFOLLOW", 0), 0o600)
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(key)
        return
    from apache_beam.io.filesystems import FileSystems
    with FileSystems.create(uri) as f:
        f.write(key)


def read_key(uri: str) -> bytes:
    from apache_beam.io.filesystems import FileSystems
    with FileSystems.open(uri) as f:
        key = f.read()
    if len(key) < 16:
        raise RuntimeError(f"{uri}: not a dpsynth noise key")
    return key


def delete_key(uri: str) -> bool:
    """Deletes an attempt's key object; True when it is gone (or was never
    written). A key that stays lets whoever reads it remove that run's
    noise, so a failed delete is reported (one line), never silent; it does
    not fail the run, whose release is not at stake."""
    from apache_beam.io.filesystems import FileSystems
    try:
        if not FileSystems.exists(uri):
            return True
        FileSystems.delete([uri])
        return True
    except Exception as err:  # e.g. no delete permission on the location
        reason = " ".join(str(err).split())[:200]
        logging.getLogger("dpsynth").warning(
            "could not delete the noise key %s (%s): delete it by hand, "
            "whoever can read it can remove that run's noise", uri, reason)
        return False
