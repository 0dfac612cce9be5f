"""deploy/launch.py (orchestrator-style args), deploy/publish.py, and the
Dataflow/Flink submit scripts (DRY_RUN: the exact commands they would run)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from dpsynth.deploy import launch, publish

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def parser():
    from dpsynth.pipelines.cli import generate
    return generate.parser()


def test_launch_translates_beam_style_flags(parser):
    argv = ["--runner=DataflowRunner", "--project=p", "--temp_location=gs://b/t",
            "--run_id=nightly-1", "--lifetime_epsilon=8", "--num_classes=10",
            "--vote_filter=true", "--overwrite=false", "--labels=0,1,7",
            "--output=gs://b/out", "--input", "gs://b/in/*.npz"]
    assert launch.translate(argv, parser) == [
        "--runner=DataflowRunner", "--project=p", "--temp_location=gs://b/t",
        "--run-id=nightly-1", "--lifetime-epsilon=8", "--num-classes=10",
        "--vote-filter", "--labels=0,1,7", "--output=gs://b/out",
        "--input", "gs://b/in/*.npz"]
    # dpsynth's parser accepts the result; Beam keeps its own flags.
    args, beam = parser.parse_known_args(launch.translate(argv, parser))
    assert (args.run_id, args.lifetime_epsilon, args.vote_filter,
            args.overwrite, args.labels) == ("nightly-1", 8.0, True, False,
                                             [0, 1, 7])
    assert beam == ["--runner=DataflowRunner", "--project=p",
                    "--temp_location=gs://b/t"]


def test_launch_turns_off_on_by_default_switches(parser):
    out = launch.translate(["--center=false", "--covariance=per-class"],
                           parser)
    assert out == ["--no-center", "--covariance=per-class"]
    args, _ = parser.parse_known_args(out)
    assert (args.center, args.covariance) == (False, "per-class")
    assert launch.translate(["--center=true"], parser) == ["--center"]


def test_launch_drops_orchestrator_job_labels(parser):
    for labels in ("--labels=airflow-version=v3-1-8",
                   '--labels={"airflow-version": "v3-1-8"}'):
        assert launch.translate([labels, "--epsilon=1"], parser) == [
            "--epsilon=1"]
    with pytest.raises(ValueError, match="expected true or false"):
        launch.translate(["--overwrite=maybe"], parser)


def test_launch_runs_as_a_file_outside_the_repo(tmp_path):
    """Flex Template / Airflow run `python deploy/launch.py` from elsewhere."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, str(REPO / "deploy" / "launch.py"),
                           "--help"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--lifetime-epsilon" in proc.stdout


def _fake_release(path: Path, run_id: str) -> None:
    from dpsynth.pipelines.release import release
    (path / "v-1").mkdir(parents=True)
    (path / "v-1" / "_gmm.npz").write_bytes(b"mixture")
    # LATEST.json needs the files' digests (this dpsynth always lists them).
    (path / "_manifest.json").write_text(json.dumps({
        "run_id": run_id, "created_utc": "20260101T000000Z", "root": "v-1",
        "private": True,
        "samples_total": 5, "classes": [],
        "files": release.file_digests(str(path / "v-1")),
        "privacy": {"spent": {"epsilon": 1.0, "delta": 1e-5}}}))


def test_publish_points_latest_at_the_run_release(tmp_path, capsys):
    root = tmp_path / "releases"
    _fake_release(root / "2026-01-01", "nightly-2026-01-01")
    rc = publish.main(["--output", str(root / "2026-01-01"), "--run-id",
                       "nightly-2026-01-01", "--output-root", str(root)])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["epsilon_spent"] == 1.0
    latest = json.loads((root / "LATEST.json").read_text())
    assert latest["release"] == str(root / "2026-01-01")
    # Public: DP outputs and configuration only; nothing from the budget
    # store (attempt counts, lifetime spend, timestamps of how a run went).
    assert set(latest) == {"release", "run_id", "created_utc",
                           "samples_total", "epsilon_spent", "delta",
                           "manifest_sha256"}
    assert set(summary) == set(latest) | {"latest"}


def test_publish_refuses_another_runs_release_or_no_release(tmp_path, capsys):
    root = tmp_path / "releases"
    _fake_release(root / "2026-01-01", "someone-else")
    assert publish.main(["--output", str(root / "2026-01-01"), "--run-id",
                         "nightly-2026-01-01", "--output-root", str(root)]) == 1
    assert "produced by run 'someone-else'" in capsys.readouterr().err
    assert publish.main(["--output", str(root / "missing"), "--run-id", "x",
                         "--output-root", str(root)]) == 1
    assert not (root / "LATEST.json").exists()


