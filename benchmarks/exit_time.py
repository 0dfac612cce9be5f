"""How long the `dpsynth` command takes to end after its last line.

Once Beam and PipelineDP are imported, Python's interpreter teardown (freeing
every module and object) takes a noticeable time that the user waits
through after the summary. ``dpsynth.pipelines.cli.run`` (the ``dpsynth`` command)
runs the exit handlers and ends the process without that teardown;
``dpsynth.pipelines.cli.main`` under ``sys.exit`` is the ordinary exit it replaces.
Both run the same command (by default the demo job) in a fresh process,
alternately, and are timed from the last line the command printed to the
process's end, and as a whole.

    python benchmarks/exit_time.py                 # the demo, 3 runs each
    python benchmarks/exit_time.py --runs 5 -- generate --direct_num_workers 2

Printed: per way the median seconds (last line -> end, whole command), the
ratio, the 1-min load average before and after.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WAYS = {
    "run (dpsynth)": "from dpsynth.pipelines import cli; cli.run()",
    "sys.exit(main())": "import sys; from dpsynth.pipelines import cli; "
                        "sys.exit(cli.main())",
}


def time_once(code: str, argv: list[str]) -> tuple[float, float]:
    """(seconds from the last printed line to the end, whole command)."""
    out = tempfile.mkdtemp(prefix="exit-time-")
    try:
        args = [sys.executable, "-u", "-c",
                f"import sys; sys.argv = ['dpsynth'] + sys.argv[1:]; {code}",
                *argv, "--output", os.path.join(out, "r")]
        start = time.perf_counter()
        proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        last = start
        for _ in proc.stdout:
            last = time.perf_counter()
        code_ = proc.wait()
        end = time.perf_counter()
        if code_ != 0:
            raise SystemExit(f"the command failed (exit {code_})")
        return end - last, end - start
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("command", nargs="*", default=["generate"],
                        help="the dpsynth command and its flags, after --")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    times: dict[str, list[tuple[float, float]]] = {w: [] for w in WAYS}
    for _ in range(args.runs):
        for way, code in WAYS.items():
            times[way].append(time_once(code, args.command))
    print(f"dpsynth {' '.join(args.command)}: {args.runs} runs each, "
          f"alternating; load {load:.1f} -> {os.getloadavg()[0]:.1f}")
    medians = {}
    for way, runs in times.items():
        tail = statistics.median(t for t, _ in runs)
        whole = statistics.median(w for _, w in runs)
        medians[way] = tail
        print(f"  {way:18s} last line -> end {tail:6.3f} s   "
              f"whole {whole:6.2f} s")
    fast, slow = medians["run (dpsynth)"], medians["sys.exit(main())"]
    print(f"  ending: {slow / max(fast, 1e-6):.0f}x faster, "
          f"{slow - fast:.2f} s less a command")


if __name__ == "__main__":
    main()
