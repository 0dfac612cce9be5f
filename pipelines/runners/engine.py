"""The engine a run uses, as the job sees it.

``select.resolve(beam_args)`` returns one typed ``Engine``, from the
operator's flags, before any data is read or any budget reserved; the job
then asks only it, never an engine's name:

* ``beam_args``: the Beam flags it runs with (``options.beam_options``
  turns them into strict options with dpsynth's runner classes);
* ``keeps_job_graph``: whether its service keeps the pickled job graph
  where more people may read it than the data (the noise key must not be
  in it);
* ``check_before_charge(spec, options)``: its pre-flight checks (a Beam release its
  overrides were not written for, a cluster's workers), one line each;
* ``close()``: what it started for the run (a local cluster).

One module (or package) per engine under ``pipelines/runners/``:
``direct_runner`` (Beam's FnApiRunner, in memory or worker processes),
``dask/`` (dpsynth's DaskRunner and its clusters), ``prism``, ``portable``
(Flink, Spark, Dataflow and any other runner Beam knows), the way Beam keeps
``runners/<name>/``; ``select`` picks one. This module is their common
base and imports none of them.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence


class Engine:
    """A Beam runner as the job sees it; subclasses change what differs."""

    name = "beam"
    keeps_job_graph = False

    def __init__(self, beam_args: Sequence[str],
                 runner: Optional[str] = None) -> None:
        self.beam_args = tuple(beam_args)
        self.runner = runner

    def check_before_charge(self, spec: Any, options: Any) -> None:
        """Pre-flight checks on the run's spec and its Beam ``options``
        (``options.beam_options``), before the budget is reserved
        (``UsageError`` or ``ClusterMismatch``: one line). Nothing by
        default."""

    def close(self) -> None:
        """Ends what this engine started for the run. Nothing by default."""

    def job_graph_refusal(self) -> str:
        """The one line refusing a noise key in a kept job graph."""
        return (f"{self.runner} keeps the job graph where more people may "
                "read it than the data: pass --noise-key-location")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(runner={self.runner!r})"
