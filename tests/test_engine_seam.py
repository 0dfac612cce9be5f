"""One engine seam (issue 70): the flags choose one typed engine, once; the
job and the transforms talk to it and never name an engine."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from dpsynth.pipelines.runners import select
from dpsynth.pipelines.runners.engine import Engine

REPO = Path(__file__).resolve().parent.parent
ENGINE_WORDS = ("dask", "dataflow", "prism", "flink", "spark")


@pytest.mark.parametrize("argv, name", [
    ([], "direct"),
    (["--runner", "DirectRunner"], "direct"),
    (["--runner=FnApiRunner"], "direct"),
    (["--runner", "dask"], "dask"),
    (["--runner", "apache_beam.runners.dask.dask_runner.DaskRunner"], "dask"),
    (["--runner", "dpsynth.pipelines.runners.dask.runner.DaskRunner"], "dask"),
    (["--runner", "PrismRunner"], "prism"),
    (["--runner", "DataflowRunner"], "dataflow"),
    (["--runner", "FlinkRunner"], "portable"),
    (["--runner", "SparkRunner"], "portable"),
    (["--runner", "my.company.ClusterRunner"], "portable"),
])
def test_the_flags_choose_one_engine(argv, name):
    engine = select.resolve(argv)
    assert isinstance(engine, Engine) and engine.name == name
    assert engine.beam_args == tuple(argv)
    assert engine.keeps_job_graph is (name == "dataflow")


def test_choosing_an_engine_starts_nothing_and_imports_no_engine():
    """Resolving --runner dask imports neither Beam nor Dask: the checks
    and the start are the engine's, later."""
    code = ("import sys; from dpsynth.pipelines.runners import select; "
            "e = select.resolve(['--runner', 'dask']); "
            "print(e.name, sorted(m for m in ('distributed', 'apache_beam', "
            "'dpsynth.pipelines.runners.dask.runner') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, check=True, cwd=REPO).stdout.split()
    assert out == ["dask", "[]"]


def _names_in_code(path: Path) -> list[str]:
    """Identifiers, attribute names, imported modules and non-docstring
    strings of a module (its comments and docstrings may explain engines)."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef,
                                       ast.AsyncFunctionDef, ast.ClassDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            found.append(node.id)
        elif isinstance(node, ast.Attribute):
            found.append(node.attr)
        elif isinstance(node, ast.ImportFrom):
            found.append(node.module or "")
            found += [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in docstrings):
            found.append(node.value)
    return found


@pytest.mark.parametrize("path", [
    *(REPO / "pipelines" / m for m in ("job.py", "job_plan.py", "graph.py",
                                       "job_manifest.py")),
    REPO / "pipelines" / "release" / "protocol.py",
    *sorted((REPO / "transforms").glob("*.py"))],
    ids=lambda p: str(p.relative_to(REPO)))
def test_the_job_and_the_transforms_never_name_an_engine(path):
    named = [n for n in _names_in_code(path)
             if any(word in n.lower() for word in ENGINE_WORDS)]
    assert not named, f"{path.relative_to(REPO)} names engines: {named}"
