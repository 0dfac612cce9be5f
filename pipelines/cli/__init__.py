"""The `dpsynth` command line: generate, encode, evaluate, report, sample,
budget.

Each sub-command lives in its own module, which registers its flags and
handler here; this module only dispatches (nothing imports it).
"""

from __future__ import annotations

import atexit
import importlib
import os
import signal
import sys
from typing import Optional, Sequence

from dpsynth.pipelines import console

# (sub-command, its module, takes Beam pipeline options)
COMMANDS = (("generate", "dpsynth.pipelines.cli.generate", True),
            ("encode", "dpsynth.pipelines.cli.encode", True),
            ("evaluate", "dpsynth.pipelines.cli.evaluate", False),
            ("report", "dpsynth.pipelines.cli.report", False),
            ("sample", "dpsynth.pipelines.release.sample", False),
            ("budget", "dpsynth.pipelines.budget.store", False))


def build_parser(only: Optional[str] = None) -> console.Parser:
    """The `dpsynth` parser; ``only``: register just that sub-command (its
    module alone is imported: `dpsynth generate --help` loads no other)."""
    parser = console.Parser(
        prog="dpsynth",
        description="Differentially private synthetic embedding datasets.")
    parser.add_argument("--version", action="version",
                        version=f"dpsynth {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command, name, _ in COMMANDS:
        if only is not None and command != only:
            continue
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        module.register(sub)
    return parser


def version() -> str:
    """The installed dpsynth version (no Beam import: answers at once)."""
    from importlib import metadata
    try:
        return metadata.version("dpsynth")
    except metadata.PackageNotFoundError:  # run from a checkout
        return "unknown (not installed)"


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv else "generate"
    return console.run_stoppable(lambda: _dispatch(argv), command)


def _dispatch(argv: list[str]) -> int:
    if argv[:1] == ["--version"]:
        print(f"dpsynth {version()}")
        return 0
    names = {c for c, _, _ in COMMANDS}
    parser = build_parser(argv[0] if argv[:1] and argv[0] in names else None)
    args, rest = parser.parse_known_args(argv)
    takes_beam = {c: b for c, _, b in COMMANDS}
    if takes_beam.get(args.command):
        return args.handler(args, rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return args.handler(args)


def run() -> None:
    """The ``dpsynth`` command: ``main``, then the exit without Python's
    interpreter teardown, which after Beam and PipelineDP are imported
    tears down modules and objects the finished job no longer needs: the
    user waited 0.8-1.3 s after the summary, every run
    (``benchmarks/exit_time.py``). Exit handlers still run (logging's
    flush, the fork server's and a local Dask cluster's shutdown, Beam's
    job server's), Ctrl-C ignored while they do, then the process ends.
    An exception keeps Python's own exit (its traceback)."""
    code = main()
    _flush()
    # A Ctrl-C now would cut the clean-up short (measured on Prism: Beam's
    # job server stop sleeps 1 s, a traceback, its folder left): it runs
    # to its end, within the handlers' own time-outs.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    atexit._run_exitfuncs()  # what a normal exit runs first, once
    _flush()
    os._exit(code)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a pipe whose reader left
            pass
