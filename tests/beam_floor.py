"""The Beam range CI tests (pyproject's ``apache-beam>=FLOOR,<CEILING``):
the floor in a venv of its own for CI's floor run, and the one command that
moves the ceiling.

    python tests/beam_floor.py setup            # prints the floor venv's python
    python tests/beam_floor.py range            # prints FLOOR CEILING
    python tests/beam_floor.py ceiling 2.80     # admit Beam up to 2.79.x

CI installs the newest Beam the range admits for the whole suite and runs the
engine tests on the floor, so moving the ceiling is that command plus a CI
run (and, where a Dask internal changed shape, its new shape in
pipelines/runners/dask/compat.py: the Dask tests then say so in one line).

The venv sees this environment (a ``.pth`` file naming its site-packages:
job_graph.py's ``overlay_venv``; ``--system-site-packages`` would reach the
base interpreter's packages instead of an active venv's) and installs
``apache-beam[dask]==FLOOR`` under a constraints file of this environment's
pins, dropping the pins that Beam FLOOR refuses (measured for 2.71.0:
cryptography, grpcio, httplib2, jsonpickle, pyarrow), as the gcp venv of
deploy/dataflow/job_graph.py does. Default place ``$DPSYNTH_BEAM_FLOOR_VENV``
or ``${XDG_CACHE_HOME:-~/.cache}/dpsynth/venv-beam-floor``; a stamp file
records the floor, so a second call takes a moment (the first: ~1 min).
The tests run there with the checkout on ``PYTHONPATH``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent


def _beam_spec() -> str:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())[
        "project"]["dependencies"]
    (spec,) = [d for d in deps if d.startswith("apache-beam")]
    return spec


def floor() -> str:
    """The lowest Beam pyproject.toml declares (``apache-beam>=X,<Y``), as
    Beam spells its version (2.71 -> 2.71.0)."""
    parts = re.search(r">=\s*([0-9.]+)", _beam_spec()).group(1).split(".")
    return ".".join(parts + ["0"] * (3 - len(parts)))


def ceiling() -> str:
    """The first Beam release pyproject.toml no longer admits (``<Y``)."""
    return re.search(r"<\s*([0-9.]+)", _beam_spec()).group(1)


def set_ceiling(new: str) -> int:
    """Rewrites every ``apache-beam...>=FLOOR,<OLD`` in pyproject.toml to
    ``<new``; returns how many specs changed."""
    if not re.fullmatch(r"2\.[0-9]+", new):
        raise SystemExit(f"beam_floor.py ceiling: {new!r} is not 2.N")
    path = REPO / "pyproject.toml"
    text, old = path.read_text(), ceiling()
    pattern = re.compile(r'(apache-beam(?:\[[a-z]+\])?>=[0-9.]+,<)'
                         + re.escape(old) + '"')
    text, count = pattern.subn(lambda m: m.group(1) + new + '"', text)
    path.write_text(text)
    return count


def venv_dir() -> Path:
    if os.environ.get("DPSYNTH_BEAM_FLOOR_VENV"):
        return Path(os.environ["DPSYNTH_BEAM_FLOOR_VENV"])
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "dpsynth" / "venv-beam-floor"


def _stamp(venv: Path) -> Path:
    return venv / f".dpsynth-beam-floor-{floor()}"


def ready_python() -> Optional[Path]:
    """The floor venv's python if it is built for the current floor."""
    venv = venv_dir()
    python = venv / "bin" / "python"
    return (python if _stamp(venv).is_file() and python.is_file()
            and _job_graph().overlay_current(venv) else None)


def _job_graph():
    """deploy/dataflow/job_graph.py (a script, not a package module)."""
    path = REPO / "deploy" / "dataflow" / "job_graph.py"
    spec = importlib.util.spec_from_file_location("_job_graph", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ensure() -> Path:
    python = ready_python()
    if python is not None:
        return python
    venv, version = venv_dir(), floor()
    print(f"beam_floor: creating {venv} (apache-beam[dask]=={version} over "
          f"this environment)", file=sys.stderr, flush=True)
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    python = _job_graph().overlay_venv(venv)
    dropped = _job_graph().install_keeping_pins(
        str(python), venv / "constraints.txt",
        [f"apache-beam[dask]=={version}"], unpinned=["apache-beam"])
    got = subprocess.run([str(python), "-c", "import apache_beam; "
                          "print(apache_beam.__version__)"],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    if got.stdout.strip() != version:
        raise RuntimeError(f"{venv}: Beam {got.stdout.strip()}, not {version}")
    _stamp(venv).write_text(json.dumps({"beam": version,
                                        "dropped_pins": sorted(dropped)}))
    return python


USAGE = "usage: python tests/beam_floor.py setup | range | ceiling 2.N"

if __name__ == "__main__":
    args = sys.argv[1:]
    if args == ["setup"]:
        try:
            print(ensure())
        except (RuntimeError, subprocess.CalledProcessError) as err:
            sys.exit(f"beam_floor.py setup: the floor venv: {err}")
    elif args == ["range"]:
        print(floor(), ceiling())
    elif len(args) == 2 and args[0] == "ceiling":
        print(f"apache-beam <{args[1]}: {set_ceiling(args[1])} specs in "
              "pyproject.toml; now push it and let CI run the suite there")
    else:
        sys.exit(USAGE)
