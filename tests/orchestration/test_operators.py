"""The operators read eventpipe's exit codes as a scheduler should: done is success,
nothing to do is skipped, a transient failure raises what Airflow retries, a
configuration or data error fails without a retry; the command's output is the task's
log, and connections become environment variables."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from eventpipe.airflow import EventpipeProcessOperator, EventpipeReprocessOperator


def _fake(tmp_path: Path, code: int) -> str:
    """An ``eventpipe`` that prints its arguments and an environment variable, then
    exits with ``code``."""
    script = tmp_path / f"eventpipe-{code}"
    script.write_text(f'#!/bin/sh\necho "args: $*"\necho "dsn: $WAREHOUSE_DSN"\nexit {code}\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


@pytest.mark.parametrize(
    ("code", "raised"),
    [(0, None), (99, AirflowSkipException), (75, AirflowException), (1, AirflowException),
     (2, AirflowFailException), (65, AirflowFailException)],
)  # fmt: skip
def test_exit_codes_become_task_states(tmp_path: Path, code: int, raised: Any) -> None:
    task = EventpipeProcessOperator(task_id="process", executable=_fake(tmp_path, code),
                                    config="/etc/eventpipe.yaml")  # fmt: skip
    if raised is None:
        output = task.execute({})  # type: ignore[arg-type]
        assert "args: process --once -c /etc/eventpipe.yaml --idle-exit-code 99" in output
        return
    with pytest.raises(raised) as failed:
        task.execute({})  # type: ignore[arg-type]
    # The retried failure is AirflowException itself; the others are its subclasses.
    assert (type(failed.value) is AirflowException) == (code in (75, 1))
    assert "dsn:" in str(failed.value) or "nothing to do" in str(failed.value)


def test_connections_become_the_variables_the_config_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_WAREHOUSE", "postgresql://user:secret@db:5432/dw")
    task = EventpipeReprocessOperator(task_id="reprocess", executable=_fake(tmp_path, 0),
                                      day="2026-11-21", destinations=["dw"],
                                      connections={"WAREHOUSE_DSN": "warehouse"})  # fmt: skip
    output = task.execute({})  # type: ignore[arg-type]
    assert "args: reprocess --from 2026-11-21 --to 2026-11-21 --destination dw" in output
    assert "dsn: postgres://user:secret@db:5432/dw" in output  # Airflow's URI of it
