"""Who may set which runner option of a scheduled run (deploy/README.md,
"Who configures what").

A runner option that names a binary, a package, an image, a command, an
endpoint or a cluster chooses *what runs* as the operator, on the operator's
machines, while the run's noise key is readable there: ``prism_location`` of
a binary in the dataset team's bucket ran it on the Airflow worker. Those
options, and the choice of runner itself, are the operator's
(``DPSYNTH_OPERATOR_CONFIG``): ``OPERATOR_ONLY`` below is the one table of
them. The dataset team (its Airflow Variable, a trigger's params) may tune
only the sizes in ``DATASET_RUNNER_PARAMS``; any other key is refused.

Names are matched however they are spelled: with or without leading dashes,
``--name=value``, ``-`` or ``_``, any case, and the other option strings
Beam gives the same option (``--extra_package`` / ``--extra_packages``).
Beam's parser is built with ``allow_abbrev=False``, so a prefix
(``--prism_loc``) is not an option Beam reads (tests/test_runner_trust.py
checks that stays so).

``python -m dpsynth.deploy.runner_trust`` is what the nightly DAG (which
imports nothing of dpsynth) runs: it checks the dataset team's settings and
prints the runner's Beam options as JSON, or one line and exit 2.
"""

from __future__ import annotations

import inspect
import json
import sys
from typing import Mapping, Optional, Sequence

# Why each is the operator's; the reasons are the classes of the review.
_BINARY = "names a binary that runs"
_PACKAGE = "names Python packages or code installed on the workers"
_IMAGE = "names a container image that runs"
_COMMAND = "names a command or environment that runs the SDK harness"
_ENDPOINT = "names a service the job talks to (code or data go there)"
_CLUSTER = "names the cluster, project or account the job runs in"
_RUNNER = "chooses the engine that runs the job"

# Beam pipeline option (its flag without dashes, as in apache_beam/options/
# pipeline_options.py and apache_beam/runners/dask/dask_runner.py, plus
# dpsynth's --dask_dashboard) -> why only the operator may set it.
OPERATOR_ONLY: dict[str, str] = {
    "runner": _RUNNER,
    # binaries and the jars/launchers that start job servers
    "prism_location": _BINARY,
    "prism_beam_version_override": _BINARY,  # picks the Prism release run
    "flink_job_server_jar": _BINARY,
    "spark_job_server_jar": _BINARY,
    "kafka_streams_job_server_jar": _BINARY,
    "flink_version": _BINARY,  # picks the job server jar Beam downloads
    "spark_version": _BINARY,
    "job_server_java_launcher": _BINARY,
    "job_server_jvm_properties": _BINARY,
    "jar_cache_dir": _BINARY,  # jars found there are run
    "maven_repository_url": _BINARY,  # where jars are downloaded from
    "dataflow_worker_jar": _BINARY,
    "profiler_agent": _BINARY,
    # Python packages and code
    "extra_packages": _PACKAGE,
    "setup_file": _PACKAGE,
    "requirements_file": _PACKAGE,
    "requirements_cache": _PACKAGE,
    "requirements_cache_only_sources": _PACKAGE,
    "sdk_location": _PACKAGE,
    "files_to_stage": _PACKAGE,
    "beam_plugins": _PACKAGE,  # modules imported by every worker
    "pickle_library": _PACKAGE,  # how the job's code is serialised
    "save_main_session": _PACKAGE,
    "on_success_matcher": _PACKAGE,  # a pickled callable
    "staging_location": _PACKAGE,  # workers install what is staged there
    "temp_location": _PACKAGE,  # the staging default
    "artifacts_dir": _PACKAGE,
    # images
    "sdk_container_image": _IMAGE,
    "worker_harness_container_image": _IMAGE,
    "sdk_harness_container_image_overrides": _IMAGE,
    "dataflow_container_base_repository": _IMAGE,
    "prebuild_sdk_container_engine": _IMAGE,
    "prebuild_sdk_container_base_image": _IMAGE,
    "docker_registry_push_url": _IMAGE,
    "direct_embed_docker_python": _IMAGE,
    # commands / SDK harness environments
    "environment_type": _COMMAND,
    "environment_config": _COMMAND,
    "environment_options": _COMMAND,
    "experiments": _COMMAND,  # e.g. runner_harness_container_image=...
    "dataflow_service_options": _COMMAND,
    "output_executable_path": _COMMAND,
    "template_location": _COMMAND,
    "dataflow_job_file": _COMMAND,
    "update": _COMMAND,  # replaces a running job
    "transform_name_mapping": _COMMAND,
    "create_from_snapshot": _COMMAND,
    # endpoints
    "job_endpoint": _ENDPOINT,
    "artifact_endpoint": _ENDPOINT,
    "expansion_service": _ENDPOINT,
    "expansion_services": _ENDPOINT,
    "beam_services": _ENDPOINT,
    "use_transform_service": _ENDPOINT,
    "dataflow_endpoint": _ENDPOINT,
    "big_query_endpoint": _ENDPOINT,
    "pubsub_root_url": _ENDPOINT,
    "blob_service_endpoint": _ENDPOINT,
    "azure_connection_string": _ENDPOINT,
    "aws_endpoint_url": _ENDPOINT,
    "s3_endpoint_url": _ENDPOINT,
    "hdfs_host": _ENDPOINT,
    "hdfs_port": _ENDPOINT,
    "bootstrap_servers": _ENDPOINT,
    "job_port": _ENDPOINT,
    "artifact_port": _ENDPOINT,
    "expansion_port": _ENDPOINT,
    "profile_location": _ENDPOINT,  # profiles (of private data) go there
    # clusters, projects, accounts, networks
    "flink_master": _CLUSTER,
    "spark_master_url": _CLUSTER,
    "spark_rest_url": _CLUSTER,
    "dask_client_address": _CLUSTER,
    "dask_scheduler_file": _CLUSTER,
    "dask_dashboard": _ENDPOINT,  # serves the local cluster's tasks
    "project": _CLUSTER,
    "region": _CLUSTER,
    "worker_region": _CLUSTER,
    "worker_zone": _CLUSTER,
    "zone": _CLUSTER,
    "network": _CLUSTER,
    "subnetwork": _CLUSTER,
    "use_public_ips": _CLUSTER,
    "service_account_email": _CLUSTER,
    "impersonate_service_account": _CLUSTER,
    "gcp_oauth_scopes": _CLUSTER,
    "dataflow_kms_key": _CLUSTER,
    "application_id": _CLUSTER,
}

