"""Issue 13: the Beam job at the new default (``--covariance auto``) against
the old default (``--covariance shared``): wall time and validation
accuracy, on the fit / validation split of a shared TRAIN file.

    nice python benchmarks/studies/adaptive_beam.py --dataset cifar10 --epsilons 1,8

Runs ``python -m dpsynth.pipelines.cli.generate`` on the fit part (written to a
temporary .npz), the modes back to back per epsilon (same machine load,
same secret noise seed: paired), scores the shared README's probe on the
validation part and appends one JSON line per run to
benchmark-data/studies/adaptive_beam-issue13.jsonl. Test files are not read.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from benchmarks.studies.study_data import DATA, probe, selection_split  # noqa: E402

LOG = os.path.join(DATA, "adaptive_beam-issue13.jsonl")


def run_job(fit: str, classes: int, eps: str, mode: str, seed: int,
            out: str, extra: list) -> float:
    """One `dpsynth generate` run; returns its wall seconds."""
    cmd = [sys.executable, "-m", "dpsynth.pipelines.cli.generate", "--input", fit,
           "--num-classes", str(classes), "--epsilon", eps, "--covariance",
           mode, "--noise-seed", str(seed), "--output", out, *extra]
    t0 = time.time()
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return time.time() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="cifar10")
    ap.add_argument("--epsilons", default="1,8")
    ap.add_argument("--modes", default="auto,shared",
                    help="run in this order per epsilon (repeats allowed: "
                    "auto,shared,shared,auto pairs the timings)")
    ap.add_argument("--seed", type=int, default=1000)
    ap.add_argument("--no-log", action="store_true")
    args, extra = ap.parse_known_args()
    import numpy as np
    from dpsynth.pipelines.release import load_release
    split = selection_split(args.dataset)
    with tempfile.TemporaryDirectory() as tmp:
        fit = os.path.join(tmp, "fit.npz")
        np.savez(fit, embeddings=split.x_fit.astype(np.float32),
                 labels=split.y_fit)
        for eps in args.epsilons.split(","):
            for i, mode in enumerate(args.modes.split(",")):
                out = os.path.join(tmp, f"eps{eps}-{mode}-{i}")
                wall = run_job(fit, split.classes, eps, mode, args.seed, out,
                               extra)
                xs, ys, manifest = load_release(out)
                acc = probe(xs, ys, split)
                plan = manifest.get("adaptive_plan") or {}
                row = {"dataset": args.dataset, "mode": mode,
                       "epsilon": float(eps), "seed": args.seed,
                       "wall_s": round(wall, 1),
                       "val_accuracy": round(100 * acc, 2),
                       "structure": plan.get("structure", mode),
                       "sums_share": plan.get("shares_of_mu2", {}).get(
                           "moments"),
                       "spent_epsilon": manifest["privacy"]["spent"]["epsilon"],
                       "rows": len(ys), "extra": extra,
                       "load": os.getloadavg()[0]}
                print(json.dumps(row), flush=True)
                if not args.no_log:
                    with open(LOG, "a") as f:
                        f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
