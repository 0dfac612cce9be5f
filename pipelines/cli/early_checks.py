"""Refusals that need no pipeline library (a user mistake is answered in a second).

A flag typo or an --input glob that matches nothing is refused here, before
Beam and TensorFlow are imported (2-5 s); the full checks after the import
(``runners.options.check_beam_args``, ``io.match_files``) stay the
authority: these only refuse what those would refuse too.
``benchmarks/refusal_time.py`` measures the answer time.
"""

from __future__ import annotations

import argparse
import difflib
import fnmatch
import os
import re
from typing import Optional, Sequence

from dpsynth.pipelines.cli.beam_flags import BEAM_FLAGS
from dpsynth.pipelines.runners import runner_names


def problem(own: argparse.ArgumentParser, beam_argv: Sequence[str],
            command: str, input_glob: Optional[str] = None) -> Optional[str]:
    """The one-line refusal of the command line, or None (then the full
    checks run after the imports). The input is looked for here only for
    the local runner: with another, where its workers read comes first (a
    local path a cluster elsewhere cannot read is refused as such)."""
    runner = runner_names.runner_flag(beam_argv)
    local = runner is None or runner.lower() in runner_names.LOCAL_RUNNERS
    return (unknown_flag(own, beam_argv, command)
            or (missing_input(input_glob) if local else None))


def unknown_flag(own: argparse.ArgumentParser, beam_argv: Sequence[str],
                 command: str) -> Optional[str]:
    """A flag neither ``own`` (it did not parse it) nor Beam defines."""
    for arg in beam_argv:
        name = arg.split("=", 1)[0]
        if (not name.startswith("--") or name in BEAM_FLAGS
                or name.startswith("--dask_")):
            continue
        hint = _closest(name, _flag_names(own) + sorted(BEAM_FLAGS))
        return (f"unknown flag {name}; did you mean {hint}?" if hint else
                f"unknown flag {name} (see dpsynth {command} --help)")
    return None


def missing_input(pattern: Optional[str]) -> Optional[str]:
    """A local --input glob that matches no file (remote ones are listed
    after the import, by Beam's file systems)."""
    if not pattern or "://" in pattern or os.path.isdir(pattern):
        return None  # the demo, gs://, or io's own directory message
    if os.path.lexists(pattern) or _any_match(pattern):
        return None
    return f"--input {pattern!r}: no files match"


def _any_match(pattern: str) -> bool:
    """Whether a file might match as Beam matches local globs: the files
    under the folder of the part before the first wildcard, against the
    whole pattern. fnmatch's '*' also crosses '/' and matches dot files, so
    it accepts every path Beam's '*' and '**' do (and more): never a false
    refusal."""
    if pattern.endswith(("/", "\\")):
        pattern += "*"
    prefix = re.match(r"[^[*?]*", pattern).group(0)
    if prefix == pattern:  # no wildcard, and nothing there
        return False
    root = os.path.dirname(prefix)
    rest = pattern[len(root):].lstrip("/")
    # One folder's names suffice when no wildcard can cross a '/'.
    flat = not any(c in rest for c in "/?[") and "**" not in rest
    for folder, _, files in os.walk(root or "."):
        for name in files:
            path = os.path.join(folder, name)
            if not root:  # a relative pattern: os.walk adds "./"
                path = os.path.relpath(path)
            if fnmatch.fnmatchcase(path, pattern):
                return True
        if flat:
            break
    return False


def _flag_names(parser: argparse.ArgumentParser) -> list[str]:
    return [s for action in parser._actions for s in action.option_strings
            if s.startswith("--")]


def _closest(flag: str, candidates: Sequence[str]) -> Optional[str]:
    """The flag a typo most likely meant, as ``runners.options._closest``
    (which imports Beam) finds it: '_' and '-' alike; the one flag it
    abbreviates, else the closest."""
    norm = {c.replace("_", "-"): c for c in candidates if c != "--help"}
    typed = flag.replace("_", "-")
    longer = sorted(n for n in norm if n.startswith(typed))
    if longer:
        return norm[longer[0]] if len(longer) == 1 else None
    match = difflib.get_close_matches(typed, list(norm), n=1, cutoff=0.6)
    return norm[match[0]] if match else None
