"""Stream mode: destinations with ``mode: stream`` get events within seconds, on Spark
Structured Streaming.

* **Source**: a Python data source (``eventpipe_log``) that reads the log as it is written,
  the active segments too, up to their last complete line (eventpipe.log.tail). Its
  offsets are byte positions per segment identity, so a segment sealed (renamed) between
  two micro-batches is followed under its new name.
* **Queue**: one streaming query per stream destination, its checkpoint (offsets and
  commits, Spark's write-ahead log) in ``incoming/queue.dst=<id>/checkpoint``: a restart
  resumes exactly where the destination stopped, and a micro-batch that was under way is
  replayed with the same offsets.
* **Micro-batch**: its lines are copied to ``incoming/queue.dst=<id>/batch-<n>/`` (one
  file per segment, named like it, so an unreadable line's key is known) and run
  through the same job as batch mode, for this destination only (multiplexing, table
  names, lookups, mapping, flattening, typing, patching under the lock, loading,
  failed/). The run id is ``stream-<id>-<n>``, so that a replayed micro-batch loads
  nothing twice (loads are idempotent per run, destination and table). Its lines are then
  archived as ``archive/YYYY-MM-DD/streaming-archive.dst=<id>-<stamp>.log.lz4`` and the
  destination's progress is recorded, which lets the batch side archive a sealed segment
  once every stream destination has read it.
* A transient failure (destination down, a DuckDB file held by a reader too long) is
  retried within the micro-batch with backoff; the query does not stop for it. Any other
  error stops the query, and :class:`StreamSupervisor` starts it again with backoff, from
  its checkpoint.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    SupportsTriggerAvailableNow,
)

from eventpipe.config import Config
from eventpipe.errors import retry_transient
from eventpipe.events import utc_now
from eventpipe.log import tail
from eventpipe.paths import DataLayout
from eventpipe.processing.runtime.pipeline import PipelineBusyError, Runtime
from eventpipe.retry import Backoff
from eventpipe.state.locks import open_locks
from eventpipe.state.store import micro_batch

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger("eventpipe.stream")

MAX_BATCH_BYTES = 64 << 20
"""Log bytes per micro-batch at most (after a backlog: bounded memory and load size)."""


@dataclass(frozen=True)
class _Range(InputPartition):
    identity: str
    path: str
    start: int
    end: int


class _LogReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, layout: DataLayout, destination_id: str) -> None:
        self.layout = layout
        self.destination_id = destination_id
        self.paths: dict[str, str] = {}
        self.target: dict[str, int] | None = None

    def initialOffset(self) -> dict[str, int]:
        return {}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxBytes(MAX_BATCH_BYTES)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = {s.identity: s.end for s in tail.segments(self.layout)}

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        budget = None if isinstance(limit, ReadAllAvailable) else MAX_BATCH_BYTES
        if isinstance(limit, ReadMaxBytes):
            budget = limit.max_bytes
        offsets: dict[str, int] = {}
        taken = False
        for segment in tail.segments(self.layout):
            self.paths[segment.identity] = str(segment.path)
            begin = start.get(segment.identity, 0)
            end = segment.end
            if self.target is not None:  # AvailableNow: nothing written after the start
                end = min(end, self.target.get(segment.identity, 0))
            end = max(begin, end)
            if budget is not None and end - begin > budget:
                end = _line_boundary(segment.path, begin, begin + budget, whole=not taken)
            taken = taken or end > begin
            if budget is not None:
                budget = max(0, budget - (end - begin))
            offsets[segment.identity] = end
        # A segment that left incoming/ was read to its end (see tail.consumed).
        return offsets

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[_Range]:
        # A path unknown after a restart (a replayed micro-batch): read() finds it.
        return [
            _Range(ident, self.paths.get(ident) or str(self.layout.incoming), begin, stop)
            for ident, begin, stop in _ranges(start, end)
        ]

    def read(self, partition: InputPartition) -> Iterator[tuple[str]]:
        assert isinstance(partition, _Range)
        path = tail.locate(self.layout, partition.identity, Path(partition.path))
        if path is None:
            raise FileNotFoundError(
                f"segment {partition.identity} ({partition.path}) left incoming/ before "
                f"stream destination {self.destination_id} read it"
            )
        for line in tail.read_lines(path, partition.start, partition.end):
            yield (line.decode("utf-8", errors="replace"),)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing: the progress is recorded by the micro-batch itself once it loaded
        (Spark calls this only when it plans the next micro-batch)."""


def _ranges(start: dict[str, int], end: dict[str, int]) -> list[tuple[str, int, int]]:
    """(segment identity, first byte, end) of each segment a micro-batch from offsets
    ``start`` to ``end`` reads (a segment new since ``start`` from its first byte)."""
    return [(i, start.get(i, 0), stop) for i, stop in end.items() if stop > start.get(i, 0)]


