"""Which Beam runner a ``--runner`` flag names; the Dask aliases.

Kept free of Beam and Dask imports: ``dpsynth.pipelines.cli.generate`` calls it for
every run, and ``dpsynth.deploy.runner_options`` (pure option builders) uses the names.
"""

from __future__ import annotations

from typing import Optional, Sequence

# dpsynth's subclass of Beam's DaskRunner (pipelines/runners/dask/runner.py): it adds
# the workaround for the upstream bug and the local cluster for trying it.
DASK_RUNNER = "dpsynth.pipelines.runners.dask.runner.DaskRunner"
BEAM_DASK_RUNNER = "apache_beam.runners.dask.dask_runner.DaskRunner"
DASK_NAMES = frozenset({"dask", "daskrunner", BEAM_DASK_RUNNER.lower(),
                        DASK_RUNNER.lower()})


def is_dask(runner: Optional[str]) -> bool:
    """True for dask / DaskRunner / either class path, in any case."""
    return runner is not None and runner.lower() in DASK_NAMES


# Beam's local runner (dpsynth runs it as Beam's FnApiRunner).
LOCAL_RUNNERS = ("directrunner", "direct", "fnapirunner")


def flag_value(argv: Sequence[str], name: str) -> Optional[str]:
    """The value of the last ``--<name>`` in a Beam argument list
    (``--name=value`` or ``--name value``)."""
    value, flag = None, f"--{name}"
    for i, arg in enumerate(argv):
        if arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
        elif arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
    return value


def runner_flag(argv: Sequence[str]) -> Optional[str]:
    """The value of the last ``--runner`` in a Beam argument list."""
    return flag_value(argv, "runner")


def default_running_mode(workers: int) -> str:
    """DirectRunner's running mode when none is given: several workers run
    as processes (``multi_threading`` corrupted data here), one in memory."""
    return "multi_processing" if workers > 1 else "in_memory"


def wants_worker_processes(argv: Sequence[str]) -> bool:
    """Whether these Beam flags run the local runner with worker processes
    (``--direct_running_mode multi_processing``, or several
    ``--direct_num_workers`` and no mode), read without importing Beam.
    A hint for starting work early: ``dpsynth.pipelines.runners.options.beam_options``
    decides for real."""
    runner = runner_flag(argv)
    if runner is not None and runner.lower() not in LOCAL_RUNNERS:
        return False
    mode = flag_value(argv, "direct_running_mode")
    if mode is None:
        try:
            workers = int(flag_value(argv, "direct_num_workers") or 1)
        except ValueError:  # refused later, by Beam's parser
            return False
        mode = default_running_mode(workers)
    return mode == "multi_processing"


# What a user gives instead when Beam cannot start a runner's job server
# itself (a jar Maven does not serve, no network, no Java): by the class of
# Beam's job server.
_JOB_SERVER_FLAGS = {
    "flink": "--flink_job_server_jar=JAR",
    "spark": "--spark_job_server_jar=JAR",
    "prism": "--prism_location=BINARY",
}


class JobServerFailed(RuntimeError):
    """Beam could not start the job server of a portable runner: one line
    naming the flags that avoid the start, not Beam's chained tracebacks
    (a Maven 404, then a DNS error: 190 lines for ``--runner flink``)."""

    def __init__(self, server_class: str, cause: BaseException) -> None:
        engine = next((e for e in _JOB_SERVER_FLAGS
                       if e in server_class.lower()), None)
        name = engine.capitalize() if engine else server_class
        instead = "--job_endpoint=HOST:PORT of a running job server"
        if engine:
            instead += (f", or {_JOB_SERVER_FLAGS[engine]} (python -m "
                        f"dpsynth.deploy.install_engines {engine} fetches "
                        "it and prints its path)")
        super().__init__(f"Beam could not start the {name} job server "
                         f"({_first_line(cause)}); give {instead}")


def _first_line(err: BaseException, limit: int = 240) -> str:
    """The first sentence of an exception's message, shortened."""
    text = " ".join(str(err).split()) or type(err).__name__
    sentence = text.split(". ", 1)[0]
    return sentence if len(sentence) <= limit else sentence[:limit] + "..."
