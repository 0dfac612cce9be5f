"""Beam's temporary folders do not outlive a pipeline (pipelines/runners/temp_cleanup.py)."""

from __future__ import annotations

import os

import pytest

@pytest.mark.parametrize("stop", [KeyboardInterrupt, ValueError])
def test_a_pipeline_whose_build_stops_leaves_no_temporary_folder(
        tmp_path, monkeypatch, stop):
    """Beam removes a pipeline's local temporary folder only once run() is
    reached; Ctrl-C or bad input while the graph is built left it."""
    from dpsynth.pipelines.runners.temp_cleanup import pipeline_run
    from dpsynth.pipelines.runners.options import beam_options
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    with pytest.raises(stop):
        with pipeline_run(beam_options([])):
            raise stop
    assert os.listdir(tmp_path) == []


def test_a_pipeline_run_runs_what_was_built(tmp_path, monkeypatch):
    import apache_beam as beam

    from dpsynth.pipelines.runners.temp_cleanup import pipeline_run
    from dpsynth.pipelines.runners.options import beam_options
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "t"))
    (tmp_path / "t").mkdir()
    with pipeline_run(beam_options([])) as p:
        _ = p | beam.Create(["x"]) | beam.Map(
            lambda v, path: open(path, "w").write(v), str(tmp_path / "ran"))
    assert (tmp_path / "ran").read_text() == "x"
    assert os.listdir(tmp_path / "t") == []


def test_a_job_server_whose_start_stops_removes_its_folder(tmp_path,
                                                         monkeypatch):
    """Ctrl-C while Beam starts Prism's job server: Beam removes the job
    server's folder only when a started one stops at exit."""
    from apache_beam.runners.portability import job_server

    from dpsynth.pipelines.runners import temp_cleanup
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    temp_cleanup._install()

    class Interrupted(job_server.SubprocessJobServer):
        def subprocess_cmd_and_endpoint(self):
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        Interrupted().start()
    assert os.listdir(tmp_path) == []
