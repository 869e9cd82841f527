"""`eventpipe run` keeps its child commands running: a child that fails is started
again; one that Ctrl-C stopped (with the whole terminal's process group) is not, and
is no error."""

from __future__ import annotations

import logging
import os
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


def test_a_start_removes_only_the_metrics_directories_of_this_hosts_dead_supervisors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket
    import subprocess
    import tempfile

    from eventpipe.service import _metrics_directory

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that no process has now
    host = socket.gethostname()
    names = {
        "dead": f"eventpipe-metrics-{dead.pid}@{host}-abc",
        "alive": f"eventpipe-metrics-{os.getpid()}@{host}-abc",
        "elsewhere": f"eventpipe-metrics-{dead.pid}@not-{host}-abc",
        "unnamed": "eventpipe-metrics-x1y2z3",
    }
    for name in names.values():
        (tmp_path / name).mkdir()
        (tmp_path / name / "counter_1.db").write_bytes(b"x")

    made = Path(_metrics_directory())

    left = {path.name for path in tmp_path.iterdir()}
    assert left == {names["alive"], names["elsewhere"], names["unnamed"], made.name}
    assert made.name.startswith(f"eventpipe-metrics-{os.getpid()}@{host}-")