# Names other Beam versions or SDKs give such options (not options of the
# Beam this project pins; kept so that an upgrade cannot open them).
FOR_OTHER_BEAM_VERSIONS = ("expansion_service", "expansion_services",
                           "dataflow_worker_jar")

# Other spellings of the same options: Beam's second option strings and the
# parameters of dpsynth.deploy.runner_options.*_args that set them.
ALIASES: dict[str, str] = {
    "extra_package": "extra_packages",
    "beam_plugin": "beam_plugins",
    "file_to_stage": "files_to_stage",
    "environment_option": "environment_options",
    "experiment": "experiments",
    "dataflow_service_option": "dataflow_service_options",
    "job_server_jvm_property": "job_server_jvm_properties",
    "gcp_oauth_scope": "gcp_oauth_scopes",
    "bigquery_endpoint": "big_query_endpoint",
    "no_use_public_ips": "use_public_ips",
    "no_save_main_session": "save_main_session",
    "master_url": "spark_master_url",  # spark_args
    "client_address": "dask_client_address",  # dask_args
    "scheduler_file": "dask_scheduler_file",
    "job_server_jar": "flink_job_server_jar",  # flink_args / spark_args
}

# The parameters of dpsynth.deploy.runner_options.<runner>_args the dataset team's
# ``runner_params`` may set: sizes and a name, nothing that chooses what runs.
DATASET_RUNNER_PARAMS = ("num_workers", "running_mode", "machine_type",
                         "max_num_workers", "job_name", "parallelism",
                         "npartitions", "partition_size")
WHO = ("only the operator's config may set it (DPSYNTH_OPERATOR_CONFIG "
       "runner / runner_params / beam_options, deploy/README.md)")


def option_name(key: object) -> str:
    """``--Extra-Package=x`` -> ``extra_package``: the name as spelled,
    without dashes in front, a value, or case."""
    name = str(key).strip().lstrip("-").split("=", 1)[0].strip()
    return name.replace("-", "_").lower()


_OPERATOR_ONLY_LOWER = {name.lower(): name for name in OPERATOR_ONLY}


def operator_only(key: object) -> Optional[str]:
    """The table's option ``key`` sets, however spelled; None if none."""
    name = option_name(key)
    name = ALIASES.get(name, name)
    return _OPERATOR_ONLY_LOWER.get(name.lower())


def refuse_operator_only(where: str, keys: Sequence[object]) -> None:
    """One line naming the first key of ``where`` (a setting of the dataset
    team) that sets an operator-only runner option."""
    for key in keys:
        option = operator_only(key)
        if option is not None:
            raise ValueError(
                f"{where}: {str(key)!r} is the runner option --{option}, "
                f"which {OPERATOR_ONLY[option]}: {WHO}; the dataset's "
                "config and a run's params cannot set it")


