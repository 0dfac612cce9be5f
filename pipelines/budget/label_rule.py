"""The label rule (what makes a record's class) pinned by a dataset's
first release: a run under another rule is refused
(``LabelRuleConflict``); a document from before rules were pinned gets
its rule once from the logged admin command (``set_label_rule``)."""

from __future__ import annotations

import json
from typing import Optional

from dpsynth.pipelines.budget.record import (LabelRuleConflict, _check_ids,
                                             _new_document, _now)
from dpsynth.pipelines.budget.storage import _document_uri, _transact


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
