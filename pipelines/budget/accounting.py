"""Lifetime accounting of the recorded attempts: mechanisms as the
document stores them, and their composition (``_compose``: one
``PrivacyLedger`` over every attempt's mechanisms, identical ones merged)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter

from dpsynth.dp_ops.ledger import Mechanism, PrivacyLedger


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
