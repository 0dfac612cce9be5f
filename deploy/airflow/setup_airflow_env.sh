#!/usr/bin/env bash
# Creates (or reuses) the separate Airflow virtualenv used by the nightly DAG
# and its tests. Airflow pins many libraries (SQLAlchemy, protobuf, grpc,
# numpy ranges...) that clash with dpsynth's own stack (TensorFlow, Beam), so
# Airflow never goes into the project's environment: the DAG's Beam task runs
# dpsynth with *another* interpreter (Variable `dpsynth_python`).
#
# Usage: deploy/airflow/setup_airflow_env.sh [VENV_DIR]
#   VENV_DIR defaults to $DPSYNTH_AIRFLOW_VENV, else
#   ${XDG_CACHE_HOME:-~/.cache}/dpsynth/venv-airflow: a user cache, outside
#   the repository (~2 GB).
#   AIRFLOW_VERSION / BEAM_PROVIDER_VERSION override the pins below.
# Exit status 0 once `VENV_DIR/bin/airflow version` works; the venv is reused
# (a stamp file records the pins) so later runs take a second.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${1:-${DPSYNTH_AIRFLOW_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dpsynth/venv-airflow}}"
airflow_version="${AIRFLOW_VERSION:-3.1.8}"
provider_version="${BEAM_PROVIDER_VERSION:-6.3.1}"
# BeamRunPythonPipelineOperator refuses to construct without the google
# provider (its Dataflow mixin checks for it), whatever the runner.
google_version="${GOOGLE_PROVIDER_VERSION:-22.8.0}"
python_bin="${PYTHON:-python3}"
stamp="$venv/.dpsynth-airflow-$airflow_version-beam-$provider_version-google-$google_version"

if [[ -f "$stamp" && -x "$venv/bin/airflow" ]]; then
  echo "reusing $venv (Airflow $airflow_version)"
  exit 0
fi

echo "creating $venv (takes minutes, ~2 GB) with Airflow $airflow_version," \
     "apache-airflow-providers-apache-beam $provider_version," \
     "apache-airflow-providers-google $google_version"
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
"$python_bin" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet \
  "apache-airflow==$airflow_version" \
  "apache-airflow-providers-apache-beam==$provider_version" \
  "apache-airflow-providers-google==$google_version"
"$venv/bin/airflow" version
touch "$stamp"
