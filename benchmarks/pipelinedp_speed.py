"""Wall time of one per-class aggregation pass: dpsynth's own PerClassSum
(in-place accumulator + keyed noise, the path before PipelineDP) vs the family
through PipelineDP (dpsynth.transforms.pipelinedp.ClassSums), same run, alternating
runs; blocks are generated inside the pipeline (a 'gen' run measures that
alone). Results: benchmarks/results/pipelinedp.md.

    python -m benchmarks.pipelinedp_speed --rows 200000 --dim 64 --family sum
"""

from __future__ import annotations

import argparse
import time

import apache_beam as beam
import numpy as np
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.pvalue import AsDict

from dpsynth.dp_ops import plan
from dpsynth.dp_ops.ledger import Mechanism, PrivacyLedger
from dpsynth.dp_ops.noise import SeededNoise
from dpsynth.transforms.aggregate import Block, PerClassSum
from dpsynth.transforms.pipelinedp import (ClassSums, _Concatenated, class_second_moment_family,
                                   class_sum_family, pieces)

R = 0.7


def make_block(i: int, size: int, dim: int, classes: int) -> Block:
    rng = np.random.default_rng([7, i])
    x = rng.normal(size=(size, dim))
    x *= np.minimum(1.0, R / np.linalg.norm(x, axis=1))[:, None]
    y = np.sort(rng.integers(0, classes, size))
    return Block(x, y, np.zeros((size, 0)), np.zeros(size, np.int64))


def ledger_for(labels, family: str) -> PrivacyLedger:
    ledger = PrivacyLedger(2.0, 1e-5)
    sens = R * R if "second-moment" in family else R
    for c in labels:
        ledger.register(Mechanism(plan.name(c, family), "bench",
                                  plan.partition(c), sens, 5.0))
    return ledger


def run(mode: str, args) -> float:
    labels = list(range(args.classes))
    fam = (class_sum_family(R) if args.family == "sum"
           else class_second_moment_family(R))
    ledger, noise = ledger_for(labels, fam.name), SeededNoise(1)
    n_blocks = args.rows // args.block
    opts = PipelineOptions(direct_num_workers=1)
    start = time.perf_counter()
    with beam.Pipeline(options=opts) as p:
        blocks = (p | beam.Create(list(range(n_blocks)))
                  | beam.Map(make_block, args.block, args.dim, args.classes))
        if mode == "gen":
            out = blocks | beam.Map(lambda b: len(b.y))
        elif mode == "today":
            # dpsynth's own per-class combine and noise (the path before
            # PipelineDP): one in-place partial per class and bundle.
            sums = blocks | PerClassSum(
                labels, _Concatenated([fam], args.dim),
                every_label=False)
            zero = fam.zero(args.dim)
            place = pieces([fam], args.dim)[0]

            def noisy(_, s):
                for c in labels:
                    v = zero if s.get(c) is None else place.value(s[c])
                    yield c, fam.release(ledger, noise, plan.name(c, fam.name),
                                         v)
            out = (p | "Once" >> beam.Create([None])
                   | beam.FlatMap(noisy, AsDict(sums)))
        else:
            t = ClassSums(labels, args.dim, fam, ledger, noise)
            out = blocks | t
            t.aggregation.accountant.compute_budgets()
        out | beam.Map(lambda _: None)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--block", type=int, default=2000)
    ap.add_argument("--family", choices=["sum", "second-moment"],
                    default="sum")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    times = {"gen": [], "today": [], "pipelinedp": []}
    for _ in range(args.repeats):
        for mode in ("gen", "today", "pipelinedp", "pipelinedp", "today"):
            times[mode].append(run(mode, args))
    best = {m: min(v) for m, v in times.items()}
    print(f"rows={args.rows} dim={args.dim} family={args.family} "
          + " ".join(f"{m}={v:.2f}s(min of {len(times[m])})"
                     for m, v in best.items()))
    print("all runs: " + "; ".join(
        f"{m}: " + ", ".join(f"{t:.2f}" for t in v) for m, v in times.items()))
    extra = best["pipelinedp"] - best["today"]
    print(f"pipelinedp/today wall: {best['pipelinedp'] / best['today']:.3f} "
          f"(+{extra:.2f} s)")


if __name__ == "__main__":
    main()
