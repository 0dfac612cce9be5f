"""Beam pipeline-option sets for the runners dpsynth supports.

Each ``*_args`` function is pure: it turns a few named parameters into the
``--flag=value`` list that ``PipelineOptions`` (and so ``python -m
dpsynth.pipelines.cli.generate``) accepts. Nothing here imports Google Cloud clients or
needs credentials; ``pipeline_options`` only builds a ``PipelineOptions``.

Runners:
  * DirectRunner: in-process (``in_memory``, one worker) or
    ``multi_processing`` with N worker processes. ``multi_threading`` is
    refused: it corrupted data in this project's tests.
  * DataflowRunner: project, region, gs:// temp/staging locations, worker
    machine type, and dpsynth shipped to the workers: ``--setup_file`` of a
    checkout, ``--extra_package`` of a dpsynth wheel (installed from one:
    ``$DPSYNTH_WORKER_PACKAGE`` or the wheel pip installed) or a prebuilt
    container, ``--sdk_container_image``; never a job without it.
  * FlinkRunner (portable): ``--flink_master`` plus the SDK harness
    environment (DOCKER, PROCESS, EXTERNAL worker pool, or LOOPBACK for a
    local cluster), the job server jar (``--flink_job_server_jar``, see
    ``dpsynth.deploy.install_engines``) or a running job server
    (``--job_endpoint``).
  * SparkRunner (portable): ``--spark_master_url`` (``local[N]`` runs Spark
    inside the job server), the environment and the job server as Flink's.
  * PrismRunner: Beam's Go runner, ``--prism_location`` (the binary that
    ``dpsynth.deploy.install_engines`` builds) or a running Prism
    (``--job_endpoint``); the SDK harness runs in this process (LOOPBACK).
  * DaskRunner (``dpsynth.pipelines.runners.dask.runner``): ``--dask_client_address`` of a
    running ``dask scheduler`` (or ``--dask_scheduler_file``); with neither,
    the job starts a local cluster for the run (for trying it).

``python -m dpsynth.deploy.runner_options dataflow --project P ...`` prints the list (one
shell-quoted line) for scripts; ``add_runner_arguments`` / ``beam_args_from``
let a CLI expose the same parameters.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Optional, Sequence

from dpsynth.pipelines.runners.runner_names import DASK_NAMES, default_running_mode

REPO_ROOT = Path(__file__).resolve().parent.parent


def checkout_setup_file() -> Optional[str]:
    """setup.py of the checkout this module runs from; None when dpsynth is
    installed (from its wheel: no setup.py beside the package)."""
    setup = REPO_ROOT / "setup.py"
    if setup.is_file() and (REPO_ROOT / "pyproject.toml").is_file():
        return str(setup)
    return None


SETUP_FILE = checkout_setup_file()
# A dpsynth wheel (or sdist) for the workers where there is no checkout.
WORKER_PACKAGE_ENV = "DPSYNTH_WORKER_PACKAGE"

DIRECT_MODES = ("in_memory", "multi_processing")
PORTABLE_ENVIRONMENTS = ("DOCKER", "PROCESS", "EXTERNAL", "LOOPBACK")
FLINK_ENVIRONMENTS = PORTABLE_ENVIRONMENTS
PRISM_ENVIRONMENTS = ("LOOPBACK", "EXTERNAL", "DOCKER")
# Masters that run the engine inside the job server on this machine: there
# the default environment is LOOPBACK (the submitting process runs the
# Python code), elsewhere DOCKER.
LOCAL_FLINK_MASTERS = ("[local]", "[auto]")
DEFAULT_MACHINE_TYPE = "n2-standard-4"
DEFAULT_REGION = "us-central1"
DEFAULT_FLINK_MASTER = "localhost:8081"
DEFAULT_SPARK_MASTER = "local[4]"  # Beam's default
RUNNER_CHOICES = "direct, dataflow, flink, spark, prism, dask"
RUNNER_NAMES = {"direct": "DirectRunner", "directrunner": "DirectRunner",
                "dataflow": "DataflowRunner",
                "dataflowrunner": "DataflowRunner",
                "flink": "FlinkRunner", "flinkrunner": "FlinkRunner",
                "spark": "SparkRunner", "sparkrunner": "SparkRunner",
                "prism": "PrismRunner", "prismrunner": "PrismRunner",
                **{name: "DaskRunner" for name in DASK_NAMES}}
_JOB_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DASK_ADDRESS = re.compile(r"^([a-z]+://)?[^\s/:]+:\d+$")
_ENDPOINT = re.compile(r"^[^\s/:]+:\d+$")
_SPARK_MASTER = re.compile(r"^(local(\[(\d+|\*)\])?|spark://\S+|yarn|k8s://\S+)$")


def direct_args(num_workers: int = 1,
                running_mode: Optional[str] = None) -> list[str]:
    """DirectRunner; more than one worker means ``multi_processing``."""
    if num_workers < 1:
        raise ValueError(f"--direct_num_workers must be >= 1, got {num_workers}")
    mode = running_mode or default_running_mode(num_workers)
    if mode == "multi_threading":
        raise ValueError("--direct_running_mode multi_threading is not "
                         "supported by dpsynth (it corrupts data); use "
                         "multi_processing")
    if mode not in DIRECT_MODES:
        raise ValueError(f"--direct_running_mode must be one of "
                         f"{DIRECT_MODES}, got {mode!r}")
    return ["--runner=DirectRunner", f"--direct_num_workers={num_workers}",
            f"--direct_running_mode={mode}"]


def installed_wheel() -> Optional[str]:
    """The wheel file pip installed dpsynth from, where it still exists
    (pip records a local file's URL in the distribution's
    ``direct_url.json``); None for an index, editable or checkout install."""
    import json
    from importlib import metadata
    from urllib.parse import unquote, urlparse
    try:
        text = metadata.distribution("dpsynth").read_text("direct_url.json")
        url = urlparse(json.loads(text or "{}").get("url", ""))
    except (metadata.PackageNotFoundError, ValueError, AttributeError):
        return None
    path = unquote(url.path)
    if url.scheme == "file" and path.endswith(".whl") and Path(path).is_file():
        return path
    return None


def worker_package(extra_package: Optional[str] = None) -> Optional[str]:
    """What ships dpsynth to workers that Beam does not start here:
    ``extra_package`` or ``$DPSYNTH_WORKER_PACKAGE`` (a wheel or sdist;
    local paths must exist), else None (then: the checkout's setup.py, the
    installed wheel, or an image)."""
    package = extra_package or os.environ.get(WORKER_PACKAGE_ENV) or None
    if package and "://" not in package and not Path(package).is_file():
        source = "--extra-package" if extra_package else WORKER_PACKAGE_ENV
        raise ValueError(f"{source} {package}: no such file (a dpsynth wheel "
                         "or sdist for the workers)")
    return package


def _dataflow_package(setup_file: Optional[str], extra_package: Optional[str],
                      sdk_container_image: Optional[str]) -> list[str]:
    """How Dataflow's workers get dpsynth: never a job without it."""
    if setup_file and not Path(setup_file).is_file():
        raise ValueError(f"--setup-file {setup_file}: no such file")
    package = worker_package(extra_package)
    args = [f"--setup_file={setup_file}"] if setup_file else []
    args += [f"--extra_package={package}"] if package else []
    if sdk_container_image:
        return args + [f"--sdk_container_image={sdk_container_image}"]
    if args:
        return args
    found = checkout_setup_file() or installed_wheel()
    if found is None:
        raise ValueError(
            "Dataflow workers need dpsynth and this install has no checkout "
            f"(setup.py) or wheel file to ship: set {WORKER_PACKAGE_ENV} or "
            "pass --extra-package PATH/dpsynth-VERSION-py3-none-any.whl, or "
            "--sdk-container-image IMAGE (deploy/dataflow/Dockerfile)")
    flag = "--setup_file" if found.endswith("setup.py") else "--extra_package"
    return [f"{flag}={found}"]


