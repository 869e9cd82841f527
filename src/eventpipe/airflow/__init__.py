"""eventpipe in Apache Airflow (``pip install eventpipe[airflow]``; docs/orchestration.md).

Operators that run eventpipe's commands in the worker, as a scheduler expects of them:
their fields templated (``{{ ds }}``), secrets from Airflow connections, the command's
output in the task's log, and its exit code read (docs/orchestration.md): done is
success, nothing to do is *skipped*, a transient failure is retried (the task's
``retries``), a configuration or data error fails without a retry. eventpipe's state
store, not Airflow's database, is the record of what was done: a task run twice, or
after Airflow's database was dropped, does nothing twice.
"""

from eventpipe.airflow.operators import (
    EventpipeOperator,
    EventpipeProcessOperator,
    EventpipeReplayFailedOperator,
    EventpipeReprocessOperator,
    EventpipeVerifyOperator,
)

__all__ = [
    "EventpipeOperator",
    "EventpipeProcessOperator",
    "EventpipeReplayFailedOperator",
    "EventpipeReprocessOperator",
    "EventpipeVerifyOperator",
]
