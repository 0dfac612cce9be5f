#!/usr/bin/env bash
# Submit dpsynth to Apache Spark (3.x) through Beam's portable SparkRunner.
#
#   deploy/spark/submit.sh [dpsynth generate flags...]
#
# Settings (environment):
#   SPARK_MASTER_URL  local[N] (default local[4]: Spark runs inside the job
#                     server on this machine), spark://HOST:PORT, yarn, k8s://...
#   ENVIRONMENT_TYPE  how Spark executors run the Python SDK harness: LOOPBACK
#                     (default for local[N]: this process runs the Python code),
#                     DOCKER (default otherwise; ENVIRONMENT_CONFIG = SDK image,
#                     e.g. one built from dpsynth.deploy/dataflow/Dockerfile), EXTERNAL
#                     (ENVIRONMENT_CONFIG = host:port of a Beam worker pool), PROCESS
#   ENVIRONMENT_CONFIG, PARALLELISM, PYTHON
#   SPARK_JOB_SERVER_JAR  Beam's Spark 3 job server jar; default: the one
#                     `python -m dpsynth.deploy.install_engines spark` installed, if any
#                     (else Beam downloads it)
#   JOB_ENDPOINT      host:port of a Spark job server already running
# --output and --input must be paths every executor can reach unless the
# master is local[N].
# DRY_RUN=1 prints the command instead of running it.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
python="${PYTHON:-python3}"

cd "$repo"
runner_flags=(spark --spark-master-url "${SPARK_MASTER_URL:-local[4]}")
[[ -n "${ENVIRONMENT_TYPE:-}" ]] && runner_flags+=(--environment-type "$ENVIRONMENT_TYPE")
[[ -n "${ENVIRONMENT_CONFIG:-}" ]] && runner_flags+=(--environment-config "$ENVIRONMENT_CONFIG")
[[ -n "${PARALLELISM:-}" ]] && runner_flags+=(--parallelism "$PARALLELISM")
if [[ -n "${JOB_ENDPOINT:-}" ]]; then
  runner_flags+=(--job-endpoint "$JOB_ENDPOINT")
else
  jar="${SPARK_JOB_SERVER_JAR:-$("$python" -m dpsynth.deploy.install_engines --print spark 2>/dev/null || true)}"
  [[ -n "$jar" ]] && runner_flags+=(--spark-job-server-jar "$jar")
fi
beam_line="$("$python" -m dpsynth.deploy.runner_options "${runner_flags[@]}")"
eval "beam_args=($beam_line)"

if [[ "${DRY_RUN:-0}" == 1 ]]; then
  printf '%q ' "$python" -m dpsynth.pipelines.cli.generate "${beam_args[@]}" "$@"; echo
else
  exec "$python" -m dpsynth.pipelines.cli.generate "${beam_args[@]}" "$@"
fi
