"""SLOW (minutes on first use): the nightly Airflow DAG with real Airflow.

Airflow's dependency pins clash with dpsynth's (TensorFlow, Beam...), so it
lives in its own virtualenv, created here by deploy/airflow/setup_airflow_env.sh
at ``$DPSYNTH_AIRFLOW_VENV`` (default ``$XDG_CACHE_HOME/dpsynth/venv-airflow``,
else ``~/.cache/dpsynth/venv-airflow``: outside the repository) and reused by
later runs (~2-3 min and ~2 GB the first time, announced with one line). If
pip cannot install Airflow, every test here is skipped with pip's message.

The DAG's tasks run dpsynth as a user installs it: from its wheel, in a
fresh venv (tests/wheel_env.py; DPSYNTH_PYTHON), with no checkout on any
path, from a DAGs folder that also holds packages named ``models`` and
``pipelines`` (the DAG's subprocesses start there, so ``python -m`` puts
them first on ``sys.path``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import wheel_env
from tests.conftest import release_dir

REPO = Path(__file__).resolve().parent.parent


def default_venv(env=os.environ) -> Path:
    """Where the Airflow venv lives: $DPSYNTH_AIRFLOW_VENV, else a user cache
    (the same rule as deploy/airflow/setup_airflow_env.sh)."""
    if env.get("DPSYNTH_AIRFLOW_VENV"):
        return Path(env["DPSYNTH_AIRFLOW_VENV"])
    home = env.get("HOME") or os.path.expanduser("~")
    cache = env.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")
    return Path(cache) / "dpsynth" / "venv-airflow"


VENV = default_venv()
SETUP = REPO / "deploy" / "airflow" / "setup_airflow_env.sh"
DAG_CHECK = REPO / "deploy" / "airflow" / "dag_check.py"
DATE = "2026-01-02"


@pytest.fixture(scope="module")
def airflow_venv(request) -> Path:
    if not (VENV / "bin" / "airflow").exists():
        # Past pytest's capture: the first run sits here for minutes.
        capture = request.config.pluginmanager.getplugin("capturemanager")
        with capture.global_and_fixture_disabled():
            print(f"\nbuilding the Airflow test virtualenv in {VENV} (a few "
                  f"minutes, ~2 GB; DPSYNTH_AIRFLOW_VENV moves it)",
                  file=sys.stderr, flush=True)
    # This interpreter builds it (a venv's, pyenv's or the system's), not
    # whichever python3 comes first on PATH.
    proc = subprocess.run(["bash", str(SETUP), str(VENV)], cwd=REPO,
                          capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "PYTHON": sys.executable})
    if proc.returncode != 0:
        reason = (f"Airflow could not be installed into {VENV} by {SETUP}: "
                  f"{(proc.stderr or proc.stdout).strip()[-800:]}")
        print(reason, file=sys.stderr)
        pytest.skip(reason)
    return VENV


@pytest.fixture(scope="module")
def airflow_home(airflow_venv, installed, tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("airflow-home")
    proc = subprocess.run([str(airflow_venv / "bin" / "airflow"), "db",
                           "migrate"], env=_env(home, {}), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return home


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """dpsynth from its wheel in a fresh venv, and a DAGs folder holding
    the DAG file that wheel installed beside a user's own packages."""
    root = tmp_path_factory.mktemp("installed")
    python = wheel_env.make_venv(root / "venv",
                                 wheel_env.built_distributions()[1])
    dag = subprocess.run(
        [str(python), "-c", "import dpsynth.deploy, os; print(os.path.join("
         "os.path.dirname(dpsynth.deploy.__file__), 'airflow', "
         "'dpsynth_nightly.py'))"], env=wheel_env.clean_env(), cwd=root,
        capture_output=True, text=True, check=True).stdout.strip()
    assert dag.startswith(str(root / "venv")), dag
    dags = root / "dags"
    dags.mkdir()
    shutil.copy(dag, dags)
    for name in ("models", "pipelines"):
        (dags / name).mkdir()
        (dags / name / "__init__.py").write_text(
            "raise ImportError('a user package was imported')\n")
    INSTALLED.update(python=str(python), dags=str(dags))
    return INSTALLED


INSTALLED: dict = {}


def _env(home: Path, config: dict, operator: dict = None) -> dict:
    env = {k: v for k, v in wheel_env.clean_env().items()
           if not k.startswith(("AIRFLOW", "VIRTUAL_ENV"))}
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": INSTALLED["dags"],
        "AIRFLOW_VAR_DPSYNTH_CONFIG": json.dumps(config),
        # The operator's settings (store, output root, key, cap) come from
        # the workers' environment, never the dataset's Variable.
        "DPSYNTH_OPERATOR_CONFIG": json.dumps(operator or {}),
        "DPSYNTH_PYTHON": INSTALLED["python"],
    })
    return env


def dag_check(venv: Path, home: Path, config: dict, *args: str,
              operator: dict = None) -> dict:
    proc = subprocess.run(
        [str(venv / "bin" / "python"), str(DAG_CHECK), "--no-retries",
         "--dag-folder", INSTALLED["dags"], *args],
        env=_env(home, config, operator), capture_output=True, text=True,
        timeout=900,
        cwd=INSTALLED["dags"])
    lines = [l for l in proc.stdout.splitlines() if l.startswith("DAG_CHECK ")]
    assert lines, f"no report (rc {proc.returncode}): {proc.stderr[-4000:]}"
    report = json.loads(lines[-1][len("DAG_CHECK "):])
    report["log"] = proc.stdout[-6000:] + proc.stderr[-6000:]
    return report


