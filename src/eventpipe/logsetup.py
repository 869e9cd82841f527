"""Operator logs on stderr: one line per event of note, as text or as JSON objects."""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any

import orjson

from eventpipe.config import LoggingConfig

# Attributes every LogRecord has; anything else was passed with `extra=` and is a field.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


def _timestamp(record: logging.LogRecord) -> str:
    when = datetime.fromtimestamp(record.created, UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record)} {record.levelname:<7} {record.name}: {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "time": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD:
                payload[key] = value
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(payload, default=str).decode()


class _NotOurInterrupt(logging.Filter):
    """Drops Py4J's report of a call into the JVM cut short by KeyboardInterrupt: in
    eventpipe that is a stop asked for (Ctrl-C, a second SIGTERM), which the pipeline
    says in a line of its own; Py4J logged it with a traceback, on the root logger."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            record.name == "root" and record.msg == "KeyboardInterrupt while sending command."
        )


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to ``sys.stderr`` as it is when a record comes (as Python's own last-resort
    handler does), not as it was when logging was configured: the root logger's handler
    outlives a command run in process (the tests' CLI runner) and its captured stream."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


_FORMATTERS = (TextFormatter, JsonFormatter)
"""What eventpipe's handlers format with (a handler of the root logger with one is ours:
replaced when logging is configured again, as CLI commands run in one process do)."""


def configure_logging(settings: LoggingConfig) -> None:
    """Send eventpipe's and uvicorn's logs to stderr in the configured format, and the
    warnings and errors of libraries that log without handlers of their own (Py4J logs
    on the root logger) in the same format, not as Python's bare ``ERROR:root:`` lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if settings.format == "json" else TextFormatter())
    level = getattr(logging, settings.level.upper())
    for name in ("eventpipe", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(level)
        logger.propagate = False
    others = _Stderr()
    others.setFormatter(handler.formatter)
    others.setLevel(max(level, logging.WARNING))  # a library's own info is not eventpipe's
    others.addFilter(_NotOurInterrupt())
    root = logging.getLogger()
    root.handlers[:] = [h for h in root.handlers if not isinstance(h.formatter, _FORMATTERS)]
    root.addHandler(others)
    # uvicorn's notes on each worker's start and stop ("Waiting for application
    # startup"...): seven lines per worker that eventpipe's own start and stop lines say
    # in one. Its warnings and errors stay; at debug level, everything.
    if level > logging.DEBUG:
        logging.getLogger("uvicorn.error").setLevel(max(level, logging.WARNING))
    # One line per request would be most of the output at thousands of requests a second;
    # /metrics counts requests by status instead.
    logging.getLogger("uvicorn.access").disabled = True
