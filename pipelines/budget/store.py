"""Lifetime privacy budget of a private dataset, across all its releases.

Every release of dpsynth reads the same private records, so releases compose
*sequentially*: the privacy loss a person suffers over the dataset's lifetime
is the composition of every mechanism of every release that ever drew noise
from the data. This module keeps that record in one JSON document per private
dataset id (``{store_uri}/{dataset_id}.budget.json``, a local path or a
``gs://`` prefix) and refuses a new release whose mechanisms, composed with
all the recorded ones, would exceed the dataset's lifetime cap.

The document is operator-only: it holds timestamps and attempt counts, which
depend on how runs went (a crash may depend on the data). Nothing from it
reaches a release, ``LATEST.json`` or a notification.

Lifetime cap. The cap (epsilon, delta) is pinned in the document when it is
created. A later run may ask for a stricter epsilon (used for its own check)
but never a larger one nor another delta (``CapConflict``); only the logged
admin command ``dpsynth budget set-cap ... --reason`` changes
it, and the change is kept in the document.

Label rule. The rule that makes a record's class (the label feature, or
the class folders in label order, and the label set) is pinned in the
document by the dataset's first release; a run under another rule is
refused (``LabelRuleConflict``), since classes of two rules are not
disjoint. A document written before rules were pinned, whose releases
spent on classes, pins no rule a run brings (it could not be checked
against those releases): the logged admin command ``... budget_store
set-label-rule ... --reason`` records it once.

Accounting. All recorded mechanisms plus the new ones are put in one
``dpsynth.dp_ops.ledger.PrivacyLedger`` and composed by its ``spent_epsilon``: within a
class everything composes sequentially (across releases too), and classes
compose in parallel (a record is in exactly one class; labels are a public
per-record rule that is the same for every release of one dataset id), the
global mechanisms joining every class. Identical mechanisms of different
releases are merged into one with the summed ``count`` before composing, which
is exact (composition is commutative) and keeps a year of nightly releases as
fast to account as one release.

Concurrency. The read-check-write of a transaction is atomic: a local store
holds an exclusive ``fcntl`` lock on ``<document>.lock`` for the whole
transaction and replaces the document atomically (write temp + ``os.replace``);
a ``gs://`` store uses a compare-and-swap on the object generation
(``if_generation_match``) and re-runs the whole check when another writer won.
Two concurrent runs therefore cannot both spend the last of the budget.

Ownership. Each launch holds a random owner token. An attempt belongs to the
launch that reserved (or took over) it: every status change names the owner
and is refused for anyone else (``AttemptLost``). The owner keeps a lease on
its attempt (``Lease``: renewed every ``lease_seconds / 4``); a second launch
of the same run id while the lease is alive is refused before it reads
anything (``AttemptInProgress``: nothing charged), so one run id has one
running attempt. A launch that stops on an exception gives its lease back at
once; a killed one holds it until it expires (``DPSYNTH_LEASE_SECONDS``,
default 120 s: keep it below the orchestrator's retry delay). Lease times
are the store's clock (a file's mtime, a GCS object's ``updated``), never a
launcher's, so a launcher whose clock is fast cannot take over a live
owner. An owner checks its lease at each pass boundary (``Lease.verify``)
and stops once it was taken over.

Life of one attempt of a run (statuses, in order):

  reserved   recorded before any data is read; the spend counts from now on
  running    the pipeline is about to read private data
  staged     the release is complete in its attempt's own staging folder; the
             folder and the sha256 of its manifest are recorded (the spend is
             committed before any byte reaches --output)
  published  the manifest at --output names the release
  failed     the pipeline failed after reading data, or its staged release
             failed the checks before publication (never published)
  abandoned  its owner's lease ran out while running; a newer attempt took
             the run id over (the spend stays; the old owner can change
             nothing any more)

Invariant: the composed spend of all recorded attempts >= the composition of
every release whose bytes ever became readable. Every attempt's spend stays
recorded forever, whatever happened to it. A retry of a run id (the nightly
DAG retries with the same --run-id) reuses an attempt only when that costs
nothing new: an attempt still ``reserved`` read no data; a ``staged`` attempt
is re-published from exactly the folder it recorded, after checking the
manifest's digest and every file's sha256 against the manifest (no new
noise, and never another draw under that run id; a changed folder is never
published and its attempt becomes ``failed``: ``reject_staged``).
Any other retry (the crashed attempt read data and may have drawn noise, and
nothing of it is staged) is a new attempt, charged again and refused when it
no longer fits under the cap. A ``published`` run id is refused
(``RunConflict``): its release is out; ``dpsynth generate`` stops earlier when
it finds that run's release at --output.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import datetime
import fcntl
import json
import math
import os
import random
import re
import sys
import tempfile
import threading
import time
from collections import Counter
from typing import Callable, Iterator, Optional

from dpsynth.dp_ops.ledger import Mechanism, PrivacyLedger

FORMAT = "dpsynth-budget-ledger/1"
RESERVED, RUNNING, STAGED = "reserved", "running", "staged"
PUBLISHED, FAILED, ABANDONED = "published", "failed", "abandoned"
# Statuses whose owner may still be working on the attempt.
_LIVE = (RESERVED, RUNNING, STAGED)
# Accountants are numerical (PLD discretisation): a cap met to within this
# relative tolerance is met.
_REL_TOL = 1e-9
_DATASET_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_GCS_CAS_ATTEMPTS = 50
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


# ---------------------------------------------------------------- public API


def reserve(store_uri: str, dataset_id: str, run_id: str,
            mechanisms: list[Mechanism], epsilon: float, delta: float,
            lifetime_epsilon: Optional[float],
            lifetime_delta: Optional[float], accountant: str = "pld",
            owner: Optional[str] = None, lease: Optional[float] = None,
            created_utc: str = "",
            label_rule: Optional[dict] = None) -> Reservation:
    """Records (or takes over) an attempt of ``run_id`` for ``owner``.

    Takes over the latest attempt, charging nothing, when it is ``reserved``
    (no data read) or ``staged`` (the caller re-publishes the recorded
    folder) and no other owner holds a live lease on it. Otherwise records a
    new attempt, which must fit: ``BudgetExceeded`` (nothing written) when the
    composition of every recorded attempt with ``mechanisms`` exceeds the
    lifetime cap. ``AttemptInProgress`` when another launch holds the run id;
    ``RunConflict`` when it is recorded with other mechanisms or published;
    ``CapConflict`` when the cap asked for is wider than the pinned one.
    ``lifetime_epsilon`` / ``lifetime_delta`` may be None once the cap is
    pinned (the first run of a dataset must give the epsilon; its delta
    defaults to ``delta``). ``created_utc`` is recorded with the run id's
    first attempt and returned by every later one. ``label_rule`` (what
    makes a record's class: its label feature and the label set) is pinned
    by the dataset's first reservation; another one is refused
    (``LabelRuleConflict``, nothing written). None: not checked (callers
    that account mechanisms without classes).
    """
    _check_ids(dataset_id, run_id)
    if not mechanisms:
        raise ValueError(f"run {run_id}: no mechanisms to reserve")
    owner = owner or new_owner()
    lease = lease_seconds() if lease is None else lease
    new = [_mechanism_to_dict(m) for m in mechanisms]
    result: dict = {}

    def update(doc: Optional[dict], now: float) -> Optional[dict]:
        doc = _new_document(dataset_id) if doc is None else doc
        cap_eps, cap_delta = _cap_for_run(doc, store_uri, lifetime_epsilon,
                                          lifetime_delta, delta)
        _pin_label_rule(doc, store_uri, label_rule)
        entry = _find(doc, run_id)
        if entry is not None:
            _check_retry(entry, new, store_uri, dataset_id, owner, now)
            _check_staged_entry(entry, store_uri, dataset_id)
            if entry["status"] in (RESERVED, STAGED):
                if entry.get("owner"):  # names a staging folder: keep it
                    entry.setdefault("past_owners", []).append(entry["owner"])
                entry.update(owner=owner, lease_until=now + lease,
                             updated_at=_now())
                result.update(already_spent=True, entry=copy.deepcopy(entry),
                              spent=_compose(doc["releases"], cap_delta,
                                             accountant), delta=cap_delta)
                return doc
            if entry["status"] == RUNNING:  # its owner's lease ran out
                entry.update(status=ABANDONED, updated_at=_now())
        attempt = 1 if entry is None else entry.get("attempt", 1) + 1
        created = ((created_utc or _now()) if entry is None
                   else entry.get("created_utc") or entry.get("reserved_at"))
        entry = {
            "run_id": run_id, "attempt": attempt, "status": RESERVED,
            "epsilon": float(epsilon), "delta": float(delta),
            "accountant": accountant, "mechanisms": new,
            "lifetime_cap": {"epsilon": cap_eps, "delta": cap_delta},
            "release_uri": None, "reserved_at": _now(), "updated_at": _now(),
            "created_utc": created, "owner": owner,
            "lease_until": now + lease,
        }
        spent = _compose(doc["releases"] + [entry], cap_delta, accountant)
        if spent > cap_eps * (1 + _REL_TOL):
            before = _compose(doc["releases"], cap_delta, accountant)
            again = (f" (attempt {attempt}: an earlier attempt of this run id "
                     "read the data and stays charged)" if attempt > 1 else "")
            raise BudgetExceeded(
                f"dataset {dataset_id!r}: release {run_id!r}{again} (epsilon="
                f"{epsilon:g}, delta={delta:g}) would bring the lifetime "
                f"epsilon to {spent:.4f} at delta={cap_delta:g}, over the "
                f"lifetime cap {cap_eps:g} (--lifetime-epsilon, pinned in the store; "
                f"already spent {before:.4f} by "
                f"{len(doc['releases'])} earlier attempt(s), see "
                f"{_document_uri(store_uri, dataset_id)}). Nothing was run or "
                "written; lower --epsilon, or raise the cap deliberately "
                "with `dpsynth budget set-cap`.")
        entry["lifetime_epsilon_after"] = spent
        doc["releases"].append(entry)
        result.update(already_spent=False, entry=copy.deepcopy(entry),
                      spent=spent, delta=cap_delta)
        return doc

    _transact(store_uri, dataset_id, update)
    return _reservation(store_uri, dataset_id, result["entry"],
                        result["already_spent"], result["spent"],
                        result["delta"], lease)


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


def _pin_label_rule(doc: dict, store_uri: str,
                    rule: Optional[dict]) -> None:
    """Pins the dataset's label rule at its first release; refuses another.

    Classes compose in parallel only because each record is in exactly one
    class of one rule. Relabelling the same records (another label column,
    another label set or class-folder order) puts a record in a class of
    each rule: releases under two rules compose sequentially, which the
    per-class accounting cannot express, so it would undercount (two
    single-class releases of epsilon 1 under two label columns were
    accounted 1.007 for a true loss of 1.465). Refused rather than
    charged as sequential: a second rule is almost always a configuration
    slip, and a refusal costs nothing while a wrong charge is permanent.
    """
    if rule is None:
        return
    rule = json.loads(json.dumps(rule, sort_keys=True))  # plain JSON
    pinned = doc.get("label_rule")
    if pinned is None:
        _check_unlabelled(doc, store_uri, rule)
        doc["label_rule"] = dict(rule, set_at=_now())
        return
    if {k: v for k, v in pinned.items() if k != "set_at"} != rule:
        raise LabelRuleConflict(
            f"{_document_uri(store_uri, doc['dataset_id'])}: dataset "
            f"{doc['dataset_id']!r} is labelled by {_rule_text(pinned)} "
            f"(pinned by its first release), not {_rule_text(rule)}; classes "
            "compose in parallel only under one label rule, so this run is "
            "refused and nothing was charged")


def _check_unlabelled(doc: dict, store_uri: str, rule: dict) -> None:
    """A document without a rule may pin one only if no recorded release
    relied on classes: one written before rules were pinned has class
    releases under a rule it never recorded, and pinning whatever the next
    run brings would let a relabelling pass the cap again (1.007 accounted,
    1.465 true). The partitions name the classes, not the label feature,
    so the rule cannot be derived: an administrator states it once."""
    classes = _recorded_classes(doc)
    if not classes:
        return
    dataset_id = doc["dataset_id"]
    where = _document_uri(store_uri, dataset_id)
    labels = ",".join(str(v) for v in rule.get("labels", []))
    how = (f"--class-folders {','.join(rule['class_folders'])}"
           if "class_folders" in rule
           else f"--label-feature {rule.get('label_feature')}")
    raise LabelRuleConflict(
        f"{where}: dataset {dataset_id!r} has {len(doc['releases'])} "
        "release(s) recorded before label rules were pinned, so this run's "
        f"rule ({_rule_text(rule)}) cannot be checked; refused, nothing "
        "charged. If those releases used this rule, record it once: dpsynth "
        "budget set-label-rule "
        f"--budget-store {store_uri} --dataset-id {dataset_id} {how} "
        f"--labels {labels} --reason '...'")


def _recorded_classes(doc: dict) -> set[int]:
    """The labels of every class partition a recorded attempt spent on."""
    found = set()
    for entry in doc.get("releases", []):
        for m in entry.get("mechanisms", []):
            part = str(m.get("partition", ""))
            label = part[len("class="):]
            if part.startswith("class=") and label.lstrip("-").isdigit():
                found.add(int(label))
    return found


def set_label_rule(store_uri: str, dataset_id: str, rule: dict,
                   reason: str, by: str = "") -> dict:
    """Admin: records the label rule of a dataset whose document has none
    (written before rules were pinned), and why and by whom. A pinned rule
    is never changed (classes of two rules overlap); a rule whose label set
    misses a recorded class cannot be the one those releases used."""
    _check_ids(dataset_id)
    if not reason.strip():
        raise ValueError("set-label-rule needs a non-blank --reason: the "
                         "change is kept in the store for audits")
    rule = json.loads(json.dumps(rule, sort_keys=True))
    change: dict = {}

    def update(doc: Optional[dict], now: float) -> dict:
        doc = _new_document(dataset_id) if doc is None else doc
        where = _document_uri(store_uri, dataset_id)
        if doc.get("label_rule") is not None:
            raise LabelRuleConflict(
                f"{where}: dataset {dataset_id!r} already has its label rule "
                f"({_rule_text(doc['label_rule'])}); it is never changed")
        missing = sorted(_recorded_classes(doc) - set(rule["labels"]))
        if missing:
            raise LabelRuleConflict(
                f"{where}: recorded releases spent on class(es) {missing}, "
                f"which --labels {rule['labels']} does not hold: not the "
                "rule they used")
        doc["label_rule"] = dict(rule, set_at=_now())
        change.clear()
        change.update({"at": _now(), "by": by, "reason": reason,
                       "rule": dict(rule)})
        doc.setdefault("label_rule_changes", []).append(dict(change))
        return doc

    _transact(store_uri, dataset_id, update)
    return change


def _rule_text(rule: dict) -> str:
    return ", ".join(f"{k}={rule[k]}" for k in sorted(rule) if k != "set_at")


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


def _set_status(reservation: Reservation, status: str,
                allowed_from: tuple[str, ...], **fields) -> None:
    def update(doc: Optional[dict], now: float) -> Optional[dict]:
        entry = _require(doc, reservation)
        _check_owner(entry, reservation)
        if entry["status"] == status and all(
                entry.get(k) == v for k, v in fields.items()):
            return None
        if entry["status"] not in allowed_from:
            raise ValueError(
                f"run {reservation.run_id!r} (attempt {reservation.attempt}) "
                f"is {entry['status']}; it cannot become {status}")
        entry.update(status=status, updated_at=_now(),
                     lease_until=now + reservation.lease_seconds,
                     **fields)
        if status == PUBLISHED:
            entry["committed_at"] = entry["updated_at"]
        return doc

    _transact(reservation.store_uri, reservation.dataset_id, update)


def _check_owner(entry: dict, reservation: Reservation) -> None:
    if entry.get("owner") not in (None, reservation.owner) or (
            entry["status"] == ABANDONED):
        raise AttemptLost(
            f"run {reservation.run_id!r} attempt {reservation.attempt} was "
            "taken over by another launch (this one's lease had run out); "
            "this launch publishes nothing")


def mark_running(reservation: Reservation) -> None:
    """The attempt is about to read private data: from now on a retry of
    this run id is charged again unless this attempt gets staged."""
    _set_status(reservation, RUNNING, (RESERVED,))


def commit_staged(reservation: Reservation, folder: str,
                  manifest_sha256: str) -> None:
    """The attempt's release is complete in ``folder``: recorded, with its
    manifest's digest, before any of its bytes are placed under --output.
    Only that folder may ever be published under this run id."""
    staged = {"folder": folder, "manifest_sha256": manifest_sha256}
    if reservation.staged is not None:  # a takeover re-publishing it
        if reservation.staged != staged:
            raise RunConflict(
                f"run {reservation.run_id!r}: the store recorded the staged "
                f"release {reservation.staged['folder']} (manifest sha256 "
                f"{reservation.staged['manifest_sha256'][:12]}...), not "
                f"{folder}; refusing to publish another draw")
        _set_status(reservation, STAGED, (STAGED,))
        return
    _set_status(reservation, STAGED, (RUNNING,), staged=staged)


def reject_staged(reservation: Reservation, reason: str) -> None:
    """The attempt's staged release failed its checks before publication
    (files changed or missing, parts inconsistent, manifest not the one
    recorded): it is never published. The attempt becomes failed (its
    spend stays), so a retry of the run id is a new, charged attempt."""
    _set_status(reservation, FAILED, (RUNNING, STAGED), rejected=reason[:300])


def commit(reservation: Reservation, release_uri: str) -> None:
    """Marks the attempt as published at ``release_uri``."""
    _set_status(reservation, PUBLISHED, (STAGED,), release_uri=release_uri)


def renew(reservation: Reservation) -> None:
    """Extends the owner's lease (``Lease`` calls it in the background)."""
    def update(doc: Optional[dict], now: float) -> Optional[dict]:
        entry = _require(doc, reservation)
        _check_owner(entry, reservation)
        if entry["status"] not in _LIVE:
            return None
        entry["lease_until"] = now + reservation.lease_seconds
        return doc

    _transact(reservation.store_uri, reservation.dataset_id, update)


def mark_published(store_uri: str, dataset_id: str, run_id: str,
                   release_uri: str, manifest_sha256: str) -> None:
    """Records that ``run_id``'s staged attempt is published at
    ``release_uri`` (a retry found its manifest there: the crash came
    between that write and ``commit``). The published manifest must be the
    one the store recorded as staged."""
    def update(doc: Optional[dict], now: float) -> Optional[dict]:
        entry = None if doc is None else _find(doc, run_id)
        if entry is None:
            raise ValueError(f"budget store {_document_uri(store_uri, dataset_id)}"
                             f" has no record of run {run_id!r}, whose release "
                             f"is at {release_uri}")
        staged = entry.get("staged") or {}
        if staged.get("manifest_sha256") not in (None, manifest_sha256):
            raise RunConflict(
                f"run {run_id!r}: the release at {release_uri} is not the one "
                "the budget store recorded as staged (manifest digests "
                "differ); investigate before anything else is published")
        if entry["status"] == PUBLISHED:
            return None
        if entry["status"] != STAGED:
            raise ValueError(f"run {run_id!r} is {entry['status']}, not staged; "
                             f"its release at {release_uri} was not recorded")
        entry.update(status=PUBLISHED, release_uri=release_uri,
                     committed_at=_now(), updated_at=_now())
        return doc

    _transact(store_uri, dataset_id, update)


def release_failed(reservation: Reservation) -> None:
    """The owner stops (an exception, Ctrl-C): marks a running attempt
    failed (its spend stays: it read data and may have drawn noise) and gives
    the lease back, so a retry need not wait for it. Reserved and staged
    attempts keep their status: a retry takes them over at no new cost."""
    def update(doc: Optional[dict], now: float) -> Optional[dict]:
        entry = _require(doc, reservation)
        if entry.get("owner") not in (None, reservation.owner):
            return None  # not ours any more
        if entry["status"] == RUNNING:
            entry.update(status=FAILED, updated_at=_now())
        if entry["status"] in _LIVE + (FAILED,):
            entry["lease_until"] = 0
        return doc

    _transact(reservation.store_uri, reservation.dataset_id, update)


def recorded_manifest(store_uri: str, dataset_id: str, run_id: str
                      ) -> Optional[str]:
    """The sha256 of the manifest the store recorded for ``run_id``'s
    published attempt (or its staged one: a crash between the manifest's
    write and ``commit``); None when no attempt of it got that far. The only
    manifest a check of that run's release may accept: one verified on its
    own could have been rewritten with its files."""
    entries = [e for e in history(store_uri, dataset_id)
               if e["run_id"] == run_id and e["status"] in (PUBLISHED, STAGED)
               and isinstance((e.get("staged") or {}).get("manifest_sha256"),
                              str)]
    entries.sort(key=lambda e: e["status"] != PUBLISHED)  # published first
    return entries[0]["staged"]["manifest_sha256"] if entries else None


def run_owners(store_uri: str, dataset_id: str, run_id: str) -> set[str]:
    """The owner tokens of every recorded attempt of ``run_id`` (a staging
    folder named by one of them was charged in this store)."""
    return {owner for e in history(store_uri, dataset_id)
            if e["run_id"] == run_id
            for owner in [e.get("owner"), *e.get("past_owners", [])] if owner}


class Lease:
    """Keeps the owner's lease alive while a launch works on its attempt.

    A daemon thread renews it every ``lease_seconds / 4``. Should the
    attempt be taken over (this launch's renewals failed for a whole lease),
    ``check()`` raises ``AttemptLost``; the store refuses that launch's
    status changes in any case.
    """

    def __init__(self, reservation: Optional[Reservation]) -> None:
        self.reservation = reservation
        self._stop = threading.Event()
        self._lost: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name="dpsynth-lease")

    def __enter__(self) -> "Lease":
        if self.reservation is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        every = self.reservation.lease_seconds / 4
        while not self._stop.wait(every):
            try:
                renew(self.reservation)
            except AttemptLost as err:
                self._lost = err
                return
            except Exception:  # a transient store error: try again later
                continue

    def check(self) -> None:
        if self._lost is not None:
            raise AttemptLost(str(self._lost))

    def verify(self) -> None:
        """At a pass boundary: asks the store now (renewing the lease) and
        raises ``AttemptLost`` if another launch took the attempt over, so
        that an owner resumed after its lease ran out (SIGSTOP, a long GC
        pause) stops instead of running the rest of the pipeline. A
        transient store error is left to the background renewals."""
        if self.reservation is None:
            return
        self.check()
        try:
            renew(self.reservation)
        except AttemptLost as err:
            self._lost = err
            raise
        except Exception:  # the store is unreachable for a moment
            return

    @property
    def lost(self) -> Optional[AttemptLost]:
        """The takeover this launch noticed, if any."""
        return None if self._lost is None else AttemptLost(str(self._lost))


