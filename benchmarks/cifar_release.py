"""Issue 2 acceptance on real embeddings: the Beam job on CIFAR-10 features.

Runs `python -m dpsynth.pipelines.cli.generate` on ../shared/data/cifar10-effnetlite0/
train.npz (the private set) at each epsilon, times it, and scores the shared
README's logistic probe trained on the release on test.npz.

    python benchmarks/cifar_release.py --epsilons 1,8 [generate flags...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
DATA = os.path.join(os.path.dirname(ROOT), "shared", "data",
                    "cifar10-effnetlite0")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epsilons", default="1,8")
    args, extra = ap.parse_known_args()
    if not os.path.exists(DATA):
        sys.exit(f"shared data not found at {DATA}")
    from benchmarks.utility_study import probe_accuracy
    from dpsynth.pipelines.release import load_release
    from dpsynth.transforms.io import load_arrays
    xt, yt = load_arrays(os.path.join(DATA, "test.npz"))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for eps in args.epsilons.split(","):
            out = os.path.join(tmp, f"eps{eps}")
            cmd = [sys.executable, "-m", "dpsynth.pipelines.cli.generate", "--input",
                   os.path.join(DATA, "train.npz"), "--num-classes", "10",
                   "--epsilon", eps, "--output", out, *extra]
            t0 = time.time()
            subprocess.run(cmd, check=True, cwd=ROOT,
                           stdout=subprocess.DEVNULL)
            wall = time.time() - t0
            xs, ys, manifest = load_release(out)
            acc = probe_accuracy(xs, ys, xt, yt)
            rows.append((eps, acc, wall, manifest["privacy"]["spent"]["epsilon"],
                         len(ys)))
            print(f"eps={eps}: probe accuracy {acc:.4f}, wall {wall:.0f} s, "
                  f"spent {rows[-1][3]:.4f}, {len(ys)} rows", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
