"""Runs DAGs of a dags/ folder for logical dates in one process, as ``airflow dags test``
does for one (``DAG.test``, the same call), and prints each run's task states as JSON:
one Airflow start for several runs. Run with Airflow's environment (AIRFLOW_HOME...).

    python dag_runner.py [--migrate] DAG_ID=DATE [DAG_ID=DATE ...]
"""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime


def main(arguments: list[str]) -> None:
    from airflow.models.dagbag import DagBag

    if arguments[:1] == ["--migrate"]:
        from airflow.utils.db import upgradedb

        upgradedb()
        arguments = arguments[1:]
    bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    assert not bag.import_errors, bag.import_errors
    results = []
    for argument in arguments:
        dag_id, date = argument.split("=", 1)
        logical = datetime.fromisoformat(date)
        if logical.tzinfo is None:
            logical = logical.replace(tzinfo=UTC)
        run = bag.get_dag(dag_id).test(logical_date=logical)
        states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
        results.append({"dag": dag_id, "date": date, "states": states})
    print("RESULTS " + json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1:])
