"""Where one local job's time goes, stage by stage (issue 27).

Runs one `dpsynth generate` job on DirectRunner with W worker processes
(the benchmark data of ``benchmarks/scaling.py``, its default flags) and
prints the runner's fused stages in order with their wall times (Beam's
``FnApiRunner._execute_bundle``, timed in the runner process) and the
spans of the job with no worker running traced work (``dpsynth.transforms.progress``).
Stages that run in the runner process (shuffles, PipelineDP's small
stages) cost the same whatever the cores: on a 2-core machine,
``--workers 16`` shows what 16 workers cost there.

    python benchmarks/stage_timeline.py --workers 16 --min-seconds 0.1
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from typing import Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks import scaling  # noqa: E402


def idle_spans(spans, start: float, end: float,
               least: float) -> list[tuple[float, float]]:
    """[from, to] offsets of ``start`` during which no traced span runs,
    at least ``least`` seconds long."""
    out, edge = [], start
    for _, _, a, b in sorted(spans, key=lambda s: s[2]):
        if a - edge >= least:
            out.append((edge - start, a - start))
        edge = max(edge, b)
    if end - edge >= least:
        out.append((edge - start, end - start))
    return out


def timed_stages(log: list):
    """Patches the FnApiRunner to append (stage, start, end) to ``log``."""
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    original = fn_runner.FnApiRunner._execute_bundle

    def execute(self, context, bundle_manager, bundle_input):
        start = time.time()
        try:
            return original(self, context, bundle_manager, bundle_input)
        finally:
            log.append((bundle_manager.stage.name, start, time.time()))
    fn_runner.FnApiRunner._execute_bundle = execute


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--gen-args", default="--output-format parquet",
                   help="more `dpsynth generate` flags")
    p.add_argument("--min-seconds", type=float, default=0.1,
                   help="print stages and idle spans at least this long")
    args = p.parse_args(argv)
    engine = scaling.ENGINES["direct"]
    engine.launch(args.workers)
    from dpsynth.pipelines import console, job
    from dpsynth.pipelines.cli import generate
    from dpsynth.transforms import progress
    data = scaling.make_data(scaling.DEFAULT_CACHE, args.rows, args.dim)
    out = tempfile.mkdtemp(prefix="dpsynth-timeline-")
    trace = os.path.join(out, "trace.tsv")
    os.environ[progress.TRACE_ENV] = trace
    flags = ["--input", os.path.join(data, "part-*"), "--output",
             os.path.join(out, "rel"), "--num-classes", str(scaling.CLASSES),
             "--noise-seed", "1", *args.gen_args.split(),
             *engine.flags(args.workers)]
    parsed, beam_argv = scaling._parse_generate(flags)
    console.setup_logging()
    log: list = []
    timed_stages(log)
    try:  # the release is ~1.5 GB at the default size: never leave it
        t0 = time.time()
        job.run(generate.spec_from_args(parsed, beam_argv))
        t1 = time.time()
        spans = progress.read_trace(trace)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    print(f"job {t1 - t0:.1f} s, {args.workers} workers "
          f"({os.cpu_count()} cores)")
    previous = t0
    for name, a, b in log:
        if b - a >= args.min_seconds:
            print(f"stage {a - t0:7.2f} s {b - a:6.2f} s  (after a gap of "
                  f"{a - previous:5.2f} s)  {name[:100]}")
        previous = b
    for a, b in idle_spans(spans, t0, t1, args.min_seconds):
        print(f"no worker busy {a:7.2f} -> {b:7.2f} s ({b - a:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
