"""Beam's import-time "WARNING:root:apitools not found ..." line stays off
the API's and the deploy tools' stderr, as it stays off the command line's
(issue 72), without configuring the caller's logging."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _python(code: str, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO),
           "XDG_CACHE_HOME": str(Path(cwd) / "cache")}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_the_api_prints_no_apitools_line(tmp_path):
    proc = _python(
        "import dpsynth\n"
        "r = dpsynth.generate(dpsynth.GenerateSpec(\n"
        "    output=dpsynth.OutputOptions(path='rel'),\n"
        "    generator=dpsynth.GeneratorOptions(noise_seed=1)))\n"
        "print(r.manifest['run_id'])\n", tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "apitools" not in proc.stderr, proc.stderr[:2000]


def test_install_engines_prints_no_apitools_line(tmp_path):
    proc = _python("from dpsynth.deploy import install_engines\n"
                   "install_engines.main(['--print', 'prism'])\n", tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "apitools" not in proc.stderr, proc.stderr[:2000]


def test_only_that_record_is_dropped_and_logging_is_left_alone():
    from dpsynth.pipelines import quiet_beam
    root = logging.getLogger()
    before = (list(root.handlers), list(root.filters), root.level)
    quiet_beam.import_beam()
    assert (list(root.handlers), list(root.filters), root.level) == before
    drop = quiet_beam._DropApitools()
    record = lambda msg: logging.LogRecord("root", logging.WARNING, "", 0,
                                           msg, None, None)
    assert not drop.filter(record("apitools not found, and bigquery ..."))
    assert drop.filter(record("something a user can act on"))
