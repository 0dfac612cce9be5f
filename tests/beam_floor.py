"""The declared Beam floor (pyproject's ``apache-beam>=FLOOR``) in a venv of
its own, for CI's floor run (issue 51 item 2).

    python tests/beam_floor.py setup    # prints the venv's python

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


def floor() -> str:
    """The lowest Beam pyproject.toml declares (``apache-beam>=X,<3``), as
    Beam spells its version (2.71 -> 2.71.0)."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())[
        "project"]["dependencies"]
    (spec,) = [d for d in deps if d.startswith("apache-beam")]
    parts = re.search(r">=\s*([0-9.]+)", spec).group(1).split(".")
    return ".".join(parts + ["0"] * (3 - len(parts)))


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


if __name__ == "__main__":
    if sys.argv[1:] != ["setup"]:
        sys.exit("usage: python tests/beam_floor.py setup")
    print(ensure())
