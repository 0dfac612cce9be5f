"""Importing Beam without its import-time warning.

``import apache_beam`` logs "WARNING:root:apitools not found, and bigquery
client libraries are not available ..." through the root logger while its
GCP modules load: nothing a dpsynth user can act on. The command line drops
it (``console``'s filter, among its other noise); the API and the deploy
tools import Beam through ``import_beam`` instead, which drops that one
record and leaves the caller's logging as it was (no handler or level is
set: a library must not configure its user's logging).
"""

from __future__ import annotations

import logging

APITOOLS = "apitools not found"  # = the first of console._NOISE


class _DropApitools(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return APITOOLS not in record.getMessage()


def import_beam() -> None:
    """Imports apache_beam (once per process) with that record dropped: a
    filter on the root logger, where Beam logs it, for the import only."""
    root = logging.getLogger()
    drop = _DropApitools()
    root.addFilter(drop)
    try:
        import apache_beam  # noqa: F401
    finally:
        root.removeFilter(drop)