def dataset_runner_params(runner: str, params: object,
                          where: str = "dpsynth_config runner_params"
                          ) -> dict:
    """The dataset team's ``runner_params`` for ``runner``, keys as the
    runner's parameters; ValueError in one line for an operator-only option,
    a key not in DATASET_RUNNER_PARAMS or one ``runner`` does not take."""
    if not isinstance(params, Mapping):
        raise ValueError(f"{where}: must be a JSON object")
    refuse_operator_only(where, list(params))
    out = {}
    for key, value in params.items():
        name = option_name(key)
        if name not in DATASET_RUNNER_PARAMS:
            raise ValueError(f"{where}: unknown key {str(key)!r}; the "
                             f"dataset may set {list(DATASET_RUNNER_PARAMS)}"
                             f", other runner options are the operator's")
        if name not in _parameters(runner):
            raise ValueError(f"{where}: {str(key)!r} is not a parameter of "
                             f"{runner}")
        out[name] = value
    return out


def _parameters(runner: str) -> set[str]:
    """The keyword parameters of the ``*_args`` function of ``runner``."""
    from dpsynth.deploy import runner_options
    name = runner_options.RUNNER_NAMES.get(str(runner).lower())
    if name is None:
        raise ValueError(f"runner must be one of {runner_options.RUNNER_CHOICES}; "
                         f"got {runner!r}")
    function = getattr(runner_options, name[:-len("Runner")].lower() + "_args")
    return set(inspect.signature(function).parameters)


def check_delta(delta: object, where: str) -> None:
    """A run's delta from the dataset's config, bounded as ``dpsynth
    generate --delta`` bounds it (dp_ops.config.check_delta, no
    --allow-large-delta in a scheduled run)."""
    from dpsynth.dp_ops.config import check_delta as bound
    if isinstance(delta, bool) or not isinstance(delta, (int, float)):
        raise ValueError(f"{where}: delta must be a number, got {delta!r}")
    try:
        bound(float(delta))
    except ValueError as err:
        raise ValueError(f"{where}: {err}".split(
            "; pass --allow-large-delta")[0]) from None


def scheduled_runner_args(operator: Mapping, dataset: Mapping) -> list[str]:
    """The Beam options of a scheduled run: the operator's ``runner``,
    ``runner_params`` and ``beam_options`` (``--name=value`` each), the
    dataset team's ``runner_params`` checked first (sizes only; the
    operator's win where both set one)."""
    from dpsynth.deploy import runner_options
    runner = operator.get("runner") or "DirectRunner"
    params = dataset_runner_params(runner, dataset.get("runner_params", {}))
    own = operator.get("runner_params") or {}
    if not isinstance(own, Mapping):
        raise ValueError("DPSYNTH_OPERATOR_CONFIG runner_params: must be a "
                         "JSON object")
    args = runner_options.runner_args(runner, **{**params, **own})
    return args + beam_option_args(operator.get("beam_options") or {})


def beam_option_args(options: object) -> list[str]:
    """The operator's ``beam_options`` {name: value} as ``--name=value``
    (``true``: the bare flag)."""
    if not isinstance(options, Mapping):
        raise ValueError("DPSYNTH_OPERATOR_CONFIG beam_options: must be a "
                         "JSON object")
    args = []
    for key, value in options.items():
        name = str(key).strip().lstrip("-")  # as written: Beam's spelling
        if not name or "=" in name or " " in name:
            raise ValueError(f"DPSYNTH_OPERATOR_CONFIG beam_options: "
                             f"{str(key)!r} is not an option name")
        args.append(f"--{name}" if value is True else f"--{name}={value}")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``check DATASET_JSON``: the dataset team's settings, each a JSON
    object under the name the refusal gives it; ``args OPERATOR_JSON
    DATASET_JSON``: the runner's Beam options as a JSON list. Errors: one
    line on stderr, exit 2."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args[:1] == ["check"] and len(args) == 2:
            check_dataset(json.loads(args[1]))
            print("ok")
        elif args[:1] == ["args"] and len(args) == 3:
            print(json.dumps(scheduled_runner_args(json.loads(args[1]),
                                                   json.loads(args[2]))))
        else:
            raise ValueError("usage: check DATASET_JSON | args OPERATOR_JSON "
                             "DATASET_JSON")
    except (ValueError, TypeError) as err:
        print(str(err).splitlines()[0] if str(err) else type(err).__name__,
              file=sys.stderr)
        return 2
    return 0


def check_dataset(sources: Mapping) -> None:
    """Each ``{where: settings}`` of the dataset team: no key of any may
    set an operator-only runner option; a ``delta`` must be bounded."""
    for where, given in sources.items():
        if not isinstance(given, Mapping):
            raise ValueError(f"{where}: must be a JSON object")
        refuse_operator_only(where, list(given))
        if "delta" in given:
            check_delta(given["delta"], where)


if __name__ == "__main__":
    sys.exit(main())