def dataflow_args(project: str, temp_location: str,
                  region: str = DEFAULT_REGION,
                  staging_location: Optional[str] = None,
                  machine_type: str = DEFAULT_MACHINE_TYPE,
                  max_num_workers: Optional[int] = None,
                  job_name: Optional[str] = None,
                  setup_file: Optional[str] = None,
                  sdk_container_image: Optional[str] = None,
                  service_account_email: Optional[str] = None,
                  subnetwork: Optional[str] = None,
                  use_public_ips: Optional[bool] = None,
                  experiments: Sequence[str] = (),
                  extra_package: Optional[str] = None) -> list[str]:
    """DataflowRunner.

    Workers get dpsynth from what is given: ``setup_file`` (Beam builds an
    sdist of that checkout), ``extra_package`` (or ``$DPSYNTH_WORKER_PACKAGE``:
    a dpsynth wheel; workers pip-install either with its dependencies at
    start-up) or, faster, ``sdk_container_image`` (deploy/dataflow/Dockerfile).
    With none of them: the setup.py of the checkout this runs from, else the
    wheel file pip installed dpsynth from; where neither exists (installed
    from an index) the options are refused in one line naming what to pass.
    """
    if not project:
        raise ValueError("--project is required for Dataflow")
    if not region:
        raise ValueError("--region is required for Dataflow")
    staging_location = staging_location or _child(temp_location, "staging")
    for flag, uri in (("--temp_location", temp_location),
                      ("--staging_location", staging_location)):
        if not uri.startswith("gs://"):
            raise ValueError(f"{flag} must be a gs:// path for Dataflow, "
                             f"got {uri!r}")
    if job_name is not None and not _JOB_NAME.match(job_name):
        raise ValueError(f"--job_name {job_name!r}: Dataflow job names are "
                         "lower-case letters, digits and '-'")
    args = ["--runner=DataflowRunner", f"--project={project}",
            f"--region={region}", f"--temp_location={temp_location}",
            f"--staging_location={staging_location}",
            f"--machine_type={machine_type}",
            *_dataflow_package(setup_file, extra_package,
                               sdk_container_image)]
    if max_num_workers is not None:
        if max_num_workers < 1:
            raise ValueError("--max_num_workers must be >= 1")
        args.append(f"--max_num_workers={max_num_workers}")
    if job_name:
        args.append(f"--job_name={job_name}")
    if service_account_email:
        args.append(f"--service_account_email={service_account_email}")
    if subnetwork:
        args.append(f"--subnetwork={subnetwork}")
    if use_public_ips is not None:
        args.append("--use_public_ips" if use_public_ips
                    else "--no_use_public_ips")
    args += [f"--experiments={e}" for e in experiments]
    return args