def history(store_uri: str, dataset_id: str) -> list[dict]:
    """Every recorded release of ``dataset_id``, oldest first."""
    _check_ids(dataset_id)
    doc = _backend(store_uri, dataset_id).read()
    return [] if doc is None else copy.deepcopy(doc["releases"])


def lifetime_spent(store_uri: str, dataset_id: str, delta: float,
                   accountant: str = "pld") -> float:
    """Epsilon at ``delta`` of everything ever reserved for ``dataset_id``."""
    return _compose(history(store_uri, dataset_id), delta, accountant)


def spend_after(store_uri: str, dataset_id: str,
                mechanisms: list[Mechanism], delta: float,
                accountant: str = "pld") -> tuple[float, float]:
    """(lifetime epsilon now, after one more release of ``mechanisms``) at
    ``delta``: what `generate --plan-only` reports; reads, writes nothing."""
    entries = history(store_uri, dataset_id)
    planned = {"mechanisms": [_mechanism_to_dict(m) for m in mechanisms]}
    return (_compose(entries, delta, accountant),
            _compose(entries + [planned], delta, accountant))


# ------------------------------------------------------------- accounting


def _mechanism_to_dict(m: Mechanism) -> dict:
    out = m.to_dict()
    out.pop("noise_multiplier", None)  # derived; not needed to rebuild
    return out


