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
        if self._progress is None or not self._progress.path:
            return blocks
        progress, stage = self._progress, self._stage

        def report(block):
            progress.add(stage, _rows(block))
            return block
        # the blocks' own type (and so their coder) passes through
        return blocks | beam.Map(report).with_output_types(
            blocks.element_type)
