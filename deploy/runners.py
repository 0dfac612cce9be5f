"""Beam pipeline-option sets for the runners dpsynth supports.

Each ``*_args`` function is pure: it turns a few named parameters into the
``--flag=value`` list that ``PipelineOptions`` (and so ``python -m
pipelines.generate``) accepts. Nothing here imports Google Cloud clients or
needs credentials; ``pipeline_options`` only builds a ``PipelineOptions``.

Runners:
  * DirectRunner: in-process (``in_memory``, one worker) or
    ``multi_processing`` with N worker processes. ``multi_threading`` is
    refused: it corrupted data in this project's tests.
  * DataflowRunner: project, region, gs:// temp/staging locations, worker
    machine type, and this project packaged for the workers with
    ``--setup_file`` (or a prebuilt container, ``--sdk_container_image``).
  * FlinkRunner (portable): ``--flink_master`` plus the SDK harness
    environment (DOCKER, PROCESS, EXTERNAL worker pool, or LOOPBACK for a
    local cluster).
  * DaskRunner (``pipelines.dask_runner``): ``--dask_client_address`` of a
    running ``dask scheduler`` (or ``--dask_scheduler_file``); with neither,
    the job starts a local cluster for the run (for trying it).

``python -m deploy.runners dataflow --project P ...`` prints the list (one
shell-quoted line) for scripts; ``add_runner_arguments`` / ``beam_args_from``
let a CLI expose the same parameters.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from pathlib import Path
from typing import Optional, Sequence

from pipelines.runner_names import DASK_NAMES, resolve_dask

REPO_ROOT = Path(__file__).resolve().parent.parent
SETUP_FILE = str(REPO_ROOT / "setup.py")

DIRECT_MODES = ("in_memory", "multi_processing")
FLINK_ENVIRONMENTS = ("DOCKER", "PROCESS", "EXTERNAL", "LOOPBACK")
DEFAULT_MACHINE_TYPE = "n2-standard-4"
DEFAULT_REGION = "us-central1"
DEFAULT_FLINK_MASTER = "localhost:8081"
RUNNER_NAMES = {"direct": "DirectRunner", "directrunner": "DirectRunner",
                "dataflow": "DataflowRunner",
                "dataflowrunner": "DataflowRunner",
                "flink": "FlinkRunner", "flinkrunner": "FlinkRunner",
                **{name: "DaskRunner" for name in DASK_NAMES}}
_JOB_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DASK_ADDRESS = re.compile(r"^([a-z]+://)?[^\s/:]+:\d+$")


def direct_args(num_workers: int = 1,
                running_mode: Optional[str] = None) -> list[str]:
    """DirectRunner; more than one worker means ``multi_processing``."""
    if num_workers < 1:
        raise ValueError(f"--direct_num_workers must be >= 1, got {num_workers}")
    mode = running_mode or ("multi_processing" if num_workers > 1
                            else "in_memory")
    if mode == "multi_threading":
        raise ValueError("--direct_running_mode multi_threading is not "
                         "supported by dpsynth (it corrupts data); use "
                         "multi_processing")
    if mode not in DIRECT_MODES:
        raise ValueError(f"--direct_running_mode must be one of "
                         f"{DIRECT_MODES}, got {mode!r}")
    return ["--runner=DirectRunner", f"--direct_num_workers={num_workers}",
            f"--direct_running_mode={mode}"]


def dataflow_args(project: str, temp_location: str,
                  region: str = DEFAULT_REGION,
                  staging_location: Optional[str] = None,
                  machine_type: str = DEFAULT_MACHINE_TYPE,
                  max_num_workers: Optional[int] = None,
                  job_name: Optional[str] = None,
                  setup_file: Optional[str] = SETUP_FILE,
                  sdk_container_image: Optional[str] = None,
                  service_account_email: Optional[str] = None,
                  subnetwork: Optional[str] = None,
                  use_public_ips: Optional[bool] = None,
                  experiments: Sequence[str] = ()) -> list[str]:
    """DataflowRunner.

    Workers get this project either from ``setup_file`` (Beam builds an sdist
    of it and workers pip-install it with its dependencies at start-up) or,
    faster, from ``sdk_container_image`` (deploy/dataflow/Dockerfile); with an
    image, pass ``setup_file=None``.
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
    if setup_file is None and sdk_container_image is None:
        raise ValueError("Dataflow workers need this project: pass a "
                         "setup_file or an sdk_container_image")
    args = ["--runner=DataflowRunner", f"--project={project}",
            f"--region={region}", f"--temp_location={temp_location}",
            f"--staging_location={staging_location}",
            f"--machine_type={machine_type}"]
    if setup_file:
        args.append(f"--setup_file={setup_file}")
    if sdk_container_image:
        args.append(f"--sdk_container_image={sdk_container_image}")
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
               environment_type: str = "DOCKER",
               environment_config: Optional[str] = None,
               parallelism: Optional[int] = None,
               flink_version: Optional[str] = None,
               setup_file: Optional[str] = SETUP_FILE,
               submit_uber_jar: bool = False) -> list[str]:
    """Portable FlinkRunner.

    ``environment_type``: DOCKER (``environment_config`` = SDK image, default
    ``apache/beam_python3.X_sdk``), PROCESS (``environment_config`` = JSON with
    the boot ``command``), EXTERNAL (``environment_config`` = host:port of a
    Beam worker pool sidecar), LOOPBACK (the submitting process runs the user
    code: only for a local/test Flink cluster).
    """
    env = environment_type.upper()
    if env not in FLINK_ENVIRONMENTS:
        raise ValueError(f"--environment_type must be one of "
                         f"{FLINK_ENVIRONMENTS}, got {environment_type!r}")
    if env in ("PROCESS", "EXTERNAL") and not environment_config:
        raise ValueError(f"--environment_type {env} needs --environment_config")
    if not flink_master:
        raise ValueError("--flink_master is required (host:port, [local] or "
                         "[auto])")
    args = ["--runner=FlinkRunner", f"--flink_master={flink_master}",
            f"--environment_type={env}"]
    if environment_config:
        args.append(f"--environment_config={environment_config}")
    if parallelism is not None:
        if parallelism < 1:
            raise ValueError("--parallelism must be >= 1")
        args.append(f"--parallelism={parallelism}")
    if flink_version:
        args.append(f"--flink_version={flink_version}")
    if submit_uber_jar:
        args.append("--flink_submit_uber_jar")
    if setup_file and env != "LOOPBACK":
        args.append(f"--setup_file={setup_file}")
    return args


