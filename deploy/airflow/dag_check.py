"""Import the DAGs of deploy/airflow in a DagBag and, optionally, run one.

Runs inside the Airflow virtualenv (deploy/airflow/setup_airflow_env.sh):

    AIRFLOW_HOME=/tmp/af ~/.cache/dpsynth/venv-airflow/bin/airflow db migrate
    AIRFLOW_HOME=/tmp/af DPSYNTH_PYTHON=$(which python3) \\
        ~/.cache/dpsynth/venv-airflow/bin/python deploy/airflow/dag_check.py \\
        --run 2026-01-02 --conf '{"epsilon": 1.0}'

Prints one JSON line: {"import_errors": {...}, "dags": [...], "run":
{"state": ..., "tasks": {task_id: state}}}. ``--no-retries`` sets every
task's retries to 0 so that a failing task fails the test run at once
(``dag.test`` would otherwise wait out the retry delay).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dag-folder",
                   default=os.path.dirname(os.path.abspath(__file__)))
    p.add_argument("--dag-id", default="dpsynth_nightly")
    p.add_argument("--run", metavar="YYYY-MM-DD",
                   help="run the DAG once for this logical date (dag.test)")
    p.add_argument("--conf", default="{}", help="JSON DAG-run conf (params)")
    p.add_argument("--no-retries", action="store_true")
    args = p.parse_args()

    from airflow.models.dagbag import DagBag
    bag = DagBag(dag_folder=args.dag_folder, include_examples=False)
    report: dict = {"import_errors": {k: str(v) for k, v in
                                      bag.import_errors.items()},
                    "dags": sorted(bag.dag_ids)}
    if args.run and not report["import_errors"]:
        dag = bag.get_dag(args.dag_id)
        if args.no_retries:
            for t in dag.tasks:
                t.retries = 0
        logical = datetime.strptime(args.run, "%Y-%m-%d").replace(
            tzinfo=timezone.utc)
        run = dag.test(logical_date=logical, run_conf=json.loads(args.conf))
        report["run"] = {"state": str(run.state), "run_id": run.run_id,
                         "tasks": {ti.task_id: str(ti.state)
                                   for ti in run.get_task_instances()}}
    print("DAG_CHECK " + json.dumps(report))
    return 0 if not report["import_errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
