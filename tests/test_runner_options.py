"""Runner option sets: what reaches Beam, and a real 2-process DirectRunner run."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import release_dir
from apache_beam.options.pipeline_options import (
    DirectOptions, FlinkRunnerOptions, GoogleCloudOptions, PortableOptions,
    SetupOptions, StandardOptions, WorkerOptions)

from dpsynth.deploy import runner_options

REPO = Path(__file__).resolve().parent.parent


def test_direct_in_process_and_multi_processing():
    opts = runner_options.pipeline_options(runner_options.direct_args())
    assert opts.view_as(StandardOptions).runner == "DirectRunner"
    assert opts.view_as(DirectOptions).direct_running_mode == "in_memory"
    opts = runner_options.pipeline_options(runner_options.direct_args(num_workers=2))
    direct = opts.view_as(DirectOptions)
    assert (direct.direct_num_workers, direct.direct_running_mode) == (
        2, "multi_processing")


def test_direct_refuses_multi_threading():
    with pytest.raises(ValueError, match="multi_threading"):
        runner_options.direct_args(2, "multi_threading")
    with pytest.raises(ValueError, match="direct_num_workers"):
        runner_options.direct_args(0)


def test_dataflow_options_reach_beam():
    args = runner_options.dataflow_args(
        project="my-proj", region="europe-west4",
        temp_location="gs://bkt/tmp", machine_type="n2-highmem-8",
        max_num_workers=20, job_name="dpsynth-nightly-20260101",
        service_account_email="runner@my-proj.iam.gserviceaccount.com",
        use_public_ips=False, experiments=["use_runner_v2"])
    opts = runner_options.pipeline_options(args)
    assert opts.view_as(StandardOptions).runner == "DataflowRunner"
    gcp = opts.view_as(GoogleCloudOptions)
    assert (gcp.project, gcp.region) == ("my-proj", "europe-west4")
    assert gcp.temp_location == "gs://bkt/tmp"
    assert gcp.staging_location == "gs://bkt/tmp/staging"
    assert gcp.job_name == "dpsynth-nightly-20260101"
    assert gcp.service_account_email.startswith("runner@")
    workers = opts.view_as(WorkerOptions)
    assert workers.machine_type == "n2-highmem-8"
    assert workers.max_num_workers == 20
    assert workers.use_public_ips is False
    setup = opts.view_as(SetupOptions).setup_file
    assert setup == str(REPO / "setup.py") and Path(setup).is_file()
    assert "use_runner_v2" in opts.get_all_options()["experiments"]


def test_dataflow_with_container_image_and_validation():
    args = runner_options.dataflow_args(
        "p", "gs://b/t", staging_location="gs://b/s", setup_file=None,
        sdk_container_image="europe-docker.pkg.dev/p/r/dpsynth:1")
    opts = runner_options.pipeline_options(args)
    assert opts.view_as(WorkerOptions).sdk_container_image.endswith(
        "dpsynth:1")
    assert opts.view_as(SetupOptions).setup_file is None
    assert opts.view_as(GoogleCloudOptions).staging_location == "gs://b/s"
    with pytest.raises(ValueError, match="gs:// path"):
        runner_options.dataflow_args("p", "/tmp/local")
    with pytest.raises(ValueError, match="--project"):
        runner_options.dataflow_args("", "gs://b/t")
    with pytest.raises(ValueError, match="job names"):
        runner_options.dataflow_args("p", "gs://b/t", job_name="Nightly_Run")
    with pytest.raises(ValueError, match="--setup-file /no/setup.py"):
        runner_options.dataflow_args("p", "gs://b/t", setup_file="/no/setup.py")


def _installed_from(monkeypatch, wheel):
    """dpsynth as a wheel install sees it: no checkout beside the package,
    ``wheel`` (or None) the file pip installed it from."""
    monkeypatch.setattr(runner_options, "checkout_setup_file", lambda: None)
    monkeypatch.setattr(runner_options, "installed_wheel", lambda: wheel)
    monkeypatch.delenv(runner_options.WORKER_PACKAGE_ENV, raising=False)


def test_dataflow_from_an_installed_wheel_ships_a_wheel_or_refuses(
        monkeypatch, tmp_path):
    """Issue 51: installed from its wheel, dpsynth has no setup.py to ship;
    the workers get a wheel instead, and with none to find the options are
    refused in one line naming what to pass: never a job whose workers lack
    dpsynth."""
    wheel = tmp_path / "dpsynth-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"PK")
    _installed_from(monkeypatch, None)
    with pytest.raises(ValueError) as err:
        runner_options.dataflow_args("p", "gs://b/t")
    assert "\n" not in str(err.value)
    for name in ("DPSYNTH_WORKER_PACKAGE", "--extra-package",
                 "--sdk-container-image"):
        assert name in str(err.value)
    monkeypatch.setenv(runner_options.WORKER_PACKAGE_ENV, str(wheel))
    opts = runner_options.pipeline_options(runner_options.dataflow_args("p", "gs://b/t"))
    setup = opts.view_as(SetupOptions)
    assert (setup.extra_packages, setup.setup_file) == ([str(wheel)], None)
    monkeypatch.setenv(runner_options.WORKER_PACKAGE_ENV, str(tmp_path / "gone.whl"))
    with pytest.raises(ValueError, match="DPSYNTH_WORKER_PACKAGE .*gone.whl"):
        runner_options.dataflow_args("p", "gs://b/t")
    _installed_from(monkeypatch, str(wheel))  # the wheel pip installed
    assert f"--extra_package={wheel}" in runner_options.dataflow_args("p", "gs://b/t")
    # remote Flink/Spark workers get the wheel too; LOOPBACK needs nothing
    assert runner_options.flink_args("jm:8081", setup_file=None)[-1] == \
        f"--extra_package={wheel}"
    assert not [a for a in runner_options.spark_args("local[2]", setup_file=None)
                if a.startswith("--extra")]
    _installed_from(monkeypatch, None)  # an image needs nothing else
    args = runner_options.dataflow_args("p", "gs://b/t", sdk_container_image="i:1")
    assert not [a for a in args if a.startswith(("--setup", "--extra"))]
    parser = argparse.ArgumentParser()
    runner_options.add_runner_arguments(parser)
    ns = parser.parse_args(["--runner", "dataflow", "--project", "p",
                            "--temp-location", "gs://b/t",
                            "--extra-package", str(wheel)])
    assert f"--extra_package={wheel}" in runner_options.beam_args_from(ns)


def test_flink_options_reach_beam():
    args = runner_options.flink_args("flink-jm:8081", "docker",
                              "apache/beam_python3.11_sdk:2.77.0",
                              parallelism=4, flink_version="1.20")
    opts = runner_options.pipeline_options(args)
    assert opts.view_as(StandardOptions).runner == "FlinkRunner"
    flink = opts.view_as(FlinkRunnerOptions)
    assert (flink.flink_master, flink.parallelism, flink.flink_version) == (
        "flink-jm:8081", 4, "1.20")
    portable = opts.view_as(PortableOptions)
    assert portable.environment_type == "DOCKER"
    assert portable.environment_config.startswith("apache/beam_python3.11")
    assert opts.view_as(SetupOptions).setup_file == str(REPO / "setup.py")
    loop = runner_options.pipeline_options(runner_options.flink_args("[local]", "LOOPBACK"))
    assert loop.view_as(PortableOptions).environment_type == "LOOPBACK"
    assert loop.view_as(SetupOptions).setup_file is None
    ext = runner_options.pipeline_options(
        runner_options.flink_args(environment_type="EXTERNAL",
                           environment_config="localhost:50000"))
    assert ext.view_as(PortableOptions).environment_config == "localhost:50000"
    with pytest.raises(ValueError, match="needs --environment_config"):
        runner_options.flink_args(environment_type="EXTERNAL")
    with pytest.raises(ValueError, match="environment_type must be one of"):
        runner_options.flink_args(environment_type="K8S")


def test_cli_parameters_and_dispatch():
    parser = argparse.ArgumentParser()
    runner_options.add_runner_arguments(parser)
    ns = parser.parse_args(["--runner", "dataflow", "--project", "p",
                            "--temp-location", "gs://b/t"])
    opts = runner_options.pipeline_options(runner_options.beam_args_from(ns))
    assert opts.view_as(GoogleCloudOptions).region == runner_options.DEFAULT_REGION
    assert runner_options.beam_args_from(parser.parse_args([]))[0] == \
        "--runner=DirectRunner"
    assert runner_options.runner_args("FlinkRunner")[0] == "--runner=FlinkRunner"
    with pytest.raises(ValueError, match="--temp-location"):
        runner_options.beam_args_from(parser.parse_args(["--runner", "dataflow"]))
    with pytest.raises(ValueError, match="--runner must be one of"):
        runner_options.runner_args("storm")


def test_dask_options_reach_beam():
    pytest.importorskip("distributed", reason="needs the dask extra")
    from apache_beam.runners.dask.dask_runner import DaskOptions
    from dpsynth.pipelines.runners import options
    opts = runner_options.pipeline_options(runner_options.dask_args("tcp://10.0.0.5:8786"))
    assert opts.view_as(StandardOptions).runner == \
        "dpsynth.pipelines.runners.dask.runner.DaskRunner"
    assert opts.view_as(DaskOptions).address == "tcp://10.0.0.5:8786"
    for name in ("dask", "DaskRunner",
                 "apache_beam.runners.dask.dask_runner.DaskRunner"):
        assert runner_options.runner_args(name) == ["--runner=DaskRunner"]
        beam = options.beam_options(["--runner", name])
        assert beam.view_as(StandardOptions).runner == \
            "dpsynth.pipelines.runners.dask.runner.DaskRunner"
    parser = argparse.ArgumentParser()
    runner_options.add_runner_arguments(parser)
    assert runner_options.beam_args_from(parser.parse_args(
        ["--runner", "dask", "--dask-client-address", "h:8786"])) == [
        "--runner=DaskRunner", "--dask_client_address=h:8786"]
    with pytest.raises(ValueError, match="not both"):
        runner_options.dask_args("tcp://h:1", scheduler_file="/tmp/s.json")
    with pytest.raises(ValueError, match="tcp://HOST:PORT"):
        runner_options.dask_args("http://h/x")
    with pytest.raises(ValueError, match="not both"):
        runner_options.dask_args(npartitions=2, partition_size=3)


def test_module_prints_shell_line():
    out = subprocess.run(
        [sys.executable, "-m", "dpsynth.deploy.runner_options", "flink", "--flink-master",
         "jm:8081", "--environment-type", "LOOPBACK"],
        cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert shlex.split(out) == ["--runner=FlinkRunner", "--flink_master=jm:8081",
                                "--environment_type=LOOPBACK"]
    bad = subprocess.run([sys.executable, "-m", "dpsynth.deploy.runner_options", "dataflow"],
                         cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and "--temp-location" in bad.stderr


def test_importable_without_gcp_credentials():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GOOGLE_", "CLOUDSDK_"))}
    env["GOOGLE_APPLICATION_CREDENTIALS"] = "/nonexistent.json"
    code = ("import sys, dpsynth.deploy.runner_options as r; "
            "args = r.dataflow_args('p', 'gs://b/t'); "
            "assert 'apache_beam' not in sys.modules; "  # pure until asked
            "r.pipeline_options(args)")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                   check=True, timeout=120)


def test_flex_template_metadata_is_valid():
    meta = json.loads((REPO / "deploy/dataflow/metadata.json").read_text())
    assert meta["name"] and meta["description"]
    names = {p["name"] for p in meta["parameters"]}
    assert {"output", "epsilon", "delta", "budget_store", "dataset_id",
            "lifetime_epsilon", "lifetime_delta", "run_id"} <= names
    for p in meta["parameters"]:
        assert set(p) >= {"name", "label", "helpText"}, p
    # Every template parameter is a flag `dpsynth generate` understands.
    pytest.importorskip("dpsynth.pipelines.cli.generate")
    from dpsynth.pipelines.cli import generate
    parser = generate.parser()
    known = {a for action in parser._actions for a in action.option_strings}
    missing = {p["name"] for p in meta["parameters"]
               if "--" + p["name"].replace("_", "-") not in known}
    assert not missing, f"template parameters unknown to generate: {missing}"


def _generate_available() -> str | None:
    """Why the real DirectRunner run cannot happen, or None."""
    try:
        if importlib.util.find_spec("dpsynth.pipelines.cli.generate") is None:
            return "dpsynth.pipelines.cli.generate does not exist yet"
    except ImportError as e:
        return f"dpsynth.pipelines.cli.generate is not importable: {e}"
    return None


def test_direct_runner_two_worker_processes_real_run(tmp_path):
    reason = _generate_available()
    if reason:
        pytest.skip(reason)
    out = tmp_path / "release"
    cmd = [sys.executable, "-m", "dpsynth.pipelines.cli.generate",
           *runner_options.direct_args(num_workers=2), "--output", str(out),
           "--run-id", "direct-2proc"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)},
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["run_id"] == "direct-2proc"
    assert (release_dir(out) / "_gmm.npz").is_file()
    assert list((release_dir(out) / "data").glob("synthetic-*.tfrecord"))


def test_local_blas_threads_share_the_cores_among_direct_workers(monkeypatch):
    """DirectRunner's worker processes split the cores for large BLAS
    products (the vote search, encoders); other runners are left alone."""
    from dpsynth.pipelines.runners.options import beam_options, local_blas_threads
    monkeypatch.setattr("os.cpu_count", lambda: 64)  # the machine's
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)))
    assert local_blas_threads(beam_options([])) == 8  # the usable cores
    assert local_blas_threads(beam_options(
        ["--direct_num_workers=2",
         "--direct_running_mode=multi_processing"])) == 4
    assert local_blas_threads(beam_options(["--direct_num_workers=16"])) == 1
    assert local_blas_threads(beam_options(
        ["--runner=DataflowRunner", "--project=p", "--region=r",
         "--temp_location=gs://b/t"])) is None
    monkeypatch.delattr("os.sched_getaffinity")  # macOS: the machine's
    assert local_blas_threads(beam_options(["--direct_num_workers=16"])) == 4


def test_flink_job_server_jar_and_endpoint_reach_beam():
    opts = runner_options.pipeline_options(runner_options.flink_args(
        "[local]", parallelism=2, job_server_jar="/c/flink-js.jar"))
    assert opts.view_as(PortableOptions).environment_type == "LOOPBACK"
    assert opts.view_as(FlinkRunnerOptions).flink_job_server_jar == \
        "/c/flink-js.jar"
    assert opts.view_as(SetupOptions).setup_file is None
    ext = runner_options.pipeline_options(runner_options.flink_args(
        "[local]", job_endpoint="localhost:8099"))
    assert ext.view_as(PortableOptions).job_endpoint == "localhost:8099"
    # a remote master keeps Docker workers and ships the package
    assert runner_options.flink_args("jm:8081")[2] == "--environment_type=DOCKER"
    with pytest.raises(ValueError, match="not both"):
        runner_options.flink_args(job_server_jar="/j.jar", job_endpoint="h:1")
    with pytest.raises(ValueError, match="HOST:PORT"):
        runner_options.flink_args(job_endpoint="http://h/x")


def test_spark_options_reach_beam():
    from apache_beam.options.pipeline_options import SparkRunnerOptions
    args = runner_options.spark_args("local[2]", job_server_jar="/c/spark-js.jar")
    assert args[:3] == ["--runner=SparkRunner", "--spark_master_url=local[2]",
                        "--environment_type=LOOPBACK"]
    opts = runner_options.pipeline_options(args)
    assert opts.view_as(StandardOptions).runner == "SparkRunner"
    spark = opts.view_as(SparkRunnerOptions)
    assert (spark.spark_master_url, spark.spark_job_server_jar) == (
        "local[2]", "/c/spark-js.jar")
    remote = runner_options.pipeline_options(runner_options.spark_args(
        "spark://m:7077", "EXTERNAL", "localhost:50000", parallelism=4))
    assert remote.view_as(PortableOptions).environment_type == "EXTERNAL"
    assert remote.view_as(SetupOptions).setup_file == str(REPO / "setup.py")
    assert runner_options.spark_args("spark://m:7077")[2] == \
        "--environment_type=DOCKER"
    with pytest.raises(ValueError, match="spark_master_url must be"):
        runner_options.spark_args("m:7077")
    with pytest.raises(ValueError, match="needs --environment_config"):
        runner_options.spark_args("local[2]", "PROCESS")
    assert runner_options.runner_args("spark")[0] == "--runner=SparkRunner"


def test_prism_options_reach_beam():
    from apache_beam.options.pipeline_options import PrismRunnerOptions
    opts = runner_options.pipeline_options(runner_options.prism_args("/c/prism"))
    assert opts.view_as(StandardOptions).runner == "PrismRunner"
    assert opts.view_as(PrismRunnerOptions).prism_location == "/c/prism"
    assert opts.view_as(PortableOptions).environment_type == "LOOPBACK"
    assert runner_options.prism_args(job_endpoint="localhost:8073") == [
        "--runner=PrismRunner", "--environment_type=LOOPBACK",
        "--job_endpoint=localhost:8073"]
    assert runner_options.runner_args("PrismRunner") == [
        "--runner=PrismRunner", "--environment_type=LOOPBACK"]
    with pytest.raises(ValueError, match="not both"):
        runner_options.prism_args("/c/prism", job_endpoint="localhost:8073")
    ext = runner_options.pipeline_options(runner_options.prism_args(
        job_endpoint="localhost:8073", environment_type="external",
        environment_config="localhost:50000"))
    assert ext.view_as(PortableOptions).environment_type == "EXTERNAL"
    assert ext.view_as(PortableOptions).environment_config == \
        "localhost:50000"
    with pytest.raises(ValueError, match="needs --environment_config"):
        runner_options.prism_args(environment_type="EXTERNAL")
    with pytest.raises(ValueError, match="Prism runs the environments"):
        runner_options.prism_args(environment_type="PROCESS",
                           environment_config='{"command": "boot"}')


@pytest.mark.parametrize("argv, expected", [
    (["flink", "--flink-master", "[local]", "--flink-job-server-jar", "/j.jar",
      "--parallelism", "2"],
     ["--runner=FlinkRunner", "--flink_master=[local]",
      "--environment_type=LOOPBACK", "--parallelism=2",
      "--flink_job_server_jar=/j.jar"]),
    (["spark", "--spark-master-url", "local[2]", "--job-endpoint", "h:8099"],
     ["--runner=SparkRunner", "--spark_master_url=local[2]",
      "--environment_type=LOOPBACK", "--job_endpoint=h:8099"]),
    (["prism", "--prism-location", "/c/prism"],
     ["--runner=PrismRunner", "--environment_type=LOOPBACK",
      "--prism_location=/c/prism"]),
])
def test_cli_builds_portable_runner_options(argv, expected, capsys):
    assert runner_options.main(argv) == 0
    assert shlex.split(capsys.readouterr().out) == expected


def test_install_engines_paths_are_pinned_to_beam(tmp_path):
    from dpsynth.deploy import install_engines as ie
    root = ie.cache_root({"HOME": "/h"})
    assert root == Path("/h/.cache/dpsynth/engines")
    assert ie.cache_root({"HOME": "/h", "XDG_CACHE_HOME": "/c"}) == \
        Path("/c/dpsynth/engines")
    assert ie.cache_root({"DPSYNTH_ENGINES_DIR": "/e"}) == Path("/e")
    assert ie.flink_version({}) == "1.20"
    with pytest.raises(ValueError, match="1.19"):
        ie.flink_version({"DPSYNTH_FLINK_VERSION": "1.18"})
    assert ie.engine_path("flink", tmp_path, "2.77.0", "1.20") == (
        tmp_path / "m2/org/apache/beam/beam-runners-flink-1.20-job-server"
        "/2.77.0/beam-runners-flink-1.20-job-server-2.77.0.jar")
    assert ie.engine_path("spark", tmp_path, "2.77.0", "1.20").name == \
        "beam-runners-spark-3-job-server-2.77.0.jar"
    assert ie.engine_path("prism", tmp_path, "2.77.0", "1.20") == \
        tmp_path / "beam-2.77.0/prism"
    # the registry's "no such version" is told apart from a failed install
    miss = ie._outcome("flink", False, tmp_path / "x.jar",
                       "[ERROR] ... Could not find artifact a:b:jar:1 in "
                       "central", ["mvn"])
    assert miss["not_served"] and miss["error"].startswith("Could not find")
    down = ie._outcome("flink", False, tmp_path / "x.jar",
                       "Could not transfer artifact: connect timed out",
                       ["mvn"])
    assert not down["not_served"]
    assert "INSTALL FAILED" in ie.describe("flink", down)
