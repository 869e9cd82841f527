"""The long-running processes: ``eventpipe collect`` (the collector: one process, or
``server.workers`` supervised processes sharing the port), ``eventpipe run`` (the
collector and the pipeline as one supervised service) and ``eventpipe process`` (the
pipeline: batch runs on a period, a streaming query per stream destination, a graceful
stop on SIGTERM).

Collector workers are child processes (spawned: nothing of this process's state is
shared); each is a writer of the log (``<writer_id>-<n>``) on a socket of its own in the
port's ``SO_REUSEPORT`` group. This process holds the port (bound, not listening), passes
SIGUSR1 on, restarts a worker that exits (1 s doubling to 60 s), and on SIGTERM/Ctrl-C
stops them all. A worker gets SIGTERM if this process dies (``PR_SET_PDEATHSIG``), so
none is left serving alone. Their metrics are summed per host (prometheus_client's
multiprocess mode, in a directory of this process's under the temporary directory,
named for its pid and host: a collector that was killed could not remove its own, so
each start removes those of this host's supervisors no longer running).

The collector serves HTTP in this process; the pipeline (``eventpipe process``) runs in
a child process, so that the collector never waits on Spark and a Spark failure cannot
take ingest down, and so does each configured source's reader (``eventpipe read ID``).
A child is restarted with exponential backoff (1 s doubling to 60 s) if it exits; on
SIGTERM/Ctrl-C the collector stops first (finishing requests, sealing), then the
children get SIGTERM: the pipeline's loads under way get
``processing.shutdown_grace_seconds`` to finish, and that grace plus 15 s before
SIGKILL; a reader gets 30 s.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eventpipe.config import Config, LoadedConfig
from eventpipe.errors import EventpipeError
from eventpipe.logsetup import configure_logging
from eventpipe.retry import Backoff

if TYPE_CHECKING:
    from eventpipe.processing.batch.run import RunReport

log = logging.getLogger("eventpipe.service")

SPARK_STOP_SECONDS = 15.0
"""How long the pipeline may take to stop its Spark session after its loads."""
RELEASED_EXIT = 4
"""The exit code of ``eventpipe process --release-when-idle`` that stopped because it had
nothing to do (processing.release_idle_seconds): its supervisor starts it again when a
segment is sealed, not as a crash."""
CONSOLE_STOP_SECONDS = 5.0
"""How long the console may take to stop (it holds nothing but open pages)."""
READER_STOP_SECONDS = 30.0
"""How long a source's reader may take to finish the read under way (it resumes from its
slot if killed: nothing is lost)."""


class Supervisor:
    """Keeps one eventpipe child command running until stopped: the pipeline
    (``process``), a source's reader (``read ID``)."""

    def __init__(
        self,
        name: str,
        arguments: list[str],
        config_path: Path | None,
        grace_seconds: float,
        *,
        wake: Callable[[], bool] | None = None,
    ) -> None:
        """``wake``: after the child exits with RELEASED_EXIT, whether there is work for
        it again (asked every second)."""
        self.name = name
        self.wake = wake
        self.command = [sys.executable, "-m", "eventpipe.cli", *arguments]
        if config_path is not None:
            self.command += ["-c", str(config_path)]
        self.grace_seconds = grace_seconds
        self._stop = threading.Event()
        self._child: subprocess.Popen[bytes] | None = None
        self._thread = threading.Thread(target=self._supervise, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _supervise(self) -> None:
        backoff = Backoff(1.0, 60.0, jitter=False)
        while not self._stop.is_set():
            self._child = subprocess.Popen(self.command)
            log.info("%s started (pid %d)", self.name, self._child.pid)
            code = self._child.wait()
            if self._stop.is_set():
                return
            if code == RELEASED_EXIT and self.wake is not None:
                while not self.wake():
                    if self._stop.wait(1.0):
                        return
                log.info("%s: work arrived; starting it again", self.name)
                backoff = Backoff(1.0, 60.0, jitter=False)
                continue
            if code in (130, -signal.SIGINT):
                # Ctrl-C in a terminal reaches the whole process group: this process
                # is stopping too. Not a crash, and nothing to restart.
                log.info("%s stopped by Ctrl-C (SIGINT)", self.name)
                return
            delay = backoff.wait() or 0.0  # no deadline: always a wait
            log.error("%s exited with %d; restarting in %.0f s", self.name, code, delay)
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
                log.warning("%s did not stop within %.0f s; killing it", self.name,
                            self.grace_seconds)  # fmt: skip
                child.kill()
                child.wait()
        self._thread.join(timeout=5)


def collect(loaded: LoadedConfig) -> None:
    """Serve the collector until SIGTERM/Ctrl-C: in this process with one worker, else
    as ``server.workers`` supervised processes."""
    from eventpipe.collector.server import announce_dev_key, prepare, serve

    config, dev_key = prepare(loaded)
    if dev_key is not None:
        announce_dev_key(config, dev_key)
    count = config.server.workers or os.cpu_count() or 1
    if count == 1:
        serve(config, source=loaded.source)
    else:
        CollectorWorkers(config, loaded.source, count).run()


class CollectorWorkers:
    """``count`` collector processes sharing one port (see the module's docstring)."""

    POLL_SECONDS = 0.2

    def __init__(self, config: Config, source: str, count: int) -> None:
        self.config = config
        self.source = source
        self.count = count
        self._stop = threading.Event()
        self._context = multiprocessing.get_context("spawn")
        self._workers: dict[int, Any] = {}
        self._reports: Any = self._context.Queue()
        """Each worker's start: ("ready", n) once it holds its writer id and its port,
        or ("failed", n, message, fix)."""

    def run(self) -> None:
        from eventpipe.collector.server import claim_port, shared_socket

        server = self.config.server
        claim_port(server.host, server.port)  # nothing else listens there
        holder = shared_socket(server.host, server.port, listen=False)  # keeps the port
        port = holder.getsockname()[1]
        self.config = self.config.model_copy(
            update={"server": server.model_copy(update={"port": port})}
        )
        metrics = _metrics_directory()
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics  # the workers inherit it
        previous = {sig: signal.signal(sig, self._on_signal)
                    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}  # fmt: skip
        try:
            for worker in range(self.count):
                self._start(worker)
            self._wait_ready()
            log.info("collector: %d workers on %s:%d", self.count, server.host, port)
            self._supervise()
        finally:
            self._stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
            shutil.rmtree(metrics, ignore_errors=True)
            holder.close()

    def _on_signal(self, sig: int, frame: object) -> None:
        if sig == signal.SIGUSR1:  # eventpipe rotate, or an operator: every worker seals
            for process in list(self._workers.values()):
                if process.pid is not None and process.is_alive():
                    os.kill(process.pid, signal.SIGUSR1)
            return
        self._stop.set()

    def _start(self, worker: int) -> None:
        process = self._context.Process(
            target=_collector_worker, args=(self.config, self.source, worker, self._reports),
            name=f"collector-{worker}", daemon=False,
        )  # fmt: skip
        start_with_stops_held(process)
        self._workers[worker] = process

    def _wait_ready(self) -> None:
        """Until every worker serves; the first one's error if one cannot start (its
        writer id is taken: another collector writes this directory as this host)."""
        waiting = set(self._workers)
        while waiting:
            if self._stop.is_set():
                return
            try:
                report = self._reports.get(timeout=self.POLL_SECONDS)
            except queue.Empty:
                for worker in sorted(waiting):
                    code = self._workers[worker].exitcode
                    if code is not None:
                        why = f"collector worker {worker} exited with {code} before it started"
                        raise EventpipeError(why, fix="its log above says why") from None
                continue
            if report[0] == "ready":
                waiting.discard(report[1])
            else:
                raise EventpipeError(report[2], fix=report[3])

    def _supervise(self) -> None:
        backoffs = {w: Backoff(1.0, 60.0, jitter=False) for w in self._workers}
        due: dict[int, float] = {}
        while not self._stop.wait(self.POLL_SECONDS):
            while not self._reports.empty():  # restarted workers' starts: logged by them
                self._reports.get_nowait()
            for worker, process in self._workers.items():
                if worker in due or process.is_alive():
                    continue
                _forget(process.pid)
                delay = backoffs[worker].wait() or 0.0
                log.error("collector worker %d exited with %s; starting it again in %.0f s",
                          worker, process.exitcode, delay)  # fmt: skip
                due[worker] = time.monotonic() + delay
            for worker, at in list(due.items()):
                if time.monotonic() >= at:
                    del due[worker]
                    self._start(worker)

    def _stop_all(self) -> None:
        for process in self._workers.values():
            if process.is_alive():
                process.terminate()  # SIGTERM: requests in flight finish, segments sealed
        deadline = time.monotonic() + self.config.server.shutdown_grace_seconds + 15
        for process in self._workers.values():
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                log.warning("collector worker %s did not stop in time; killing it", process.name)
                process.kill()
                process.join()
            elif process.exitcode:  # a clean stop is 0: its active segments may be left
                log.warning("collector worker %s exited with %s while stopping; a segment "
                            "it had active is sealed by the next start", process.name,
                            process.exitcode)  # fmt: skip


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def start_with_stops_held(process: Any) -> None:
    """Start ``process`` (spawned) with SIGTERM and SIGINT blocked; the collector worker
    unblocks them once its handlers are in place (``collector.server.serve``). A stop
    that comes while it still imports (the supervisor stopping right after it started
    it, Ctrl-C in the terminal) then waits for its handler instead of ending it before
    it has sealed what its predecessor left. The signal mask passes through fork and
    exec; this thread's own mask is as it was after the start. (CPython starts its
    resource tracker the same way, and unblocks both signals after: it is started first,
    so that the start of the process does not unblock them early.)"""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        process.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _collector_worker(config: Config, source: str, worker: int, reports: Any) -> None:
    """A worker process's entry point; ``reports``: where it says it started, or why not."""
    from eventpipe.collector.server import serve

    _die_with_parent()
    configure_logging(config.logging)
    try:
        serve(config, source=source, worker=worker, shared=True,
              on_ready=lambda: reports.put(("ready", worker)))  # fmt: skip
    except EventpipeError as exc:
        reports.put(("failed", worker, exc.message, exc.fix))
        log.error("collector worker %d: %s", worker, exc)
        sys.exit(1)


def _die_with_parent() -> None:
    """SIGTERM when the supervisor dies, however it dies (Linux; elsewhere nothing)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # it died before the call
        os.kill(os.getpid(), signal.SIGTERM)


METRICS_PREFIX = "eventpipe-metrics-"


def _metrics_directory() -> str:
    """A new directory for the workers' metrics files, ``<prefix><pid>@<host>-<random>``;
    those left by this host's supervisors that were killed (SIGKILL, the OOM killer) are
    removed first. The host in the name keeps a container sharing the temporary
    directory, whose pids are not ours, from removing another's."""
    host = socket.gethostname()
    for stale in Path(tempfile.gettempdir()).glob(f"{METRICS_PREFIX}*@*-*"):
        pid, _, owner = stale.name.removeprefix(METRICS_PREFIX).rsplit("-", 1)[0].partition("@")
        with contextlib.suppress(OSError):  # another start removed it first
            if (owner == host and pid.isdigit() and not _running(int(pid))
                    and stale.stat().st_uid == os.getuid()):  # fmt: skip
                shutil.rmtree(stale, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{METRICS_PREFIX}{os.getpid()}@{host}-")


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def _forget(pid: int | None) -> None:
    """A dead worker's live gauges leave the host's metrics."""
    if pid is not None and "PROMETHEUS_MULTIPROC_DIR" in os.environ:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


def run(loaded: LoadedConfig, config_path: Path | None) -> None:
    """Serve the collector, and supervise the pipeline and a reader per source, until
    SIGTERM/Ctrl-C. A config with sources and no api keys runs no collector."""
    collecting = bool(loaded.config.api_keys or loaded.embedded or not loaded.config.sources)
    if collecting:
        # A second `run` of this config finds the port taken: refused before its pipeline
        # starts a JVM (it took 37 s to start it and stop it again). A collector that is
        # stopping has closed its port already: the new one starts, and waits for its
        # writer ids.
        from eventpipe.collector.server import claim_port

        claim_port(loaded.config.server.host, loaded.config.server.port)
    # The pipeline's own grace for its loads, and time to stop Spark after them.
    config = loaded.config
    grace = config.processing.shutdown_grace_seconds + SPARK_STOP_SECONDS
    children = [Supervisor("pipeline", ["process", "--release-when-idle"], config_path, grace,
                           wake=lambda: bool(config.layout.sealed_segments()))]  # fmt: skip
    children += [Supervisor(f"source {s}", ["read", s], config_path, READER_STOP_SECONDS)
                 for s in loaded.config.sources]  # fmt: skip
    if config.console.enabled:  # a small process of its own, never Spark's
        children.append(Supervisor("console", ["console"], config_path, CONSOLE_STOP_SECONDS))
    else:
        log.info("console: off (set console.token to serve it; docs/console.md)")
    for child in children:
        child.start()
    archive = _build_class_data_in_background(config)
    try:
        if collecting:
            collect(loaded)
        else:  # sources only: nothing to collect over HTTP
            log.info("no api_keys: no collector; the sources' readers and the pipeline run")
            _until_stopped()
    finally:
        for child in children:
            child.stop()
        if archive is not None and archive.poll() is None:
            archive.terminate()  # unfinished: the next start builds it again
            archive.wait()


def _build_class_data_in_background(config: Config) -> subprocess.Popen[bytes] | None:
    """``eventpipe spark-archive`` in a child process at low priority, when this
    machine's JVM class-data archive is missing: the service answers at once (on a fresh
    machine, building it first kept the first request waiting some 100 s), the
    pipeline's Spark starts without it this time, and every later start uses it. Its
    output goes to data/logs/spark-archive.log."""
    from eventpipe.processing.runtime import class_data

    path = class_data.archive_path()
    if path is None or path.is_file() or config.spark.settings.get("spark.remote"):
        return None
    logs = config.layout.spark_log.parent
    logs.mkdir(parents=True, exist_ok=True)
    with (logs / "spark-archive.log").open("ab") as output:
        child = subprocess.Popen(
            ["nice", "-n", "10", sys.executable, "-m", "eventpipe.cli", "spark-archive"],
            stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    log.info("building the JVM class-data archive in the background (data/logs/"
             "spark-archive.log): Spark starts in about half the time from the next "
             "start")  # fmt: skip
    return child


def _until_stopped() -> None:
    """Wait for SIGTERM or Ctrl-C."""
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    stopping.wait()


def process(
    config: Config,
    *,
    once: bool,
    report: Callable[[RunReport], None],
    idle: Callable[[], None],
    release_when_idle: bool = False,
) -> bool:
    """``eventpipe process``: batch runs every ``processing.batch_period_seconds`` (``once``:
    one, after the streams caught up with the log), beside a streaming query per stream
    destination. Between two runs, the segments sealed meanwhile are compressed for the
    archive and their schemas inferred (processing/batch/archiving.py, ``wait_preparing_sealed``;
    processing/batch/segment_schemas.py). ``report`` is given each run's report; ``idle`` is
    called when a run finds nothing to process after one that did (or at the first).

    ``release_when_idle``: return True, Spark stopped, once nothing was processed for
    ``processing.release_idle_seconds`` (never with stream destinations); the caller
    starts it again when there is work (``eventpipe run``'s supervisor). Else False."""
    import signal

    from eventpipe.errors import retry_transient
    from eventpipe.processing.batch.archiving import wait_preparing_sealed
    from eventpipe.processing.batch.job import pending, run_pending
    from eventpipe.processing.modes import stream
    from eventpipe.processing.runtime import shutdown
    from eventpipe.processing.runtime.pipeline import PipelineBusyError, Runtime
    from eventpipe.processing.runtime.spark import on_terminal, start_session

    streaming = any(d.mode == "stream" for d in config.destinations.values())
    runtime = Runtime(config)  # the session comes after the look at what is pending
    work = pending(runtime) if once and not streaming else None
    if work is not None and work.empty:
        idle()  # no Spark session (5-15 s) for nothing
        return False
    short = work is not None and work.small  # a JVM for a life of seconds
    # A run by hand (--once at a terminal) draws Spark's progress bar; the service logs
    # step lines, and its JVM's own output goes to data/logs/spark.log.
    settings = on_terminal(config.spark.settings) if once else config.spark.settings
    spark = start_session(settings, short_lived=short, jvm_log=config.layout.spark_log)
    runtime = Runtime(config, spark, state=runtime.state)
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
    release = config.processing.release_idle_seconds
    if not release_when_idle or streaming:
        release = None
    idle_since: float | None = None
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
                    lambda: run_pending(runtime), attempts=3 if once else None,
                    max_delay=max(period, 1.0), log=pipeline_log, unless=(PipelineBusyError,),
                    sleep=shutdown.pause,
                )  # fmt: skip
            except PipelineBusyError as exc:
                if once:
                    raise
                pipeline_log.warning("%s; next try later", exc)
                shutdown.pause(period)
                continue
            if reports:
                idle_since = None
            elif idle_since is None:
                idle_since = time.monotonic()
                idle()
            for one in reports:
                report(one)
            # The wait prepares what seals meanwhile (archive, schema): Spark is idle.
            if once or wait_preparing_sealed(config, period, spark):
                return False
            if release and idle_since is not None and time.monotonic() - idle_since >= release:
                if config.layout.sealed_segments():
                    continue  # sealed in the wait: the next run takes it
                pipeline_log.info(
                    "nothing to process for %.0f s: stopping Spark to free its memory "
                    "(processing.release_idle_seconds); it starts again when a segment is "
                    "sealed", time.monotonic() - idle_since)  # fmt: skip
                return True
    finally:
        streams.stop()
        spark.stop()
