"""How long `dpsynth` takes to refuse a flag typo or a missing --input
(issue 72: answers in a second; goal: under 1 s).

Each refusal runs as the ``dpsynth`` command in a fresh process, alternately
with two references in the same run: an empty Python start and the Beam
import that these refusals used to wait for. A refusal that still waits for
Beam shows a ratio to the Beam import near 1.

    python benchmarks/refusal_time.py            # 5 runs each
    python benchmarks/refusal_time.py --runs 9

Printed: per case the median seconds, its ratio to the Beam import, and
whether it answered with exit status 2 (the one-line error).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = "import sys; sys.argv[0] = 'dpsynth'; from dpsynth.pipelines import cli; cli.run()"

CASES = {
    "generate flag typo": ["-c", CLI, "generate", "--inptu", "x.npz"],
    "generate missing --input": ["-c", CLI, "generate", "--input",
                                 "/nonexistent/emb-*.npz", "--num-classes", "3"],
    "generate Beam-flag typo": ["-c", CLI, "generate", "--runner",
                                "DirectRunner", "--direct_num_wrokers", "2"],
    "encode flag typo": ["-c", CLI, "encode", "--images", "a", "--output",
                         "b", "--encodr", "x"],
    "(python start)": ["-c", "pass"],
    "(import apache_beam)": ["-c", "import apache_beam"],
}


def time_once(argv: list[str]) -> tuple[float, int]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, *argv], cwd=ROOT,
                          capture_output=True)
    return time.perf_counter() - start, proc.returncode


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    times = {name: [] for name in CASES}
    codes = {}
    for _ in range(args.runs):  # alternately: the load moves them alike
        for name, argv in CASES.items():
            seconds, codes[name] = time_once(argv)
            times[name].append(seconds)
    beam = statistics.median(times["(import apache_beam)"])
    print(f"load average (1 min): {os.getloadavg()[0]:.2f}; "
          f"{args.runs} runs each")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:28s} {median:6.2f} s  {median / beam:5.2f} x Beam "
              f"import  (exit {codes[name]})")


if __name__ == "__main__":
    main()
