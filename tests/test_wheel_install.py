"""dpsynth installed from its wheel into a fresh venv, as a user gets it
(issue 51 item 1): the distribution holds one top-level package,
``dpsynth``, so a user's own ``models/``, ``pipelines/``, ``transforms/``,
``deploy/`` and ``dp_ops/`` packages beside their script neither shadow
dpsynth's nor are shadowed by them (an editable install hides such a
collision: its import hook is not how users install). Building the wheel
takes ~8 s once per change of the sources, the venv ~6 s, each run a few
seconds."""

from __future__ import annotations

import shlex
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests import wheel_env
from tests.conftest import gmm_data

USER_PACKAGES = ("models", "pipelines", "transforms", "deploy", "dp_ops")


@pytest.fixture(scope="module")
def dists() -> tuple[Path, Path]:
    return wheel_env.built_distributions()


@pytest.fixture(scope="module")
def venv_python(dists, tmp_path_factory) -> Path:
    return wheel_env.make_venv(tmp_path_factory.mktemp("venv") / "v", dists[1])


@pytest.fixture
def user_project(tmp_path) -> Path:
    """A user's folder with packages named like dpsynth's design folders
    (``models.classifiers`` is what dpsynth's own spec imports), a tiny
    labelled .npz and a script that runs dpsynth's API."""
    for name in USER_PACKAGES:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"OWNER = 'user-{name}'\n")
    (tmp_path / "models" / "classifiers.py").write_text(
        "raise RuntimeError('the user module was imported by dpsynth')\n")
    x, y = gmm_data(240, d=8)
    np.savez(tmp_path / "train.npz", embeddings=x, labels=y)
    (tmp_path / "run.py").write_text(textwrap.dedent("""\
        import sys
        import models, pipelines, transforms, deploy, dp_ops
        import dpsynth
        from dpsynth import (GenerateSpec, GeneratorOptions, InputOptions,
                             OutputOptions, generate, load_release)
        from dpsynth.pipelines.api import generate as long_path
        assert long_path is generate
        assert dpsynth.__file__.startswith(sys.prefix), dpsynth.__file__
        release = generate(GenerateSpec(
            input=InputOptions(path="train.npz", num_classes=3),
            generator=GeneratorOptions(epsilon=4.0, noise_seed=3),
            output=OutputOptions(path=sys.argv[1])))
        x, y = release.arrays()
        frame = load_release(sys.argv[1], as_="pandas")
        assert len(frame) == len(y) > 0
        for mod in (models, pipelines, transforms, deploy, dp_ops):
            assert mod.OWNER == "user-" + mod.__name__, mod
        print("rows", len(y))
        """))
    return tmp_path


def _run(cmd: list, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True,
                          text=True, env=wheel_env.clean_env(), timeout=600)


def test_the_wheel_and_sdist_hold_only_dpsynth(dists):
    sdist, wheel = dists
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {
        "dpsynth", wheel.name.split("-py3")[0] + ".dist-info"}
    assert "dpsynth/pipelines/cli/__init__.py" in names
    assert "dpsynth/models/classifiers.py" in names
    # The sdist (what Beam's --setup_file stages for Dataflow's workers)
    # installs one package; it ships no tests, benchmarks or results.
    with tarfile.open(sdist) as tar:
        members = tar.getnames()
        root = members[0].split("/")[0]
        top = tar.extractfile(f"{root}/dpsynth.egg-info/top_level.txt")
        assert top.read().decode().split() == ["dpsynth"]
    tops = {m.split("/")[1] for m in members if m.count("/") >= 1}
    assert not tops & {"tests", "benchmarks", "docs"}, tops


def test_a_user_script_beside_its_own_packages_runs_the_api(
        venv_python, user_project):
    proc = _run([venv_python, "run.py", user_project / "out"], user_project)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().startswith("rows ")


def test_the_cli_from_the_wheel_beside_user_packages(venv_python,
                                                     user_project):
    """The console script, with worker processes (each imports dpsynth's
    modules again, from the user's folder)."""
    dpsynth = venv_python.parent / "dpsynth"
    proc = _run([dpsynth, "generate", "--input", "train.npz",
                 "--num-classes", 3, "--output", user_project / "cli-out",
                 "--noise-seed", 3, "--direct_num_workers", 2],
                user_project)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (user_project / "cli-out" / "_manifest.json").is_file()
    help_run = _run([dpsynth, "generate", "--help"], user_project)
    assert help_run.returncode == 0 and "--input" in help_run.stdout


def test_dataflow_options_from_the_wheel_ship_that_wheel(venv_python, dists,
                                                         tmp_path):
    """Issue 51: no checkout, so no setup.py; the Dataflow workers get the
    wheel pip installed dpsynth from (or $DPSYNTH_WORKER_PACKAGE's)."""
    cmd = [venv_python, "-m", "dpsynth.deploy.runner_options", "dataflow",
           "--project", "p", "--temp-location", "gs://b/t"]
    proc = _run(cmd, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    args = shlex.split(proc.stdout)
    assert f"--extra_package={dists[1]}" in args
    assert not [a for a in args if a.startswith("--setup_file")]
    other = tmp_path / dists[1].name
    other.write_bytes(dists[1].read_bytes())
    proc = subprocess.run([str(c) for c in cmd], cwd=tmp_path, text=True,
                          capture_output=True, timeout=600,
                          env=wheel_env.clean_env(
                              DPSYNTH_WORKER_PACKAGE=str(other)))
    assert shlex.split(proc.stdout)[-1] == f"--extra_package={other}"
