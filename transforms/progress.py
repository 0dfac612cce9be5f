"""Operator-only progress of a local run: rows seen per pass.

Workers append ``<pass>\t<rows>`` lines to a local file the launcher named
(``console.ProgressPrinter`` tails it and prints one line per pass now and
then). Row counts are exact, so like Beam's counters they are for the
operator's console only: never in the release, the manifest or the logs.
With a remote runner (Dataflow, a Dask cluster on other hosts) the file is
not shared and progress comes from the runner's own monitoring; a worker
that cannot write the file stays silent.
"""

from __future__ import annotations

import os
import time
from typing import Optional

import apache_beam as beam


class ProgressFile:
    """Where workers report progress (None: nowhere)."""

    def __init__(self, path: Optional[str]) -> None:
        self.path = path

    def reset(self) -> None:
        """Empties the file (between the pipeline runs of one job)."""
        if self.path:
            with open(self.path, "w"):
                pass

    def add(self, stage: str, rows: int) -> None:
        if not self.path:
            return
        try:  # one short O_APPEND write: lines never interleave
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        except OSError:
            return
        try:
            os.write(fd, f"{stage}\t{int(rows)}\n".encode())
        finally:
            os.close(fd)


def _rows(block) -> int:
    y = block[1] if isinstance(block, tuple) else block.y
    return len(y)


class ReportProgress(beam.PTransform):
    """Blocks unchanged; each block's row count reported under ``stage``."""

    def __init__(self, progress: Optional[ProgressFile], stage: str) -> None:
        super().__init__()
        self._progress, self._stage = progress, stage

    def expand(self, blocks):
        path = None if self._progress is None else self._progress.path
        if not path and not trace_path():
            return blocks
        # the blocks' own type (and so their coder) passes through
        return blocks | beam.ParDo(_ReportFn(
            ProgressFile(path), self._stage)).with_output_types(
                blocks.element_type)


class _ReportFn(beam.DoFn):
    """Reports each block's rows; with a stage trace, each bundle of the
    pass as a ``pass:<stage>`` span (on DirectRunner the fused bundle: the
    read and what follows it)."""

    def __init__(self, progress: ProgressFile, stage: str) -> None:
        self._progress, self._stage = progress, stage
        self._span = BundleSpan(f"pass:{stage}")

    def start_bundle(self) -> None:
        self._span.start()

    def finish_bundle(self) -> None:
        self._span.end()

    def process(self, block):
        self._span.mark()
        self._progress.add(self._stage, _rows(block))
        yield block


# ------------------------------------------------------------ stage trace
# For benchmarks and tests only: which process ran each stage, and when.
# With DPSYNTH_STAGE_TRACE=<file> in the environment of the launcher (and
# so of the workers it starts: DirectRunner's SDK processes, a local Dask
# cluster) each traced span appends "<stage>\t<pid>\t<start>\t<end>" to the
# file. No row counts or data: stage names are transform labels.
TRACE_ENV = "DPSYNTH_STAGE_TRACE"


def trace_path() -> Optional[str]:
    return os.environ.get(TRACE_ENV) or None


def trace(stage: str, start: float, end: float) -> None:
    """Appends one span (wall-clock seconds) to the trace file, if any."""
    path = trace_path()
    if not path:
        return
    try:  # one short O_APPEND write: lines never interleave
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    except OSError:
        return
    try:
        os.write(fd, f"{stage}\t{os.getpid()}\t{start:.6f}\t{end:.6f}\n"
                 .encode())
    finally:
        os.close(fd)


class BundleSpan:
    """A DoFn's bundle as one traced span: ``start()`` in start_bundle,
    ``mark()`` per element, ``end()`` in finish_bundle (bundles that saw
    no element are not traced). On a fused DirectRunner stage the span is
    the whole bundle (the read that feeds it included)."""

    def __init__(self, stage: str) -> None:
        self.stage = stage
        self._start: Optional[float] = None
        self._seen = False

    def __getstate__(self):
        return {"stage": self.stage, "_start": None, "_seen": False}

    def start(self) -> None:
        self._start, self._seen = time.time(), False

    def mark(self) -> None:
        if self._start is None:  # a runner that skipped start_bundle
            self._start = time.time()
        self._seen = True

    def end(self) -> None:
        if self._seen and self._start is not None:
            trace(self.stage, self._start, time.time())
        self._start, self._seen = None, False


def read_trace(path: str) -> list[tuple[str, int, float, float]]:
    """The spans of a trace file: (stage, pid, start, end)."""
    spans = []
    with open(path) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) == 4:
                spans.append((parts[0], int(parts[1]), float(parts[2]),
                              float(parts[3])))
    return spans


def stage_table(spans, min_share: float = 0.0) -> list[dict]:
    """Per stage: spans, distinct processes, busy seconds (sum of spans),
    elapsed seconds (first start to last end) and parallelism (busy /
    elapsed), in order of first start; stages under ``min_share`` of all
    busy time are left out."""
    by_stage: dict = {}
    for stage, pid, start, end in spans:  # write:class<l> -> write
        by_stage.setdefault(stage.split(":class")[0], []).append(
            (pid, start, end))
    total = sum(e - s for _, _, s, e in spans) or 1.0
    rows = []
    for stage, items in by_stage.items():
        busy = sum(e - s for _, s, e in items)
        first, last = min(s for _, s, _ in items), max(e for _, _, e in items)
        elapsed = max(last - first, 1e-9)
        if busy / total < min_share:
            continue
        rows.append({"stage": stage, "spans": len(items),
                     "workers": len({p for p, _, _ in items}),
                     "busy_s": busy, "elapsed_s": last - first,
                     "start": first, "parallelism": busy / elapsed})
    return sorted(rows, key=lambda r: r["start"])
