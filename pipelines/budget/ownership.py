"""Who may change an attempt: each launch's random owner token, the lease
it holds on its attempt (``DPSYNTH_LEASE_SECONDS``), and the checks that
refuse a retry of a run id while another launch's lease is alive, a
changed configuration, a published run, or a status change by a launch
that lost its attempt (``AttemptLost``)."""

from __future__ import annotations

import math
import os

from dpsynth.pipelines.budget.accounting import _canonical
from dpsynth.pipelines.budget.record import (ABANDONED, AttemptInProgress,
                                             AttemptLost,
                                             DEFAULT_LEASE_SECONDS, PUBLISHED,
                                             Reservation, RunConflict, STAGED,
                                             _LIVE)
from dpsynth.pipelines.budget.storage import _document_uri


def new_owner() -> str:
    """A random owner token for one launch (also names its staging)."""
    return os.urandom(8).hex()


def lease_seconds() -> float:
    """The lease an owner holds on its attempt (operator setting)."""
    text = os.environ.get("DPSYNTH_LEASE_SECONDS")
    if not text:
        return DEFAULT_LEASE_SECONDS
    value = float(text)
    if not value > 0:
        raise ValueError(f"DPSYNTH_LEASE_SECONDS must be > 0, got {text}")
    return value


def _check_retry(entry: dict, new: list[dict], store_uri: str,
                 dataset_id: str, owner: str, now: float) -> None:
    run_id = entry["run_id"]
    if _canonical(entry["mechanisms"]) != _canonical(new):
        raise RunConflict(
            f"budget store {_document_uri(store_uri, dataset_id)}: "
            f"run id {run_id!r} is already recorded with different "
            "mechanisms (another configuration); use a new --run-id")
    if entry["status"] == PUBLISHED:
        raise RunConflict(
            f"run id {run_id!r} of dataset {dataset_id!r} is already "
            f"published at {entry['release_uri']}; re-running it would "
            "publish a second release. Read that release, or start a new "
            "run with a new --run-id (it will be charged).")
    lease_left = entry.get("lease_until", 0) - now
    if (entry["status"] in _LIVE and entry.get("owner") not in (None, owner)
            and lease_left > 0):
        raise AttemptInProgress(
            f"run id {run_id!r} of dataset {dataset_id!r} is being run by "
            f"another launch (attempt {entry.get('attempt', 1)}, "
            f"{entry['status']}); not starting a second one. If that launch "
            f"is dead, retry in {math.ceil(lease_left)} s, when its lease "
            "expires.")


def _check_staged_entry(entry: dict, store_uri: str,
                        dataset_id: str) -> None:
    """A staged attempt is re-published only from the folder and manifest
    digest it recorded; an entry without them (written by an older dpsynth,
    or edited) cannot be, and is refused in one line, not a KeyError."""
    if entry["status"] != STAGED:
        return
    staged = entry.get("staged")
    if not (isinstance(staged, dict)
            and isinstance(staged.get("folder"), str)
            and isinstance(staged.get("manifest_sha256"), str)):
        raise RunConflict(
            f"budget store {_document_uri(store_uri, dataset_id)}: run id "
            f"{entry['run_id']!r} attempt {entry.get('attempt', 1)} is "
            "recorded as staged without its staged folder and manifest "
            "digest (an older ledger format, or an edited one), so it cannot "
            "be re-published safely; it stays charged. Use a new --run-id")


def _check_owner(entry: dict, reservation: Reservation) -> None:
    if entry.get("owner") not in (None, reservation.owner) or (
            entry["status"] == ABANDONED):
        raise AttemptLost(
            f"run {reservation.run_id!r} attempt {reservation.attempt} was "
            "taken over by another launch (this one's lease had run out); "
            "this launch publishes nothing")