def flink_args(flink_master: str = DEFAULT_FLINK_MASTER,
               environment_type: Optional[str] = None,
               environment_config: Optional[str] = None,
               parallelism: Optional[int] = None,
               flink_version: Optional[str] = None,
               setup_file: Optional[str] = SETUP_FILE,
               submit_uber_jar: bool = False,
               job_server_jar: Optional[str] = None,
               job_endpoint: Optional[str] = None) -> list[str]:
    """Portable FlinkRunner.

    ``environment_type``: DOCKER (``environment_config`` = SDK image, default
    ``apache/beam_python3.X_sdk``), PROCESS (``environment_config`` = JSON with
    the boot ``command``), EXTERNAL (``environment_config`` = host:port of a
    Beam worker pool sidecar), LOOPBACK (the submitting process runs the user
    code: only for a local/test Flink cluster); default LOOPBACK for the
    embedded cluster (``[local]``), DOCKER otherwise.
    ``job_server_jar``: Beam's Flink job server (a path; without it Beam
    downloads the jar of ``flink_version``); ``job_endpoint``: host:port of a
    job server already running (then no jar is started).
    """
    if not flink_master:
        raise ValueError("--flink_master is required (host:port, [local] or "
                         "[auto])")
    if environment_type is None:
        environment_type = ("LOOPBACK" if flink_master in LOCAL_FLINK_MASTERS
                            else "DOCKER")
    args = ["--runner=FlinkRunner", f"--flink_master={flink_master}"]
    if flink_version:
        args.append(f"--flink_version={flink_version}")
    if submit_uber_jar:
        args.append("--flink_submit_uber_jar")
    return args + _job_server_args(
        "flink", environment_type, environment_config, parallelism,
        setup_file, job_server_jar, job_endpoint)