def _generate_records_budget() -> bool:
    """Has the lead wired budget_store.reserve into `dpsynth generate`?"""
    from dpsynth.pipelines.cli import generate
    flags = {s for a in generate.parser()._actions for s in a.option_strings}
    return "--budget-store" in flags


def test_dagbag_imports_without_errors(airflow_venv, airflow_home, tmp_path):
    report = dag_check(airflow_venv, airflow_home, {})
    assert report["import_errors"] == {}, report["log"]
    assert report["dags"] == ["dpsynth_nightly"]


@pytest.fixture(scope="module")
def nightly(airflow_venv, airflow_home, tmp_path_factory) -> dict:
    """One scheduled date run end to end with DirectRunner on the demo."""
    root = tmp_path_factory.mktemp("nightly")
    operator = {"output_root": str(root / "releases"),
                "budget_store": str(root / "budgets"),
                "dataset_id": "digits-demo", "lifetime_epsilon": 10.0,
                "noise_key_location": str(root / "keys")}
    config = {"epsilon": 1.0}
    report = dag_check(airflow_venv, airflow_home, config, "--run", DATE,
                       operator=operator)
    return {"report": report, "root": root, "config": config,
            "operator": operator}


def test_one_nightly_run_end_to_end(nightly):
    report, root = nightly["report"], nightly["root"]
    assert report["run"]["state"] == "success", report["log"]
    assert report["run"]["tasks"] == {"budget_check": "success",
                                      "generate": "success",
                                      "publish_notify": "success"}
    release = root / "releases" / DATE
    manifest = json.loads((release / "_manifest.json").read_text())
    assert manifest["run_id"] == f"digits-demo-{DATE}"
    assert manifest["privacy"]["target"]["epsilon"] == 1.0
    assert list((release_dir(release) / "data").glob("synthetic-*.tfrecord"))
    latest = json.loads((root / "releases" / "LATEST.json").read_text())
    assert latest["release"] == str(release)
    assert latest["run_id"] == manifest["run_id"]
    # Public files and task logs: nothing from the budget store, no exact
    # row counts (issue 25).
    assert not any(k.startswith("lifetime") for k in latest)
    assert "rows read" not in report["log"]


def test_rerun_of_the_same_date_spends_nothing_twice(nightly, airflow_venv,
                                                     airflow_home):
    if not _generate_records_budget():
        pytest.skip("dpsynth generate has no --budget-store yet (the lead "
                    "wires dpsynth.pipelines.budget.store.reserve into generate)")
    from dpsynth.pipelines.budget import store as budget_store
    root, config = nightly["root"], nightly["config"]
    store = nightly["operator"]["budget_store"]
    first = budget_store.history(store, "digits-demo")
    assert [(e["run_id"], e["status"]) for e in first] == [
        (f"digits-demo-{DATE}", "published")]
    manifest_before = (root / "releases" / DATE / "_manifest.json").read_text()
    again = dag_check(airflow_venv, airflow_home, config, "--run", DATE,
                      operator=nightly["operator"])
    assert again["run"]["state"] == "success", again["log"]
    assert budget_store.history(store, "digits-demo") == first
    assert (root / "releases" / DATE / "_manifest.json").read_text() == \
        manifest_before


def test_exhausted_budget_stops_before_generate(airflow_venv, airflow_home,
                                                tmp_path):
    from dpsynth.dp_ops.ledger import Mechanism
    from dpsynth.pipelines.budget import store as budget_store
    store = str(tmp_path / "budgets")
    # An earlier release already spent almost all of the lifetime cap: the
    # nightly epsilon=1 release cannot fit in the 0.05 that is left.
    budget_store.reserve(store, "digits-demo", "earlier",
                         [Mechanism("class=0/sum", "moments", "class=0", 1.0,
                                    2.0)], 2.0, 1e-5, 100.0, 1e-5)
    cap = budget_store.lifetime_spent(store, "digits-demo", 1e-5) + 0.05
    operator = {"output_root": str(tmp_path / "releases"),
                "budget_store": store, "lifetime_epsilon": cap,
                "noise_key_location": str(tmp_path / "keys")}
    report = dag_check(airflow_venv, airflow_home, {}, "--run", DATE,
                       operator=operator)
    tasks = report["run"]["tasks"]
    assert tasks["budget_check"] == "failed", report["log"]
    assert tasks["generate"] == "upstream_failed"
    assert "over the cap" in report["log"] or "refusing" in report["log"]
    assert not (tmp_path / "releases").exists()


def test_an_unlisted_extra_arg_fails_before_generate(airflow_venv,
                                                     airflow_home, tmp_path):
    """extra_args is an allowlist: --record-timings would put wall times in
    the task log, so the run stops in budget_check, naming the flag."""
    operator = {"output_root": str(tmp_path / "releases"),
                "budget_store": str(tmp_path / "budgets"),
                "noise_key_location": str(tmp_path / "keys")}
    config = {"extra_args": {"record_timings": True}}
    report = dag_check(airflow_venv, airflow_home, config, "--run", DATE,
                       operator=operator)
    tasks = report["run"]["tasks"]
    assert tasks["budget_check"] == "failed", report["log"]
    assert tasks["generate"] == "upstream_failed"
    assert "'record_timings' is not allowed" in report["log"]
    assert not (tmp_path / "releases").exists()
