"""The long-running processes: ``eventpipe run`` (the collector and the pipeline as one
supervised service) and ``eventpipe process`` (the pipeline: batch runs on a period, a
streaming query per stream destination, a graceful stop on SIGTERM).

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
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from eventpipe.config import Config, LoadedConfig
from eventpipe.retry import Backoff

if TYPE_CHECKING:
    from eventpipe.processing.run import RunReport

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
        backoff = Backoff(1.0, 60.0, jitter=False)
        while not self._stop.is_set():
            self._child = subprocess.Popen(self.command)
            log.info("pipeline started (pid %d)", self._child.pid)
            code = self._child.wait()
            if self._stop.is_set():
                return
            delay = backoff.wait() or 0.0  # no deadline: always a wait
            log.error("pipeline exited with %d; restarting in %.0f s", code, delay)
            if self._stop.wait(delay):
                return

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


def process(
    config: Config, *, once: bool, report: Callable[[RunReport], None], idle: Callable[[], None]
) -> None:
    """``eventpipe process``: batch runs every ``processing.batch_period_seconds`` (``once``:
    one, after the streams caught up with the log), beside a streaming query per stream
    destination. ``report`` is given each run's report; ``idle`` is called when there was
    nothing to process."""
    import signal

    from eventpipe.errors import retry_transient
    from eventpipe.processing import shutdown, stream
    from eventpipe.processing.job import process_pending
    from eventpipe.processing.run import PipelineBusyError
    from eventpipe.processing.spark import start_session

    spark = start_session(config.spark.settings)
    # SIGTERM (from `eventpipe run`, or an init system): nothing new starts, loads under
    # way get shutdown_grace_seconds to finish and record their progress (a second
    # SIGTERM, or Ctrl-C: at once). What is cut short resumes with its batch ids.
    grace = config.processing.shutdown_grace_seconds
    signal.signal(signal.SIGTERM, lambda signum, frame: shutdown.request(grace))
    period = config.processing.batch_period_seconds
    pipeline_log = logging.getLogger("eventpipe.processing")
    # Stream destinations: one streaming query each, beside the batch runs (--once: up to
    # what the log holds now, then the batch run).
    streams = stream.StreamSupervisor(spark, config)
    try:
        if once:
            stream.run_once(spark, config)
        else:
            streams.start()
        while True:
            try:
                # A destination that is down stops alone: the others load, and it tries
                # again after 1 s, 2 s, 4 s... up to the batch period (--once: 3 tries).
                reports = retry_transient(
                    lambda: process_pending(config, spark), attempts=3 if once else None,
                    max_delay=max(period, 1.0), log=pipeline_log, unless=(PipelineBusyError,),
                    sleep=shutdown.pause,
                )  # fmt: skip
            except PipelineBusyError as exc:
                if once:
                    raise
                pipeline_log.warning("%s; next try later", exc)
                shutdown.pause(period)
                continue
            if not reports:
                idle()
            for one in reports:
                report(one)
            if once or shutdown.wait(period):
                return
    finally:
        streams.stop()
        spark.stop()
