"""The one-screen summary `dpsynth generate` prints after publishing.

Everything in it is public configuration or a DP output of the release
(read back from its manifest), plus the lifetime spend of the budget store,
which is a composition of recorded configurations.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Optional

SHOWN_CLASSES = 12


def stage_shares(mechanisms: list[dict]) -> dict[str, float]:
    """Share of the privacy cost per stage for the costliest class: every
    mechanism is Gaussian, so a class's cost is mu^2 = sum count / z^2
    (Gaussian DP), which adds up across stages (epsilon does not)."""
    per_part: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    globals_ = defaultdict(float)
    for m in mechanisms:
        if not m["sigma"]:
            continue
        cost = m["count"] * (m["sensitivity"] / m["sigma"]) ** 2
        target = globals_ if m["partition"] == "global" else per_part[m["partition"]]
        target[m["stage"]] += cost
    parts = list(per_part.values()) or [{}]
    worst = max(parts, key=lambda p: sum(p.values()))
    costs = defaultdict(float, worst)
    for stage, cost in globals_.items():
        costs[stage] += cost
    total = sum(costs.values())
    return {s: c / total for s, c in costs.items()} if total else {}


def _classes_line(classes: list[dict]) -> str:
    shown = ", ".join(f"{c['label']}: {c['samples']}"
                      for c in classes[:SHOWN_CLASSES])
    more = (f", ... ({len(classes) - SHOWN_CLASSES} more classes)"
            if len(classes) > SHOWN_CLASSES else "")
    return shown + more


def render(output: str, manifest: dict,
           lifetime: Optional[tuple[float, float, str]] = None) -> str:
    """``lifetime``: (epsilon spent, cap, dataset id) when a store is used."""
    privacy = manifest["privacy"]
    spent, target = privacy["spent"], privacy["target"]
    shares = stage_shares(privacy["mechanisms"])
    by_stage = ", ".join(f"{s} {100 * v:.0f} %" for s, v in
                         sorted(shares.items(), key=lambda kv: -kv[1]))
    lines = [
        f"release: {output}  (run {manifest['run_id']}, "
        f"{manifest['samples_total']} synthetic rows, "
        f"{len(manifest['classes'])} classes, d={manifest['embedding_dim']})",
        f"privacy: epsilon {spent['epsilon']:.4g} spent of {target['epsilon']:g}"
        f" at delta {target['delta']:g} ({privacy['accountant']} accountant, "
        f"{len(privacy['mechanisms'])} mechanisms, add/remove one record)",
    ]
    if by_stage:
        lines.append(f"  budget by stage (share of the costliest class's "
                     f"Gaussian-DP cost): {by_stage}")
    if lifetime is not None:
        used, cap, dataset = lifetime
        lines.append(f"lifetime budget of {dataset!r}: epsilon {used:.4g} "
                     f"spent of the cap {cap:g} by all recorded releases")
    lines.append(f"rows per class (DP): {_classes_line(manifest['classes'])}")
    for warning in manifest.get("warnings", []):
        lines.append(f"warning: {warning}")
    read = (f"read it: dpsynth.pipelines.release.load_release({output!r}, "
            f"as_='numpy') -> shuffled (x, y)")
    data = f"{output.rstrip('/')}/{manifest.get('root', '')}/data"
    if manifest.get("outputs", {}).get("format") == "parquet":
        # The version folder, not --output: a killed launch's placed files
        # (another run's version folder) may lie beside it.
        read += f", or pandas.read_parquet({data!r})"
    lines.append(read + f"; the shards are under {data}/ (one class each)")
    return "\n".join(lines)
