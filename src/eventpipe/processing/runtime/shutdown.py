"""A graceful stop of the pipeline process (SIGTERM).

``request(grace)`` is called from the signal handler: from then on no new work starts
(a run, a destination, a table's load, a part of a load, an HTTP send attempt: each
calls ``check`` first and raises StopRequested), while what is under way finishes and
records its progress. After ``grace`` seconds the process exits anyway (status 143, as
killed by SIGTERM), whatever it waits for (a load may be blocked in a database driver,
in a thread that cannot be interrupted); a second SIGTERM interrupts the main thread at
once. Whatever was cut short is resumed by the next run, with its batch ids: nothing
loads twice (the same as after a kill -9, which the fault suite tests).
"""

from __future__ import annotations

import logging
import os
import sys
import threading

log = logging.getLogger("eventpipe.processing")

_requested = threading.Event()


class StopRequested(KeyboardInterrupt):
    """The process is stopping: no new work starts (a KeyboardInterrupt, so that it
    stops a run wherever it is raised, as Ctrl-C does)."""


def request(grace: float) -> None:
    """Stop gracefully: work under way gets ``grace`` seconds to finish."""
    if _requested.is_set():
        log.warning("second stop signal: stopping now")
        raise KeyboardInterrupt
    _requested.set()
    log.warning("stopping: loads under way get up to %.0f s to finish", grace)
    timer = threading.Timer(grace, _interrupt, args=(grace,))
    timer.daemon = True
    timer.start()


EXIT_STATUS = 143
"""128 + SIGTERM: what a shell reports for a process SIGTERM ended."""


def _interrupt(grace: float) -> None:
    log.warning("still busy after %.0f s: exiting; the run resumes next time", grace)
    for handler in logging.getLogger().handlers + logging.getLogger("eventpipe").handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_STATUS)


def requested() -> bool:
    return _requested.is_set()


def check(before: str) -> None:
    """Raise StopRequested if the process is stopping (``before``: the work not begun)."""
    if _requested.is_set():
        raise StopRequested(f"stopping before {before}")


def wait(seconds: float) -> bool:
    """Sleep up to ``seconds``; True at once if the process is stopping."""
    return _requested.wait(seconds)


def pause(seconds: float) -> None:
    """Sleep ``seconds`` between tries; StopRequested at once if the process stops."""
    if _requested.wait(seconds):
        raise StopRequested("stopping instead of trying again")


def reset() -> None:
    """Forget a stop request (tests run several pipelines in one process)."""
    _requested.clear()
