"""The dataset's lifetime cap: pinned in the document by the first run,
checked (a run may be stricter, never wider, and measures at the pinned
delta), and changed only by the logged admin command (``set_cap``)."""

from __future__ import annotations

import math
from typing import Optional

from dpsynth.pipelines.budget.record import (CapConflict, _REL_TOL, _check_cap,
                                             _check_ids, _new_document, _now)
from dpsynth.pipelines.budget.storage import _backend, _document_uri, _transact


def _cap_for_run(doc: dict, store_uri: str, epsilon: Optional[float],
                 delta: Optional[float], run_delta: float
                 ) -> tuple[float, float]:
    """The cap this run is checked against; pins it in a new document.

    A run may be stricter than the pinned epsilon, never wider, and must
    measure at the pinned delta (another delta is another curve).
    """
    pinned = doc.get("lifetime_cap")
    where = _document_uri(store_uri, doc["dataset_id"])
    if pinned is None:
        pinned = _legacy_cap(doc)
    if pinned is None:
        if epsilon is None:
            raise CapConflict(
                f"{where}: dataset {doc['dataset_id']!r} has no lifetime cap "
                "yet; pass --lifetime-epsilon to create it (it is pinned in "
                "the store from then on)")
        delta = run_delta if delta is None else delta
        _check_cap(epsilon, delta)
        doc["lifetime_cap"] = {"epsilon": float(epsilon),
                               "delta": float(delta), "set_at": _now()}
        return float(epsilon), float(delta)
    if "lifetime_cap" not in doc:  # a document from before caps were pinned
        doc["lifetime_cap"] = dict(pinned, set_at=_now())
    cap_eps, cap_delta = pinned["epsilon"], pinned["delta"]
    _check_pinned_cap(cap_eps, cap_delta, where)
    if delta is not None and not math.isclose(delta, cap_delta, rel_tol=1e-12):
        raise CapConflict(
            f"{where}: --lifetime-delta {delta:g} differs from the dataset's "
            f"pinned lifetime delta {cap_delta:g}; drop the flag, or change "
            "the cap with `dpsynth budget set-cap`")
    if epsilon is not None and epsilon > cap_eps * (1 + _REL_TOL):
        raise CapConflict(
            f"{where}: --lifetime-epsilon {epsilon:g} is above the dataset's "
            f"pinned lifetime cap {cap_eps:g}; a run cannot widen it (an "
            "administrator can: `dpsynth budget set-cap`)")
    return (cap_eps if epsilon is None else float(epsilon)), cap_delta


def _check_pinned_cap(epsilon, delta, where: str) -> None:
    """A cap pinned before the bounds (a lifetime delta of 0.5) or edited
    is refused rather than trusted; the admin command replaces it."""
    try:
        _check_cap(float(epsilon), float(delta))
    except (TypeError, CapConflict) as err:
        raise CapConflict(
            f"{where}: the pinned lifetime cap is out of bounds ({err}); "
            "nothing was charged. Replace it with `dpsynth "
            "budget set-cap`") from None


def _legacy_cap(doc: dict) -> Optional[dict]:
    """The strictest cap recorded by the runs of an older document."""
    caps = [e["lifetime_cap"] for e in doc["releases"] if e.get("lifetime_cap")]
    if not caps:
        return None
    strict = min(caps, key=lambda c: c["epsilon"])
    return {"epsilon": strict["epsilon"], "delta": strict["delta"]}


def set_cap(store_uri: str, dataset_id: str, epsilon: float, delta: float,
            reason: str, by: str = "") -> dict:
    """Admin: changes the pinned lifetime cap and records why and by whom."""
    _check_ids(dataset_id)
    _check_cap(epsilon, delta)
    if not reason.strip():
        raise ValueError("set-cap needs a non-blank --reason: the change is "
                         "kept in the store for audits")
    change: dict = {}

    def update(doc: Optional[dict], now: float) -> dict:
        doc = _new_document(dataset_id) if doc is None else doc
        before = doc.get("lifetime_cap") or _legacy_cap(doc)
        doc["lifetime_cap"] = {"epsilon": float(epsilon),
                               "delta": float(delta), "set_at": _now()}
        change.clear()
        change.update({"at": _now(), "by": by, "reason": reason,
                       "from": before, "to": dict(doc["lifetime_cap"])})
        doc.setdefault("cap_changes", []).append(dict(change))
        return doc

    _transact(store_uri, dataset_id, update)
    return change


def pinned_cap(store_uri: str, dataset_id: str) -> Optional[dict]:
    """The dataset's lifetime cap {"epsilon", "delta"}, or None (no runs)."""
    _check_ids(dataset_id)
    doc = _backend(store_uri, dataset_id).read()
    if doc is None:
        return None
    cap = doc.get("lifetime_cap") or _legacy_cap(doc)
    return None if cap is None else {"epsilon": cap["epsilon"],
                                     "delta": cap["delta"]}
