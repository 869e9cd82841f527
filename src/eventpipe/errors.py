"""Errors every layer shares.

An error carries a stable ``name``, the values involved and, where there is one, the fix,
and the exit code a command ends with because of it (schedulers retry on 75 only).
Destinations and senders classify failures as :class:`TransientError` (retry with backoff)
or :class:`TerminalError` (the event goes to ``failed/`` with the reason); nothing guesses.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from eventpipe.retry import Backoff

T = TypeVar("T")


class EventpipeError(Exception):
    """Base of eventpipe's own errors: a stable name, fields, and what to do next."""

    name = "eventpipe_error"
    exit_code = 1
    """What the command exits with (docs/orchestration.md): 1 unless a subclass says."""

    def __init__(self, message: str, *, fix: str | None = None, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.fields = fields

    def __str__(self) -> str:
        if self.fix:
            return f"{self.message} (fix: {self.fix})"
        return self.message


class ConfigError(EventpipeError):
    """The configuration cannot be used; the message names every wrong key by its path."""

    name = "config_error"
    exit_code = 2  # a retry will not fix it


class TransientError(EventpipeError):
    """A failure that may pass by itself (connection lost, disk full): retry with backoff."""

    name = "transient_error"
    exit_code = 75  # EX_TEMPFAIL: worth retrying


class TerminalError(EventpipeError):
    """A failure that retrying cannot fix: the event goes to failed/ with this reason."""

    name = "terminal_error"
    exit_code = 65  # EX_DATAERR: a retry will not fix it


class QueryError(EventpipeError):
    """``eventpipe query`` refused or failed a statement (it runs one read-only query)."""

    name = "query_error"


class DataDirLockedError(EventpipeError):
    """Another collector already owns this data directory."""

    name = "data_dir_locked"
    exit_code = 75  # another collector holds it: it may stop


def retry_transient(
    call: Callable[[], T],
    *,
    attempts: int | None,
    first_delay: float = 1.0,
    max_delay: float = 60.0,
    sleep: Callable[[float], Any] = time.sleep,
    log: logging.Logger | None = None,
    unless: tuple[type[TransientError], ...] = (),
) -> T:
    """``call()``, again after each TransientError, waiting ``first_delay`` seconds and
    doubling up to ``max_delay``; ``attempts`` in all (None: until it succeeds). The last
    TransientError is raised when the attempts run out; other errors, and the ``unless``
    kinds, at once."""
    backoff = Backoff(first_delay, max_delay, jitter=False)
    attempt = 1
    while True:
        try:
            return call()
        except TransientError as exc:
            if isinstance(exc, unless) or (attempts is not None and attempt >= attempts):
                raise
            delay = backoff.wait() or 0.0  # no deadline: always a wait
            (log or logging.getLogger("eventpipe")).warning(
                "%s; retrying in %.0f s (attempt %d%s)", exc.message, delay, attempt + 1,
                f" of {attempts}" if attempts else "",
            )  # fmt: skip
            sleep(delay)
            attempt += 1


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type when it has none): drivers
    and Spark put queries and stack traces after it."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def redacted(dsn: str) -> str:
    """``host:port/dbname`` of a DSN, for messages: never its password or options."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        parts = conninfo_to_dict(dsn)
    except Exception:  # noqa: BLE001 - an unparseable DSN is shown as nothing of it
        return "(unreadable dsn)"
    host, port, name = (
        parts.get("host", "localhost"),
        parts.get("port", "5432"),
        parts.get("dbname", ""),
    )
    return f"{host}:{port}/{name}"
