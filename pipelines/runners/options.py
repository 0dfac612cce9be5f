"""Beam pipeline options for dpsynth's jobs: safe defaults, strict flags.

A privacy tool must not run with a mistyped flag silently dropped
(``--epsilom 1`` would otherwise publish at the default epsilon): every
argument that dpsynth's own parser does not know must be an option that
one of Beam's ``PipelineOptions`` classes defines, or the run stops before
any data is read, naming the closest valid flag.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.util
from typing import Iterable, Optional, Sequence

from apache_beam.options.pipeline_options import PipelineOptions

from dpsynth.pipelines.runners import locality
from dpsynth.pipelines.runners import prism, runner_names
from dpsynth.pipelines.runners import (bundle_sampler, dofn_specs,
                                       ipython_check, option_views)
from dpsynth.pipelines.runners.cores import usable_cores
from dpsynth.pipelines.runners.errors import (  # noqa: F401 (re-exported)
    ClusterLost, ClusterMismatch, UsageError)


LOCAL_RUNNERS = runner_names.LOCAL_RUNNERS


def resolve_dask(argv: Sequence[str]) -> list[str]:
    """``argv`` with a Dask runner name replaced by dpsynth's class path.

    Other runners pass through unchanged. Refuses (ValueError) when the
    ``dask`` extra is not installed, naming the install command. Imports
    the runner module, which registers Beam's ``--dask_*`` options before
    anything parses them.
    """
    argv = list(argv)
    if not runner_names.is_dask(runner_names.runner_flag(argv)):
        return argv
    if importlib.util.find_spec("distributed") is None:
        raise ValueError("--runner dask needs Dask: pip install "
                         "'dpsynth[dask]' (apache-beam[dask])")
    importlib.import_module("dpsynth.pipelines.runners.dask.runner")
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
        elif arg.startswith("--runner="):
            out.append(f"--runner={runner_names.DASK_RUNNER}")
        elif arg == "--runner" and i + 1 < len(argv):
            out.append(f"--runner={runner_names.DASK_RUNNER}")
            skip = True
        else:
            out.append(arg)
    return out



def beam_options(beam_argv: Sequence[str]) -> PipelineOptions:
    """Pipeline options with safe DirectRunner defaults.

    DirectRunner's ``multi_threading`` mode corrupted data in our tests, so
    it is refused; several workers default to ``multi_processing``. The
    DirectRunner first tries Beam's Prism runner, which it downloads (no
    network here: it fails, and leaves temporary folders behind), then falls
    back to Beam's FnApiRunner; dpsynth asks for the FnApiRunner directly.
    ``--runner dask`` (or Beam's DaskRunner class path) selects dpsynth's
    ``dpsynth.pipelines.runners.dask.runner`` (deploy/README.md "Dask").
    """
    dofn_specs.install()  # ~1 s less of building each job's graph
    option_views.install()  # ~0.5 s less of it
    ipython_check.install()  # no IPython import (~0.5 s) in the launcher
    bundle_sampler.install()  # no ~0.14 s wait at the end of each bundle
    argv = _resolve_runner(beam_argv)
    joined = " ".join(argv)
    if "multi_threading" in joined:
        raise UsageError("--direct_running_mode=multi_threading is not "
                         "supported (it corrupts data); use multi_processing")
    options = PipelineOptions(argv)
    all_opts = options.get_all_options()
    runner = (all_opts.get("runner") or "DirectRunner").lower()
    if runner not in LOCAL_RUNNERS:
        return options
    argv = [a for a in argv if not a.startswith("--runner")]
    if "--runner" in argv:  # "--runner X" as two arguments
        i = argv.index("--runner")
        del argv[i:i + 2]
    argv.append("--runner=FnApiRunner")
    from dpsynth.pipelines.runners import direct_runner
    direct_runner.install()  # cuts costs that grow with the worker count
    mode = all_opts.get("direct_running_mode")
    if "direct_running_mode" not in joined:
        mode = runner_names.default_running_mode(
            all_opts.get("direct_num_workers") or 1)
        argv.append(f"--direct_running_mode={mode}")
    if mode == "multi_processing":
        direct_runner.start_worker_server()  # imports while the job plans
    return PipelineOptions(argv)


def _resolve_runner(argv: Sequence[str]) -> list[str]:
    """``argv`` with a Dask runner name replaced by dpsynth's runner (which
    also registers Beam's ``--dask_*`` options), and Prism's cached binary
    when ``--runner prism`` names none; a missing Dask install or Prism
    binary is a usage error."""
    try:
        return prism.with_prism_location(resolve_dask(argv))
    except ValueError as err:
        raise UsageError(str(err)) from None


def _check_dask_flags(argv: Sequence[str]) -> None:
    """``--dask_*`` flags mean nothing to other runners: say which flag is
    missing rather than calling them unknown."""
    if runner_names.is_dask(runner_names.runner_flag(argv)):
        return
    for arg in argv:
        if arg.startswith("--dask_"):
            raise UsageError(f"{arg.split('=', 1)[0]} is an option of the "
                             f"Dask runner; add --runner dask")


def local_blas_threads(options: PipelineOptions) -> Optional[int]:
    """BLAS (or encoder) threads per worker process on DirectRunner: the
    usable cores shared out among its ``--direct_num_workers`` processes, so
    that large products do not oversubscribe the machine (measured: the vote
    search at 100k rows with 2 workers x 2 BLAS threads on 2 cores took
    17.1-17.9 s, with 1 thread each 14.7 s). None elsewhere: a remote
    runner's workers are sized by their own machine type."""
    opts = options.get_all_options()
    if (opts.get("runner") or "").lower() not in LOCAL_RUNNERS:
        return None
    workers = opts.get("direct_num_workers") or 1
    return max(1, usable_cores() // workers)


def is_local(options: PipelineOptions) -> bool:
    """The job runs on this machine (its workers can use local files):
    ``dpsynth.pipelines.runners.locality`` holds the rule."""
    return locality.elsewhere(options.get_all_options()) is None


def _beam_parser() -> argparse.ArgumentParser:
    """One parser holding every flag Beam's PipelineOptions classes define
    (what ``PipelineOptions.get_all_options`` builds internally; Beam has no
    public way to list them)."""
    from apache_beam.options.pipeline_options import _BeamArgumentParser
    parser = _BeamArgumentParser(allow_abbrev=False)
    seen = {}
    for cls in PipelineOptions.__subclasses__():
        seen.setdefault(str(cls), cls)
    for cls in seen.values():
        cls._add_argparse_args(parser)  # pylint: disable=protected-access
    return parser


def _flag_names(parser: argparse.ArgumentParser) -> list[str]:
    return [s for action in parser._actions for s in action.option_strings
            if s.startswith("--")]


def _closest(flag: str, candidates: Iterable[str]) -> Optional[str]:
    """The valid flag a typo most likely meant ('_' and '-' compared alike):
    the one flag it abbreviates (--eps: --epsilon), else the closest."""
    norm = {c.replace("_", "-"): c for c in candidates if c != "--help"}
    typed = flag.split("=", 1)[0].replace("_", "-")
    longer = sorted(n for n in norm if n.startswith(typed))
    if longer:
        return norm[longer[0]] if len(longer) == 1 else None
    match = difflib.get_close_matches(typed, list(norm), n=1, cutoff=0.6)
    return norm[match[0]] if match else None


def check_runner(name: Optional[str]) -> None:
    """Raises UsageError for a runner name Beam would reject only when the
    pipeline starts (after the plan is printed); a dotted class path is
    left for Beam to import."""
    if not name or "." in name:
        return
    from apache_beam.options.pipeline_options import StandardOptions
    known = [n.lower() for n in StandardOptions.KNOWN_RUNNER_NAMES]
    if name.lower() in known or name.lower() + "runner" in known:
        return
    # dask: resolved to dpsynth's runner before this check (runner_names)
    match = difflib.get_close_matches(
        name, [*StandardOptions.KNOWN_RUNNER_NAMES, "dask"], n=1, cutoff=0.5)
    hint = f"; did you mean {match[0]}?" if match else ""
    raise UsageError(f"unknown runner --runner {name}{hint} (or give a "
                     f"runner's full class path)")


def check_job_endpoint(runner: Optional[str],
                       job_endpoint: Optional[str]) -> None:
    """PortableRunner starts no job server of its own: without
    ``--job_endpoint`` Beam stops after the plan, with a traceback."""
    if (runner or "").lower() in ("portable", "portablerunner") \
            and not job_endpoint:
        raise UsageError(f"--runner {runner} needs --job_endpoint="
                         "HOST:PORT of a running job server (or name the "
                         "runner: --runner flink, spark or prism)")


def check_beam_args(rest: Sequence[str], own: argparse.ArgumentParser,
                    command: str) -> None:
    """Raises UsageError unless every argument in ``rest`` (what ``own``
    did not parse) is a Beam pipeline option."""
    if not rest:
        return
    _check_dask_flags(rest)
    rest = _resolve_runner(rest)  # registers the --dask_* options
    beam = _beam_parser()
    known, unknown = beam.parse_known_args(list(rest))
    if not unknown:
        check_runner(known.runner)
        check_job_endpoint(known.runner, getattr(known, "job_endpoint", None))
        return
    first = unknown[0]
    if not first.startswith("-"):
        raise UsageError(f"unexpected argument {first!r} (see dpsynth "
                         f"{command} --help)")
    hint = _closest(first, _flag_names(own) + _flag_names(beam))
    name = first.split("=", 1)[0]
    suffix = f"; did you mean {hint}?" if hint else f" (see dpsynth {command} --help)"
    raise UsageError(f"unknown flag {name}{suffix}")
