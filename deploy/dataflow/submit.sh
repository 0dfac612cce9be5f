#!/usr/bin/env bash
# Submit dpsynth to Google Cloud Dataflow.
#
#   deploy/dataflow/submit.sh classic        [dpsynth generate flags...]
#   deploy/dataflow/submit.sh graph          [dpsynth generate flags...]
#   deploy/dataflow/submit.sh build-template
#   deploy/dataflow/submit.sh run-template   key=value [key=value...]
#
# classic         runs `python -m dpsynth.pipelines.cli.generate` here with DataflowRunner;
#                 workers get this project through --setup_file (or IMAGE, if
#                 set, as --sdk_container_image). This process waits for the
#                 job, then writes the manifest and publishes the release.
# graph           builds the job `classic` would submit, with Dataflow's own
#                 translation under --dry_run, and writes it to GRAPH_OUT
#                 (default ./dataflow-graph): phase1/phase2.job.json (job
#                 description + pipeline proto). Stages and submits nothing
#                 (deploy/dataflow/job_graph.py; PHASE1_COUNTS: stand-in
#                 noisy class counts for phase 2).
# build-template  builds and pushes deploy/dataflow/Dockerfile as IMAGE and
#                 writes the Flex Template spec to TEMPLATE with metadata.json.
# run-template    launches a job from TEMPLATE; parameters as in metadata.json.
#
# Settings (environment): PROJECT, REGION (default us-central1), BUCKET
# (gs://bucket, for temp/staging), IMAGE (e.g.
# REGION-docker.pkg.dev/PROJECT/REPO/dpsynth:TAG), TEMPLATE (default
# $BUCKET/templates/dpsynth.json), MACHINE_TYPE (default n2-standard-4),
# MAX_WORKERS, SERVICE_ACCOUNT, PYTHON (default python3).
# DRY_RUN=1 prints the commands instead of running them.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
python="${PYTHON:-python3}"
region="${REGION:-us-central1}"
machine="${MACHINE_TYPE:-n2-standard-4}"

need() {
  for name in "$@"; do
    if [[ -z "${!name:-}" ]]; then
      echo "submit.sh: set $name (see the header of $0)" >&2
      exit 2
    fi
  done
}

run() {
  if [[ "${DRY_RUN:-0}" == 1 ]]; then
    printf '%q ' "$@"; echo
  else
    "$@"
  fi
}

mode="${1:-}"
shift || true
case "$mode" in
  classic|graph)
    need PROJECT BUCKET
    runner_flags=(dataflow --project "$PROJECT" --region "$region"
                  --temp-location "$BUCKET/tmp" --machine-type "$machine")
    [[ -n "${MAX_WORKERS:-}" ]] && runner_flags+=(--max-num-workers "$MAX_WORKERS")
    [[ -n "${SERVICE_ACCOUNT:-}" ]] && runner_flags+=(--service-account-email "$SERVICE_ACCOUNT")
    [[ -n "${IMAGE:-}" ]] && runner_flags+=(--sdk-container-image "$IMAGE")
    # dpsynth.deploy.runner_options validates the option set and prints it shell-quoted.
    beam_line="$(cd "$repo" && "$python" -m dpsynth.deploy.runner_options "${runner_flags[@]}")"
    eval "beam_args=($beam_line)"
    cd "$repo"
    if [[ "$mode" == graph ]]; then
      graph_flags=(--out "${GRAPH_OUT:-$OLDPWD/dataflow-graph}")
      [[ -n "${PHASE1_COUNTS:-}" ]] && graph_flags+=(--phase1-counts "$PHASE1_COUNTS")
      run "$python" deploy/dataflow/job_graph.py print "${graph_flags[@]}" \
        "${beam_args[@]}" "$@"
    else
      run "$python" -m dpsynth.pipelines.cli.generate "${beam_args[@]}" "$@"
    fi
    ;;
  build-template)
    need PROJECT BUCKET IMAGE
    template="${TEMPLATE:-$BUCKET/templates/dpsynth.json}"
    cd "$repo"
    run docker build -f deploy/dataflow/Dockerfile -t "$IMAGE" .
    run docker push "$IMAGE"
    run gcloud dataflow flex-template build "$template" \
      --project "$PROJECT" --image "$IMAGE" --sdk-language PYTHON \
      --metadata-file deploy/dataflow/metadata.json
    ;;
  run-template)
    need PROJECT BUCKET IMAGE
    template="${TEMPLATE:-$BUCKET/templates/dpsynth.json}"
    [[ $# -ge 1 ]] || { echo "submit.sh run-template: pass key=value parameters (output=gs://...)" >&2; exit 2; }
    params="$(IFS=,; echo "$*")"
    job="dpsynth-$(date -u +%Y%m%d-%H%M%S)"
    extra=()
    [[ -n "${MAX_WORKERS:-}" ]] && extra+=(--max-workers "$MAX_WORKERS")
    [[ -n "${SERVICE_ACCOUNT:-}" ]] && extra+=(--service-account-email "$SERVICE_ACCOUNT")
    run gcloud dataflow flex-template run "$job" \
      --project "$PROJECT" --region "$region" \
      --template-file-gcs-location "$template" \
      --temp-location "$BUCKET/tmp" --staging-location "$BUCKET/staging" \
      --worker-machine-type "$machine" \
      --parameters "sdk_container_image=$IMAGE,$params" "${extra[@]}"
    ;;
  *)
    sed -n '2,28p' "$0" >&2
    exit 2
    ;;
esac