def spark_args(master_url: str = DEFAULT_SPARK_MASTER,
               environment_type: Optional[str] = None,
               environment_config: Optional[str] = None,
               parallelism: Optional[int] = None,
               setup_file: Optional[str] = SETUP_FILE,
               job_server_jar: Optional[str] = None,
               job_endpoint: Optional[str] = None) -> list[str]:
    """Portable SparkRunner (Spark 3).

    ``master_url``: ``local[N]`` (Spark inside the job server, N threads),
    ``spark://HOST:PORT`` of a standalone cluster, ``yarn`` or ``k8s://...``.
    Environments as for Flink; default LOOPBACK for ``local[N]``, DOCKER
    otherwise. ``job_server_jar`` / ``job_endpoint`` as for Flink.
    """
    if not _SPARK_MASTER.match(master_url or ""):
        raise ValueError(f"--spark_master_url must be local[N], "
                         f"spark://HOST:PORT, yarn or k8s://..., got "
                         f"{master_url!r}")
    if environment_type is None:
        environment_type = ("LOOPBACK" if master_url.startswith("local")
                            else "DOCKER")
    return ["--runner=SparkRunner", f"--spark_master_url={master_url}",
            *_job_server_args("spark", environment_type, environment_config,
                              parallelism, setup_file, job_server_jar,
                              job_endpoint)]


def _job_server_args(engine: str, environment_type: str,
                     environment_config: Optional[str],
                     parallelism: Optional[int], setup_file: Optional[str],
                     job_server_jar: Optional[str],
                     job_endpoint: Optional[str]) -> list[str]:
    """The options Flink and Spark share: the SDK environment, parallelism,
    their job server, and the setup file where workers are not this
    process."""
    env = _environment(environment_type, environment_config)
    args = [f"--environment_type={env}"]
    if environment_config:
        args.append(f"--environment_config={environment_config}")
    args += _parallelism(parallelism)
    args += _job_server(engine, job_server_jar, job_endpoint)
    if env == "LOOPBACK":
        return args
    if setup_file:
        return args + [f"--setup_file={setup_file}"]
    # installed from a wheel: ship one if there is one (a DOCKER or PROCESS
    # environment's own image may hold dpsynth instead)
    package = worker_package() or installed_wheel()
    return args + ([f"--extra_package={package}"] if package else [])


def prism_args(prism_location: Optional[str] = None,
               job_endpoint: Optional[str] = None,
               environment_type: Optional[str] = None,
               environment_config: Optional[str] = None) -> list[str]:
    """PrismRunner: Beam's Go runner on this machine.

    ``prism_location``: the binary, which Beam starts (default: the one
    ``python -m dpsynth.deploy.install_engines prism`` built into the
    engines cache; without it the run stops naming that command); or
    ``job_endpoint``: a Prism already running (``prism --job_port N``).
    ``environment_type``: LOOPBACK (default: the Python code runs in this
    process), EXTERNAL (``environment_config`` = host:port of a Beam worker
    pool, ``python -m
    apache_beam.runners.worker.worker_pool_main --service_port N``: SDK
    workers in their own processes) or DOCKER.
    """
    if prism_location and job_endpoint:
        raise ValueError("pass --prism_location or --job_endpoint, not both")
    env = _environment(environment_type or "LOOPBACK", environment_config)
    if env not in PRISM_ENVIRONMENTS:
        raise ValueError(f"Prism runs the environments "
                         f"{PRISM_ENVIRONMENTS}, got {env}")
    args = ["--runner=PrismRunner", f"--environment_type={env}"]
    if environment_config:
        args.append(f"--environment_config={environment_config}")
    if prism_location:
        args.append(f"--prism_location={prism_location}")
    if job_endpoint:
        args += _job_server("prism", None, job_endpoint)
    return args


def _environment(environment_type: str,
                 environment_config: Optional[str]) -> str:
    """The checked SDK harness environment of a portable runner."""
    env = environment_type.upper()
    if env not in PORTABLE_ENVIRONMENTS:
        raise ValueError(f"--environment_type must be one of "
                         f"{PORTABLE_ENVIRONMENTS}, got {environment_type!r}")
    if env in ("PROCESS", "EXTERNAL") and not environment_config:
        raise ValueError(f"--environment_type {env} needs --environment_config")
    return env


def _parallelism(parallelism: Optional[int]) -> list[str]:
    if parallelism is None:
        return []
    if parallelism < 1:
        raise ValueError("--parallelism must be >= 1")
    return [f"--parallelism={parallelism}"]


def _job_server(engine: str, jar: Optional[str],
                endpoint: Optional[str]) -> list[str]:
    """A job server jar for Beam to start, or one already running."""
    if jar and endpoint:
        raise ValueError(f"pass --{engine}_job_server_jar or --job_endpoint, "
                         f"not both")
    if endpoint is not None and not _ENDPOINT.match(endpoint):
        raise ValueError(f"--job_endpoint must be HOST:PORT, got {endpoint!r}")
    if jar:
        return [f"--{engine}_job_server_jar={jar}"]
    return [f"--job_endpoint={endpoint}"] if endpoint else []


