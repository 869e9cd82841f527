"""eventpipe's example DAGs (docs/orchestration.md): copy this file into Airflow's
``dags/`` folder, or point ``EVENTPIPE_CONFIG`` at the configuration and keep it as is.

* ``eventpipe_hourly``: ``process --once`` every hour: the sealed segments into every
  batch destination (skipped when there are none).
* ``eventpipe_daily``: for each day (the run's logical date, ``{{ ds }}``), the archive
  verified, then the day reprocessed where the code version (mappings, transforms,
  lookups...) changed since it was built. ``airflow backfill create --dag-id
  eventpipe_daily --from-date A --to-date B`` (or ``airflow dags test eventpipe_daily
  DAY`` per day) rebuilds exactly the days of the range that need it; running a day again,
  or after Airflow's database was dropped, rebuilds nothing twice.

Secrets stay in Airflow: a connection per DSN, passed to eventpipe as an environment
variable its configuration names (``dsn: ${WAREHOUSE_DSN}``); set
``EVENTPIPE_CONNECTIONS`` to ``WAREHOUSE_DSN=warehouse_conn_id,...``.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG

from eventpipe.airflow import (
    EventpipeProcessOperator,
    EventpipeReprocessOperator,
    EventpipeVerifyOperator,
)

CONFIG = os.environ.get("EVENTPIPE_CONFIG", "eventpipe.yaml")
EXECUTABLE = os.environ.get("EVENTPIPE_EXECUTABLE", "eventpipe")
CONNECTIONS = dict(
    pair.split("=", 1) for pair in os.environ.get("EVENTPIPE_CONNECTIONS", "").split(",") if pair
)
START = datetime.fromisoformat(os.environ.get("EVENTPIPE_START", "2026-11-01"))
DEFAULTS = {
    "retries": 3,  # transient failures (exit 75) only: a config or data error fails at once
    "retry_delay": timedelta(minutes=2),
    "retry_exponential_backoff": True,
}
COMMON: dict[str, Any] = {"config": CONFIG, "executable": EXECUTABLE, "connections": CONNECTIONS}

with DAG(
    "eventpipe_hourly",
    schedule="@hourly",
    start_date=START,
    catchup=False,  # each run processes all that is sealed: no need to run the past hours
    max_active_runs=1,  # eventpipe takes one pipeline per data directory anyway
    default_args=DEFAULTS,
    tags=["eventpipe"],
):
    EventpipeProcessOperator(task_id="process", **COMMON)

with DAG(
    "eventpipe_daily",
    schedule="@daily",
    start_date=START,
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULTS,
    tags=["eventpipe"],
):
    verify = EventpipeVerifyOperator(task_id="verify_archive", **COMMON)
    reprocess = EventpipeReprocessOperator(task_id="reprocess_day", day="{{ ds }}", **COMMON)
    verify >> reprocess
