#!/usr/bin/env bash
# Submit dpsynth to an Apache Flink cluster through Beam's portable FlinkRunner.
#
#   deploy/flink/submit.sh [dpsynth generate flags...]
#
# Settings (environment):
#   FLINK_MASTER      host:port of the Flink REST endpoint (default localhost:8081;
#                     "[local]" starts an embedded cluster for a smoke test)
#   ENVIRONMENT_TYPE  how Flink task managers run the Python SDK harness:
#                     DOCKER (default, LOOPBACK for [local]; ENVIRONMENT_CONFIG = SDK image, e.g. an
#                     image built from dpsynth.deploy/dataflow/Dockerfile), EXTERNAL
#                     (ENVIRONMENT_CONFIG = host:port of a Beam worker pool
#                     sidecar: `docker run IMAGE --worker_pool`), PROCESS
#                     (ENVIRONMENT_CONFIG = '{"command": "/opt/apache/beam/boot"}'),
#                     or LOOPBACK (this process runs the Python code; local
#                     clusters only)
#   ENVIRONMENT_CONFIG, PARALLELISM, FLINK_VERSION (e.g. 1.20), PYTHON
#   FLINK_JOB_SERVER_JAR  Beam's Flink job server jar; default: the one
#                     `python -m dpsynth.deploy.install_engines flink` installed, if
#                     any (else Beam downloads the jar of FLINK_VERSION)
#   JOB_ENDPOINT      host:port of a Flink job server already running
#                     (instead of a jar; tests/test_engines.py starts one)
# --output and --input must be paths every task manager can reach (gs://,
# hdfs://, s3:// or a shared mount), not this machine's local disk.
# DRY_RUN=1 prints the command instead of running it.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
python="${PYTHON:-python3}"

cd "$repo"
runner_flags=(flink --flink-master "${FLINK_MASTER:-localhost:8081}")
[[ -n "${ENVIRONMENT_TYPE:-}" ]] && runner_flags+=(--environment-type "$ENVIRONMENT_TYPE")
[[ -n "${ENVIRONMENT_CONFIG:-}" ]] && runner_flags+=(--environment-config "$ENVIRONMENT_CONFIG")
[[ -n "${PARALLELISM:-}" ]] && runner_flags+=(--parallelism "$PARALLELISM")
if [[ -n "${JOB_ENDPOINT:-}" ]]; then
  runner_flags+=(--job-endpoint "$JOB_ENDPOINT")
else
  jar="${FLINK_JOB_SERVER_JAR:-}"
  if [[ -z "$jar" && -z "${FLINK_VERSION:-}" ]]; then
    jar="$("$python" -m dpsynth.deploy.install_engines --print flink 2>/dev/null || true)"
  fi
  [[ -n "$jar" ]] && runner_flags+=(--flink-job-server-jar "$jar")
fi
beam_line="$("$python" -m dpsynth.deploy.runner_options "${runner_flags[@]}")"
eval "beam_args=($beam_line)"
[[ -n "${FLINK_VERSION:-}" ]] && beam_args+=("--flink_version=$FLINK_VERSION")

if [[ "${DRY_RUN:-0}" == 1 ]]; then
  printf '%q ' "$python" -m dpsynth.pipelines.cli.generate "${beam_args[@]}" "$@"; echo
else
  exec "$python" -m dpsynth.pipelines.cli.generate "${beam_args[@]}" "$@"
fi