def _dry(script: str, *args: str, **env: str) -> list[str]:
    proc = subprocess.run(
        ["bash", str(REPO / "deploy" / script), *args], cwd=REPO,
        env={**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable, **env},
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [shlex.split(line) for line in proc.stdout.splitlines()]


def test_dataflow_classic_submit_command():
    (cmd,) = _dry("dataflow/submit.sh", "classic", "--input",
                  "gs://b/in/*.npz", "--output", "gs://b/rel/1",
                  PROJECT="proj", BUCKET="gs://b", REGION="europe-west4",
                  MAX_WORKERS="8")
    assert cmd[:3] == [sys.executable, "-m", "dpsynth.pipelines.cli.generate"]
    assert {"--runner=DataflowRunner", "--project=proj",
            "--region=europe-west4", "--temp_location=gs://b/tmp",
            "--staging_location=gs://b/tmp/staging",
            "--machine_type=n2-standard-4", "--max_num_workers=8",
            f"--setup_file={REPO / 'setup.py'}"} <= set(cmd)
    assert cmd[-4:] == ["--input", "gs://b/in/*.npz", "--output",
                        "gs://b/rel/1"]


def test_dataflow_flex_template_commands():
    build = _dry("dataflow/submit.sh", "build-template", PROJECT="proj",
                 BUCKET="gs://b", IMAGE="europe-docker.pkg.dev/proj/r/dpsynth:1")
    assert build[0][:4] == ["docker", "build", "-f", "deploy/dataflow/Dockerfile"]
    assert build[2][:5] == ["gcloud", "dataflow", "flex-template", "build",
                            "gs://b/templates/dpsynth.json"]
    assert "deploy/dataflow/metadata.json" in build[2]
    (run,) = _dry("dataflow/submit.sh", "run-template", "output=gs://b/o",
                  "num_classes=10", PROJECT="proj", BUCKET="gs://b",
                  IMAGE="img")
    assert run[:4] == ["gcloud", "dataflow", "flex-template", "run"]
    params = run[run.index("--parameters") + 1]
    assert params == "sdk_container_image=img,output=gs://b/o,num_classes=10"


def test_submit_scripts_name_missing_settings():
    proc = subprocess.run(["bash", str(REPO / "deploy/dataflow/submit.sh"),
                           "classic"], cwd=REPO, capture_output=True,
                          text=True, env={**os.environ, "DRY_RUN": "1",
                                          "PROJECT": ""})
    assert proc.returncode == 2 and "set PROJECT" in proc.stderr


def test_flink_submit_command():
    (cmd,) = _dry("flink/submit.sh", "--output", "gs://b/rel/1",
                  FLINK_MASTER="flink-jm:8081", ENVIRONMENT_TYPE="EXTERNAL",
                  ENVIRONMENT_CONFIG="localhost:50000", PARALLELISM="4",
                  FLINK_VERSION="1.20")
    assert cmd[:3] == [sys.executable, "-m", "dpsynth.pipelines.cli.generate"]
    assert {"--runner=FlinkRunner", "--flink_master=flink-jm:8081",
            "--environment_type=EXTERNAL",
            "--environment_config=localhost:50000", "--parallelism=4",
            "--flink_version=1.20"} <= set(cmd)
    from dpsynth.deploy import runner_options
    opts = runner_options.pipeline_options(cmd[3:-2])
    from apache_beam.options.pipeline_options import FlinkRunnerOptions
    assert opts.view_as(FlinkRunnerOptions).flink_master == "flink-jm:8081"


def test_airflow_venv_defaults_to_a_user_cache_outside_the_repository(tmp_path):
    """The slow Airflow test and setup_airflow_env.sh put the 2 GB venv in a user cache, never in the repo."""
    from tests.test_deploy_airflow_slow import default_venv
    assert default_venv({"HOME": "/h"}) == Path("/h/.cache/dpsynth/venv-airflow")
    assert default_venv({"HOME": "/h", "XDG_CACHE_HOME": "/c"}) == Path("/c/dpsynth/venv-airflow")
    assert default_venv({"HOME": "/h", "DPSYNTH_AIRFLOW_VENV": "/v"}) == Path("/v")
    assert REPO not in default_venv({"HOME": str(tmp_path)}).parents
    # The script agrees: with a finished venv at the default place it reuses it (and builds nothing).
    venv = tmp_path / "cache" / "dpsynth" / "venv-airflow"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "airflow").write_text("#!/bin/sh\n")
    (venv / "bin" / "airflow").chmod(0o755)
    (venv / ".dpsynth-airflow-a-beam-b-google-c").touch()
    env = {k: v for k, v in os.environ.items() if k != "DPSYNTH_AIRFLOW_VENV"}
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"), AIRFLOW_VERSION="a", BEAM_PROVIDER_VERSION="b",
               GOOGLE_PROVIDER_VERSION="c")
    proc = subprocess.run(["bash", str(REPO / "deploy" / "airflow" / "setup_airflow_env.sh")], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"reusing {venv} (Airflow a)"