def _mechanism_from_dict(d: dict) -> Mechanism:
    names = {f.name for f in dataclasses.fields(Mechanism)}
    return Mechanism(**{k: v for k, v in d.items() if k in names})


def _canonical(mechanisms: list[dict]) -> str:
    return json.dumps(sorted(json.dumps(m, sort_keys=True)
                             for m in mechanisms))


def _compose(entries: list[dict], delta: float, accountant: str) -> float:
    """Lifetime epsilon of ``entries`` (sequential across releases).

    Builds one PrivacyLedger over the union of every entry's mechanisms, with
    identical mechanisms merged into one of summed count (exact).
    """
    counts: Counter = Counter()
    for entry in entries:
        for d in entry["mechanisms"]:
            m = _mechanism_from_dict(d)
            counts[dataclasses.replace(m, name="", count=1)] += m.count
    if not counts:
        return 0.0
    ledger = PrivacyLedger(math.inf, delta, accountant)
    for i, (m, count) in enumerate(sorted(
            counts.items(), key=lambda kv: repr(kv[0]))):
        ledger.register(dataclasses.replace(
            m, name=f"{m.partition}/{m.stage}/{i}", count=count))
    return ledger.spent_epsilon(delta)


# --------------------------------------------------------------- documents


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


def _require(doc: Optional[dict], reservation: Reservation) -> dict:
    entry = (None if doc is None
             else _find(doc, reservation.run_id, reservation.attempt))
    if entry is None:
        raise ValueError(
            f"budget store {_document_uri(reservation.store_uri, reservation.dataset_id)}"
            f" has no reservation for run {reservation.run_id!r}")
    return entry


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