def _line_boundary(path: Path, start: int, end: int, *, whole: bool = True) -> int:
    """The end of the last complete line before ``end``. When no line from ``start`` ends
    before it: the end of that one line if ``whole`` (a line longer than a micro-batch's
    whole budget is taken whole, never stuck), else ``start`` (it starts the next one)."""
    boundary = tail.complete_end(path, end)
    if boundary > start:
        return boundary
    if not whole:
        return start
    with path.open("rb") as f:
        f.seek(start)
        return start + len(f.readline())


class LogSource(DataSource):
    """``spark.readStream.format("eventpipe_log").option("data_dir", ...)
    .option("destination", id)``: the log's lines, as they are written."""

    @classmethod
    def name(cls) -> str:
        return "eventpipe_log"

    def schema(self) -> str:
        return "value string"

    def streamReader(self, schema: Any) -> _LogReader:
        return _LogReader(DataLayout(Path(self.options["data_dir"])), self.options["destination"])


class StreamStopped(Exception):
    """The stream is stopping while a micro-batch waits to retry; it is replayed at the
    next start."""


def start_stream(
    spark: SparkSession,
    config: Config,
    dest_id: str,
    *,
    available_now: bool = False,
    stopping: threading.Event | None = None,
) -> StreamingQuery:
    """The streaming query of one stream destination, started. A micro-batch that fails
    as transient is retried with backoff (1 s doubling to 30 s): until it loads, or until
    ``stopping`` is set; ``available_now`` (``process --once``): 3 attempts."""
    from eventpipe.processing.batch.job import process_stream_batch
    from eventpipe.processing.batch.schema_cache import SchemaCache

    spark.dataSource.register(LogSource)
    layout = config.layout
    queue = tail.queue_dir(layout, dest_id)
    dest = config.destinations[dest_id]
    schemas = SchemaCache()  # the tables' schemas, kept from one micro-batch to the next

    def pause(seconds: float) -> None:
        if stopping is None:
            time.sleep(seconds)
        elif stopping.wait(seconds):
            raise StreamStopped(f"stream {dest_id} stopped while micro-batch waited to retry")

    # The query's runtime, for every micro-batch: the state store opened once.
    runtime = Runtime(config, spark, pause=pause).only([dest_id])

    def each_batch(frame: DataFrame, epoch: int) -> None:
        # ``frame`` is the source's view of the same ranges; the driver copies them itself
        # (a Spark job to write a thousand lines cost 0.15 s of a 1 s micro-batch).
        started = time.perf_counter()
        batch = layout.incoming / micro_batch(dest_id, epoch)  # its record's name too
        if not (batch / "_SUCCESS").exists():
            _copy_lines(layout, dest_id, queue / "checkpoint", epoch, batch)
        written = time.perf_counter()
        files = sorted(f for f in batch.iterdir() if f.name != "_SUCCESS")
        if files:
            report = retry_transient(
                lambda: process_stream_batch(runtime, epoch, files, schemas),
                attempts=3 if available_now else None, max_delay=30.0, sleep=pause, log=log,
            )  # fmt: skip
            loaded = time.perf_counter()
            _archive(layout, dest_id, files)
            log.info(
                "stream %s micro-batch %d: %d row(s) in %.2f s (lines %.2f s, job %.2f s, "
                "archive %.2f s)", dest_id, epoch, sum(report.loaded.values()),
                time.perf_counter() - started, written - started, loaded - written,
                time.perf_counter() - loaded,
            )  # fmt: skip
        tail.write_progress(layout, dest_id, _planned_end(queue / "checkpoint", epoch))
        shutil.rmtree(batch, ignore_errors=True)

    reader = (
        spark.readStream.format("eventpipe_log")
        .option("data_dir", str(layout.root.resolve()))
        .option("destination", dest_id)
        .load()
    )
    writer = (
        reader.writeStream.queryName(f"eventpipe-{dest_id}")
        .option("checkpointLocation", str(queue / "checkpoint"))
        .foreachBatch(each_batch)
    )
    checkpoint_files(spark)
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{dest.stream_interval_seconds} seconds")
    return writer.start()


CHECKPOINT_MANAGER = "spark.sql.streaming.checkpointFileManagerClass"
FILE_SYSTEM_MANAGERS = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager",
    "org.apache.spark.sql.execution.streaming.FileSystemBasedCheckpointFileManager",  # before 4.3
)


def checkpoint_files(spark: SparkSession) -> str | None:
    """Have the session write checkpoints through Hadoop's FileSystem API (the class set,
    or None where Spark's default stays: a Connect session, one configured otherwise).

    Spark's default writes them through FileContext, whose rename asks for the link
    status of each file: without Hadoop's native library (pip's PySpark has none) every
    ask is a ``readlink`` process the driver starts, eight per file of the offset and
    commit logs, about 3 ms each. Measured with Spark's event log (`bench/stream.py
    --seconds 25`, 25 micro-batches each, medians): the offset log's write 52 ms ->
    12 ms, the commit log's 42 ms -> 10 ms, on every trigger. The checkpoint is the
    driver's, in the data directory; FileSystem's rename is atomic there (POSIX rename,
    HDFS), which is what the offset log needs (an object store's is not: Spark's own
    default picks FileContext for no other reason)."""
    jvm = getattr(spark, "_jvm", None)
    if jvm is None or spark.conf.get(CHECKPOINT_MANAGER, None):
        return None
    for name in FILE_SYSTEM_MANAGERS:
        try:
            jvm.java.lang.Class.forName(name)
        except Exception:  # noqa: BLE001 - Py4J's error for a class this Spark lacks
            continue
        spark.conf.set(CHECKPOINT_MANAGER, name)
        return name
    return None


