"""Release size (issue 53): does drawing more rows from the released
mixture help the probe?

Sampling from a release's mixture is post-processing (`dpsynth sample`),
so a release could hold any number of rows at no privacy cost. For each
shared set (validation split carved from the TRAIN file only:
study_data.selection_split) or real set built by benchmarks/studies/real_sets.py
(``real:<name>``: train / validation splits), epsilon and seed, this runs the default
generator once (benchmarks.reference.generate_adaptive, the Beam job's
in-memory twin, default rule constants) and scores the shared README's
linear probe (fast_probe) trained on 1x, 2x and 5x the noisy class counts
drawn from that one mixture (generator.sample with ``oversample``: the
class proportions `dpsynth sample` keeps). epsilon = inf is the noiseless
ceiling of the same family. The probe's objective is C * (sum of losses) +
|w|^2 / 2 with C = 0.001, so more rows also weaken its penalty; each
multiple is also scored with C / multiple ("same penalty"), which
separates what the extra rows carry from that.

Each (set, epsilon, seed) appends a JSON line to
benchmark-data/studies/release_size.jsonl and is skipped when there (a rerun resumes);
``--report`` writes benchmarks/results/studies/release_size.md.

    nice -n 15 env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \\
        python -m benchmarks.studies.release_size --sets 20news,cifar10 \\
        --epsilons 1,8 --seeds 0,1
    python -m benchmarks.studies.release_size --report
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.studies.study_data import (DATA, RESULTS, append_record,  # noqa: E402
                                           selection_split)

LOG = os.path.join(DATA, "release_size.jsonl")
REPORT = os.path.join(RESULTS, "release_size.md")
MULTIPLES = (1.0, 2.0, 5.0)
# Records carry the covariance rule they ran under; a (set, eps, seed) is
# re-run when the rule changed (records without it: the issue-30 rule).
RULE = "issue53"
DELTA = 1e-5


def run_one(split, eps: float, seed: int) -> dict:
    """One default release; the probe on 1x / 2x / 5x its rows."""
    from benchmarks.studies import fast_probe
    from dpsynth.dp_ops import generator
    from benchmarks import reference
    from dpsynth.dp_ops.config import GeneratorConfig
    from dpsynth.dp_ops.noise import SeededNoise
    t = time.time()
    cfg = GeneratorConfig(labels=tuple(range(split.classes)), epsilon=eps,
                          delta=DELTA, seed=seed)
    mixes, _, _, _, st = reference.generate_adaptive(
        split.x_fit, split.y_fit, cfg, SeededNoise(1000 + seed))
    out = {}
    for mult in MULTIPLES:
        xs, ys = [], []
        for label, mix in mixes.items():
            rows = generator.sample(mix, cfg, oversample=mult)
            xs.append(rows)
            ys.append(np.full(len(rows), label))
        x, y = np.vstack(xs).astype(np.float64), np.concatenate(ys)
        out[f"x{mult:g}"] = {"rows": int(len(y)), "accuracy": fast_probe.accuracy(
            x, y, split.x_val, split.y_val, split.classes,
            warm=f"{split.name}/size")}
        if mult != 1.0:  # the probe's penalty weighed as against 1x rows
            out[f"x{mult:g}"]["accuracy_same_penalty"] = fast_probe.accuracy(
                x, y, split.x_val, split.y_val, split.classes, c=1e-3 / mult,
                warm=f"{split.name}/size-c")
    return {"structure": st.name, "mode": st.mode, "sizes": out,
            "seconds": round(time.time() - t, 1)}


def load_split(name: str):
    """A shared set's selection split, or ``real:<set>`` built by
    benchmarks/studies/real_sets.py (train -> release, validation -> probe)."""
    if name.startswith("real:"):
        from benchmarks.studies import real_sets
        return real_sets.fit_split(name[len("real:"):])
    return selection_split(name)


def load_log() -> list[dict]:
    if not os.path.exists(LOG):
        return []
    with open(LOG) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def sweep(sets: list[str], epsilons: list[float], seeds: list[int]) -> None:
    done = {(r["set"], float(r["epsilon"]), r["seed"]) for r in load_log()
            if r.get("rule", "issue30") == RULE}
    os.makedirs(DATA, exist_ok=True)
    for name in sets:
        todo = [(e, s) for s in seeds for e in epsilons
                if (name, float(e), s) not in done]
        if not todo:
            continue
        split = load_split(name)
        for eps, seed in todo:
            rec = {"set": name, "epsilon": eps, "seed": seed, "rule": RULE,
                   "fit_rows": int(len(split.y_fit)), "d": split.dim,
                   "classes": split.classes, **run_one(split, eps, seed)}
            append_record(LOG, rec)


def report() -> str:
    """Per set and epsilon: seed means at 1x / 2x / 5x, gain over 1x."""
    cells: dict = {}
    for r in load_log():
        cells.setdefault((r["set"], float(r["epsilon"]),
                          r.get("rule", "issue30")), []).append(r)
    head = ("| set | epsilon | rule | seeds | structure | 1x | 2x | 5x | 2x-1x | "
            "5x-1x | 5x-1x, same penalty |")
    lines = ["# Release size: probe accuracy (%) vs rows drawn from one "
             "released mixture", "",
             "Validation split of the TRAIN file (study_data.selection_split); "
             "default generator; probe = shared README's logistic probe "
             "(fast_probe). Gains in points; 1x = the noisy class counts "
             "(the default release); same penalty: the probe's C divided by the "
             "multiple (its penalty as against 1x rows).", "", head,
             "|" + "---|" * (head.count("|") - 1)]
    for (name, eps, rule), recs in sorted(cells.items()):
        acc = {m: 100 * np.mean([r["sizes"][f"x{m:g}"]["accuracy"]
                                 for r in recs]) for m in MULTIPLES}
        modes = sorted({r["structure"] for r in recs})
        same = [r["sizes"]["x5"].get("accuracy_same_penalty") for r in recs]
        same = ("-" if None in same
                else f"{100 * np.mean(same) - acc[1.0]:+.1f}")
        lines.append(
            f"| {name} | {eps:g} | {rule} | {len(recs)} | {', '.join(modes)} | "
            f"{acc[1.0]:.1f} | {acc[2.0]:.1f} | {acc[5.0]:.1f} | "
            f"{acc[2.0] - acc[1.0]:+.1f} | {acc[5.0] - acc[1.0]:+.1f} | "
            f"{same} |")
    text = "\n".join(lines) + "\n"
    with open(REPORT, "w") as fh:
        fh.write(text)
    return text


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sets", default="20news,cifar10")
    p.add_argument("--epsilons", default="1,8")
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--report", action="store_true")
    a = p.parse_args()
    if not a.report:
        sweep(a.sets.split(","), [float(e) for e in a.epsilons.split(",")],
              [int(s) for s in a.seeds.split(",")])
    print(report())


if __name__ == "__main__":
    main()
