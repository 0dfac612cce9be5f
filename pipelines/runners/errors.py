"""What a runner raises for the command line to print as one line. Kept
apart from ``options`` (which re-exports it): the Dask runner raises it, and
importing ``options`` from there closed a circle (options -> runner_names ->
dask_runner -> options)."""

from __future__ import annotations


class ClusterLost(RuntimeError):
    """The runner lost its cluster mid-run (a Dask scheduler gone): one
    line, not a traceback; the attempt stays charged (issue 52)."""
