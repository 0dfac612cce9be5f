"""Entry point of `dpsynth generate` for orchestrators that run a *file*.

Used as the Flex Template's ``FLEX_TEMPLATE_PYTHON_PY_FILE`` and as the
``py_file`` of Airflow's ``BeamRunPythonPipelineOperator``. Both pass options
the way Beam does (``--name=value``, underscores), while dpsynth's own flags
are argparse style (``--run-id``). This file:

  * puts the repository root on ``sys.path`` when dpsynth is not installed
    (running ``python deploy/launch.py`` puts only ``deploy/`` there);
  * renames ``--lifetime_epsilon=1`` to ``--lifetime-epsilon=1`` for every
    flag that ``dpsynth generate`` defines, and turns ``--flag=true|false``
    into ``--flag`` / nothing for its on/off flags (Flex Template parameters
    are always strings);
  * drops Dataflow *job* labels (``--labels=airflow-version=v3-1-8`` or
    ``--labels={"k": "v"}``): Airflow's Beam operator always adds them under
    that name, which collides with dpsynth's class ``--labels 0,1,...``
    (class labels never contain '=' or '{').
Everything else (Beam pipeline options) passes through unchanged.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Optional, Sequence

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off", ""}


def _ensure_importable() -> None:
    try:
        import dpsynth.pipelines.cli.generate  # noqa: F401
    except ImportError:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        sys.path.insert(0, root)


def _flags(parser: argparse.ArgumentParser) -> tuple[set[str], set[str]]:
    """(all option strings, those of on/off flags) of ``parser``."""
    known, switches = set(), set()
    for action in parser._actions:
        known.update(action.option_strings)
        if action.nargs == 0:
            switches.update(action.option_strings)
    return known, switches


def _is_job_label(value: str) -> bool:
    """``k=v`` or a JSON object: Dataflow job labels, not class labels."""
    if "=" in value:
        return True
    try:
        return isinstance(json.loads(value), dict)
    except ValueError:
        return False


def translate(argv: Sequence[str], parser: argparse.ArgumentParser) -> list[str]:
    """Beam/Flex/Airflow-style args -> args `dpsynth generate` accepts."""
    known, switches = _flags(parser)
    out: list[str] = []
    for arg in argv:
        if not arg.startswith("--"):
            out.append(arg)
            continue
        name, eq, value = arg.partition("=")
        if name == "--labels" and eq and _is_job_label(value):
            print(f"dpsynth.deploy.launch: ignoring orchestrator job labels {value}",
                  file=sys.stderr)
            continue
        dashed = "--" + name[2:].replace("_", "-")
        if dashed not in known:
            out.append(arg)  # a Beam pipeline option
        elif dashed in switches and eq:
            if value.lower() in _TRUE:
                out.append(dashed)
            elif value.lower() not in _FALSE:
                raise ValueError(f"{name}: expected true or false, got {value!r}")
            elif "--no-" + dashed[2:] in known:  # an on-by-default switch
                out.append("--no-" + dashed[2:])
        else:
            out.append(dashed + eq + value)
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    _ensure_importable()
    from dpsynth.pipelines.cli import generate
    args = list(sys.argv[1:] if argv is None else argv)
    return generate.main(translate(args, generate.parser()))


if __name__ == "__main__":
    sys.exit(main())
