"""The budget ledger's document: its format, the attempt statuses, the
store's errors, ``Reservation`` (one recorded attempt, as the store hands
it back) and the helpers that make, find and check a document's parts.
The protocol they serve: ``dpsynth.pipelines.budget.store``."""

from __future__ import annotations

import dataclasses
import datetime
import math
import re
from typing import Optional

from dpsynth.dp_ops.ledger import Mechanism
from dpsynth.pipelines.budget.accounting import _mechanism_from_dict


FORMAT = "dpsynth-budget-ledger/1"
RESERVED, RUNNING, STAGED = "reserved", "running", "staged"
PUBLISHED, FAILED, ABANDONED = "published", "failed", "abandoned"
# Statuses whose owner may still be working on the attempt.
_LIVE = (RESERVED, RUNNING, STAGED)
# Accountants are numerical (PLD discretisation): a cap met to within this
# relative tolerance is met.
_REL_TOL = 1e-9
_DATASET_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
DEFAULT_LEASE_SECONDS = 120.0


class BudgetExceeded(ValueError):
    """The new release would push the dataset past its lifetime cap."""


class RunConflict(ValueError):
    """A run id is already recorded with different mechanisms, or is
    published, or is owned by another launch."""


class AttemptInProgress(RunConflict):
    """Another launch holds a live lease on this run id's attempt."""


class AttemptLost(RunConflict):
    """This launch no longer owns its attempt (another launch took over)."""


class CapConflict(ValueError):
    """A run asked for a lifetime cap other than the one pinned."""


class LabelRuleConflict(ValueError):
    """A run labels the dataset's records by another rule than the one
    pinned at its first release (classes would no longer be disjoint)."""


@dataclasses.dataclass(frozen=True)
class Reservation:
    """One recorded attempt of a run against a dataset's lifetime budget."""

    store_uri: str
    dataset_id: str
    run_id: str
    attempt: int
    epsilon: float
    delta: float
    mechanisms: tuple[Mechanism, ...]
    already_spent: bool  # reused an attempt: nothing new was charged
    status: str
    lifetime_epsilon_spent: float
    lifetime_delta: float
    release_uri: Optional[str] = None
    owner: str = ""
    # {"folder", "manifest_sha256"} once the attempt is staged.
    staged: Optional[dict] = None
    # Taken when the run id's first attempt was reserved; kept by retries,
    # so a release's public timestamp does not tell whether it was retried.
    created_utc: str = ""
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    lifetime_cap: Optional[dict] = None  # {"epsilon", "delta"} checked


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


def _new_document(dataset_id: str) -> dict:
    return {"format": FORMAT, "dataset_id": dataset_id, "releases": []}


def _find(doc: dict, run_id: str, attempt: Optional[int] = None
          ) -> Optional[dict]:
    """The latest attempt of ``run_id`` (or the given one)."""
    found = [e for e in doc["releases"] if e["run_id"] == run_id and (
        attempt is None or e.get("attempt", 1) == attempt)]
    return found[-1] if found else None


def _reservation(store_uri: str, dataset_id: str, entry: dict,
                 already_spent: bool, spent: float, lifetime_delta: float,
                 lease: float) -> Reservation:
    return Reservation(
        store_uri=store_uri, dataset_id=dataset_id, run_id=entry["run_id"],
        attempt=entry.get("attempt", 1), epsilon=entry["epsilon"],
        delta=entry["delta"],
        mechanisms=tuple(_mechanism_from_dict(d) for d in entry["mechanisms"]),
        already_spent=already_spent, status=entry["status"],
        lifetime_epsilon_spent=spent, lifetime_delta=lifetime_delta,
        release_uri=entry.get("release_uri"), owner=entry.get("owner", ""),
        staged=entry.get("staged"),
        created_utc=entry.get("created_utc") or entry.get("reserved_at", ""),
        lease_seconds=lease, lifetime_cap=entry.get("lifetime_cap"))


def _check_ids(dataset_id: str, run_id: Optional[str] = None) -> None:
    if not _DATASET_ID.match(dataset_id or ""):
        raise ValueError(
            f"--dataset-id {dataset_id!r}: use 1-128 letters, digits, '.', "
            "'_' or '-' (it names the budget file)")
    if run_id is not None and not (run_id and run_id.strip() == run_id):
        raise ValueError(f"--run-id {run_id!r}: must be non-empty, no "
                         "surrounding spaces")


def _check_cap(lifetime_epsilon: float, lifetime_delta: float) -> None:
    """The cap's bounds are the per-run bounds (``dpsynth.dp_ops.config``):
    epsilon at most MAX_EPSILON, delta far below 1/n, i.e. at most
    MAX_DELTA (n is private, so the bound is that public constant; a
    lifetime delta of 0.5 made every release fit at epsilon 0).
    ``CapConflict``: generate reports it in one line, nothing read."""
    from dpsynth.dp_ops.config import MAX_DELTA, MAX_EPSILON
    if not (math.isfinite(lifetime_epsilon)
            and 0 < lifetime_epsilon <= MAX_EPSILON):
        # inf would be no cap at all (and is not valid JSON).
        raise CapConflict(
            f"--lifetime-epsilon must be a finite number in (0, "
            f"{MAX_EPSILON:g}], got {lifetime_epsilon:g}")
    if not 0 < lifetime_delta <= MAX_DELTA:  # also rejects NaN
        raise CapConflict(
            f"--lifetime-delta must be in (0, {MAX_DELTA:g}] (delta "
            f"must be far below 1/n, like --delta), got {lifetime_delta:g}")


def _validate(doc: dict, where: str) -> dict:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{where}: not a {FORMAT} document")
    return doc
