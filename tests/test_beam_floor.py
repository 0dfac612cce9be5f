"""The declared Beam range is true (issue 51 item 2): a seeded release on
the floor Beam (pyproject's ``apache-beam>=FLOOR``) holds the same bytes as
on the installed, newest one; with two worker processes, so the floor's
multi-process DirectRunner is the one that runs. CI builds the floor venv
(.ci/run: ``python tests/beam_floor.py setup``) and also runs the
engine-touching test files there; without that venv this test skips. ~20 s.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from tests import beam_floor
from tests.conftest import assert_same_release, gmm_data

ARGS = ["--num-classes", 3, "--clusters", 3, "--epsilon", 3,
        "--noise-seed", 11, "--vote-filter", "--direct_num_workers", 2,
        "--block-size", 64]


def _generate(python, data, out) -> None:
    proc = subprocess.run(
        [str(python), "-m", "dpsynth.pipelines.cli", "generate", "--input",
         str(data), "--output", str(out), *map(str, ARGS)],
        capture_output=True, text=True, timeout=900, cwd=beam_floor.REPO,
        env={**os.environ, "PYTHONPATH": str(beam_floor.REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_a_seeded_release_on_the_floor_beam_is_byte_identical(tmp_path):
    python = beam_floor.ready_python()
    if python is None:
        pytest.skip(f"no Beam {beam_floor.floor()} venv at "
                    f"{beam_floor.venv_dir()} (python tests/beam_floor.py "
                    f"setup builds it; CI does)")
    import apache_beam
    x, y = gmm_data(900, d=6, classes=3, seed=4)
    data = tmp_path / "train.npz"
    np.savez(data, embeddings=x, labels=y)
    _generate(sys.executable, data, tmp_path / "newest")
    _generate(python, data, tmp_path / "floor")
    assert_same_release(tmp_path / "newest", tmp_path / "floor",
                        may_differ=frozenset({"versions"}))
    from dpsynth.pipelines.release.release import read_manifest
    beams = [read_manifest(str(tmp_path / n))["versions"]["apache-beam"]
             for n in ("newest", "floor")]
    assert beams == [apache_beam.__version__, beam_floor.floor()]