def dask_args(client_address: Optional[str] = None,
              scheduler_file: Optional[str] = None,
              npartitions: Optional[int] = None,
              partition_size: Optional[int] = None) -> list[str]:
    """DaskRunner (dpsynth's, ``dpsynth.pipelines.runners.dask.runner``).

    ``client_address``: the scheduler, ``tcp://HOST:PORT`` (or a
    ``scheduler_file`` it wrote). With neither, ``dpsynth generate`` starts
    a local cluster for the run, which is only for trying the runner.
    ``npartitions`` / ``partition_size``: Dask partitions of each created
    PCollection (default: Beam's, 128 elements; the read ranges and the
    release's shards are spread one per partition whatever these say).
    """
    if client_address and scheduler_file:
        raise ValueError("pass --dask_client_address or "
                         "--dask_scheduler_file, not both")
    if client_address is not None and not _DASK_ADDRESS.match(client_address):
        raise ValueError(f"--dask_client_address must look like "
                         f"tcp://HOST:PORT, got {client_address!r}")
    if npartitions is not None and partition_size is not None:
        raise ValueError("pass --dask_npartitions or --dask_partition_size, "
                         "not both")
    args = ["--runner=DaskRunner"]
    if client_address:
        args.append(f"--dask_client_address={client_address}")
    if scheduler_file:
        args.append(f"--dask_scheduler_file={scheduler_file}")
    for flag, value in (("--dask_npartitions", npartitions),
                        ("--dask_partition_size", partition_size)):
        if value is not None:
            if value < 1:
                raise ValueError(f"{flag} must be >= 1")
            args.append(f"{flag}={value}")
    return args


def runner_args(runner: str, **params) -> list[str]:
    """Dispatches on ``runner`` (direct / dataflow / flink / spark / prism /
    dask, any case)."""
    name = RUNNER_NAMES.get(runner.lower())
    if name == "DirectRunner":
        return direct_args(**params)
    if name == "DataflowRunner":
        return dataflow_args(**params)
    if name == "FlinkRunner":
        return flink_args(**params)
    if name == "SparkRunner":
        return spark_args(**params)
    if name == "PrismRunner":
        return prism_args(**params)
    if name == "DaskRunner":
        return dask_args(**params)
    raise ValueError(f"--runner must be one of {RUNNER_CHOICES}; "
                     f"got {runner!r}")


def pipeline_options(args: Sequence[str]):
    """PipelineOptions from an arg list (imports Beam, nothing of GCP; Dask
    names resolve to dpsynth's runner, as in ``dpsynth generate``)."""
    from apache_beam.options.pipeline_options import PipelineOptions
    from dpsynth.pipelines.runners.options import resolve_dask
    return PipelineOptions(resolve_dask(args))


def _child(uri: str, name: str) -> str:
    return uri.rstrip("/") + "/" + name


# --------------------------------------------------------- CLI integration


