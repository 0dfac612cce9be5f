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
import copy
import dataclasses
import json
import os
import sys
from typing import Optional

from dpsynth.dp_ops.ledger import Mechanism
from dpsynth.pipelines.budget.accounting import (_compose,
                                                 _mechanism_from_dict,
                                                 _mechanism_to_dict)
from dpsynth.pipelines.budget.cap import _cap_for_run, pinned_cap, set_cap
from dpsynth.pipelines.budget.label_rule import (_pin_label_rule, _rule_text,
                                                 set_label_rule)
from dpsynth.pipelines.budget.ownership import (_check_owner, _check_retry,
                                                _check_staged_entry,
                                                lease_seconds, new_owner)
from dpsynth.pipelines.budget.record import (ABANDONED, BudgetExceeded,
                                             CapConflict, FAILED, PUBLISHED,
                                             RESERVED, RUNNING, Reservation,
                                             RunConflict, STAGED, _LIVE,
                                             _REL_TOL, _check_ids, _find,
                                             _new_document, _now, _reservation)
from dpsynth.pipelines.budget.storage import _backend, _document_uri, _transact


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


# --------------------------------------------------------------- documents


def _require(doc: Optional[dict], reservation: Reservation) -> dict:
    entry = (None if doc is None
             else _find(doc, reservation.run_id, reservation.attempt))
    if entry is None:
        raise ValueError(
            f"budget store {_document_uri(reservation.store_uri, reservation.dataset_id)}"
            f" has no reservation for run {reservation.run_id!r}")
    return entry


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
