"""`eventpipe run` keeps its child commands running: a child that fails is started
again; one that Ctrl-C stopped (with the whole terminal's process group) is not, and
is no error."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import pytest

from eventpipe.service import Supervisor


def _supervisor(tmp_path: Path, code: str) -> tuple[Supervisor, Path]:
    starts = tmp_path / "starts"
    supervisor = Supervisor("pipeline", ["process"], None, grace_seconds=5)
    supervisor.command = [sys.executable, "-c", f"open({str(starts)!r}, 'a').write('x')\n{code}"]
    return supervisor, starts


@pytest.mark.parametrize(
    "code", ["raise SystemExit(130)", "import os, signal; os.kill(os.getpid(), signal.SIGINT)"]
)
def test_a_child_stopped_by_ctrl_c_is_not_restarted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, code: str
) -> None:
    supervisor, starts = _supervisor(tmp_path, code)
    with caplog.at_level(logging.INFO, logger="eventpipe.service"):
        supervisor.start()
        supervisor._thread.join(10)
    assert not supervisor._thread.is_alive()
    assert starts.read_text() == "x"
    assert [r.levelname for r in caplog.records] == ["INFO", "INFO"]
    assert "stopped by Ctrl-C" in caplog.records[-1].getMessage()
    supervisor.stop()


def test_a_child_that_fails_is_started_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    supervisor, starts = _supervisor(tmp_path, "raise SystemExit(1)")
    with caplog.at_level(logging.INFO, logger="eventpipe.service"):
        supervisor.start()
        deadline = time.monotonic() + 10
        while not (starts.exists() and len(starts.read_text()) >= 2):
            assert time.monotonic() < deadline, "it was not started again"
            time.sleep(0.05)
        supervisor.stop()
    assert any("exited with 1; restarting" in r.getMessage() for r in caplog.records)