# ---------------------------------------------------------------- backends


def _dumps(doc: dict) -> str:
    """The document as strict JSON: a NaN or inf is refused (ValueError),
    never written as ``NaN`` / ``Infinity``, which other readers reject."""
    return json.dumps(doc, indent=1, sort_keys=True, allow_nan=False)


def _document_uri(store_uri: str, dataset_id: str) -> str:
    return f"{store_uri.rstrip('/')}/{dataset_id}.budget.json"


def _backend(store_uri: str, dataset_id: str):
    if not store_uri:
        raise ValueError("--budget-store: empty path")
    uri = _document_uri(store_uri, dataset_id)
    if uri.startswith("gs://"):
        return _GcsDocument(uri)
    if "://" in uri and not uri.startswith("file://"):
        raise ValueError(f"--budget-store {store_uri}: only local paths and "
                         "gs:// are supported (they allow atomic updates)")
    return _LocalDocument(uri.removeprefix("file://"))


def _transact(store_uri: str, dataset_id: str,
              update: Callable[[Optional[dict], float], Optional[dict]]
              ) -> None:
    """Atomically applies ``update(doc, now)`` (None = no write) to the
    document; ``now`` is the store's clock (see ``_LocalDocument.clock``,
    ``_GcsDocument.clock``), never this launcher's: a launcher whose clock is
    fast must not see a live owner's lease as expired.

    ``update`` may run several times (gs:// retries after a lost race), so it
    must only depend on the document and time it is given.
    """
    _backend(store_uri, dataset_id).transact(update)


