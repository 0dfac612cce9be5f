#!/usr/bin/env bash
# Submit dpsynth to an Apache Flink cluster through Beam's portable FlinkRunner.
#
#   deploy/flink/submit.sh [dpsynth generate flags...]
#
# Settings (environment):
#   FLINK_MASTER      host:port of the Flink REST endpoint (default localhost:8081;
#                     "[local]" starts an embedded cluster for a smoke test)
#   ENVIRONMENT_TYPE  how Flink task managers run the Python SDK harness:
#                     DOCKER (default; ENVIRONMENT_CONFIG = SDK image, e.g. an
#                     image built from deploy/dataflow/Dockerfile), EXTERNAL
#                     (ENVIRONMENT_CONFIG = host:port of a Beam worker pool
#                     sidecar: `docker run IMAGE --worker_pool`), PROCESS
#                     (ENVIRONMENT_CONFIG = '{"command": "/opt/apache/beam/boot"}'),
#                     or LOOPBACK (this process runs the Python code; local
#                     clusters only)
#   ENVIRONMENT_CONFIG, PARALLELISM, FLINK_VERSION (e.g. 1.20), PYTHON
# The job server jar matching FLINK_VERSION is downloaded by Beam on first
# use (Maven Central), so the submitting machine needs that access.
# --output and --input must be paths every task manager can reach (gs://,
# hdfs://, s3:// or a shared mount), not this machine's local disk.
# DRY_RUN=1 prints the command instead of running it.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
python="${PYTHON:-python3}"

runner_flags=(flink --flink-master "${FLINK_MASTER:-localhost:8081}"
              --environment-type "${ENVIRONMENT_TYPE:-DOCKER}")
[[ -n "${ENVIRONMENT_CONFIG:-}" ]] && runner_flags+=(--environment-config "$ENVIRONMENT_CONFIG")
[[ -n "${PARALLELISM:-}" ]] && runner_flags+=(--parallelism "$PARALLELISM")
cd "$repo"
beam_line="$("$python" -m deploy.runners "${runner_flags[@]}")"
eval "beam_args=($beam_line)"
[[ -n "${FLINK_VERSION:-}" ]] && beam_args+=("--flink_version=$FLINK_VERSION")

if [[ "${DRY_RUN:-0}" == 1 ]]; then
  printf '%q ' "$python" -m pipelines.generate "${beam_args[@]}" "$@"; echo
else
  exec "$python" -m pipelines.generate "${beam_args[@]}" "$@"
fi
