"""Operator logs: one line per event of note, as text or JSON objects."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import orjson
import pytest

from eventpipe.config import LoggingConfig
from eventpipe.logsetup import configure_logging


@pytest.fixture(autouse=True)
def _restore_loggers() -> Iterator[None]:
    names = ("eventpipe", "uvicorn.error", "uvicorn.access")
    saved = {
        n: (
            logging.getLogger(n).handlers[:],
            logging.getLogger(n).level,
            logging.getLogger(n).propagate,
            logging.getLogger(n).disabled,
        )
        for n in names
    }
    yield
    for name, (handlers, level, propagate, disabled) in saved.items():
        logger = logging.getLogger(name)
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate
        logger.disabled = disabled


def test_json_logs_are_one_object_per_line_with_extra_fields(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging(LoggingConfig(format="json", level="info"))
    log = logging.getLogger("eventpipe.test")
    log.info("sealed %s", "seg.log", extra={"bytes": 12})
    log.debug("not shown at info")
    [line] = capsys.readouterr().err.splitlines()
    record = orjson.loads(line)
    assert record["message"] == "sealed seg.log"
    assert record["level"] == "info"
    assert record["logger"] == "eventpipe.test"
    assert record["bytes"] == 12
    assert record["time"].endswith("Z")


def test_text_logs_read_as_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(LoggingConfig(format="text", level="warning"))
    logging.getLogger("eventpipe.test").warning("backpressure on")
    [line] = capsys.readouterr().err.splitlines()
    assert line.endswith("WARNING eventpipe.test: backpressure on")
