"""Nightly dpsynth release, one per schedule interval, under a lifetime budget.

    budget_check  ->  generate (BeamRunPythonPipelineOperator)  ->  publish_notify

* ``budget_check`` asks the dataset's budget store whether one more release
  fits under the lifetime cap (``python -m dpsynth.pipelines.budget.store check``);
  if not it fails the run *without retries* and nothing is launched. The
  task log gets one fixed line (fits / does not fit), never the check's
  report (attempt counts, lifetime epsilon spent): read that with
  ``python -m dpsynth.pipelines.budget.store show`` where the store is. It also
  builds the runner's Beam options (``dpsynth.deploy.runner_options``) for the next task.
* ``generate`` runs ``python -m dpsynth.deploy.launch`` (= ``dpsynth
  generate``) with the chosen runner. The authoritative spend is recorded by the job itself
  (``budget_store.reserve`` before any data is read): the check above is only a
  cheap pre-flight that avoids launching a cluster for nothing.
* ``publish_notify`` verifies the published release (its ``_manifest.json``
  names this run), moves ``{output_root}/LATEST.json`` to it (path and the
  verified manifest's sha256, which ``load_latest`` checks) and logs/sends a
  notification.

Idempotency: the output prefix is ``{output_root}/{ds}`` and the run id is
``{dataset_id}-{ds}``; re-running a date (clear + retry, backfill) reuses that
run id, so the budget store charges it once and the job does not write a
second, different release.

Privacy settings of the operator (see deploy/README.md, "Operating the budget
store"): the lifetime cap is pinned in the dataset's budget document by its
first run (``lifetime_epsilon`` / ``lifetime_delta`` below only create it; a
trigger cannot change them, and a later run cannot widen the pinned cap: only
``python -m dpsynth.pipelines.budget.store set-cap --reason ...`` can). The job's
console, which the Beam operator forwards to the task log, carries no exact
row counts, wall times or file names (``extra_args`` is an allowlist:
``EXTRA_ARGS_ALLOWED``; ``--verbose``, ``--record-timings``,
``--show-row-counts`` and ``--noise-seed`` are refused), and the
summary that goes to ``LATEST.json`` and the webhook has nothing from the
budget store.

Two roles, two sources of settings (deploy/README.md, "Who configures
what"). The operator's settings -- where releases, the budget ledgers and
the noise keys live, the private dataset's id, its lifetime cap and the
epsilon a release may ask for -- come from the Airflow workers' environment
(``DPSYNTH_OPERATOR_CONFIG``), which whoever edits the dataset's Variable or
triggers a run cannot change: a key location they could read would let them
remove the noise, an empty store would reset the lifetime budget. The
dataset team's settings come from the Airflow Variable ``dpsynth_config``,
overridden per run by the DAG params (``airflow dags trigger
dpsynth_nightly -c '{"epsilon": 2.0}'``; params may set only ``epsilon``,
within the operator's range). The runner, and every runner option that
names a binary, package, image, command, endpoint or cluster
(``dpsynth.deploy.runner_trust.OPERATOR_ONLY``, matched however spelled),
are the operator's: the dataset team once ran its own Prism binary as the
operator that way. So is where each dataset id's input may be read from
(``inputs``): dataset B's records were released under A's id and budget.
An operator key or option in the Variable or the params fails the run in
budget_check with one line naming it, before the store is asked.

  DPSYNTH_OPERATOR_CONFIG   JSON object in the workers' environment; keys
                  (defaults in OPERATOR_DEFAULTS below):
    output_root       releases go to {output_root}/{ds}; LATEST.json there
    budget_store      local dir or gs:// prefix of the budget ledgers
    dataset_id        private dataset id (one lifetime budget per id)
    lifetime_epsilon, lifetime_delta   the dataset's lifetime cap, used only
                      when its budget document is created (then pinned)
    noise_key_location  where each run's noise key lives while it runs
                      (gs:// prefix readable only by the job's service
                      account, or a local folder of the operator's own, mode
                      0700: dpsynth refuses one others can read or write)
    epsilon_range     [min, max]: the epsilon a release may ask for
    runner            DirectRunner (default) | DataflowRunner | FlinkRunner |
                      SparkRunner | PrismRunner | DaskRunner
    runner_params     keyword args of dpsynth.deploy.runner_options.<runner>_args, e.g.
                      {"project": "p", "region": "europe-west4",
                       "temp_location": "gs://b/tmp"} or
                      {"flink_master": "jm:8081", "environment_type": "DOCKER"}
                      or {"master_url": "spark://host:7077"} (SparkRunner)
                      or {"job_endpoint": "prism:8073"} (PrismRunner)
                      or {"client_address": "tcp://dask-scheduler:8786"}
    beam_options      more Beam options {name: value}, e.g. {"sdk_location":
                      "container"}
    inputs            {dataset_id: prefix}: the only folder (local or
                      gs://...) its input may lie under; "" = the demo. A
                      dataset id without one is refused.

  dpsynth_config   JSON object; keys (defaults in DEFAULTS below):
    runner_params     sizes of the operator's runner only (dpsynth.deploy.
                      runner_trust.DATASET_RUNNER_PARAMS: num_workers,
                      running_mode, machine_type, max_num_workers, job_name,
                      parallelism, npartitions, partition_size)
    input             input glob under the operator's ``inputs`` prefix of
                      the dataset id ("" = the embedded digits demo)
    num_classes       labels are 0..N-1 (10 for the demo)
    epsilon, delta    of each release (epsilon within the operator's range;
                      delta at most dpsynth's 1e-4, as ``--delta``)
    extra_args        JSON object of more `dpsynth generate` flags, only
                      those in EXTRA_ARGS_ALLOWED (another fails the run
                      in budget_check with one line naming it)
    notify_url        optional webhook receiving the release summary

Environment of the Airflow workers (read when the DAG is parsed):
  DPSYNTH_PYTHON  interpreter of the environment where dpsynth is installed
                  (``pip install dpsynth``: its wheel, no checkout needed).
                  Airflow lives in its own virtualenv because its pins clash
                  with dpsynth's; default ``python3``. Every dpsynth step runs
                  there as ``python -m dpsynth...``: the DAG itself imports
                  nothing of dpsynth, and a DAGs folder holding packages of
                  its own (``models/``...) does not collide with dpsynth's,
                  which all live under ``dpsynth``.
  DPSYNTH_WORKER_PACKAGE  DataflowRunner: a dpsynth wheel for the workers
                  (or the operator's ``runner_params`` {"extra_package":
                  PATH}); without it
                  the wheel pip installed dpsynth from, or
                  ``sdk_container_image``; with none, budget_check fails in
                  one line (deploy/README.md, Dataflow).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta

from airflow.providers.apache.beam.operators.beam import (
    BeamRunPythonPipelineOperator)
from airflow.sdk import DAG, Param, Variable, task

DPSYNTH_PYTHON = os.environ.get("DPSYNTH_PYTHON", "python3")
# `dpsynth generate` for the Beam operator, run as a module of the installed
# package (py_options ["-m"]).
LAUNCH_MODULE = "dpsynth.deploy.launch"
# Where the default releases and budgets go (the config normally sets both).
_DATA = os.path.join(os.path.expanduser("~"), "dpsynth")

# The dataset team's settings (Variable dpsynth_config, DAG params).
DEFAULTS = {
    "runner_params": {},  # sizes only (runner_trust.DATASET_RUNNER_PARAMS)
    "input": "",
    "num_classes": 10,
    "epsilon": 1.0,
    "delta": 1e-5,
    "extra_args": {},
    "notify_url": "",
}
# The operator's settings (DPSYNTH_OPERATOR_CONFIG in the workers'
# environment): nothing the dataset team edits can set them.
OPERATOR_ENV = "DPSYNTH_OPERATOR_CONFIG"
OPERATOR_DEFAULTS = {
    "output_root": os.path.join(_DATA, "nightly"),
    "budget_store": os.path.join(_DATA, "budgets"),
    "dataset_id": "digits-demo",
    "lifetime_epsilon": 10.0,
    "lifetime_delta": 1e-5,
    "noise_key_location": os.path.join(_DATA, "noise-keys"),
    "epsilon_range": [0.1, 4.0],
    # What runs: the engine, the parameters of its dpsynth.deploy.runner_options
    # *_args function and more Beam options ({name: value}); the dataset
    # team cannot set any option that names a binary, package, image,
    # command, endpoint or cluster (dpsynth.deploy.runner_trust).
    "runner": "DirectRunner",
    "runner_params": {},
    "beam_options": {},
    # dataset_id -> the only place its input may be read from (a folder
    # prefix, local or gs://...; "" = the embedded digits demo).
    "inputs": {"digits-demo": ""},
}
RUNNERS = ("DirectRunner", "DataflowRunner", "FlinkRunner", "SparkRunner",
           "PrismRunner", "DaskRunner")
# The only `dpsynth generate` flags ``extra_args`` may add (an allowlist:
# a flag added to dpsynth later stays out until it is listed here). Each one
# is public configuration that changes nothing printed to the task log but
# the configuration itself. Kept out on purpose: --verbose (matched input
# file names, libraries' logs), --record-timings (wall times grow with n),
# --show-row-counts (exact counts), --noise-seed (seeded, not private noise),
# --allow-large-delta, --overwrite, the image flags (--bad-images-report
# names private files) and the flags this DAG sets itself (output, run id,
# budget store, cap, noise key location: the operator's). Beam options go
# in ``runner_params``.
EXTRA_ARGS_ALLOWED = (
    "labels", "input_format", "embedding_feature", "label_feature",
    "embedding_dim", "non_finite", "output_format", "rows_per_shard",
    "accountant", "budget_weights", "covariance", "clusters", "clip_norm",
    "normalize", "center", "no_center", "covariance_rank",
    "samples_per_class", "seed", "cluster_dim", "tree_depth",
    "branch_threshold", "lloyd_rounds", "variance_floor", "vote_filter",
    "vote_threshold", "vote_oversample", "vote_max_candidates",
    "block_size", "split_bytes", "materialise_blocks")
# What a trigger's params may override (never an operator setting).
TRIGGER_KEYS = ("epsilon",)
# Checks the dataset team's settings against the table of operator-only
# runner options (in dpsynth, where DPSYNTH_PYTHON has it installed).
TRUST_MODULE = "dpsynth.deploy.runner_trust"


def settings(params: dict, environ=os.environ) -> dict:
    """DEFAULTS < Variable dpsynth_config (+ dpsynth_runner) < DAG params,
    then the operator's settings (``operator_settings``) on top, which
    none of those may name."""
    cfg = dict(DEFAULTS)
    stored = Variable.get("dpsynth_config", default={}, deserialize_json=True)
    if not isinstance(stored, dict):
        raise ValueError("Variable dpsynth_config: must be a JSON object")
    given = {k: v for k, v in (params or {}).items() if v not in (None, "")}
    check_dataset_sources(stored, given)
    _refuse_operator_keys("Variable dpsynth_config", stored)
    unknown = set(stored) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"Variable dpsynth_config: unknown keys {sorted(unknown)}"
                         f"; known: {sorted(DEFAULTS)}")
    cfg.update(stored)
    if Variable.get("dpsynth_runner", default=None) not in (None, ""):
        raise ValueError(f"Variable dpsynth_runner: the runner is the "
                         f"operator's setting ({OPERATOR_ENV} runner); "
                         "delete the Variable")
    _refuse_operator_keys("the run's params", given)
    other = sorted(set(given) - set(TRIGGER_KEYS))
    if other:
        raise ValueError(f"the run's params: {other} cannot be set per run "
                         f"(only {list(TRIGGER_KEYS)})")
    cfg.update(given)
    check_extra_args(cfg["extra_args"])
    # the dataset's sizes; "runner_params" becomes the operator's below
    cfg["dataset_runner_params"] = cfg["runner_params"]
    cfg.update(operator_settings(environ))
    check_epsilon(cfg["epsilon"], cfg["epsilon_range"])
    check_input(cfg["input"], cfg["dataset_id"], cfg["inputs"])
    return cfg


def check_dataset_sources(stored: dict, given: dict) -> None:
    """The dataset team's Variable and the run's params may set no
    operator-only runner option (any spelling) and only a bounded delta:
    checked by dpsynth.deploy.runner_trust, the one table of them."""
    runner_params = stored.get("runner_params", {})
    extra = stored.get("extra_args", {})
    sources = {"Variable dpsynth_config": stored,
               "Variable dpsynth_config runner_params": runner_params,
               "Variable dpsynth_config extra_args": extra,
               "the run's params": given}
    proc = subprocess.run([DPSYNTH_PYTHON, "-m", TRUST_MODULE, "check",
                           json.dumps(sources)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or ["no output"]
        raise ValueError(lines[-1])


def _refuse_operator_keys(where: str, given: dict) -> None:
    """One line naming an operator setting the dataset team tried to set
    (``runner_params`` is both's: the dataset's holds sizes only)."""
    for name in sorted(given):
        if str(name) in OPERATOR_DEFAULTS and str(name) not in DEFAULTS:
            raise ValueError(
                f"{where}: {name!r} is the operator's setting ({OPERATOR_ENV} "
                "in the Airflow workers' environment, deploy/README.md); the "
                "dataset's config and a run's params cannot set it")


def operator_settings(environ=os.environ) -> dict:
    """OPERATOR_DEFAULTS < the JSON object in ``DPSYNTH_OPERATOR_CONFIG``
    (read when a task runs, from the workers' environment)."""
    text = environ.get(OPERATOR_ENV, "").strip()
    try:
        given = json.loads(text) if text else {}
    except ValueError:
        given = None
    if not isinstance(given, dict):
        raise ValueError(f"{OPERATOR_ENV}: must be a JSON object")
    unknown = set(given) - set(OPERATOR_DEFAULTS)
    if unknown:
        raise ValueError(f"{OPERATOR_ENV}: unknown keys {sorted(unknown)}; "
                         f"known: {sorted(OPERATOR_DEFAULTS)}")
    out = dict(OPERATOR_DEFAULTS, **given)
    low_high = out["epsilon_range"]
    if not (isinstance(low_high, (list, tuple)) and len(low_high) == 2
            and all(isinstance(v, (int, float)) for v in low_high)
            and 0 < low_high[0] <= low_high[1] < float("inf")):
        raise ValueError(f"{OPERATOR_ENV}: epsilon_range must be [min, max] "
                         f"with 0 < min <= max, got {low_high!r}")
    if out["runner"] not in RUNNERS:
        raise ValueError(f"{OPERATOR_ENV}: runner must be one of {RUNNERS}, "
                         f"got {out['runner']!r}")
    for key in ("runner_params", "beam_options", "inputs"):
        if not isinstance(out[key], dict):
            raise ValueError(f"{OPERATOR_ENV}: {key} must be a JSON object")
    if not all(isinstance(v, str) for v in out["inputs"].values()):
        raise ValueError(f"{OPERATOR_ENV}: inputs must map each dataset id "
                         "to a path prefix (a string)")
    return out


def _path_parts(path: str) -> tuple[str, list[str]]:
    """(scheme, segments) of a path; a local one made absolute with its
    links resolved. A '..' segment is refused: no way out of a prefix."""
    scheme, sep, rest = path.partition("://")
    if not sep:
        scheme, rest = "", os.path.realpath(path)
    segments = rest.split("/")
    if ".." in segments:
        raise ValueError(f"input {path!r}: '..' is not allowed in a "
                         "scheduled run's input")
    return scheme, [s for s in segments if s not in ("", ".")]


def check_input(path: str, dataset_id: str, inputs: dict) -> None:
    """The dataset's input must lie under the prefix the operator pinned
    for its dataset id (``inputs``), so one dataset's records are never
    released or charged under another's id; refused in one line."""
    if dataset_id not in inputs:
        raise ValueError(f"{OPERATOR_ENV} inputs: no input location for "
                         f"dataset {dataset_id!r}: the operator pins one per "
                         "dataset id")
    prefix = inputs[dataset_id]
    if not isinstance(path, str):
        raise ValueError(f"Variable dpsynth_config: input must be a string, "
                         f"got {path!r}")
    if path == "" or prefix == "":
        if path == prefix:  # the embedded demo, pinned as ""
            return
        raise ValueError(f"input {path!r} is not under {prefix!r}, the "
                         f"location {OPERATOR_ENV} inputs pins for dataset "
                         f"{dataset_id!r}")
    scheme, segments = _path_parts(path)
    pinned_scheme, pinned = _path_parts(prefix)
    if scheme != pinned_scheme or segments[:len(pinned)] != pinned:
        raise ValueError(f"input {path!r} is not under {prefix!r}, the "
                         f"location {OPERATOR_ENV} inputs pins for dataset "
                         f"{dataset_id!r}")


def check_epsilon(epsilon: object, allowed: list) -> None:
    """The release's epsilon must lie in the operator's range."""
    low, high = allowed
    if (isinstance(epsilon, bool) or not isinstance(epsilon, (int, float))
            or not low <= epsilon <= high):
        raise ValueError(f"epsilon {epsilon!r} is outside the operator's "
                         f"epsilon_range [{low:g}, {high:g}] "
                         f"({OPERATOR_ENV})")


def check_extra_args(extra: object) -> None:
    """Refuses, in one line naming it, an ``extra_args`` flag that is not in
    EXTRA_ARGS_ALLOWED (``-`` or ``_`` in its name alike)."""
    if not isinstance(extra, dict):
        raise ValueError("dpsynth_config extra_args: must be a JSON object "
                         f"of flags, got {type(extra).__name__}")
    for name in extra:
        if str(name).replace("-", "_") not in EXTRA_ARGS_ALLOWED:
            raise ValueError(
                f"dpsynth_config extra_args: {name!r} is not allowed in a "
                "scheduled run (only flags that print nothing data-dependent "
                "to task logs: see EXTRA_ARGS_ALLOWED in "
                "deploy/airflow/dpsynth_nightly.py)")


def _cap_flags(cfg: dict) -> list[str]:
    """The configured cap: creates the pinned cap of a new dataset; for an
    existing one the check refuses a value above the pinned cap."""
    return ["--lifetime-epsilon", str(cfg["lifetime_epsilon"]),
            "--lifetime-delta", str(cfg["lifetime_delta"])]


def _dpsynth(args: list[str], echo: bool = True) -> subprocess.CompletedProcess:
    """Runs `DPSYNTH_PYTHON -m <args>` (dpsynth as installed there); with
    ``echo``, its output goes to the task log."""
    proc = subprocess.run([DPSYNTH_PYTHON, "-m", *args],
                          capture_output=True, text=True)
    if echo:
        print(proc.stdout)
        print(proc.stderr, file=sys.stderr)
    return proc


def check_budget(cfg: dict, run_id: str) -> str:
    """The pre-flight ``budget_store check``: returns the one line for the
    task log, or raises AirflowFailException (over the cap, or a cap that
    conflicts with the pinned one: retrying cannot help) or RuntimeError.

    The check's report (attempts of this run id, lifetime epsilon spent)
    stays out of the task log: attempt counts can follow from private data
    (a crash on a bad row) and task logs reach more people than the store.
    Every line logged here is fixed text plus public configuration."""
    from airflow.exceptions import AirflowFailException
    store, dataset = cfg["budget_store"], cfg["dataset_id"]
    check = _dpsynth([
        "dpsynth.pipelines.budget.store", "check",
        "--budget-store", store, "--dataset-id", dataset, "--run-id", run_id,
        "--epsilon", str(cfg["epsilon"]), "--delta", str(cfg["delta"]),
        "--num-classes", str(cfg["num_classes"]), *_cap_flags(cfg)],
        echo=False)
    where = (f"details where the store is: python -m "
             f"dpsynth.pipelines.budget.store show --budget-store {store} "
             f"--dataset-id {dataset}")
    if check.returncode == 3:
        raise AirflowFailException(
            f"budget check: run {run_id} refused: one more release would go "
            f"over the cap of dataset {dataset!r}, or the configured cap "
            f"differs from its pinned one; nothing launched ({where})")
    if check.returncode != 0:
        raise RuntimeError(f"budget check failed (exit {check.returncode}) "
                           f"for run {run_id}; {where}")
    return (f"budget check: run {run_id} fits under the lifetime cap of "
            f"dataset {dataset!r}")


# The runner's Beam options, built by dpsynth.deploy.runner_options where dpsynth
# is installed (pure option builders; Airflow's venv has no dpsynth).
def runner_options(cfg: dict) -> list[str]:
    """The Beam options of the operator's runner: its ``runner_params`` and
    ``beam_options``, and the sizes the dataset's ``runner_params`` set
    (checked again there: nothing else passes)."""
    operator = {k: cfg[k] for k in ("runner", "runner_params",
                                    "beam_options")}
    dataset = {"runner_params": cfg.get("dataset_runner_params", {})}
    proc = subprocess.run([DPSYNTH_PYTHON, "-m", TRUST_MODULE, "args",
                           json.dumps(operator), json.dumps(dataset)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or ["no output"]
        raise ValueError(f"runner options of {cfg['runner']}: {lines[-1]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def beam_option_dict(args: list[str]) -> dict:
    """['--a=1', '--flag'] -> {'a': '1', 'flag': True} for the operator."""
    out: dict = {}
    for arg in args:
        name, eq, value = arg[2:].partition("=")
        out[name] = value if eq else True
    return out


def run_plan(cfg: dict, ds: str, runner_args: list[str]) -> dict:
    """What the generate and publish tasks get: the runner's Beam options
    and dpsynth's flags. The operator's settings are set last, so no
    ``extra_args`` or runner option can replace them."""
    run_id = f"{cfg['dataset_id']}-{ds}"
    output = f"{cfg['output_root'].rstrip('/')}/{ds}"
    options = beam_option_dict(runner_args)
    options.pop("runner", None)  # the operator passes --runner itself
    options.update(cfg["extra_args"])
    options.update({
        "output": output, "run_id": run_id,
        "num_classes": cfg["num_classes"],
        "epsilon": cfg["epsilon"], "delta": cfg["delta"],
        "budget_store": cfg["budget_store"],
        "dataset_id": cfg["dataset_id"],
        # Creates the pinned cap on the first run; equal to it after.
        "lifetime_epsilon": cfg["lifetime_epsilon"],
        "lifetime_delta": cfg["lifetime_delta"]})
    if cfg["noise_key_location"]:
        options["noise_key_location"] = cfg["noise_key_location"]
    if cfg["input"]:
        options["input"] = cfg["input"]
    return {"runner": cfg["runner"], "options": options,
            "output": output, "run_id": run_id,
            "output_root": cfg["output_root"],
            "notify_url": cfg["notify_url"]}


with DAG(
    dag_id="dpsynth_nightly",
    description="nightly DP synthetic embedding release under a lifetime "
                "privacy budget",
    schedule="@daily",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,  # releases of one dataset spend one budget in turn
    default_args={"retries": 1, "retry_delay": timedelta(minutes=10)},
    params={
        "epsilon": Param(None, type=["null", "number"],
                         description="within the operator's epsilon_range"),
    },
    tags=["dpsynth", "privacy"],
) as dag:

    @task(multiple_outputs=True)
    def budget_check(params=None, ds=None) -> dict:
        from airflow.exceptions import AirflowFailException
        params = params or {}
        try:
            cfg = settings(params)
            # before the pre-flight: the runner's options are refused or
            # built before anything asks the store
            runner_args = runner_options(cfg)
        except ValueError as err:  # configuration: retrying cannot help
            raise AirflowFailException(str(err)) from None
        run_id = f"{cfg['dataset_id']}-{ds}"
        print(check_budget(cfg, run_id))
        return run_plan(cfg, ds, runner_args)

    plan = budget_check()

    generate = BeamRunPythonPipelineOperator(
        task_id="generate",
        py_file=LAUNCH_MODULE,
        py_options=["-m"],
        py_interpreter=DPSYNTH_PYTHON,
        runner=plan["runner"],
        pipeline_options=plan["options"],
        # The job itself records its spend. A retry reuses the run id: it
        # re-publishes a staged release (no new spend), or, if the crashed
        # attempt had read data, is charged again as a new attempt (and
        # refused if that would exceed the lifetime cap).
        retries=2,
    )

    @task
    def publish_notify(plan: dict) -> dict:
        proc = _dpsynth([
            "dpsynth.deploy.publish", "--output", plan["output"],
            "--run-id", plan["run_id"], "--output-root", plan["output_root"],
            # Only the manifest the store recorded for this run passes.
            "--budget-store", plan["options"]["budget_store"],
            "--dataset-id", plan["options"]["dataset_id"]])
        if proc.returncode != 0:
            raise RuntimeError(f"release check failed: {proc.stderr[-2000:]}")
        summary = json.loads(proc.stdout)
        print(f"dpsynth release {summary['run_id']} published at "
              f"{summary['release']}: {summary['samples_total']} rows, "
              f"epsilon {summary['epsilon_spent']:.4g}")
        if plan["notify_url"]:
            import urllib.request
            request = urllib.request.Request(
                plan["notify_url"], data=json.dumps(summary).encode(),
                headers={"Content-Type": "application/json"})
            urllib.request.urlopen(request, timeout=30).close()
        return summary

    generate >> publish_notify(plan)
