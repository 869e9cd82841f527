"""``eventpipe run``: the collector and the batch pipeline as one supervised service.

The collector serves HTTP in this process; the pipeline (``eventpipe process``) runs in a
child process, so that the collector never waits on Spark and a Spark failure cannot take
ingest down. The child is restarted with exponential backoff (1 s doubling to 60 s) if it
exits; on SIGTERM/Ctrl-C the collector stops first (finishing requests, sealing), then the
child gets SIGTERM (its loads under way get ``processing.shutdown_grace_seconds`` to finish)
and that grace plus 15 s before SIGKILL.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
from pathlib import Path

from eventpipe.config import LoadedConfig

log = logging.getLogger("eventpipe.service")

SPARK_STOP_SECONDS = 15.0
"""How long the pipeline may take to stop its Spark session after its loads."""


class PipelineSupervisor:
    """Keeps one ``eventpipe process`` child running until stopped."""

    def __init__(self, config_path: Path | None, grace_seconds: float) -> None:
        self.command = [sys.executable, "-m", "eventpipe.cli", "process"]
        if config_path is not None:
            self.command += ["-c", str(config_path)]
        self.grace_seconds = grace_seconds
        self._stop = threading.Event()
        self._child: subprocess.Popen[bytes] | None = None
        self._thread = threading.Thread(target=self._supervise, name="pipeline", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _supervise(self) -> None:
        backoff = 1.0
        while not self._stop.is_set():
            self._child = subprocess.Popen(self.command)
            log.info("pipeline started (pid %d)", self._child.pid)
            code = self._child.wait()
            if self._stop.is_set():
                return
            log.error("pipeline exited with %d; restarting in %.0f s", code, backoff)
            if self._stop.wait(backoff):
                return
            backoff = min(backoff * 2, 60.0)

    def stop(self) -> None:
        self._stop.set()
        child = self._child
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(self.grace_seconds)
            except subprocess.TimeoutExpired:
                log.warning("pipeline did not stop within %.0f s; killing it", self.grace_seconds)
                child.kill()
                child.wait()
        self._thread.join(timeout=5)


def run(loaded: LoadedConfig, config_path: Path | None) -> None:
    """Serve the collector and supervise the pipeline until SIGTERM/Ctrl-C."""
    from eventpipe.collector.server import serve

    # The pipeline's own grace for its loads, and time to stop Spark after them.
    grace = loaded.config.processing.shutdown_grace_seconds + SPARK_STOP_SECONDS
    supervisor = PipelineSupervisor(config_path, grace)
    supervisor.start()
    try:
        serve(loaded)
    finally:
        supervisor.stop()