def dask_args(client_address: Optional[str] = None,
              scheduler_file: Optional[str] = None,
              npartitions: Optional[int] = None,
              partition_size: Optional[int] = None) -> list[str]:
    """DaskRunner (dpsynth's, ``pipelines.dask_runner``).

    ``client_address``: the scheduler, ``tcp://HOST:PORT`` (or a
    ``scheduler_file`` it wrote). With neither, ``dpsynth generate`` starts
    a local cluster for the run, which is only for trying the runner.
    ``npartitions`` / ``partition_size``: Dask partitions of each created
    PCollection (default: one per element, e.g. per read range).
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
    """Dispatches on ``runner`` (direct / dataflow / flink / dask, any
    case)."""
    name = RUNNER_NAMES.get(runner.lower())
    if name == "DirectRunner":
        return direct_args(**params)
    if name == "DataflowRunner":
        return dataflow_args(**params)
    if name == "FlinkRunner":
        return flink_args(**params)
    if name == "DaskRunner":
        return dask_args(**params)
    raise ValueError(f"--runner must be one of direct, dataflow, flink, dask; "
                     f"got {runner!r}")


def pipeline_options(args: Sequence[str]):
    """PipelineOptions from an arg list (imports Beam, nothing of GCP; Dask
    names resolve to dpsynth's runner, as in ``dpsynth generate``)."""
    from apache_beam.options.pipeline_options import PipelineOptions
    return PipelineOptions(resolve_dask(args))


def _child(uri: str, name: str) -> str:
    return uri.rstrip("/") + "/" + name


# --------------------------------------------------------- CLI integration


def add_runner_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds ``--runner`` and the parameters of the four option sets."""
    g = parser.add_argument_group("runner (see deploy/README.md)")
    g.add_argument("--runner", default="direct",
                   help="direct (default), dataflow, flink or dask")
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
    g.add_argument("--setup-file", default=SETUP_FILE,
                   help="package shipped to Dataflow/Flink workers")
    g.add_argument("--sdk-container-image", default=None)
    g.add_argument("--service-account-email", default=None)
    g.add_argument("--flink-master", default=DEFAULT_FLINK_MASTER)
    g.add_argument("--environment-type", default="DOCKER",
                   help=f"Flink: one of {FLINK_ENVIRONMENTS}")
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
        setup = None if ns.sdk_container_image and \
            ns.setup_file == SETUP_FILE else ns.setup_file
        return dataflow_args(
            project=ns.project, temp_location=ns.temp_location,
            region=ns.region, staging_location=ns.staging_location,
            machine_type=ns.machine_type, max_num_workers=ns.max_num_workers,
            job_name=ns.job_name, setup_file=setup,
            sdk_container_image=ns.sdk_container_image,
            service_account_email=ns.service_account_email)
    if name == "FlinkRunner":
        return flink_args(ns.flink_master, ns.environment_type,
                          ns.environment_config, ns.parallelism,
                          setup_file=ns.setup_file)
    if name == "DaskRunner":
        return dask_args(ns.dask_client_address, ns.dask_scheduler_file)
    raise ValueError(f"--runner must be one of direct, dataflow, flink, dask; "
                     f"got {ns.runner!r}")


def main(argv: Optional[list[str]] = None) -> int:
    """Prints the Beam options for a runner as one shell-quoted line."""
    parser = argparse.ArgumentParser(
        prog="python -m deploy.runners",
        description="print the Beam pipeline options of a runner")
    add_runner_arguments(parser)
    args = sys.argv[1:] if argv is None else argv
    # `python -m deploy.runners dataflow --project ...`: positional runner.
    if args and not args[0].startswith("-"):
        args = ["--runner", args[0], *args[1:]]
    try:
        print(shlex.join(beam_args_from(parser.parse_args(args))))
    except ValueError as e:
        parser.error(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
