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
    root = logging.getLogger()
    root_handlers = root.handlers[:]
    yield
    root.handlers[:] = root_handlers
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


def test_a_library_logging_on_the_root_logger_is_written_as_eventpipe_writes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging(LoggingConfig(format="json", level="info"))
    configure_logging(LoggingConfig(format="json", level="info"))  # again: one handler
    logging.getLogger("somelibrary").info("a library's own detail")
    logging.error("Exception while sending command.")  # as Py4J reports a lost JVM
    [line] = capsys.readouterr().err.splitlines()
    record = orjson.loads(line)
    assert (record["logger"], record["level"]) == ("root", "error")
    assert record["message"] == "Exception while sending command."


def test_py4j_reporting_a_stop_asked_for_writes_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging(LoggingConfig(format="text", level="info"))
    try:
        raise KeyboardInterrupt  # a second SIGTERM, or Ctrl-C, during a call into the JVM
    except KeyboardInterrupt:
        logging.exception("KeyboardInterrupt while sending command.")  # Py4J's own words
    logging.getLogger("eventpipe.processing").warning("second stop signal: stopping now")
    [line] = capsys.readouterr().err.splitlines()
    assert line.endswith("WARNING eventpipe.processing: second stop signal: stopping now")
