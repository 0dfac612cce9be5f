"""What a runner raises for the command line to print as one line. Kept
apart from ``options`` (which re-exports them): the Dask runner raises
them, and importing ``options`` from there closed a circle (options ->
runner_names -> dask_runner -> options)."""

from __future__ import annotations


class ClusterLost(RuntimeError):
    """The runner lost its cluster mid-run (a Dask scheduler gone): one
    line, not a traceback; the attempt stays charged (its noise may have
    been drawn)."""


class UsageError(ValueError):
    """A bad flag or flag combination, found before any data is read."""


class ClusterMismatch(UsageError):
    """The cluster's workers cannot run this job as planned (another
    dpsynth, or hosts elsewhere given local paths): found before any work
    is submitted."""
