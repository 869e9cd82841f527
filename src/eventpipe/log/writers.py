"""The writers of the log: who they are, and whether they are alive.

Every collector process is a writer. Its id (``server.writer_id``, by default this
host's name, then ``-<worker number>``) is in the name of every file it writes, so that
processes on one host and hosts sharing one data directory never write the same file.
A writer holds ``incoming/writer.w=<id>.lock`` (its pid and host inside) while it runs
and touches it every few seconds: the file's modification time is its heartbeat.

A writer is alive when:

* it runs on this host: it holds its lock (``flock``, which the kernel drops however the
  process dies: a dead local writer is known at once);
* it runs on another host: its heartbeat is younger than ``writer_timeout_seconds``
  (``flock`` over a network file system is not to be trusted, so a remote writer is
  judged by time only).

A writer that is not alive is recovered (its active segments cut at their last whole
line and sealed) by the next process that starts with its id, by the pipeline before
each run, and by ``eventpipe rotate`` (log/segments.py ``recover_dead``). A recovered
writer's lock names the process that recovered it; a writer that finds its lock names
another process (it was paused longer than the timeout, and taken for dead) stops
accepting events, since what it appended could land in a segment already read.
"""

from __future__ import annotations

import os
import re
import socket
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from eventpipe import locks
from eventpipe.paths import DataLayout

if TYPE_CHECKING:
    from eventpipe.log.settings import LogSettings

HOST = socket.gethostname()
"""This host's name, as writers' lock files record it."""
PIPELINE_WRITER = "pipeline"
"""The name the pipeline writes its own failed/ records of the log under (lines of a
segment that are not JSON): one pipeline runs at a time, so it is a writer too. No
collector's id is this (theirs end in a worker number)."""


class TakenOverError(Exception):
    """This writer's lock names another process: it was taken for dead."""


def host_id() -> str:
    """This host's name as the start of a writer id (letters, digits, ``_``, ``-``)."""
    cleaned = re.sub(r"[^A-Za-z0-9_-]+", "-", HOST.split(".")[0]).strip("-_")
    return cleaned[:56] or "host"


def host_writer(worker: int, base: str | None = None) -> str:
    """The id of worker ``worker`` (from 0) of a collector whose writer id is ``base``
    (default: this host's name)."""
    return f"{base or host_id()}-{worker}"


def lock_details() -> str:
    """What a writer writes in its lock after its pid: the host."""
    return f"{HOST}\n"


def heartbeat_seconds(settings: LogSettings) -> float:
    return min(5.0, settings.writer_timeout_seconds / 10)


def heartbeat(layout: DataLayout, writer: str) -> None:
    """Touch ``writer``'s lock; TakenOverError when the lock names another process."""
    path = layout.writer_lock(writer)
    pid, host = locks.read(path)
    if pid != os.getpid() or host != HOST:
        raise TakenOverError(
            f"writer {writer}'s lock names pid {pid} on {host or '?'}: it was taken for dead "
            "(no heartbeat for writer_timeout_seconds)"
        )
    os.utime(path)


@dataclass(frozen=True)
class WriterState:
    id: str
    pid: int | None
    host: str
    heartbeat_age: float
    """Seconds since the writer last touched its lock."""
    alive: bool


def state(layout: DataLayout, writer: str, timeout: float, now: float | None = None) -> WriterState:
    """Whether ``writer`` is alive (see the module's docstring), with what its lock says."""
    path = layout.writer_lock(writer)
    pid, host = locks.read(path)
    try:
        age = (time.time() if now is None else now) - path.stat().st_mtime
    except FileNotFoundError:
        return WriterState(writer, None, "", float("inf"), alive=False)
    alive = locks.is_held(path) if host in ("", HOST) else age < timeout
    return WriterState(writer, pid, host, max(0.0, age), alive)


def states(layout: DataLayout, timeout: float) -> list[WriterState]:
    """Every writer that has written to this data directory."""
    now = time.time()
    return [state(layout, writer, timeout, now) for writer in layout.writers()]
