"""The operators: one eventpipe command each, run as a child process of the task.

Why a child process rather than eventpipe's functions in the task's own process: the
job holds a Spark session (a JVM) and signal handlers for a graceful stop, which belong
to a process of their own, and a worker's Python then needs none of eventpipe's
dependencies but the ``eventpipe`` command (``executable``: a path, such as a virtual
environment's). Killing the task (a timeout, a user) sends SIGTERM to the command, which
stops as ``eventpipe process`` does: what it had loaded stays recorded, and the retry
goes on from there.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseHook, BaseOperator, Context
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from eventpipe.errors import ConfigError, TerminalError

DONE, IDLE = 0, 99
"""Done; and what the operators ask for when there was nothing to do (``--idle-exit-code
99``). The failures' codes are the errors' own (docs/orchestration.md)."""
NO_RETRY = (ConfigError.exit_code, TerminalError.exit_code)
"""A configuration or data error: a retry would fail the same way."""


class EventpipeOperator(BaseOperator):
    """Run ``eventpipe <arguments> -c <config>``.

    ``config``: the configuration file (default: ``EVENTPIPE_CONFIG`` of the worker, else
    ``./eventpipe.yaml``). ``connections``: environment variables the command gets from
    Airflow connections, ``{"WAREHOUSE_DSN": "warehouse"}``: the connection's URI, which
    the configuration names as ``${WAREHOUSE_DSN}`` (secrets stay in Airflow). ``env``:
    more environment variables. ``executable``: the ``eventpipe`` command to run.
    ``arguments``, ``config`` and ``env`` are templated.
    """

    template_fields: Sequence[str] = ("arguments", "config", "env")
    ui_color = "#d9ecf2"

    def __init__(
        self,
        *,
        arguments: Sequence[str],
        config: str | None = None,
        connections: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
        executable: str = "eventpipe",
        idle: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.arguments = list(arguments)
        self.config = config
        self.connections = dict(connections or {})
        self.env = dict(env or {})
        self.executable = executable
        self.idle = idle
        self._child: subprocess.Popen[str] | None = None

    def command(self) -> list[str]:
        command = [self.executable, *self.arguments]
        if self.config:
            command += ["-c", self.config]
        if self.idle:
            command += ["--idle-exit-code", str(IDLE)]
        return command

    def execute(self, context: Context) -> str:
        environment = {**os.environ, **self.env}
        for variable, conn_id in self.connections.items():
            environment[variable] = BaseHook.get_connection(conn_id).get_uri()
        command = self.command()
        self.log.info("running %s", " ".join(command))
        lines: list[str] = []
        with subprocess.Popen(
            command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, bufsize=1,
        ) as self._child:  # fmt: skip
            assert self._child.stdout is not None
            for line in self._child.stdout:
                lines.append(line.rstrip("\n"))
                self.log.info("%s", lines[-1])
            code = self._child.wait()
        last = next((line for line in reversed(lines) if line.strip()), "")
        if code == DONE:
            return "\n".join(lines[-20:])
        if code == IDLE and self.idle:
            raise AirflowSkipException(f"nothing to do: {last}")
        if code in NO_RETRY:
            raise AirflowFailException(f"eventpipe exited with {code}: {last}")
        raise AirflowException(f"eventpipe exited with {code}: {last}")  # retried

    def on_kill(self) -> None:
        if self._child is not None and self._child.poll() is None:
            self._child.send_signal(signal.SIGTERM)


class EventpipeProcessOperator(EventpipeOperator):
    """``eventpipe process --once``: every sealed segment not yet processed, into every
    batch destination (first the runs that did not finish). Skipped when there is none."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(arguments=["process", "--once"], **kwargs)


class EventpipeReprocessOperator(EventpipeOperator):
    """``eventpipe reprocess`` of the days ``day`` to ``last_day`` (templated; default
    the run's logical day, ``{{ ds }}``): each day whose rows were built with another
    code version, or whose archive changed, is rebuilt in one transaction; one up to date
    is left alone, so the same task run twice rebuilds nothing twice, and a backfill over
    a range rebuilds exactly those days. Skipped when no day needed it."""

    template_fields: Sequence[str] = (*EventpipeOperator.template_fields, "day", "last_day")

    def __init__(
        self,
        *,
        day: str = "{{ ds }}",
        last_day: str | None = None,
        destinations: Sequence[str] = (),
        force: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(arguments=[], **kwargs)
        self.day = day
        self.last_day = last_day
        self.destinations = list(destinations)
        self.force = force

    def command(self) -> list[str]:
        self.arguments = ["reprocess", "--from", self.day, "--to", self.last_day or self.day]
        for destination in self.destinations:
            self.arguments += ["--destination", destination]
        if self.force:
            self.arguments.append("--force")
        return super().command()


class EventpipeVerifyOperator(EventpipeOperator):
    """``eventpipe archive verify``: every archived file against its manifest and index;
    fails (without a retry) when one does not match."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(arguments=["archive", "verify"], idle=False, **kwargs)


class EventpipeReplayFailedOperator(EventpipeOperator):
    """``eventpipe replay failed --destination D``: the destination's failed events sent
    through the pipeline again. Skipped when there are none."""

    template_fields: Sequence[str] = (*EventpipeOperator.template_fields, "destination")

    def __init__(self, *, destination: str, **kwargs: Any) -> None:
        super().__init__(arguments=[], **kwargs)
        self.destination = destination

    def command(self) -> list[str]:
        self.arguments = ["replay", "failed", "--destination", self.destination]
        return super().command()
