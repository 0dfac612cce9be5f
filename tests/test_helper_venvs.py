"""The helper venvs (gcp: deploy/dataflow/job_graph.py; Beam floor:
tests/beam_floor.py) see the environment that makes them, whether that is
a venv, pyenv's python or a system python (issue 59: made with
``venv --system-site-packages`` from a venv they saw the *base*
interpreter's packages, so the gcp venv had no TensorFlow and the floor venv
no scikit-learn)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import beam_floor

REPO = Path(__file__).resolve().parent.parent


def _imported_from(python: Path, module: str) -> str:
    return subprocess.run(
        [str(python), "-c", f"import {module}; print({module}.__file__)"],
        capture_output=True, text=True, check=True, cwd="/",
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    ).stdout.strip()


@pytest.fixture(scope="module")
def overlay(tmp_path_factory):
    job_graph = beam_floor._job_graph()
    venv = tmp_path_factory.mktemp("helper") / "venv"
    return job_graph, venv, job_graph.overlay_venv(venv)


def test_a_helper_venv_imports_this_environments_packages(overlay):
    job_graph, venv, python = overlay
    here = job_graph.dependency_paths()
    for module in ("sklearn", "apache_beam", "numpy"):
        where = _imported_from(python, module)
        assert any(where.startswith(p + os.sep) for p in here), (module, where)
    # its own packages first: what pip installs there wins
    path = json.loads(subprocess.run(
        [str(python), "-c", "import json, sys; print(json.dumps(sys.path))"],
        capture_output=True, text=True, check=True).stdout)
    own = [i for i, p in enumerate(path) if p.startswith(str(venv))]
    theirs = [i for i, p in enumerate(path) if p in here]
    assert own and theirs and max(own) < min(theirs), path


def test_a_helper_venv_is_rebuilt_when_the_pins_change(overlay):
    job_graph, venv, _ = overlay
    assert job_graph.overlay_current(venv)
    stamp = venv / job_graph.OVERLAY_STAMP
    made = json.loads(stamp.read_text())
    stamp.write_text(json.dumps({**made, "pins": "other"}))
    try:
        assert not job_graph.overlay_current(venv)
    finally:
        stamp.write_text(json.dumps(made))


def test_from_the_base_interpreter_the_overlay_names_its_own_packages(
        tmp_path):
    """pyenv's or a system python (here: this venv's base interpreter, or
    this one when it is no venv) puts its own site-packages in the .pth."""
    base = getattr(sys, "_base_executable", sys.executable)
    script = (
        "import importlib.util, json, sys, sysconfig; "
        f"spec = importlib.util.spec_from_file_location('jg', "
        f"{str(REPO / 'deploy' / 'dataflow' / 'job_graph.py')!r}); "
        "m = importlib.util.module_from_spec(spec); "
        "spec.loader.exec_module(m); "
        "print(json.dumps([m.dependency_paths(), "
        "sysconfig.get_paths()['purelib']]))")
    paths, purelib = json.loads(subprocess.run(
        [base, "-c", script], capture_output=True, text=True, check=True,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    ).stdout)
    assert purelib in paths, (purelib, paths)
    if sys.prefix != sys.base_prefix:  # this venv is not among them
        assert sysconfig_purelib() not in paths


def sysconfig_purelib() -> str:
    import sysconfig
    return sysconfig.get_paths()["purelib"]


def test_ci_runs_in_a_fresh_venv_and_times_its_phases():
    """.ci/run remakes its venv before installing anything into it, builds
    no venv with --system-site-packages, and prints each phase's time."""
    ci = (REPO / ".ci" / "run").read_text()
    fresh = ci.index('rm -rf "$venv"')
    made = ci.index('-m venv "$venv"')
    active = ci.index('. "$venv/bin/activate"')
    install = ci.index('python -m pip install -q -e ".[test]"')
    assert fresh < made < active < install
    assert "--system-site-packages" not in ci
    for name in ("job_graph.py", "beam_floor.py"):
        source = next(REPO.rglob(name)).read_text()
        assert '"--system-site-packages"' not in source, name
    assert ci.count('phase "') >= 7
    assert ci.count("-eq 5") == 2  # both pytest runs: nothing collected