class _LocalDocument:
    """A JSON file guarded by an exclusive fcntl lock on ``<path>.lock``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def read(self) -> Optional[dict]:
        try:
            with open(self.path, encoding="utf-8") as f:
                return _validate(json.load(f), self.path)
        except FileNotFoundError:
            return None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        with open(self.path + ".lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def transact(self, update) -> None:
        with self._locked():
            new = update(self.read(), self.clock())
            if new is not None:
                self._write(new)

    def clock(self) -> float:
        """Now, as the store's file system stamps a write (under the lock):
        the mtime of ``<document>.clock`` just rewritten. On a shared mount
        that is the file server's time, the same for every launcher."""
        path = self.path + ".clock"
        with open(path, "w") as f:
            f.write("t")
            f.flush()
            return os.fstat(f.fileno()).st_mtime

    def _write(self, doc: dict) -> None:
        folder = os.path.dirname(os.path.abspath(self.path))
        fd, tmp = tempfile.mkstemp(prefix=".budget-", dir=folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(_dumps(doc))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise


class _GcsDocument:
    """A GCS object updated by compare-and-swap on its generation."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.bucket, _, self.name = uri[len("gs://"):].partition("/")

    def _blob(self):
        from google.cloud import storage  # only gs:// stores need it
        # Object operations need no project; passing None explicitly avoids
        # failing where credentials carry none.
        client = storage.Client(
            project=os.environ.get("GOOGLE_CLOUD_PROJECT") or None)
        return client.bucket(self.bucket).blob(self.name)

    def _get(self) -> tuple[Optional[dict], int]:
        """(document, generation); generation 0 when it does not exist."""
        blob = self._blob()
        blob = blob.bucket.get_blob(self.name)
        if blob is None:
            return None, 0
        # Pinning the generation makes the body match the generation we CAS on.
        data = blob.download_as_bytes(if_generation_match=blob.generation)
        return _validate(json.loads(data), self.uri), int(blob.generation)

    def clock(self) -> float:
        """Now, as GCS stamps a write: the ``updated`` time of
        ``<document>.clock``, rewritten for the purpose."""
        from google.cloud.storage.retry import DEFAULT_RETRY
        blob = self._blob().bucket.blob(self.name + ".clock")
        # Unconditional, so retried explicitly (GCS throttles rapid
        # rewrites of one object with 429).
        blob.upload_from_string(b"t", retry=DEFAULT_RETRY)
        return blob.updated.timestamp()

    def read(self) -> Optional[dict]:
        from google.api_core import exceptions
        for _ in range(_GCS_CAS_ATTEMPTS):
            try:
                return self._get()[0]
            except (exceptions.PreconditionFailed, exceptions.NotFound):
                time.sleep(random.uniform(0.05, 0.2))  # changed mid-read
        raise RuntimeError(f"{self.uri}: kept changing while being read")

    def transact(self, update) -> None:
        from google.api_core import exceptions
        for attempt in range(_GCS_CAS_ATTEMPTS):
            try:
                doc, generation = self._get()
                new = update(doc, self.clock())
                if new is None:
                    return
                self._blob().upload_from_string(
                    _dumps(new),
                    content_type="application/json",
                    if_generation_match=generation)
                return
            except (exceptions.PreconditionFailed, exceptions.NotFound):
                # Another writer changed the document between our read and
                # write: re-read it and re-check the budget.
                time.sleep(random.uniform(0.05, 0.2) * min(attempt + 1, 10))
        raise RuntimeError(f"{self.uri}: gave up after {_GCS_CAS_ATTEMPTS} "
                           "concurrent-update conflicts")


# --------------------------------------------------------------------- CLI


def _planned_mechanisms(mechanisms_json: Optional[str],
                        num_classes: Optional[int],
                        labels: Optional[list[int]], epsilon: float,
                        delta: float, accountant: str) -> list[Mechanism]:
    """The mechanisms a planned run would record: from a manifest or JSON
    list, or the fixed plan of the given target and label set."""
    if mechanisms_json:
        with open(mechanisms_json, encoding="utf-8") as f:
            data = json.load(f)
        if isinstance(data, dict):  # a manifest: {"privacy": {"mechanisms"}}
            data = data.get("privacy", data)["mechanisms"]
        return [_mechanism_from_dict(d) for d in data]
    from dpsynth.dp_ops.config import GeneratorConfig, labels_from
    from dpsynth.dp_ops.plan import make_ledger
    cfg = GeneratorConfig(labels=labels_from(num_classes, labels),
                          epsilon=epsilon, delta=delta, accountant=accountant)
    return make_ledger(cfg).mechanisms


def pinned_cap(store_uri: str, dataset_id: str) -> Optional[dict]:
    """The dataset's lifetime cap {"epsilon", "delta"}, or None (no runs)."""
    _check_ids(dataset_id)
    doc = _backend(store_uri, dataset_id).read()
    if doc is None:
        return None
    cap = doc.get("lifetime_cap") or _legacy_cap(doc)
    return None if cap is None else {"epsilon": cap["epsilon"],
                                     "delta": cap["delta"]}


def _epsilon_flag(text: str) -> float:
    from dpsynth.dp_ops.config import parse_epsilon
    try:
        return parse_epsilon(text)
    except ValueError as err:  # argparse would hide our message
        raise argparse.ArgumentTypeError(
            str(err).replace("--epsilon ", "")) from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dpsynth.pipelines.budget.store")
    add_commands(p)
    return p


def register(subparsers) -> argparse.ArgumentParser:
    """Adds `dpsynth budget show|check|set-cap|set-label-rule`: this
    module's own sub-commands under the `dpsynth` parser."""
    p = subparsers.add_parser(
        "budget", help="the lifetime budget store: show, check a planned "
        "run, set the cap or the label rule",
        description="The lifetime budget ledger of a private dataset.")
    add_commands(p)
    p.set_defaults(handler=handle, command="budget")
    return p


def add_commands(p: argparse.ArgumentParser) -> None:
    """The budget commands and their flags, under ``p`` (this module's own
    parser or `dpsynth budget`)."""
    sub = p.add_subparsers(dest="budget_command", required=True)
    for name in ("show", "check", "set-cap", "set-label-rule"):
        s = sub.add_parser(name)
        s.add_argument("--budget-store", required=True)
        s.add_argument("--dataset-id", required=True)
    sub.choices["show"].add_argument(
        "--lifetime-delta", type=float, default=None,
        help="default: the dataset's pinned lifetime delta")
    for name in ("show", "check"):
        sub.choices[name].add_argument("--accountant", default="pld",
                                       choices=("pld", "rdp"))
    c = sub.choices["check"]
    c.add_argument("--lifetime-epsilon", type=float, default=None,
                   help="needed only for a dataset without a pinned cap; a "
                   "value above the pinned cap is refused")
    c.add_argument("--lifetime-delta", type=float, default=None,
                   help="default: the pinned lifetime delta (or --delta)")
    c.add_argument("--run-id", default=None,
                   help="a run recorded under this id before reading data, "
                   "or staged, spends nothing more; one that crashed after "
                   "reading data is charged again")
    c.add_argument("--epsilon", type=_epsilon_flag, default=4.0)
    c.add_argument("--delta", type=float, default=1e-5)
    c.add_argument("--num-classes", type=int, default=None)
    c.add_argument("--labels", type=lambda t: [int(v) for v in t.split(",")],
                   default=None)
    c.add_argument("--mechanisms-json", default=None,
                   help="a manifest.json or a JSON list of Mechanism dicts")
    s = sub.choices["set-cap"]
    s.add_argument("--lifetime-epsilon", type=float, required=True)
    s.add_argument("--lifetime-delta", type=float, required=True)
    s.add_argument("--reason", required=True,
                   help="why the cap changes (kept in the store)")
    r = sub.choices["set-label-rule"]
    by = r.add_mutually_exclusive_group(required=True)
    by.add_argument("--label-feature", default=None)
    by.add_argument("--class-folders", default=None,
                    type=lambda t: t.split(","),
                    help="the class folders in label order, comma-separated")
    r.add_argument("--labels", required=True, type=_labels_flag)
    r.add_argument("--reason", required=True,
                   help="why this is the rule of the recorded releases "
                   "(kept in the store)")


def _labels_flag(text: str) -> list[int]:
    try:
        return sorted(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of integer labels: {text!r}") from None


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m dpsynth.pipelines.budget.store {show,check,
    set-cap,set-label-rule} ...``.

    ``show`` prints the history and the lifetime epsilon; ``check`` is the
    pre-flight of a scheduled run: exit 0 if a release with the planned
    mechanisms would fit under the pinned cap, 3 if not (nothing is written;
    the authoritative reservation is made by the run itself); ``set-cap`` is
    the administrator's logged change of the pinned cap; ``set-label-rule``
    records the label rule of a document written before rules were
    pinned.
    """
    return handle(_parser().parse_args(argv))


def handle(args: argparse.Namespace) -> int:
    """Runs one parsed budget-store command with the module's error policy
    (one line, no traceback, exit 2); returns its exit code."""
    try:
        if args.budget_command == "set-cap":
            by = os.environ.get("USER") or os.environ.get("LOGNAME") or ""
            change = set_cap(args.budget_store, args.dataset_id,
                             args.lifetime_epsilon, args.lifetime_delta,
                             args.reason, by)
            print(f"budget store: dataset {args.dataset_id!r} lifetime cap "
                  f"changed from {change['from']} to (epsilon="
                  f"{args.lifetime_epsilon:g}, delta={args.lifetime_delta:g}) by "
                  f"{by or 'unknown'}: {args.reason}", file=sys.stderr)
            print(json.dumps(change, indent=1))
            return 0
        if args.budget_command == "set-label-rule":
            rule = ({"class_folders": list(args.class_folders)}
                    if args.class_folders else {"label_feature": args.label_feature})
            return _set_label_rule(args.budget_store, args.dataset_id,
                                   dict(rule, labels=args.labels), args.reason)
        entries = history(args.budget_store, args.dataset_id)
        cap = pinned_cap(args.budget_store, args.dataset_id)
        delta = (args.lifetime_delta or (cap or {}).get("delta")
                 or getattr(args, "delta", None) or 1e-5)
        spent = _compose(entries, delta, args.accountant)
        report = {"dataset_id": args.dataset_id, "releases": len(entries),
                  "lifetime_epsilon_spent": spent, "lifetime_delta": delta,
                  "lifetime_cap": cap}
        if args.budget_command == "show":
            report["history"] = [{k: e.get(k) for k in (
                "run_id", "attempt", "status", "epsilon", "delta", "release_uri",
                "reserved_at", "lifetime_epsilon_after")} for e in entries]
            print(json.dumps(report, indent=1))
            return 0
        planned = PlannedRun(
            store=args.budget_store, dataset_id=args.dataset_id,
            run_id=args.run_id, epsilon=args.epsilon, delta=args.delta,
            lifetime_epsilon=args.lifetime_epsilon,
            lifetime_delta=args.lifetime_delta, accountant=args.accountant,
            num_classes=args.num_classes,
            labels=tuple(args.labels) if args.labels else None,
            mechanisms_json=args.mechanisms_json)
        return _check(planned, entries, cap, delta, report)
    except (ValueError, RuntimeError) as err:  # one line, no traceback
        print(f"budget store: error: {err}", file=sys.stderr)
        return 2


def _set_label_rule(store: str, dataset_id: str, rule: dict,
                    reason: str) -> int:
    by = os.environ.get("USER") or os.environ.get("LOGNAME") or ""
    change = set_label_rule(store, dataset_id, rule, reason, by)
    print(f"budget store: dataset {dataset_id!r} label rule set to "
          f"{_rule_text(change['rule'])} by {by or 'unknown'}: {reason}",
          file=sys.stderr)
    print(json.dumps(change, indent=1))
    return 0


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """What `budget_store check` asks about (from its flags)."""

    store: str
    dataset_id: str
    run_id: Optional[str]
    epsilon: float
    delta: float
    lifetime_epsilon: Optional[float]
    lifetime_delta: Optional[float]
    accountant: str
    num_classes: Optional[int]
    labels: Optional[tuple[int, ...]]
    mechanisms_json: Optional[str]


def _check(run: PlannedRun, entries: list[dict],
           cap: Optional[dict], delta: float, report: dict) -> int:
    try:
        cap_eps, delta = _cap_for_run(
            {"dataset_id": run.dataset_id, "releases": entries,
             **({"lifetime_cap": cap} if cap else {})},
            run.store, run.lifetime_epsilon, run.lifetime_delta, run.delta)
    except (CapConflict, ValueError) as err:
        print(f"budget check: {err}", file=sys.stderr)
        return 3
    latest = None
    if run.run_id:
        latest = _find({"releases": entries}, run.run_id)
    if latest is not None and latest["status"] in (RESERVED, STAGED,
                                                   PUBLISHED):
        # reserved: no data read yet; staged: the retry re-publishes the
        # staged files; published: generate finds it and does nothing.
        report.update(fits=True, note=f"run {run.run_id} attempt "
                      f"{latest.get('attempt', 1)} is {latest['status']}: "
                      "a re-run spends nothing more")
        print(json.dumps(report, indent=1))
        return 0
    planned = {"mechanisms": [_mechanism_to_dict(m) for m in _planned_mechanisms(
        run.mechanisms_json, run.num_classes,
        list(run.labels) if run.labels else None, run.epsilon, run.delta,
        run.accountant)]}
    after = _compose(entries + [planned], delta, run.accountant)
    fits = after <= cap_eps * (1 + _REL_TOL)
    report.update(lifetime_epsilon_cap=cap_eps, lifetime_epsilon_after=after,
                  fits=fits)
    print(json.dumps(report, indent=1))
    if not fits:
        print(f"budget check: dataset {run.dataset_id!r} would reach "
              f"epsilon {after:.4f} > cap {cap_eps:g}; "
              "refusing to schedule the run", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
