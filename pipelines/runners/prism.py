"""Which Prism binary ``--runner prism`` starts when no flag names one.

Beam's PrismRunner, given neither ``--prism_location`` nor
``--job_endpoint``, downloads a release binary from GitHub and, offline,
fails with a long traceback. dpsynth passes instead the binary that
``python -m dpsynth.deploy.install_engines prism`` built into the engines
cache for the installed Beam, or stops with one line naming that command.
Kept free of Beam imports but its version module.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Sequence

from dpsynth.pipelines.runners import runner_names
from dpsynth.pipelines.runners.engine import Engine

INSTALL_COMMAND = "python -m dpsynth.deploy.install_engines prism"
PRISM_NAMES = frozenset({
    "prism", "prismrunner",
    "apache_beam.runners.portability.prism_runner.prismrunner"})


def engines_dir(env: Optional[dict] = None) -> Path:
    """The engines cache: ``$DPSYNTH_ENGINES_DIR``, else
    ``$XDG_CACHE_HOME/dpsynth/engines`` (default ``~/.cache``)."""
    env = os.environ if env is None else env
    if env.get("DPSYNTH_ENGINES_DIR"):
        return Path(env["DPSYNTH_ENGINES_DIR"])
    base = env.get("XDG_CACHE_HOME") or os.path.join(
        env.get("HOME", str(Path.home())), ".cache")
    return Path(base) / "dpsynth" / "engines"


def binary_path(root: Path, beam: str) -> Path:
    """Where install_engines puts Prism for Beam ``beam`` (a Prism built
    for another Beam version may not speak its protocol)."""
    return root / f"beam-{beam}" / "prism"


def is_prism(runner: Optional[str]) -> bool:
    return runner is not None and runner.lower() in PRISM_NAMES


def with_prism_location(argv: Sequence[str]) -> list[str]:
    """``argv`` plus ``--prism_location`` of the cached binary when it runs
    Prism and names no binary or job endpoint. ValueError (one line naming
    the install command) when the cache holds none."""
    argv = list(argv)
    if (not is_prism(runner_names.runner_flag(argv))
            or runner_names.flag_value(argv, "prism_location")
            or runner_names.flag_value(argv, "job_endpoint")):
        return argv
    from apache_beam.version import __version__ as beam
    binary = binary_path(engines_dir(), beam)
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        raise ValueError(f"--runner prism: no Prism binary for Beam {beam} "
                         f"in {binary.parent}; run `{INSTALL_COMMAND}` "
                         f"(or pass --prism_location or --job_endpoint)")
    return argv + [f"--prism_location={binary}"]


class PrismEngine(Engine):
    """``--runner prism``: Beam's Prism job server, the binary the operator
    names (``--prism_location``) or the one ``install_engines`` built for
    the installed Beam (``with_prism_location``)."""

    name = "prism"
