"""``--runner prism`` without ``--prism_location`` (issue 51): the binary
``install_engines prism`` cached for the installed Beam, or one line naming
that command; never Beam's download traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from apache_beam.options.pipeline_options import PrismRunnerOptions
from apache_beam.version import __version__ as BEAM

from dpsynth.deploy import install_engines
from dpsynth.pipelines.runners import prism
from dpsynth.pipelines.runners.options import UsageError, beam_options

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def engines(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("DPSYNTH_ENGINES_DIR", str(tmp_path / "engines"))
    return tmp_path / "engines"


def _stub_prism(engines: Path) -> Path:
    """An executable where install_engines puts Prism (building the real
    one with go install takes minutes: tests/test_engines.py runs it)."""
    binary = install_engines.engine_path("prism", engines, BEAM, "")
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\nexit 1\n")
    binary.chmod(0o755)
    return binary


@pytest.mark.parametrize("runner", ["prism", "PrismRunner"])
def test_the_cached_binary_reaches_beam(engines, runner):
    binary = _stub_prism(engines)
    opts = beam_options(["--runner", runner])
    assert opts.view_as(PrismRunnerOptions).prism_location == str(binary)


def test_a_named_binary_or_endpoint_is_kept(engines):
    _stub_prism(engines)
    opts = beam_options(["--runner=prism", "--prism_location=/opt/prism"])
    assert opts.view_as(PrismRunnerOptions).prism_location == "/opt/prism"
    opts = beam_options(["--runner=prism", "--job_endpoint=localhost:8073"])
    assert opts.view_as(PrismRunnerOptions).prism_location is None


def test_no_binary_is_a_usage_error_naming_the_install(engines):
    with pytest.raises(UsageError, match=prism.INSTALL_COMMAND):
        beam_options(["--runner", "prism"])
    binary = _stub_prism(engines)
    binary.chmod(0o644)  # not executable: not a binary to start
    with pytest.raises(UsageError, match=prism.INSTALL_COMMAND):
        beam_options(["--runner", "prism"])
    # Other runners never look.
    assert beam_options(["--runner", "direct"]).view_as(
        PrismRunnerOptions).prism_location is None


def test_generate_says_one_line_before_reading_data(engines, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO),
           "DPSYNTH_ENGINES_DIR": str(engines)}
    proc = subprocess.run(
        [sys.executable, "-m", "dpsynth.pipelines.cli", "generate",
         "--output", str(tmp_path / "out"), "--runner", "prism"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert prism.INSTALL_COMMAND in lines[0] and "Traceback" not in lines[0]
    assert not (tmp_path / "out").exists()