def _copy_lines(layout: DataLayout, dest_id: str, checkpoint: Path, epoch: int, out: Path) -> None:
    """The log bytes of micro-batch ``epoch`` (from the end of the one before to its own,
    as planned in the offset log), one file per segment, into ``out``; ``_SUCCESS`` last."""
    start = _planned_end(checkpoint, epoch - 1) if epoch > 0 else {}
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for ident, begin, end in _ranges(start, _planned_end(checkpoint, epoch)):
        path = tail.locate(layout, ident, layout.incoming)
        if path is None:
            raise FileNotFoundError(
                f"segment {ident} left incoming/ before stream destination {dest_id} read it"
            )
        with path.open("rb") as source, (out / path.name).open("wb") as sink:
            source.seek(begin)
            remaining = end - begin
            while remaining > 0:
                chunk = source.read(min(remaining, 1 << 20))
                if not chunk:
                    raise EOFError(f"{path} ends before offset {end}")
                sink.write(chunk)
                remaining -= len(chunk)
    (out / "_SUCCESS").touch()


def _planned_end(checkpoint: Path, epoch: int) -> dict[str, int]:
    """The source offsets Spark planned micro-batch ``epoch`` up to: its offset log entry
    (written before the batch ran; format ``v1``, metadata, one line per source)."""
    import json

    lines = (checkpoint / "offsets" / str(epoch)).read_text().splitlines()
    return {str(k): int(v) for k, v in json.loads(lines[2]).items()}


def _archive(layout: DataLayout, dest_id: str, files: list[Path]) -> Path:
    """The micro-batch's lines, into the archive as LZ4 frames (``files`` removed)."""
    from eventpipe.processing.batch.archiving import compress

    stamp = utc_now().strftime("%Y-%m-%dT%H-%M-%S.%f")
    target = layout.archive / stamp[:10] / f"streaming-archive.dst={dest_id}-{stamp}.log.lz4"
    compress(files, target)
    return target


@contextmanager
def stream_lock(config: Config, dest_id: str) -> Iterator[None]:
    """One streaming query per destination and data directory: two would share (and
    corrupt) one checkpoint. Held across hosts (eventpipe.state.locks)."""

    def busy(holder: str) -> Exception:
        return PipelineBusyError(
            f"stream destination {dest_id} is already running ({holder})",
            fix="stop the other eventpipe process or run",
        )

    with open_locks(config).holding(f"stream.dst={dest_id}", busy):
        yield


def run_once(spark: SparkSession, config: Config) -> None:
    """Every stream destination, up to what the log holds now (``process --once``)."""
    from eventpipe.processing.batch.run import stream_ids

    for dest_id in stream_ids(config):
        with stream_lock(config, dest_id):
            start_stream(spark, config, dest_id, available_now=True).awaitTermination()


HEALTHY_SECONDS = 60.0
"""A query that ran this long before it stopped is restarted after 1 s again."""


class StreamSupervisor:
    """Keeps each stream destination's query running (``eventpipe process``): a query
    that stops on an error is started again from its checkpoint, after 1 s, 2 s, 4 s...
    (at most 60 s; back to 1 s once it ran ``HEALTHY_SECONDS``); other destinations are
    not affected."""

    def __init__(self, spark: SparkSession, config: Config) -> None:
        self.spark = spark
        self.config = config
        self._stop = threading.Event()
        from eventpipe.processing.batch.run import stream_ids

        self._threads = [
            threading.Thread(target=self._keep, args=(d,), name=f"stream-{d}", daemon=True)
            for d in stream_ids(config)
        ]
        self._queries: dict[str, StreamingQuery] = {}

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def _keep(self, dest_id: str) -> None:
        backoff = Backoff(1.0, 60.0, jitter=False)
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                with stream_lock(self.config, dest_id):
                    query = start_stream(self.spark, self.config, dest_id, stopping=self._stop)
                    self._queries[dest_id] = query
                    log.info("stream %s started", dest_id)
                    query.awaitTermination()
                return
            except Exception as exc:  # noqa: BLE001 - reported, then the query restarts
                if self._stop.is_set():
                    return
                if time.monotonic() - started >= HEALTHY_SECONDS:
                    backoff.reset()
                delay = backoff.wait() or 0.0  # no deadline: always a wait
                log.error("stream %s stopped: %s; restarting in %.0f s", dest_id, exc, delay)
                self._stop.wait(delay)

    def stop(self) -> None:
        self._stop.set()
        for query in list(self._queries.values()):
            try:
                query.stop()
            except Exception as exc:  # noqa: BLE001 - stopping anyway
                log.warning("stopping %s: %s", query.name, exc)
        for thread in self._threads:
            if thread.ident is not None:  # started
                thread.join(timeout=10)
