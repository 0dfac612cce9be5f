"""The Beam range dpsynth declares and what guards it (issue 70).

* pyproject.toml declares one range (floor and ceiling) for Beam and both
  of its extras, the installed Beam lies inside it, and moving the ceiling
  is one command.
* The Dask runner's overrides of Beam internals match the installed Beam
  (``dask_compat``); a Beam whose internals differ stops ``--runner dask``
  in one line before the budget is reserved: nothing charged, nothing
  written.
* The helper venvs pin only what must match (the gcp extra resolves in
  minutes) and give up in one line after a time limit.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import beam_floor

REPO = Path(__file__).resolve().parent.parent
SPEC = re.compile(r'"apache-beam(?:\[([a-z]+)\])?>=([0-9.]+),<([0-9.]+)"')


def _specs(text: str) -> list[tuple[str, str, str]]:
    return SPEC.findall(text)


def test_one_beam_range_for_beam_and_its_extras():
    specs = _specs((REPO / "pyproject.toml").read_text())
    assert {extra for extra, _, _ in specs} == {"", "dask", "gcp"}
    assert len({(lo, hi) for _, lo, hi in specs}) == 1, specs
    assert beam_floor.floor().startswith(specs[0][1])
    assert beam_floor.ceiling() == specs[0][2]


def test_the_installed_beam_is_inside_the_range():
    import apache_beam
    from packaging.version import Version
    installed = Version(apache_beam.__version__)
    assert Version(beam_floor.floor()) <= installed
    assert installed < Version(beam_floor.ceiling())


def test_moving_the_ceiling_is_one_command(tmp_path, monkeypatch):
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    monkeypatch.setattr(beam_floor, "REPO", tmp_path)
    old_floor = beam_floor.floor()
    assert beam_floor.set_ceiling("2.99") == 3
    specs = _specs((tmp_path / "pyproject.toml").read_text())
    assert {hi for _, _, hi in specs} == {"2.99"}
    assert beam_floor.floor() == old_floor
    with pytest.raises(SystemExit, match="not 2.N"):
        beam_floor.set_ceiling("3")


# ------------------------------------------------------- Dask's internals

distributed = pytest.importorskip(
    "distributed", reason="the Dask checks need pip install -e '.[test]'")


def test_the_installed_beam_has_the_shapes_the_dask_runner_was_written_for():
    from dpsynth.pipelines.runners.dask import compat as dask_compat
    assert dask_compat.refusal() is None, dask_compat.installed_shapes()


def test_a_beam_with_other_internals_is_refused_in_one_line(monkeypatch):
    from apache_beam.runners.dask import dask_runner as beam_dask
    from dpsynth.pipelines.runners.dask import compat as dask_compat

    def visitor(bag_kwargs=None, lazy_side_inputs=False, spill=None):
        raise AssertionError("never called")
    monkeypatch.setattr(beam_dask.DaskRunner, "to_dask_bag_visitor",
                        staticmethod(visitor))
    line = dask_compat.refusal()
    assert line is not None and "\n" not in line
    assert "to_dask_bag_visitor" in line and "nothing was read or charged" in line


def test_beams_visitor_is_called_with_what_its_release_takes(monkeypatch):
    from apache_beam.runners.dask import dask_runner as beam_dask
    from dpsynth.pipelines.runners.dask import compat as dask_compat
    seen = []
    monkeypatch.setattr(beam_dask.DaskRunner, "to_dask_bag_visitor",
                        staticmethod(lambda bag_kwargs=None: seen.append(
                            bag_kwargs)))
    dask_compat.beam_visitor({"a": 1}, True)  # a 2.77-shaped Beam
    monkeypatch.setattr(
        beam_dask.DaskRunner, "to_dask_bag_visitor",
        staticmethod(lambda bag_kwargs=None, lazy_side_inputs=False:
                     seen.append((bag_kwargs, lazy_side_inputs))))
    dask_compat.beam_visitor({"b": 2}, True)  # a 2.78-shaped one
    assert seen == [{"a": 1}, ({"b": 2}, True)]


def test_an_unforeseen_beam_stops_dask_before_the_budget_is_reserved(
        tmp_path, monkeypatch, capsys):
    """Beam 2.78 broke the Dask runner after the reservation (ε charged for
    nothing); a Beam whose internals differ now stops before it."""
    from apache_beam.runners.dask import transform_evaluator
    from dpsynth.pipelines.cli import generate
    from dpsynth.pipelines.budget import store as budget_store

    def apply(self, input_bag, side_inputs=None, lazy=False):
        raise AssertionError("never called")
    monkeypatch.setattr(transform_evaluator.ParDo, "apply", apply)
    store = tmp_path / "budgets"
    rc = generate.main([
        "--output", str(tmp_path / "out"), "--budget-store", str(store),
        "--dataset-id", "d", "--lifetime-epsilon", "10", "--runner", "dask"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "ParDo.apply" in err and "nothing was read or charged" in err
    assert budget_store.history(str(store), "d") == []  # nothing charged
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------- helper venvs

def _job_graph():
    return beam_floor._job_graph()


def test_helper_venvs_pin_what_must_match_and_nothing_else():
    """The gcp venv's constraints: the project's requirements and what
    TensorFlow is built against; not the whole environment (its
    opentelemetry-api pin sent pip backtracking for 46+ minutes)."""
    names = _job_graph().must_match()
    for needed in ("apache-beam", "numpy", "protobuf", "tensorflow",
                   "scikit-learn", "pipeline-dp"):
        assert needed in names
    assert not any(n.startswith("opentelemetry") for n in names)
    assert "google-api-core" not in names and "dpsynth" not in names


def test_a_helper_venv_install_that_hangs_stops_in_one_line(
        tmp_path, monkeypatch):
    job_graph = _job_graph()
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nsleep 30\n")
    fake.chmod(0o755)
    monkeypatch.setattr(job_graph, "PIP_TIMEOUT_S", 1)
    with pytest.raises(job_graph.HelperVenvFailed) as err:
        job_graph.install_keeping_pins(str(fake), tmp_path / "c.txt",
                                       ["apache-beam[gcp]==0"])
    assert "\n" not in str(err.value)
    assert "still resolving after 1 s" in str(err.value)


def test_the_gcp_setup_failure_is_one_line(tmp_path):
    """``job_graph.py setup`` that cannot build its venv: exit 1, one line
    naming the step (CI prints it and goes on)."""
    env = {"PATH": "/usr/bin:/bin", "DPSYNTH_GCP_VENV": str(tmp_path / "v"),
           "DPSYNTH_HELPER_PIP_TIMEOUT": "1", "HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, str(REPO / "deploy" / "dataflow" / "job_graph.py"),
         "setup"], capture_output=True, text=True, env=env, timeout=300)
    lines = [ln for ln in done.stderr.splitlines()
             if not ln.startswith("job_graph: creating")]
    assert done.returncode == 1, done.stderr
    assert len(lines) == 1 and lines[0].startswith(
        "job_graph.py setup: the gcp venv:"), done.stderr
