"""A collector worker's stop (collector/server.py): Ctrl-C in a terminal reaches a
worker twice over, from the terminal (the whole process group) and as the supervisor's
SIGTERM, in either order. That is one stop, which seals the log; only a second Ctrl-C
stops at once."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from eventpipe.collector.app import Collector
from eventpipe.collector.server import _Server, uvicorn_config
from tests.conftest import make_config


@pytest.mark.parametrize(
    "first", [signal.SIGTERM, signal.SIGINT], ids=["supervisor first", "terminal first"]
)
def test_ctrl_c_and_the_supervisors_sigterm_are_one_stop(tmp_path: Path, first: int) -> None:
    server = _Server(uvicorn_config(Collector(make_config(tmp_path / "data"))))
    second = signal.SIGINT if first == signal.SIGTERM else signal.SIGTERM
    server.handle_exit(first, None)
    server.handle_exit(second, None)
    assert server.should_exit
    assert not server.force_exit  # the lifespan's shutdown runs: segments are sealed
    server.handle_exit(signal.SIGINT, None)  # a second Ctrl-C
    assert server.force_exit


def _stopped_while_it_imports(record: str) -> None:
    """A worker's start, in short: a stop arrives before its handler is in place."""
    import os
    import time

    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)

    def note(what: str) -> None:
        with open(record, "a") as out:
            out.write(what)

    note("still running;")
    signal.signal(signal.SIGTERM, lambda *_: note("stop handled"))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGTERM, signal.SIGINT))


def test_a_stop_sent_before_a_worker_has_its_handler_waits_for_it(tmp_path: Path) -> None:
    import multiprocessing

    from eventpipe.service import start_with_stops_held

    record = tmp_path / "record"
    before = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    process = multiprocessing.get_context("spawn").Process(
        target=_stopped_while_it_imports, args=(str(record),)
    )
    start_with_stops_held(process)
    assert signal.pthread_sigmask(signal.SIG_BLOCK, ()) == before  # the supervisor's own
    process.join(60)
    assert process.exitcode == 0
    assert record.read_text() == "still running;stop handled"
