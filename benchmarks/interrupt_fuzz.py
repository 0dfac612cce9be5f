"""Ctrl-C (or SIGTERM) at random moments of real `dpsynth generate` jobs.

Each round starts the command in its own session and temporary folder
(TMPDIR), sends the signal to the whole process group (what a terminal's
Ctrl-C does; ``--signal term`` sends SIGTERM to the process alone, as a
scheduler may) after a random delay, and checks what a user and an
operator would see:

* exit 0 (the job had ended) or 130 / 143 with the last line
  ``dpsynth: interrupted; ...`` / ``dpsynth: stopped (SIGTERM); ...``, and no
  traceback or library error line on the console;
* no release at --output when the line says nothing was published;
* nothing left in the temporary folder (Beam's, Dask's, the runner's log);
* no process of the job alive 20 s later.

    python benchmarks/interrupt_fuzz.py --runner direct --rounds 20
    python benchmarks/interrupt_fuzz.py --runner dask --from 4 --to 8
    python benchmarks/interrupt_fuzz.py --runner prism \\
        --prism-location "$(python -m dpsynth.deploy.install_engines --print prism)"

The input is 4 ``.npz`` files of ``--rows`` Gaussian rows (64 dimensions,
4 classes). Prints one line per round and the number of bad rounds; exits 1
if there was one.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def runner_flags(runner: str, prism_location: str) -> list[str]:
    if runner == "direct":
        return ["--direct_num_workers", "2"]
    if runner == "prism":
        return ["--runner=PrismRunner", f"--prism_location={prism_location}",
                "--environment_type=LOOPBACK"]
    return ["--runner", runner]


def write_input(folder: str, rows: int) -> str:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 64)).astype("float32")
    y = rng.integers(0, 4, rows)
    for i in range(4):
        np.savez(os.path.join(folder, f"in{i}.npz"), embeddings=x[i::4],
                 labels=y[i::4])
    return os.path.join(folder, "in*.npz")


def session_alive(sid: int) -> list[str]:
    out = subprocess.run(["pgrep", "-s", str(sid)], capture_output=True,
                         text=True).stdout
    return out.split()


def one_round(data: str, work: str, flags: list[str], at: float,
              sigterm: bool) -> list[str]:
    """Runs one job, signals it after ``at`` s; returns what was wrong."""
    out, tmp = os.path.join(work, "out"), os.path.join(work, "tmp")
    os.mkdir(tmp)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dpsynth.pipelines.cli", "generate", "--input", data,
         "--num-classes", "4", "--output", out, *flags], cwd=ROOT,
        env={**os.environ, "TMPDIR": tmp, "PYTHONPATH": ROOT},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    time.sleep(at)
    try:
        if sigterm:
            proc.terminate()
        else:
            os.killpg(proc.pid, signal.SIGINT)
    except ProcessLookupError:
        pass
    _, err = proc.communicate(timeout=300)
    lines = [l for l in err.strip().splitlines() if "apitools" not in l]
    wrong = []
    code = proc.returncode
    word = "stopped (SIGTERM)" if sigterm else "interrupted"
    if code not in (0, 143 if sigterm else 130):
        wrong.append(f"exit {code}")
    if code != 0:
        last = lines[-1] if lines else ""
        if not last.startswith(f"dpsynth: {word}"):
            wrong.append(f"last line {last!r}")
        if "nothing was published" in last and os.path.exists(
                os.path.join(out, "_manifest.json")):
            wrong.append("published, but the line says nothing was")
    noise = [l for l in lines if "Traceback" in l or "Error" in l
             or l.startswith(("ERROR", "WARNING:", "Exception"))]
    if noise:
        wrong.append(f"console: {noise[0][:120]!r}")
    left = os.listdir(tmp)
    if left:
        wrong.append(f"left in TMPDIR: {left}")
    deadline = time.time() + 20
    while session_alive(proc.pid) and time.time() < deadline:
        time.sleep(0.2)
    if session_alive(proc.pid):
        wrong.append(f"processes alive after 20 s: {session_alive(proc.pid)}")
    print(f"at {at:5.2f} s: exit {code}, {len(lines)} lines"
          + ("" if not wrong else "  BAD: " + "; ".join(wrong)), flush=True)
    return wrong


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runner", default="direct",
                        choices=["direct", "dask", "prism"])
    parser.add_argument("--prism-location", default="")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--from", dest="start", type=float, default=0.3,
                        help="earliest signal, seconds after the start")
    parser.add_argument("--to", dest="end", type=float, default=10.0)
    parser.add_argument("--signal", choices=["int", "term"], default="int")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    root = tempfile.mkdtemp(prefix="interrupt-fuzz-")
    try:
        data = write_input(root, args.rows)
        flags = runner_flags(args.runner, args.prism_location)
        print(f"{args.runner}, {args.rows} rows, SIG{args.signal.upper()} "
              f"between {args.start} and {args.end} s, load "
              f"{os.getloadavg()[0]:.1f}", flush=True)
        bad = 0
        for r in range(args.rounds):
            work = os.path.join(root, f"round{r}")
            os.mkdir(work)
            bad += bool(one_round(data, work, flags,
                                  rng.uniform(args.start, args.end),
                                  args.signal == "term"))
        print(f"{bad} bad rounds of {args.rounds}")
        return 1 if bad else 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
