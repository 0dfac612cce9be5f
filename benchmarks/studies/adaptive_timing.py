"""In-memory cost of the adaptive plan vs the issue-8 defaults (issue 13).

A proxy for the Beam job's wall time (the Beam side mirrors these steps):
the reference generator on the full CIFAR-10 train set at epsilon 1, old
defaults then the adaptive plan, back to back in one process, with the
per-stage seconds of ``benchmarks.reference``.

    nice -n 10 python benchmarks/studies/adaptive_timing.py --epsilon 1
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from benchmarks.studies.study_data import load_npz  # noqa: E402
from dpsynth.dp_ops import plan, reference  # noqa: E402
from dpsynth.dp_ops.config import GeneratorConfig  # noqa: E402
from dpsynth.dp_ops.noise import SeededNoise  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="cifar10")
    ap.add_argument("--epsilon", type=float, default=1.0)
    args = ap.parse_args()
    x, y = load_npz(args.dataset, "train")
    cfg = GeneratorConfig(labels=tuple(range(int(y.max()) + 1)),
                          epsilon=args.epsilon)
    out = {}
    for name in ("issue-8 defaults", "adaptive"):
        timings: dict = {}
        t = time.perf_counter()
        if name == "adaptive":
            _, xs, _, _, st = reference.generate_adaptive(
                x, y, cfg, SeededNoise(0), timings=timings)
            timings["structure"] = st.name
        else:
            ledger = plan.make_ledger(cfg)
            reference.generate(x, y, cfg, ledger, SeededNoise(0), timings)
        timings["total"] = round(time.perf_counter() - t, 1)
        out[name] = {k: (round(v, 1) if isinstance(v, float) else v)
                     for k, v in timings.items()}
        print(json.dumps({name: out[name]}), flush=True)
    ratio = out["adaptive"]["total"] / out["issue-8 defaults"]["total"]
    print(json.dumps({"ratio_adaptive_over_defaults": round(ratio, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
