#!/usr/bin/env bash
# Issue 27's 16-core measurement on a machine with no network (the lent
# device machine): `dpsynth generate` at 2M x 384 (16 .npz files, defaults,
# eps 4, --output-format parquet, --noise-seed 1) on Dask and DirectRunner
# with each worker count, through benchmarks/scaling.py --workers (speed-up,
# efficiency, Amdahl f, per-stage table, release digests).
#
#   BUNDLE=.scaleout bash benchmarks/scaleout_device.sh
#
# BUNDLE: a git-ignored folder of the checkout with whl/, the Python 3.12
# wheels the machine lacks, made here with network:
#   echo /.scaleout/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 \
#     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     --platform manylinux1_x86_64 -d .scaleout/whl \
#     $(cat ../shared/scaleout/wheels.txt) pipeline-dp==0.3.1 python-dp==1.1.5 dill==0.4.1
# (about 40 MB; carried to the machine with the checkout). Knobs: N,
# FILES, WORKERS (run order, W outer), ENGINES, CONFIGS, BUDGET_S (the whole
# sweep, data included; runs that no longer fit are skipped), RUN_TIMEOUT,
# SECTION, OUT (results: scaling-workers.md, runs.jsonl, log.txt,
# write_contention.txt, floor_scaling.txt), CONTENTION_ROWS, FLOOR_REPEAT
# (rounds of benchmarks/floor_scaling.py at 1 and nproc processes: the
# machine's own f for the same work with no runner; 0 skips it), PIN (1:
# a run with W workers on W cores, as scaling.py does by default; 0: all).
set -uo pipefail
BUNDLE=${BUNDLE:-.scaleout}; OUT=${OUT:-/tmp/scaleout}; PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
t0=$(date +%s)
$PY -m pip install -q --no-index --no-deps --no-cache-dir --upgrade \
    --target /tmp/site "$BUNDLE"/whl/*.whl || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
# Imports (and their bytecode) once, before any timed run.
$PY -c "import apache_beam, dask.distributed, pipeline_dp, dp_accounting, dpsynth.pipelines.cli.generate, dpsynth.pipelines.runners.dask.runner, benchmarks.scaling" \
    || { echo "import check failed"; exit 1; }
echo "wheels and imports ready in $(( $(date +%s) - t0 )) s; $(nproc) cores"
$PY benchmarks/scaling.py --workers "${WORKERS:-16,1,2,4,8}" \
    --engines "${ENGINES:-dask,direct}" --configs "${CONFIGS:-default}" \
    --dims 384 --sizes "${N:-2000000}" --files "${FILES:-16}" --format npz \
    --gen-args "--output-format parquet" --cache /tmp/dpsynth-cache \
    --out "$OUT/scaling-workers.md" --section "${SECTION:-device}" \
    --save "$OUT/runs.jsonl" --nice 0 --max-rss-gb 100 \
    --timeout "${RUN_TIMEOUT:-150}" --budget "${BUDGET_S:-400}" \
    $([ "${PIN:-1}" = 0 ] && echo --no-pin) 2>&1 | tee "$OUT/log.txt"
# The write stage's parts alone and on every core at once (drawing,
# encoding, writing files; see benchmarks/write_contention.py).
# CONTENTION_ROWS=0 skips it.
if [ "${CONTENTION_ROWS:-500000}" != 0 ]; then
  $PY benchmarks/write_contention.py --rows "${CONTENTION_ROWS:-500000}" \
      --processes "$(nproc)" --no-save --section device 2>&1 \
      | tee "$OUT/write_contention.txt"
fi
# The machine's own serial fraction for the job's work, with no runner
# (benchmarks/floor_scaling.py): the floor under the sweep's f.
if [ "${FLOOR_REPEAT:-1}" != 0 ]; then
  $PY benchmarks/floor_scaling.py --rows "${N:-2000000}" \
      --processes "1,$(nproc)" --repeat "${FLOOR_REPEAT:-1}" \
      --cache /tmp/dpsynth-cache --no-save 2>&1 | tee "$OUT/floor_scaling.txt"
fi
