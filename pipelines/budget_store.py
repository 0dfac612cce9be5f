"""Lifetime privacy budget of a private dataset, across all its releases.

Every release of dpsynth reads the same private records, so releases compose
*sequentially*: the privacy loss a person suffers over the dataset's lifetime
is the composition of every mechanism of every release that ever drew noise
from the data. This module keeps that record in one JSON document per private
dataset id (``{store_uri}/{dataset_id}.budget.json``, a local path or a
``gs://`` prefix) and refuses a new release whose mechanisms, composed with
all the recorded ones, would exceed the dataset's lifetime cap.

Accounting. All recorded mechanisms plus the new ones are put in one
``dp_ops.ledger.PrivacyLedger`` and composed by its ``spent_epsilon``: within a
class everything composes sequentially (across releases too), and classes
compose in parallel (a record is in exactly one class; labels are a public
per-record rule that is the same for every release of one dataset id), the
global mechanisms joining every class. Identical mechanisms of different
releases are merged into one with the summed ``count`` before composing, which
is exact (composition is commutative) and keeps a year of nightly releases as
fast to account as one release.

Concurrency. The read-check-write of a reservation is atomic: a local store
holds an exclusive ``fcntl`` lock on ``<document>.lock`` for the whole
transaction and replaces the document atomically (write temp + ``os.replace``);
a ``gs://`` store uses a compare-and-swap on the object generation
(``if_generation_match``) and re-runs the whole check when another writer won.
Two concurrent runs therefore cannot both spend the last of the budget.

Life of one attempt of a run (statuses, in order):

  reserved   recorded before any data is read; the spend counts from now on
  running    the pipeline is about to read private data
  staged     the release is complete in staging: its noise is fixed in files
             (the spend is committed before any byte reaches --output)
  published  the manifest at --output names the release
  failed     the pipeline failed after reading data (never published)

Invariant: the composed spend of all recorded attempts >= the composition of
every release whose bytes ever became readable. Every attempt's spend stays
recorded forever, whatever happened to it. A retry of a run id (the nightly
DAG retries with the same --run-id) reuses an attempt only when that costs
nothing new: an attempt still ``reserved`` read no data; a complete staged
release of the run id is re-published from its files, byte for byte (no new
noise). Any other retry (the crashed attempt read data and may have drawn
noise, and nothing of it is staged) is a new attempt, charged again and
refused when it no longer fits under the cap. A ``published`` run id is
refused (``RunConflict``): its release is out; ``dpsynth generate`` stops
earlier when it finds that run's release at --output.
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
import time
from collections import Counter
from typing import Callable, Iterator, Optional

from dp_ops.ledger import Mechanism, PrivacyLedger

FORMAT = "dpsynth-budget-ledger/1"
RESERVED, RUNNING, STAGED = "reserved", "running", "staged"
PUBLISHED, FAILED = "published", "failed"
# Accountants are numerical (PLD discretisation): a cap met to within this
# relative tolerance is met.
_REL_TOL = 1e-9
_DATASET_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_GCS_CAS_ATTEMPTS = 50


class BudgetExceeded(ValueError):
    """The new release would push the dataset past its lifetime cap."""


class RunConflict(ValueError):
    """A run id is already recorded with different mechanisms."""


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


# ---------------------------------------------------------------- public API


def reserve(store_uri: str, dataset_id: str, run_id: str,
            mechanisms: list[Mechanism], epsilon: float, delta: float,
            lifetime_epsilon: float, lifetime_delta: float,
            accountant: str = "pld",
            staged_available: bool = False) -> Reservation:
    """Records (or reuses) an attempt of ``run_id`` under the lifetime cap.

    Reuses the latest attempt, charging nothing, when it is ``reserved`` (no
    data read) or when ``staged_available``: the caller found this run id's
    complete staged release and re-publishes it byte for byte (its noise was
    drawn by a recorded attempt: every attempt is charged). Otherwise records a new attempt, which must
    fit: ``BudgetExceeded`` (nothing written) when the composition of every
    recorded attempt with ``mechanisms`` exceeds ``lifetime_epsilon`` at
    ``lifetime_delta``. ``RunConflict`` when ``run_id`` is recorded with other
    mechanisms or is already published.
    """
    _check_ids(dataset_id, run_id)
    _check_cap(lifetime_epsilon, lifetime_delta)
    if not mechanisms:
        raise ValueError(f"run {run_id}: no mechanisms to reserve")
    new = [_mechanism_to_dict(m) for m in mechanisms]
    result: dict = {}

    def update(doc: Optional[dict]) -> Optional[dict]:
        doc = _new_document(dataset_id) if doc is None else doc
        entry = _find(doc, run_id)
        if entry is not None:
            _check_retry(entry, new, store_uri, dataset_id)
            if entry["status"] == RESERVED or staged_available:
                result.update(already_spent=True, entry=copy.deepcopy(entry),
                              spent=_compose(doc["releases"], lifetime_delta,
                                             accountant))
                return None  # nothing to write
        attempt = 1 if entry is None else entry.get("attempt", 1) + 1
        entry = {
            "run_id": run_id, "attempt": attempt, "status": RESERVED,
            "epsilon": float(epsilon), "delta": float(delta),
            "accountant": accountant, "mechanisms": new,
            "lifetime_cap": {"epsilon": float(lifetime_epsilon),
                             "delta": float(lifetime_delta)},
            "release_uri": None, "reserved_at": _now(), "updated_at": _now(),
        }
        spent = _compose(doc["releases"] + [entry], lifetime_delta, accountant)
        if spent > lifetime_epsilon * (1 + _REL_TOL):
            before = _compose(doc["releases"], lifetime_delta, accountant)
            again = (f" (attempt {attempt}: an earlier attempt of this run id "
                     "read the data and stays charged)" if attempt > 1 else "")
            raise BudgetExceeded(
                f"dataset {dataset_id!r}: release {run_id!r}{again} (epsilon="
                f"{epsilon:g}, delta={delta:g}) would bring the lifetime "
                f"epsilon to {spent:.4f} at delta={lifetime_delta:g}, over the "
                f"lifetime cap --lifetime-epsilon {lifetime_epsilon:g} "
                f"(already spent {before:.4f} by {len(doc['releases'])} "
                f"earlier attempt(s), see {_document_uri(store_uri, dataset_id)}"
                "). Nothing was run or written; lower --epsilon or raise the "
                "cap deliberately.")
        entry["lifetime_epsilon_after"] = spent
        doc["releases"].append(entry)
        result.update(already_spent=False, entry=copy.deepcopy(entry),
                      spent=spent)
        return doc

    _transact(store_uri, dataset_id, update)
    return _reservation(store_uri, dataset_id, result["entry"],
                        result["already_spent"], result["spent"],
                        lifetime_delta)


def _check_retry(entry: dict, new: list[dict], store_uri: str,
                 dataset_id: str) -> None:
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


def _set_status(reservation: Reservation, status: str,
                allowed_from: tuple[str, ...], **fields) -> None:
    def update(doc: Optional[dict]) -> Optional[dict]:
        entry = _require(doc, reservation)
        if entry["status"] == status and all(
                entry.get(k) == v for k, v in fields.items()):
            return None
        if entry["status"] not in allowed_from:
            raise ValueError(
                f"run {reservation.run_id!r} (attempt {reservation.attempt}) "
                f"is {entry['status']}; it cannot become {status}")
        entry.update(status=status, updated_at=_now(), **fields)
        if status == PUBLISHED:
            entry["committed_at"] = entry["updated_at"]
        return doc

    _transact(reservation.store_uri, reservation.dataset_id, update)


def mark_running(reservation: Reservation) -> None:
    """The attempt is about to read private data: from now on a retry of
    this run id is charged again unless this attempt gets staged."""
    _set_status(reservation, RUNNING, (RESERVED,))


def commit_staged(reservation: Reservation) -> None:
    """The attempt's release is complete in staging: recorded before any of
    its bytes are placed under --output."""
    _set_status(reservation, STAGED, (RESERVED, RUNNING, FAILED, STAGED))


def commit(reservation: Reservation, release_uri: str) -> None:
    """Marks the attempt as published at ``release_uri``."""
    _set_status(reservation, PUBLISHED, (STAGED,), release_uri=release_uri)


def mark_published(store_uri: str, dataset_id: str, run_id: str,
                   release_uri: str) -> None:
    """Records that ``run_id``'s staged attempt is published at
    ``release_uri`` (a retry found its manifest there: the crash came
    between that write and ``commit``)."""
    def update(doc: Optional[dict]) -> Optional[dict]:
        entry = None if doc is None else _find(doc, run_id)
        if entry is None:
            raise ValueError(f"budget store {_document_uri(store_uri, dataset_id)}"
                             f" has no record of run {run_id!r}, whose release "
                             f"is at {release_uri}")
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
    """Marks an attempt that failed while running; its spend stays recorded
    (it read data and may have drawn noise). Reserved and staged attempts
    keep their status: a retry reuses them at no new cost."""
    def update(doc: Optional[dict]) -> Optional[dict]:
        entry = _require(doc, reservation)
        if entry["status"] != RUNNING:
            return None
        entry.update(status=FAILED, updated_at=_now())
        return doc

    _transact(reservation.store_uri, reservation.dataset_id, update)


def history(store_uri: str, dataset_id: str) -> list[dict]:
    """Every recorded release of ``dataset_id``, oldest first."""
    _check_ids(dataset_id)
    doc = _backend(store_uri, dataset_id).read()
    return [] if doc is None else copy.deepcopy(doc["releases"])


def lifetime_spent(store_uri: str, dataset_id: str, delta: float,
                   accountant: str = "pld") -> float:
    """Epsilon at ``delta`` of everything ever reserved for ``dataset_id``."""
    return _compose(history(store_uri, dataset_id), delta, accountant)


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
                 already_spent: bool, spent: float,
                 lifetime_delta: float) -> Reservation:
    return Reservation(
        store_uri=store_uri, dataset_id=dataset_id, run_id=entry["run_id"],
        attempt=entry.get("attempt", 1), epsilon=entry["epsilon"], delta=entry["delta"],
        mechanisms=tuple(_mechanism_from_dict(d) for d in entry["mechanisms"]),
        already_spent=already_spent, status=entry["status"],
        lifetime_epsilon_spent=spent, lifetime_delta=lifetime_delta,
        release_uri=entry.get("release_uri"))


def _check_ids(dataset_id: str, run_id: Optional[str] = None) -> None:
    if not _DATASET_ID.match(dataset_id or ""):
        raise ValueError(
            f"--dataset-id {dataset_id!r}: use 1-128 letters, digits, '.', "
            "'_' or '-' (it names the budget file)")
    if run_id is not None and not (run_id and run_id.strip() == run_id):
        raise ValueError(f"--run-id {run_id!r}: must be non-empty, no "
                         "surrounding spaces")


def _check_cap(lifetime_epsilon: float, lifetime_delta: float) -> None:
    if not lifetime_epsilon > 0 or math.isnan(lifetime_epsilon):
        raise ValueError(
            f"--lifetime-epsilon must be > 0, got {lifetime_epsilon}")
    if not 0 < lifetime_delta < 1:
        raise ValueError(
            f"--lifetime-delta must be in (0, 1), got {lifetime_delta}")


def _validate(doc: dict, where: str) -> dict:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{where}: not a {FORMAT} document")
    return doc


# ---------------------------------------------------------------- backends


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
              update: Callable[[Optional[dict]], Optional[dict]]) -> None:
    """Atomically applies ``update`` (None = no write) to the document.

    ``update`` may run several times (gs:// retries after a lost race), so it
    must only depend on the document it is given.
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
            new = update(self.read())
            if new is not None:
                self._write(new)

    def _write(self, doc: dict) -> None:
        folder = os.path.dirname(os.path.abspath(self.path))
        fd, tmp = tempfile.mkstemp(prefix=".budget-", dir=folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(doc, f, indent=1, sort_keys=True)
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
                new = update(doc)
                if new is None:
                    return
                self._blob().upload_from_string(
                    json.dumps(new, indent=1, sort_keys=True),
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


def _planned_mechanisms(args: argparse.Namespace) -> list[Mechanism]:
    if args.mechanisms_json:
        with open(args.mechanisms_json, encoding="utf-8") as f:
            data = json.load(f)
        if isinstance(data, dict):  # a manifest: {"privacy": {"mechanisms"}}
            data = data.get("privacy", data)["mechanisms"]
        return [_mechanism_from_dict(d) for d in data]
    from dp_ops.config import GeneratorConfig, labels_from
    from dp_ops.plan import make_ledger
    labels = labels_from(args.num_classes, args.labels)
    cfg = GeneratorConfig(labels=labels, epsilon=args.epsilon,
                          delta=args.delta, accountant=args.accountant)
    return make_ledger(cfg).mechanisms


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m pipelines.budget_store {show,check} ...``.

    ``show`` prints the history and the lifetime epsilon; ``check`` is the
    pre-flight of a scheduled run: exit 0 if a release with the planned
    mechanisms would fit under the cap, 3 if not (nothing is written; the
    authoritative reservation is made by the run itself).
    """
    p = argparse.ArgumentParser(prog="python -m pipelines.budget_store")
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("show", "check"):
        s = sub.add_parser(name)
        s.add_argument("--budget-store", required=True)
        s.add_argument("--dataset-id", required=True)
        s.add_argument("--lifetime-delta", type=float, default=1e-5)
        s.add_argument("--accountant", default="pld", choices=("pld", "rdp"))
    c = sub.choices["check"]
    c.add_argument("--lifetime-epsilon", type=float, required=True)
    c.add_argument("--run-id", default=None,
                   help="a run recorded under this id before reading data, "
                   "or staged, spends nothing more; one that crashed after "
                   "reading data is charged again")
    c.add_argument("--epsilon", type=float, default=4.0)
    c.add_argument("--delta", type=float, default=1e-5)
    c.add_argument("--num-classes", type=int, default=None)
    c.add_argument("--labels", type=lambda t: [int(v) for v in t.split(",")],
                   default=None)
    c.add_argument("--mechanisms-json", default=None,
                   help="a manifest.json or a JSON list of Mechanism dicts")
    args = p.parse_args(argv)

    entries = history(args.budget_store, args.dataset_id)
    spent = _compose(entries, args.lifetime_delta, args.accountant)
    report = {"dataset_id": args.dataset_id, "releases": len(entries),
              "lifetime_epsilon_spent": spent,
              "lifetime_delta": args.lifetime_delta}
    if args.command == "show":
        report["history"] = [{k: e.get(k) for k in (
            "run_id", "attempt", "status", "epsilon", "delta", "release_uri",
            "reserved_at", "lifetime_epsilon_after")} for e in entries]
        print(json.dumps(report, indent=1))
        return 0
    _check_cap(args.lifetime_epsilon, args.lifetime_delta)
    latest = None
    if args.run_id:
        latest = _find({"releases": entries}, args.run_id)
    if latest is not None and latest["status"] in (RESERVED, STAGED,
                                                   PUBLISHED):
        # reserved: no data read yet; staged: the retry re-publishes the
        # staged files; published: generate finds it and does nothing.
        report.update(fits=True, note=f"run {args.run_id} attempt "
                      f"{latest.get('attempt', 1)} is {latest['status']}: "
                      "a re-run spends nothing more")
        print(json.dumps(report, indent=1))
        return 0
    planned = {"mechanisms": [_mechanism_to_dict(m)
                              for m in _planned_mechanisms(args)]}
    after = _compose(entries + [planned], args.lifetime_delta, args.accountant)
    fits = after <= args.lifetime_epsilon * (1 + _REL_TOL)
    report.update(lifetime_epsilon_cap=args.lifetime_epsilon,
                  lifetime_epsilon_after=after, fits=fits)
    print(json.dumps(report, indent=1))
    if not fits:
        print(f"budget check: dataset {args.dataset_id!r} would reach "
              f"epsilon {after:.4f} > cap {args.lifetime_epsilon:g}; "
              "refusing to schedule the run", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