def add_runner_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds ``--runner`` and the parameters of the option sets."""
    g = parser.add_argument_group("runner (see deploy/README.md)")
    g.add_argument("--runner", default="direct",
                   help=f"one of {RUNNER_CHOICES} (default direct)")
    g.add_argument("--direct-num-workers", type=int, default=1)
    g.add_argument("--direct-running-mode", default=None,
                   choices=DIRECT_MODES)
    g.add_argument("--project", default=None, help="Dataflow: GCP project")
    g.add_argument("--region", default=DEFAULT_REGION,
                   help="Dataflow: region")
    g.add_argument("--temp-location", default=None,
                   help="Dataflow: gs:// temp location")
    g.add_argument("--staging-location", default=None,
                   help="Dataflow: gs:// staging (default temp/staging)")
    g.add_argument("--machine-type", default=DEFAULT_MACHINE_TYPE,
                   help="Dataflow: worker machine type")
    g.add_argument("--max-num-workers", type=int, default=None)
    g.add_argument("--job-name", default=None)
    g.add_argument("--setup-file", default=None,
                   help="setup.py shipped to Dataflow/Flink/Spark workers "
                   "(default: the checkout's; Flink/Spark only then)")
    g.add_argument("--extra-package", default=None,
                   help=f"Dataflow: a dpsynth wheel for the workers (default "
                   f"${WORKER_PACKAGE_ENV}, else the checkout's setup.py or "
                   "the wheel dpsynth was installed from)")
    g.add_argument("--sdk-container-image", default=None)
    g.add_argument("--service-account-email", default=None)
    g.add_argument("--flink-master", default=DEFAULT_FLINK_MASTER)
    g.add_argument("--flink-job-server-jar", default=None,
                   help="Flink: Beam's job server jar (python -m "
                   "dpsynth.deploy.install_engines flink)")
    g.add_argument("--spark-master-url", default=DEFAULT_SPARK_MASTER,
                   help="Spark: local[N], spark://HOST:PORT, yarn, k8s://...")
    g.add_argument("--spark-job-server-jar", default=None,
                   help="Spark: Beam's job server jar (python -m "
                   "dpsynth.deploy.install_engines spark)")
    g.add_argument("--prism-location", default=None,
                   help="Prism: the binary (python -m dpsynth.deploy.install_engines "
                   "prism)")
    g.add_argument("--job-endpoint", default=None,
                   help="Flink/Spark/Prism: HOST:PORT of a running job "
                   "server")
    g.add_argument("--environment-type", default=None,
                   help=f"Flink/Spark/Prism: one of {PORTABLE_ENVIRONMENTS} "
                   "(default LOOPBACK for Prism and a local master, else "
                   "DOCKER)")
    g.add_argument("--environment-config", default=None)
    g.add_argument("--parallelism", type=int, default=None)
    g.add_argument("--dask-client-address", default=None,
                   help="Dask: scheduler address tcp://HOST:PORT (none: a "
                   "local cluster for the run)")
    g.add_argument("--dask-scheduler-file", default=None)


def beam_args_from(ns: argparse.Namespace) -> list[str]:
    """The Beam option list for a namespace filled by add_runner_arguments."""
    name = RUNNER_NAMES.get(str(ns.runner).lower())
    if name == "DirectRunner":
        return direct_args(ns.direct_num_workers, ns.direct_running_mode)
    if name == "DataflowRunner":
        if not ns.temp_location:
            raise ValueError("--temp-location gs://... is required for "
                             "--runner dataflow")
        return dataflow_args(
            project=ns.project, temp_location=ns.temp_location,
            region=ns.region, staging_location=ns.staging_location,
            machine_type=ns.machine_type, max_num_workers=ns.max_num_workers,
            job_name=ns.job_name, setup_file=ns.setup_file,
            sdk_container_image=ns.sdk_container_image,
            service_account_email=ns.service_account_email,
            extra_package=ns.extra_package)
    if name == "FlinkRunner":
        return flink_args(ns.flink_master, ns.environment_type,
                          ns.environment_config, ns.parallelism,
                          setup_file=ns.setup_file or SETUP_FILE,
                          job_server_jar=ns.flink_job_server_jar,
                          job_endpoint=ns.job_endpoint)
    if name == "SparkRunner":
        return spark_args(ns.spark_master_url, ns.environment_type,
                          ns.environment_config, ns.parallelism,
                          setup_file=ns.setup_file or SETUP_FILE,
                          job_server_jar=ns.spark_job_server_jar,
                          job_endpoint=ns.job_endpoint)
    if name == "PrismRunner":
        return prism_args(ns.prism_location, ns.job_endpoint,
                          ns.environment_type, ns.environment_config)
    if name == "DaskRunner":
        return dask_args(ns.dask_client_address, ns.dask_scheduler_file)
    raise ValueError(f"--runner must be one of {RUNNER_CHOICES}; "
                     f"got {ns.runner!r}")


def main(argv: Optional[list[str]] = None) -> int:
    """Prints the Beam options for a runner as one shell-quoted line."""
    parser = argparse.ArgumentParser(
        prog="python -m dpsynth.deploy.runner_options",
        description="print the Beam pipeline options of a runner")
    add_runner_arguments(parser)
    args = sys.argv[1:] if argv is None else argv
    # `python -m dpsynth.deploy.runner_options dataflow --project ...`: positional runner.
    if args and not args[0].startswith("-"):
        args = ["--runner", args[0], *args[1:]]
    try:
        print(shlex.join(beam_args_from(parser.parse_args(args))))
    except ValueError as e:
        parser.error(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
