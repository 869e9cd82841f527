"""The batch job: sealed segments -> typed tables in every batch destination.

    read      Spark's JSON reader over the run's segments; unparseable lines -> failed/
    for each batch destination:
      multiplex   only the events of its keys (only_keys)
      table name  table_name_template as one expression; empty -> skipped, error -> failed/
      flatten     nested objects -> named columns (processing.flatten)
      type        lattice type per table and column (processing.inference)
      per table:  convert to the table's types (values that cannot be -> failed/),
                  stage as Parquet, patch the table under its lock, load atomically
    status    each segment x destination x table recorded; done segments archived

A run's segment list is stored before anything loads (state.store); after a crash the
same run resumes with the same segments and batch ids, and destinations load nothing
twice. Tables already recorded ok for the run are skipped.
"""

from __future__ import annotations

import gzip
import itertools
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from pyspark.sql import Observation
from pyspark.sql import functions as F
from pyspark.sql.types import TimestampType

from eventpipe import locks, reserved
from eventpipe.archive import retention
from eventpipe.archive.files import SUFFIX
from eventpipe.archive.write import archive_segment, prepare_segment
from eventpipe.config import Config, DestinationConfig, MeteringConfig
from eventpipe.destinations.base import Destination, LoadRequest, Metered
from eventpipe.destinations.duckdb import DuckDBDestination
from eventpipe.errors import EventpipeError, TerminalError, TransientError, first_line
from eventpipe.events import Stage, event_error_line, utc_now
from eventpipe.files import append_file, move, replacing, replacing_path, write_file
from eventpipe.paths import DataLayout, count_lines, is_uri
from eventpipe.processing import lookup, metering, shutdown, transforms
from eventpipe.processing.fields import (
    column_at,
    has_arrays,
    json_object,
    json_text_arrays,
    reference,
    set_path,
    with_type_at,
)
from eventpipe.processing.flatten import Flat, flatten_mapped, leaves
from eventpipe.processing.inference import StagedTypes, staged_column_types, token_types
from eventpipe.processing.mapping import Mapping
from eventpipe.processing.schemas import SchemaCache
from eventpipe.processing.template import Template, render, table_names
from eventpipe.processing.version import code_version
from eventpipe.reserved import (
    CORRUPT,
    DAY,
    ERROR,
    FILE,
    FILTERED,
    LOOKUP,
    RAW,
    ROW,
    SEGMENT,
    TABLE,
)
from eventpipe.retry import Backoff
from eventpipe.schema.casts import SPARK_TYPES, cast_to, conversion_problem
from eventpipe.schema.diff import Table, diff
from eventpipe.schema.naming import UNMAPPED_COLUMN, column_name, table_name
from eventpipe.schema.pointers import parse_pointer, pointer
from eventpipe.schema.types import DataType
from eventpipe.state.store import (
    ALL_TABLES,
    SENT_TABLE,
    Part,
    Run,
    StateStore,
    micro_batch,
    open_state,
    stream_run,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, DataFrameReader, DataFrameWriter, SparkSession
    from pyspark.sql.types import StructType

    from eventpipe.destinations.http import HttpSettings

log = logging.getLogger("eventpipe.processing")

TIMESTAMP = "_timestamp"


@dataclass
class RunReport:
    run_id: str
    segments: tuple[str, ...]
    resumed: bool
    loaded: dict[tuple[str, str], int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    filtered: dict[str, int] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)
    replaced: dict[str, int] = field(default_factory=dict)
    """Metering: rows of earlier runs removed because this run loaded a newer version of
    their key."""
    corrupt: int = 0
    archived: list[Path] = field(default_factory=list)


@dataclass(frozen=True)
class Rebuild:
    """A reprocess run (processing/reprocess.py): only the events of ``days`` (UTC days of
    their ``_timestamp``), loaded through ``shadow`` (the destination's shadow tables)."""

    days: tuple[str, ...]
    shadow: Callable[[Destination], Destination]


@dataclass(frozen=True)
class _Run:
    """What every step of one run shares."""

    run_id: str
    segments: tuple[str, ...]
    """Every destination's, together (one destination's: _Target.segments)."""
    config: Config
    state: StateStore
    report: RunReport
    originals: DataFrame
    """(row id, the event's original JSON), computed only for rows that are asked for."""
    lookups: Lookups
    paths: tuple[str, ...]
    """The files the run reads (segments, or the events of a replay)."""
    catalogues: dict[str, list[metering.Product]]
    """Each metering destination's products, read once at the start of the run."""
    pause: Callable[[float], None] = time.sleep
    """Waits between attempts (a stream's raises when the stream is stopping)."""
    rebuild: Rebuild | None = None
    started: datetime = field(default_factory=utc_now)
    """When the run started here: metering's window and order of arrival count from it."""
    ahead: _ArchiveAhead | None = None
    """The segments' archiving, begun when the run's Spark passes are done (_load_tables)."""

    @property
    def layout(self) -> DataLayout:
        return self.config.layout


@dataclass(frozen=True)
class _Target:
    """One destination of a run, opened."""

    id: str
    config: DestinationConfig
    segments: tuple[str, ...]
    """The segments it takes in this run (what its records are made for)."""
    destination: Destination | None
    """None for an http sink (no tables: events are sent, destinations/http.py)."""
    schemas: SchemaCache
    """Its tables' schemas (a stream's lives across micro-batches; a batch run's is new)."""


def open_destination(dest_id: str, dest: DestinationConfig, config: Config) -> Destination:
    layout = config.layout
    if dest.type == "postgres":
        from eventpipe.destinations.postgres import PostgresDestination

        assert dest.dsn is not None  # checked by the config model
        return PostgresDestination(dest_id, dest.dsn, dest.db_schema)
    if dest.type == "parquet":
        from eventpipe.destinations.parquet import ParquetDestination, SparkParquetDestination

        if dest.path is not None and is_uri(dest.path):
            from eventpipe.processing.spark import start_session

            def spark() -> SparkSession:
                return start_session(config.spark.settings)

            return SparkParquetDestination(
                dest_id, dest.path, layout.locks, spark, partition_by=dest.partition_by
            )
        root = Path(dest.path) if dest.path else layout.root / "parquet"
        return ParquetDestination(dest_id, root, layout.locks, dest.partition_by)
    return DuckDBDestination(dest_id, Path(dest.path) if dest.path else layout.warehouse,
                             layout.locks)  # fmt: skip


def _catalogues(config: Config) -> dict[str, list[metering.Product]]:
    """The products of each metering destination of ``config``."""
    return {
        dest_id: metering.read_catalogue(
            dest.metering,
            cast("Metered", open_destination(dest_id, dest, config))
            if dest.metering.products_table
            else None,
        )
        for dest_id, dest in config.destinations.items()
        if dest.metering is not None
    }


@contextmanager
def _step(what: str) -> Iterator[None]:
    """Log a step's start and duration: progress for long runs, and where the time goes."""
    started = time.perf_counter()
    log.info("%s ...", what)
    yield
    log.info("%s: %.1f s", what, time.perf_counter() - started)


class PipelineBusyError(TransientError):
    """Another pipeline process is working on this data directory."""

    name = "pipeline_busy"


@contextmanager
def pipeline_lock(layout: DataLayout) -> Iterator[None]:
    """One pipeline per data directory: two would plan runs over the same segments."""

    def busy(pid: int | None) -> Exception:
        return PipelineBusyError(
            f"another pipeline (pid {pid or '?'}) is processing {layout.root}",
            fix="wait for it, or stop it (eventpipe run includes one)",
        )

    with locks.holding(layout.locks / "pipeline.lock", busy):
        yield


def process_once(config: Config, spark: SparkSession, *, trigger: str = "once") -> RunReport | None:
    """Process every sealed segment not yet processed (and first finish interrupted
    runs); the report of the last run, None if there was nothing to do. See
    process_pending."""
    reports = process_pending(config, spark, trigger=trigger)
    return reports[-1] if reports else None


class DestinationsFailingError(TransientError):
    """Some destinations stopped on transient errors (a database that is down); the
    others finished their work. Their segments wait for them: try again later."""

    name = "destinations_failing"


def process_pending(
    config: Config, spark: SparkSession, *, trigger: str = "once"
) -> list[RunReport]:
    """Finish the runs that did not finish, then process every sealed segment not yet
    processed, in a new run; the reports of the runs, in order.

    Destinations stop alone: one that fails with a transient error (its database is
    down) leaves its part of the run unfinished and takes no new segments, while the
    others finish and go on with new ones. Its unfinished runs are completed first,
    with their own segments and batch ids, when it works again. After the others are
    done, DestinationsFailingError names the ones that stopped (retry later)."""
    with pipeline_lock(config.layout):
        return _process_pending(config, spark, trigger)


def _process_pending(config: Config, spark: SparkSession, trigger: str) -> list[RunReport]:
    ahead = _ArchiveAhead(config, [p.name for p in config.layout.sealed_segments()])
    try:
        return _run_pending(config, spark, trigger, ahead)
    finally:
        ahead.finish(cancel=True)


class _ArchiveAhead:
    """Compresses a batch's segments for the archive on a driver thread while the run's
    tables load; archive_segment then moves the files into place (archive/write.py).

    The thread begins with the first load of a run (:meth:`begin`), not before: Spark's
    passes keep both cores of a small machine busy (compressing then only slowed them
    down), while loading into DuckDB leaves about 40% of them idle, and archiving alone
    (regex scans that hold the GIL) uses about 60%. On the batch benchmark the two then
    share the cores instead of running one after the other.

    A segment the thread could not prepare (an error, or not reached) is compressed when
    it is archived, as without it. What is not an error (a BaseException: an interrupt,
    an exit) ends the thread and is raised again by :meth:`finish`, in the run's thread.
    """

    def __init__(self, config: Config, names: Sequence[str]) -> None:
        self._config = config
        self._names = list(names)
        self._cancelled = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stopped_by: BaseException | None = None

    def begin(self) -> None:
        with self._lock:
            if self._thread is None and self._names and not self._cancelled.is_set():
                self._thread = threading.Thread(target=self._prepare, name="archive-ahead",
                                                daemon=True)  # fmt: skip
                self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def finish(self, *, cancel: bool = False) -> None:
        """Wait for the thread; ``cancel``: stop it after the segment it is on (and never
        start it)."""
        with self._lock:
            if cancel:
                self._cancelled.set()
            thread = self._thread
        if thread is not None:
            thread.join()
        stopped_by, self._stopped_by = self._stopped_by, None
        if stopped_by is not None:
            raise stopped_by

    def _prepare(self) -> None:
        layout = self._config.layout
        for name in self._names:
            if self._cancelled.is_set():
                return
            try:
                prepare_segment(layout, name, self._config.archive)
            except Exception as exc:  # noqa: BLE001 (archiving compresses it itself)
                log.warning("archiving %s ahead: %s; it is compressed when archived", name,
                            first_line(exc))  # fmt: skip
            except BaseException as exc:  # noqa: BLE001 (not an error: finish raises it)
                self._stopped_by = exc
                return


def _run_pending(
    config: Config, spark: SparkSession, trigger: str, ahead: _ArchiveAhead | None = None
) -> list[RunReport]:
    layout = config.layout
    state = open_state(config)
    batch = list(batch_destinations(config))
    failing: dict[str, str] = {}
    reports: list[RunReport] = []
    for run in state.unfinished_runs():
        shutdown.check("a run")
        plan = run.plan_for(batch)
        todo = {
            d: segs
            for d, segs in plan.items()
            if d not in failing  # stopped by an older run: that one comes first
            and not state.table_ok(segs, d, ALL_TABLES)
        }
        if todo:
            reports.append(execute_run(spark, config, state, run, todo, failing, ahead))
        close_run(layout, state, run, plan, failing)
    sealed = [p.name for p in layout.sealed_segments()]
    plan = {}
    for dest_id in batch:
        if dest_id not in failing:
            done = state.done_by(dest_id, sealed)
            # A segment whose first lines it handled alone (log step, log ack): the rest.
            cursors = state.cursors(dest_id)
            pending = tuple(str(Part(s, cursors.get(s, 0))) for s in sealed if s not in done)
            if pending:
                plan[dest_id] = pending
    if plan:
        shutdown.check("a run")
        segments = list(dict.fromkeys(e for entries in plan.values() for e in entries))
        versions = {d: code_version(config, d) for d in plan}
        run = state.begin_run(segments, trigger, plan, versions)
        reports.append(execute_run(spark, config, state, run, plan, failing, ahead))
        close_run(layout, state, run, plan, failing)
    if ahead is not None:  # its thread done first (what stopped it, if anything, raised)
        with _step("archiving ahead: the rest") if ahead.running else nullcontext():
            ahead.finish()
    archived = archive_segments(config, state.segments_done(sealed, batch))
    if reports:
        reports[-1].archived = archived
    if config.archive.retention_days is not None or config.archive.max_bytes is not None:
        retention.prune(layout, config.archive.retention_days, config.archive.max_bytes)
    if failing:
        problems = "; ".join(f"{d}: {error}" for d, error in sorted(failing.items()))
        raise DestinationsFailingError(
            f"destination(s) stopped: {problems}",
            fix="their segments wait for them; the next run tries again",
            reports=reports,
        )
    return reports


def execute_run(
    spark: SparkSession,
    config: Config,
    state: StateStore,
    run: Run,
    plan: dict[str, tuple[str, ...]],
    failing: dict[str, str],
    ahead: _ArchiveAhead | None = None,
) -> RunReport:
    """The destinations of ``plan`` through one run; those that stop are put in
    ``failing``. A run killed or stopped by anything else stays unfinished: resumed.
    ``ahead``: begun when the run's first table loads."""
    layout = config.layout
    report = RunReport(run.run_id, run.segments, run.resumed)
    log.info(
        "%s %s: %d segment(s) for %s", "resuming" if run.resumed else "starting", run.run_id,
        len(run.segments), ", ".join(plan),
    )  # fmt: skip
    wanted = {entry for entries in plan.values() for entry in entries}
    paths = [str(_entry_file(layout, run.run_id, e)) for e in run.segments if e in wanted]
    only = config.model_copy(update={"destinations": {d: config.destinations[d] for d in plan}})
    # Destinations that take different segments tell them apart by a column of their own:
    # decided by the whole plan, so that every attempt of the run stages the same.
    by_segment = len({frozenset(segs) for segs in (run.plan or {}).values()}) > 1
    try:
        _run_job(spark, only, run.run_id, plan, paths, state, report, failing=failing,
                 by_segment=by_segment, ahead=ahead)  # fmt: skip
    except BaseException as exc:
        state.finish_run(run.run_id, "interrupted", error=repr(exc)[:2000])
        raise
    return report


def close_run(
    layout: DataLayout,
    state: StateStore,
    run: Run,
    plan: dict[str, tuple[str, ...]],
    failing: dict[str, str],
) -> None:
    """Mark the run done when every destination of its plan finished it (a part of a
    segment moves its destination's cursor in the segment: before the run is marked
    done, so that a crash in between repeats this step, not the load)."""
    left = [d for d, segs in plan.items() if not state.table_ok(segs, d, ALL_TABLES)]
    for dest_id, entries in plan.items():
        if dest_id not in left:
            for part in (Part.parse(e) for e in entries):
                if not part.whole:
                    end = None if part.count is None else part.start + part.count
                    source = layout.incoming / part.segment
                    # Archived already (this step repeated after a crash): it was done.
                    done = end is None or not source.exists() or end >= count_lines(source)
                    state.advance(dest_id, part.segment, end or 0, done=done, run_id=run.run_id)
    if left:
        errors = "; ".join(f"{d}: {failing.get(d, 'not finished')}" for d in left)
        state.finish_run(run.run_id, "interrupted", error=errors[:2000])
    else:
        state.finish_run(run.run_id, "done")
        shutil.rmtree(layout.tmp / run.run_id, ignore_errors=True)


def _entry_file(layout: DataLayout, run_id: str, entry: str) -> Path:
    """The file a plan entry is read from: a whole segment where it is; some of its
    lines copied once under the run's tmp/ (named as the entry, which is how its rows
    are told apart)."""
    part = Part.parse(entry)
    source = layout.incoming / part.segment
    if part.whole:
        return source
    out = layout.tmp / run_id / "parts" / entry
    if not out.exists():
        end = None if part.count is None else part.start + part.count
        with source.open("rb") as lines, replacing(out) as copy:
            copy.writelines(itertools.islice(lines, part.start, end))
    return out


def batch_destinations(config: Config) -> dict[str, DestinationConfig]:
    return {d: dest for d, dest in config.destinations.items() if dest.mode == "batch"}


def stream_ids(config: Config) -> list[str]:
    """The destinations in ``mode: stream`` (processing/stream.py runs them)."""
    return [d for d, dest in config.destinations.items() if dest.mode == "stream"]


def archive_segments(config: Config, names: Sequence[str]) -> list[Path]:
    """Archive the segments of ``names`` that every stream destination has read."""
    from eventpipe.log.tail import consumed

    layout = config.layout
    streams = stream_ids(config)
    ready = [n for n in names if consumed(layout, streams, layout.incoming / n)]
    if not ready:
        return []
    # LZ4 and the checksums release the GIL, the id scan does not: two threads archive
    # 1.2x faster than one (bench/archive.py).
    pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 1)
    with _step(f"archive {len(ready)} segment(s)"), pool:
        archived = list(pool.map(lambda n: archive_segment(layout, n, config.archive), ready))
    _drop_stale_ahead(layout)
    return archived


def _drop_stale_ahead(layout: DataLayout) -> None:
    """Remove files archived ahead for segments that are no longer in incoming/."""
    ahead = layout.tmp / "archive-ahead"
    if not ahead.is_dir():
        return
    present = {p.name for p in layout.sealed_segments()}
    for path in ahead.iterdir():
        if path.name.split(SUFFIX)[0] not in present:
            path.unlink(missing_ok=True)


def process_stream_batch(
    spark: SparkSession,
    config: Config,
    dest_id: str,
    epoch: int,
    lines: Sequence[Path],
    schemas: SchemaCache | None = None,
    pause: Callable[[float], None] = time.sleep,
) -> RunReport:
    """One micro-batch of a stream destination, its log lines in the files ``lines``,
    through the same job as batch mode, for that destination only. The run id is the
    destination's and the micro-batch's, so a replayed micro-batch loads nothing twice.
    ``schemas``: the stream's, kept from one micro-batch to the next; ``pause``: how the
    job waits (for an HTTP API that is down)."""
    layout = config.layout
    run_id = stream_run(dest_id, epoch)
    name = micro_batch(dest_id, epoch)
    report = RunReport(run_id, (name,), resumed=(layout.tmp / run_id).exists())
    only = config.model_copy(update={"destinations": {dest_id: config.destinations[dest_id]}})
    paths = [str(p) for p in lines]
    known = {dest_id: schemas or SchemaCache()}
    state = open_state(config)
    try:
        _run_job(spark, only, run_id, {dest_id: (name,)}, paths, state, report, known,
                 small=True, pause=pause)  # fmt: skip
    except Exception as exc:
        if not caused_by_data(exc):
            raise
        # First time: raised, and the query starts again from its checkpoint (the same
        # micro-batch); second time: its events are isolated.
        if Isolation(spark, only, run_id, dest_id, state, report).after(exc, (name,), lines):
            raise
    state.fold_stream(dest_id, epoch)  # older micro-batches: one row per table
    shutil.rmtree(layout.tmp / run_id, ignore_errors=True)
    return report


def _run_job(
    spark: SparkSession,
    config: Config,
    run_id: str,
    plan: dict[str, tuple[str, ...]],
    paths: list[str],
    state: StateStore,
    report: RunReport,
    schemas: dict[str, SchemaCache] | None = None,
    *,
    small: bool = False,
    pause: Callable[[float], None] = time.sleep,
    failing: dict[str, str] | None = None,
    by_segment: bool = False,
    rebuild: Rebuild | None = None,
    ahead: _ArchiveAhead | None = None,
) -> None:
    """Read ``paths`` once, then load every destination of ``config``, each the segments
    ``plan`` gives it (with the table schemas of ``schemas`` where given, else read from
    each destination). ``small``: a micro-batch, read where it is rather than staged
    first (see _stage_events). ``by_segment``: destinations take different segments
    (the staged rows keep their segment's name).

    HTTP sinks are sent on threads of their own beside the tables' loads: an API that is
    down for minutes delays no other destination of the run. ``failing``: a destination
    that fails with a TransientError is recorded there (and in the state store) and the
    others go on; without it the error is raised. ``rebuild``: a reprocess run.
    ``ahead``: the archiving to begin when the first table loads."""
    transforms.check(spark, config)
    catalogues = _catalogues(config)  # one that cannot be read stops the run here
    lookups = Lookups.plan(config)
    days = rebuild.days if rebuild else None

    def isolate(dest_id: str, exc: Exception) -> None:
        files = [_entry_file(config.layout, run_id, e) for e in plan[dest_id]]
        isolation = Isolation(spark, config, run_id, dest_id, state, report)
        stopped = isolation.after(exc, plan[dest_id], files)
        if stopped is not None and failing is not None:
            failing[dest_id] = stopped

    try:
        events = _stage_events(spark, config, run_id, paths, lookups, staged=not small,
                               by_segment=by_segment, days=days)  # fmt: skip
        if CORRUPT in events.columns and rebuild is None:
            report.corrupt = _once(
                config.layout.tmp / run_id / "failed.corrupt.done",
                lambda: _fail_corrupt(events, config.layout),
            )
    except Exception as exc:
        if failing is None or not caused_by_data(exc):
            raise
        for dest_id in config.destinations:  # the read is every destination's
            isolate(dest_id, exc)
        return
    originals = events.select(
        ROW,
        event_json(events).alias(RAW),
        _day_of(events.schema).alias(DAY),
    )
    segments = tuple(dict.fromkeys(s for segs in plan.values() for s in segs))
    shared = _Run(run_id, segments, config, state, report, originals, lookups, tuple(paths),
                  catalogues, pause, rebuild, ahead=ahead)  # fmt: skip

    def process(dest_id: str, open_target: Callable[[], _Target]) -> None:
        shutdown.check(f"{dest_id}'s part of the run")
        try:
            _process_destination(events, shared, open_target())
        except TransientError as exc:
            if failing is None:
                raise
            log.error("%s stopped: %s; its segments wait for the next run", dest_id, exc)
            failing[dest_id] = exc.message
            state.record(plan[dest_id], dest_id, ALL_TABLES, ok=False, error=exc.message[:2000],
                         run_id=run_id)  # fmt: skip
        except Exception as exc:
            if failing is None or not caused_by_data(exc):
                raise
            isolate(dest_id, exc)

    def sink(d: str) -> Callable[[], _Target]:
        return lambda: _Target(d, config.destinations[d], plan[d], None, SchemaCache())

    def table_target(d: str) -> Callable[[], _Target]:
        cache = (schemas or {}).get(d) or SchemaCache()
        dest = config.destinations[d]
        shadow = rebuild.shadow if rebuild else lambda destination: destination
        return lambda: _Target(d, dest, plan[d], shadow(open_destination(d, dest, config)), cache)

    sinks = [d for d, dest in config.destinations.items() if dest.type == "http"]
    with ThreadPoolExecutor(max_workers=max(1, len(sinks)), thread_name_prefix="send") as pool:
        sending = [pool.submit(process, d, sink(d)) for d in sinks]
        for dest_id in config.destinations:
            if dest_id not in sinks:
                process(dest_id, table_target(dest_id))
        for future in sending:
            future.result()


def caused_by_data(exc: Exception) -> bool:
    """Whether a failure of a destination's part of a run may come from the events it
    processes (Spark's analysis or a task failing, a Python error in a step), and so may
    be isolated event by event. Not: eventpipe's own classified errors (a destination
    that is down, a bad config), the disk, memory, or Spark itself gone."""
    from py4j.protocol import Py4JNetworkError

    not_data = (EventpipeError, OSError, MemoryError, Py4JNetworkError)
    return not isinstance(exc, not_data)


@dataclass(frozen=True)
class Isolation:
    """A destination's part of a run that failed for a reason its events may cause.

    The first such failure is recorded (``data-failed`` in the run's directory of the
    destination) and the destination waits, like one that is down: it may have been
    passing (an executor lost). When the same run fails so a second time, its events are
    isolated instead of failing again: the destination's lines are processed in parts,
    each a run of its own with its own schema (a part's schema has only its events'
    fields, so a field that breaks the batch breaks only its part), a failing part is
    halved down to single events, and each event that fails alone goes to failed/ with
    the error. The rest loads. Parts are runs with fixed ids (the run's and the lines'),
    so a crash during isolation repeats nothing that loaded. More failing events than
    ``max_poison_events``: the destination stops (PoisonLimitError), taken as broken.
    Stream micro-batches and replays take the same two steps (their first failure is
    raised: the query starts again from its checkpoint, the replay resumes).
    """

    spark: SparkSession
    config: Config
    run_id: str
    dest_id: str
    state: StateStore
    report: RunReport

    @property
    def root(self) -> Path:
        return self.config.layout.tmp / self.run_id / f"dst={self.dest_id}" / "isolation"

    def after(self, exc: Exception, entries: Sequence[str], files: Sequence[Path]) -> str | None:
        """Handle ``exc``, the destination's failure in this run of the plan's ``entries``,
        whose lines are in ``files`` (see the class). A first failure is recorded and
        described (the destination stops for now); None: the events were isolated."""
        error = f"{type(exc).__name__}: {first_line(exc)}"
        first_failure = self.root.parent / "data-failed"  # kept until the run is done
        if not first_failure.exists():
            write_file(first_failure, error)
            log.error("%s failed in %s (%s); tried again next time, then event by event",
                      self.dest_id, self.run_id, error)  # fmt: skip
            self.state.record(entries, self.dest_id, ALL_TABLES, ok=False, error=error[:2000],
                              run_id=self.run_id)  # fmt: skip
            return f"failed on its events' data: {error}"
        log.warning("%s failed again in %s (%s): isolating its events", self.dest_id,
                    self.run_id, error)  # fmt: skip
        with _step(f"{self.dest_id}: isolate the events of {self.run_id}"):
            self._isolate(files)
        self.state.record(entries, self.dest_id, ALL_TABLES, ok=True, run_id=self.run_id)
        return None

    def _lines(self, files: Sequence[Path]) -> list[bytes]:
        """The destination's events of the run (of its keys), in order (lines that are
        not JSON objects were recorded by the run's read already)."""
        import orjson

        keys = self.config.destinations[self.dest_id].only_keys
        lines = []
        for path in files:
            with path.open("rb") as source:
                for line in source:
                    try:
                        event = orjson.loads(line)
                    except orjson.JSONDecodeError:
                        continue
                    if isinstance(event, dict) and (keys is None or event.get("api_key") in keys):
                        lines.append(line.rstrip(b"\n") + b"\n")
        return lines

    def _isolate(self, files: Sequence[Path]) -> None:
        lines = self._lines(files)
        only = self.config.model_copy(
            update={"destinations": {self.dest_id: self.config.destinations[self.dest_id]}}
        )
        limit = self.config.destinations[self.dest_id].max_poison_events
        poisoned: list[tuple[bytes, str]] = []
        entries: list[str] = []
        # (first line, end, tables loaded whole by the part it was split from)
        parts: list[tuple[int, int, frozenset[str]]] = [(0, len(lines), frozenset())]
        while parts:
            first, end, loaded = parts.pop()
            if first >= end:
                continue
            shutdown.check(f"isolating {self.dest_id}'s events")
            entry = f"{self.run_id}:lines={first}+{end - first}"
            entries.append(entry)
            try:
                self._run_part(only, lines, entry, first, end, loaded)
            except Exception as exc:
                if not caused_by_data(exc):
                    raise
                # Tables the failed part loaded before it failed hold all its events of
                # them: its halves skip them (else they would load those rows again).
                loaded |= frozenset(self.state.loaded_tables(entry, self.dest_id))
                if end - first > 1:
                    middle = (first + end) // 2
                    parts += [(middle, end, loaded), (first, middle, loaded)]  # first half first
                    continue
                poisoned.append((lines[first], f"{type(exc).__name__}: {first_line(exc)}"))
                if len(poisoned) > limit:
                    raise PoisonLimitError(
                        f"more than {limit} events of {self.run_id} failed alone in "
                        f"{self.dest_id}, the last: {poisoned[-1][1]}",
                        fix="the destination's processing fails for most events: see the "
                        "error, fix the config (or raise max_poison_events)",
                    ) from exc
        failed = _once(self.root / "failed.done", lambda: self._fail(poisoned))
        self.state.forget(entries, self.dest_id)  # parts are not segments of the log
        with _COUNTS:
            self.report.failed[self.dest_id] = self.report.failed.get(self.dest_id, 0) + failed
        went_on = len(lines) - len(poisoned)
        log.warning("%s: %d event(s) of %s failed alone -> failed/; the other %d went on",
                    self.dest_id, len(poisoned), self.run_id, went_on)  # fmt: skip

    def _run_part(
        self,
        only: Config,
        lines: list[bytes],
        entry: str,
        first: int,
        end: int,
        loaded: frozenset[str],
    ) -> None:
        """Lines ``first`` to ``end`` through every step for the destination, as a run of
        their own (``entry``: its loads' batch ids are its own), but for the tables of
        ``loaded``."""
        name = entry.rsplit(":", 1)[1]
        path = self.root / f"{name}.log"
        if not path.exists():
            write_file(path, b"".join(lines[first:end]))
        for table in loaded:  # _load_tables skips a table recorded ok for the entry
            self.state.record([entry], self.dest_id, table, ok=True)
        part_id = f"{self.run_id}.{name}"
        report = RunReport(part_id, (name,), resumed=False)
        _run_job(self.spark, only, part_id, {self.dest_id: (entry,)}, [str(path)], self.state,
                 report)  # fmt: skip
        shutil.rmtree(self.config.layout.tmp / part_id, ignore_errors=True)
        with _COUNTS:
            for key, rows in report.loaded.items():
                self.report.loaded[key] = self.report.loaded.get(key, 0) + rows
            for counts, more in ((self.report.skipped, report.skipped),
                                 (self.report.filtered, report.filtered),
                                 (self.report.failed, report.failed)):  # fmt: skip
                for dest, n in more.items():
                    counts[dest] = counts.get(dest, 0) + n

    def _fail(self, poisoned: list[tuple[bytes, str]]) -> int:
        import orjson

        when = utc_now()
        lines = []
        for line, error in poisoned:
            key = orjson.loads(line).get("api_key")
            # The line as the log holds it: parsed again, an integer beyond 64 bits
            # would be rounded in the record (and in a replay).
            lines.append(event_error_line(
                event=orjson.Fragment(line.rstrip(b"\n")),
                error=f"processing failed for this event alone: {error}",
                stage=Stage.PROCESSING, when=when, destination=self.dest_id,
                api_key=key if isinstance(key, str) else None,
            ))  # fmt: skip
        if lines:
            _append(self.config.layout.failed_destination(self.dest_id), b"".join(lines))
        return len(lines)


def replay_failed(config: Config, spark: SparkSession, dest_id: str) -> RunReport | None:
    """Send the failed events of one destination through the pipeline again.

    ``failed/failed.dst=<id>.log`` is first renamed to ``failed/replay/`` (new failures
    then go to a fresh file), its events go through every step for this destination only,
    what fails again is written to ``failed.dst=<id>.log`` with its new error, and the
    replayed file is archived as ``archive/YYYY-MM-DD/replayed.dst=<id>.<stamp>.log.gz``.
    An interrupted replay resumes with the same file and run id, and loads nothing twice
    (loads are idempotent per run, destination and table). None: nothing to replay.
    """
    with pipeline_lock(config.layout):
        return _replay(config, spark, dest_id)


def _replay(config: Config, spark: SparkSession, dest_id: str) -> RunReport | None:
    layout = config.layout
    dest = config.destinations[dest_id]
    replay_dir = layout.failed / "replay"
    pending = sorted(replay_dir.glob(f"replaying.dst={dest_id}.*.log"))
    if not pending:
        source = layout.failed_destination(dest_id)
        if not source.exists() or source.stat().st_size == 0:
            return None
        stamp = utc_now().strftime("%Y-%m-%dT%H-%M-%S.%f")
        pending = [replay_dir / f"replaying.dst={dest_id}.{stamp}.log"]
        move(source, pending[0])
    replaying = pending[0]
    stamp = replaying.name.removeprefix(f"replaying.dst={dest_id}.").removesuffix(".log")
    run_id = f"replay-{dest_id}-{stamp}"
    report = RunReport(run_id, (replaying.name,), resumed=(layout.tmp / run_id).exists())
    events_file = layout.tmp / run_id / "events.log"
    if not events_file.exists():
        _extract_events(replaying, events_file)
    state = open_state(config)
    only = config.model_copy(update={"destinations": {dest_id: dest}})
    try:
        _run_job(spark, only, run_id, {dest_id: (replaying.name,)}, [str(events_file)], state,
                 report)  # fmt: skip
    except Exception as exc:
        if not caused_by_data(exc):
            raise
        # Raised the first time (the replay resumes when run again); then isolated.
        isolation = Isolation(spark, only, run_id, dest_id, state, report)
        if isolation.after(exc, (replaying.name,), [events_file]):
            raise
    archived = layout.archive / stamp[:10] / f"replayed.dst={dest_id}.{stamp}.log.gz"
    compress([replaying], archived)
    report.archived = [archived]
    shutil.rmtree(layout.tmp / run_id, ignore_errors=True)
    return report


@dataclass(frozen=True)
class Preview:
    """One event as a destination would receive it (``eventpipe log show
    --destination``)."""

    table: str | None
    """Its table; None: it would fail (``error``); "": skipped (empty table name);
    FILTERED: dropped by the destination's namespace or transforms."""
    error: str | None
    columns: dict[str, object]
    """Its flat columns that have a value."""


def preview(config: Config, spark: SparkSession, dest_id: str, lines: list[bytes]) -> list[Preview]:
    """``lines`` of the log through every step of ``dest_id`` before its tables are
    typed (keys, table name, lookups, mapping, flattening, explicit casts); nothing is
    loaded or recorded. One Preview per line, in order."""
    import tempfile

    import orjson

    def is_event(line: bytes) -> bool:
        try:
            return isinstance(orjson.loads(line), dict)
        except orjson.JSONDecodeError:
            return False

    valid = [is_event(line) for line in lines]
    only = config.model_copy(update={"destinations": {dest_id: config.destinations[dest_id]}})
    lookups = Lookups.plan(only)
    rows: list[dict[str, Any]] = []
    config.layout.tmp.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="preview-", dir=config.layout.tmp) as tmp:
        path = Path(tmp) / "events.log"
        path.write_bytes(
            b"".join(line.strip() + b"\n" for line, ok in zip(lines, valid, strict=True) if ok)
        )
        if any(valid):
            run_id = Path(tmp).name
            events = _stage_events(spark, only, run_id, [str(path)], lookups, staged=False)
            target = _Target(dest_id, only.destinations[dest_id], (), None, SchemaCache())
            run = _Run(run_id, (), only, open_state(config), RunReport(run_id, (), False),
                       events, lookups, (str(path),), _catalogues(only))  # fmt: skip
            ids = sorted(r[ROW] for r in events.select(ROW).collect())  # in the file's order
            flat = {r[ROW]: r.asDict() for r in _flatten_for(events, run, target).frame.collect()}
            rows = [flat.get(i, {}) for i in ids]
    out: list[Preview] = []
    events_in_order = iter(rows)
    for ok in valid:
        if not ok:
            out.append(Preview(None, "line is not a JSON object", {}))
        elif not (row := next(events_in_order)):
            out.append(Preview(None, f"not for {dest_id}: its key is not in only_keys", {}))
        elif row[TABLE] == FILTERED:
            out.append(Preview(FILTERED, None, {}))
        else:
            values = {
                k: v for k, v in row.items() if k not in (TABLE, ERROR, ROW) and v is not None
            }
            out.append(Preview(row[TABLE], row[ERROR], values))
    return out


def _extract_events(failed_file: Path, out: Path) -> None:
    """The ``event`` of each EventError line, one JSON object per line. Lines without one
    (edited by hand) are counted in the log and stay in the archived failed file."""
    import orjson

    unusable = 0
    with failed_file.open("rb") as source, replacing(out) as sink:
        for line in source:
            try:
                event = orjson.loads(line).get("event")
            except (orjson.JSONDecodeError, AttributeError):
                event = None
            if isinstance(event, dict):
                sink.write(orjson.dumps(event, option=orjson.OPT_APPEND_NEWLINE))
            elif line.strip():
                unusable += 1
    if unusable:
        log.warning("%s: %d line(s) hold no event to replay; kept in the archived file",
                    failed_file.name, unusable)  # fmt: skip


def _ref(name: str) -> Column:
    return reference((name,))


@dataclass(frozen=True)
class LookupRule:
    name: str
    source: tuple[str, ...]
    target: tuple[str, ...]
    destinations: frozenset[str] | None
    """The destinations it belongs to; None: seed 1's implicit rule, for browser events
    of every destination."""

    @property
    def column(self) -> str:
        """Where the read pass keeps its results; rules reading the same field share it
        (an implicit rule's column has browser events' results only)."""
        scope = "browser_" if self.destinations is None else ""
        return f"{LOOKUP}{scope}{self.name}_{pointer(self.source)}"


@dataclass(frozen=True)
class Lookups:
    """Every lookup rule of a run, each distinct (rule, source) computed once, in the read
    pass, into a column of its own; destinations then place the results (``set_path``)."""

    database: str
    rules: tuple[LookupRule, ...]
    """Implicit rules first, then each destination's in its configured order."""

    @classmethod
    def plan(cls, config: Config) -> Lookups:
        database = str(config.enrichment.ip_database or lookup.default_ip_database())
        rules: list[LookupRule] = []
        if config.enrichment.browser_rules:
            rules += [LookupRule(name, src, dst, None) for name, src, dst in IMPLICIT_RULES]
        for dest_id, dest in config.destinations.items():
            for rule in dest.enrichment:
                src = parse_pointer(rule.source, where="enrichment.from")
                dst = parse_pointer(rule.to, where="enrichment.to")
                rules.append(LookupRule(rule.name, src, dst, frozenset({dest_id})))
        if any(rule.name == "ip_lookup" for rule in rules):
            lookup.check_ip_database(database)  # a bad path: a config error, not a failed run
        return cls(database, tuple(rules))

    def computed(self, schema: StructType) -> dict[str, Column]:
        """The lookup columns a batch with ``schema`` gets (rules whose source it has).
        Implicit rules look up browser events' values only: server events' are passed as
        null (Spark runs a UDF on every row, whatever condition is around it)."""
        out: dict[str, Column] = {}
        for rule in self.rules:
            ref = column_at(schema, rule.source)
            if ref is not None and rule.column not in out:
                function = lookup.rule_function(rule.name, self.database)
                value = ref.cast("string")
                if rule.destinations is None:
                    value = F.when(_browser(schema), value)
                out[rule.column] = function(value)
        return out

    def for_destination(self, dest_id: str) -> list[LookupRule]:
        """The rules one destination applies, in order."""
        return [r for r in self.rules if r.destinations is None or dest_id in r.destinations]

    def text_columns(self, dest_id: str) -> set[str]:
        """The flattened columns of text fields a destination's lookups write."""
        return {
            column_name((*rule.target, field))
            for rule in self.for_destination(dest_id)
            for field in lookup.TEXT_FIELDS[rule.name]
        }


# Seed 1: applied to every browser event.
IMPLICIT_RULES = (
    ("ip_lookup", ("source_ip",), ("eventn_ctx", "location")),
    ("user_agent_parse", ("eventn_ctx", "user_agent"), ("eventn_ctx", "parsed_ua")),
)


def _stage_events(
    spark: SparkSession,
    config: Config,
    run_id: str,
    paths: Sequence[str],
    lookups: Lookups,
    *,
    staged: bool = True,
    by_segment: bool = False,
    days: Sequence[str] | None = None,
) -> DataFrame:
    """Read the run's segments once (Spark's JSON reader) into Parquet under tmp/<run>/.

    Everything after reads this columnar copy: each row gets a fixed id (failed rows find
    their original event by it), lookups run here once for all destinations, and an
    interrupted run resumes from it without parsing JSON again. Nothing is cached in
    memory, so memory stays bounded whatever the batch size.

    Not ``staged`` (a stream's micro-batch, a few thousand lines): the JSON is read where
    it is, by each step that needs it, which costs less than a copy (0.25 s of a 1 s
    micro-batch). Row ids stay fixed (the same files split the same way), and a replayed
    micro-batch reads its lines again anyway. Lines Spark cannot parse still get a copy:
    Spark refuses queries on the corrupt-record column of raw JSON.

    ``by_segment``: each row keeps its segment's name (SEGMENT), for destinations that
    take only some of the run's segments. ``days``: only the events of these UTC days
    (by ``_timestamp``, read as the pipeline reads it), before any lookup (a reprocess).
    """
    layout = config.layout
    out = layout.tmp / run_id / "events"
    if not (out / "_SUCCESS").exists():
        with _step(f"infer the schema of {len(paths)} segment(s)"):
            raw = read_events(spark, paths, by_segment=by_segment)
        if days is not None:
            raw = raw.filter(_day_of(raw.schema).isin(list(days)))
        extra: dict[str, Column] = {ROW: F.monotonically_increasing_id()}
        extra.update(lookups.computed(raw.schema))
        if not staged and CORRUPT not in raw.columns:
            return raw.withColumns(extra)
        with _step(f"read {len(paths)} segment(s) and look up"):
            _staging_writer(raw.withColumns(extra)).parquet(str(out))
    return spark.read.parquet(str(out))


def read_events(
    spark: SparkSession,
    paths: Sequence[str],
    *,
    schema: StructType | None = None,
    by_segment: bool = False,
) -> DataFrame:
    """The events of the log files ``paths`` as Spark's JSON reader reads them (with
    ``schema``, the events' schema as this function returned it before; else inferred).

    Top-level keys that look like eventpipe's own names are escaped
    (:func:`eventpipe.reserved.escape`), so the job's columns can never meet an event's.
    Lines that are not JSON objects have their text in CORRUPT and their file in FILE.
    ``by_segment``: each row's segment name in SEGMENT.
    """
    from pyspark.sql.types import StringType, StructField, StructType

    # Spark's reader matches its corrupt-record column against every line's keys (an
    # event with that key as a number failed every run): a name no event can know.
    corrupt = reserved.unguessable(CORRUPT)

    def reader() -> DataFrameReader:
        options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": corrupt}
        return spark.read.options(**options)

    if schema is None:
        inferred = reader().json(list(paths)).schema
        if not has_arrays(inferred):
            schema = inferred
        else:  # read again with arrays as the JSON text they were sent as
            schema = cast("StructType", json_text_arrays(inferred))
    else:
        fields = [
            StructField(reserved.unescape(f.name), f.dataType, f.nullable, f.metadata)
            for f in schema.fields
            if f.name not in (CORRUPT, FILE, SEGMENT)
        ]
        if CORRUPT in schema.fieldNames():
            fields.append(StructField(corrupt, StringType()))
        schema = StructType(fields)
    raw = reader().schema(schema).json(list(paths))
    # Read from the scan itself: an event's own "_metadata" key hides the plain name.
    path = raw.metadataColumn("_metadata").getField("file_path")
    columns = [_ref(c).alias(reserved.escape(c)) for c in raw.columns if c != corrupt]
    if corrupt in raw.columns:
        columns.append(F.col(corrupt).alias(CORRUPT))
        columns.append(F.when(F.col(corrupt).isNotNull(), path).alias(FILE))
    if by_segment:
        columns.append(F.regexp_extract(path, r"([^/]+)$", 1).alias(SEGMENT))
    return raw.select(*columns)


def event_json(frame: DataFrame) -> Column:
    """Each event of a frame from :func:`read_events` as JSON text, under its own keys
    (what a failed/ record keeps, and a replay reads again)."""
    names = {c: reserved.unescape(c) for c in frame.columns if not reserved.is_internal(c)}
    return json_object(frame.schema, names)


def _day_of(schema: StructType) -> Column:
    """Each raw event's UTC day (``yyyy-MM-dd``) by its ``_timestamp`` converted as the
    pipeline converts it (null where it does not convert: such events load nowhere)."""
    if TIMESTAMP not in schema.fieldNames():
        return F.lit(None).cast("string")
    source = schema[TIMESTAMP].dataType
    return F.date_format(cast_to(F.col(TIMESTAMP), DataType.TIMESTAMP, source), "yyyy-MM-dd")


def _of_segments(frame: DataFrame, target: _Target, column: Column) -> DataFrame:
    """The rows of ``frame`` from the target's segments (``column``: the row's segment)."""
    return frame.filter(column.isin(list(target.segments)))


def _browser(schema: StructType) -> Column:
    """Browser events: the collector marks server events ``src: "api"`` (if absent)."""
    if "src" not in schema.fieldNames():
        return F.lit(True)
    return F.col("src").isNull() | (F.col("src").cast("string") != F.lit("api"))


def _multiplexed(frame: DataFrame, dest: DestinationConfig) -> DataFrame:
    """The events of the destination's keys (``only_keys``; absent: all)."""
    if dest.only_keys is None:
        return frame
    return frame.filter(F.col("api_key").isin(list(dest.only_keys)))


@dataclass(frozen=True)
class _Flattened:
    """A destination's events as its tables take them (before typing per table)."""

    frame: DataFrame
    """The flat columns, explicit casts done, with TABLE (null: failed, ERROR says why;
    empty: skipped) and ROW."""
    flat: Flat
    event_schema: StructType
    """The events' schema as read (the destination's, before its lookups)."""
    name: Column
    """Each event's table name (an expression over the events as read)."""


def _flatten_for(events: DataFrame, run: _Run, target: _Target) -> _Flattened:
    """Multiplex, name the tables, place the lookups, map, flatten, cast: every step
    before the tables are typed and loaded."""
    dest_id, dest = target.id, target.config
    frame = events
    if CORRUPT in frame.columns:
        frame = frame.filter(F.col(CORRUPT).isNull())
    frame = _multiplexed(frame, dest)
    if SEGMENT in frame.columns:
        frame = _of_segments(frame, target, F.col(SEGMENT))
    lookup_columns = [c for c in frame.columns if c.startswith(LOOKUP)]
    event_schema = frame.drop(*lookup_columns, ROW, FILE, CORRUPT, SEGMENT).schema
    template = Template.parse(dest.table_name_template)
    text, error = render(template, event_schema)
    if template.literal is not None:
        name = F.lit(table_name(template.literal))
    else:
        with _step(f"{dest_id}: table names"):
            name = table_names(frame, text)
    frame = frame.withColumn(TABLE, F.when(error.isNull(), name)).withColumn(ERROR, error)
    browser = _browser(event_schema)
    for rule in run.lookups.for_destination(dest_id):
        if rule.column in frame.columns:
            condition = browser if rule.destinations is None else None
            frame = set_path(frame, rule.target, F.col(rule.column), condition)
    frame = frame.drop(*lookup_columns, FILE, CORRUPT, SEGMENT)
    frame = transforms.apply(frame, dest_id, dest)
    if dest.metering is not None:
        cutoff = dest.metering.window_start(run.started)
        arrival = run.started.strftime("%Y%m%d%H%M%S%f")
        frame = metering.route(frame, dest.metering, run.catalogues[dest_id], cutoff, arrival)
    flat = flatten_mapped(
        frame, passthrough=(TABLE, ERROR, ROW), mapping=Mapping.from_config(dest.mappings)
    )
    return _Flattened(_cast_explicit(flat.frame, flat.explicit), flat, event_schema, name)


def _process_destination(events: DataFrame, run: _Run, target: _Target) -> None:
    dest_id, report = target.id, run.report
    flattened = _flatten_for(events, run, target)
    cast, flat = flattened.frame, flattened.flat
    columns = [c for c in cast.columns if c not in (TABLE, ERROR, ROW)]
    where = run.layout.tmp / run.run_id / f"dst={dest_id}"
    staged, counts = _stage_flat(cast, where)
    report.skipped[dest_id] = counts["skipped"]
    report.filtered[dest_id] = counts.get("filtered", 0)  # a resumed run's older counts
    report.failed[dest_id] = 0
    if counts["failed"]:
        _fail_once(cast.filter(F.col(ERROR).isNotNull()), run, dest_id, "processing",
                   table=None, stage=Stage.PROCESSING)  # fmt: skip
    if target.destination is None:
        _send(staged, columns, where, run, target)
    else:
        _load_tables(staged, counts, where, columns, flat, flattened.event_schema,
                     flattened.name, run, target)  # fmt: skip
        if (metered := target.config.metering) is not None:
            report.replaced[dest_id] = _keep_newest(target.destination, metered, run.started)
    if run.rebuild is None:  # a reprocess records its days when it swaps them in
        days = sorted(counts.get("days") or ())
        run.state.record_days(dest_id, days, code_version(run.config, dest_id), run.run_id)
    run.state.record(target.segments, dest_id, ALL_TABLES, ok=True, run_id=run.run_id)
    run.state.record_destination_run(
        run.run_id,
        dest_id,
        skipped=report.skipped[dest_id],
        failed=report.failed[dest_id],
        filtered=report.filtered[dest_id],
    )


def _keep_newest(destination: Destination, metered: MeteringConfig, started: datetime) -> int:
    """Metering: of each key in the window, only the newest version's rows stay, across
    the destination's two tables; returns the rows removed. The columns it compares by
    are added where a batch left them out (all null: an event with no time is before
    every window)."""
    tables = (metered.table, metered.unclassified_table)
    wanted = {
        metering.KEY: DataType.STRING,
        metering.ORDER_AT: DataType.TIMESTAMP,
        metering.WINDOW_AT: DataType.TIMESTAMP,
        metering.ARRIVAL: DataType.STRING,
    }
    for table in tables:
        if (current := destination.describe(table)) is not None:
            destination.patch(diff(current, Table(table, wanted)))
    with _step(f"{destination.id}: keep each key's newest version"):
        removed = cast("Metered", destination).keep_newest(tables, metered.window_start(started))
    log.info("%s: %d row(s) of older versions removed", destination.id, removed)
    return removed


def _load_tables(
    staged: DataFrame,
    counts: dict[str, int],
    where: Path,
    columns: list[str],
    flat: Flat,
    event_schema: StructType,
    name: Column,
    run: _Run,
    target: _Target,
) -> None:
    """Type the destination's staged rows per table, then patch and load each table."""
    dest_id = target.id
    assert target.destination is not None
    with _step(f"{dest_id}: type {len(columns)} column(s)"):
        batch = staged_column_types(
            where / "flat", staged, TABLE, columns, known_text=run.lookups.text_columns(dest_id)
        )  # fmt: skip
    if batch.mixed:
        with _step(f"{dest_id}: bool/number mixes in {len(batch.mixed)} table(s)"):
            _type_mixes(batch, run, target, event_schema, name)
    pending = [
        (table, types)
        for table, types in sorted(batch.types.items())
        if not run.state.table_ok(target.segments, dest_id, table)  # else loaded by an earlier try
    ]

    def load(item: tuple[str, dict[str, DataType]]) -> int:
        table, types = item
        shutdown.check(f"the load of {dest_id}.{table}")
        return _load_table(_staged_table(staged, where, table), run, target, types, flat)

    # Tables are independent batches: a destination that takes loads in parallel gets
    # them on that many threads (their Spark work and their connections). The state
    # store is written here, in order, by this thread only.
    parallel = target.destination.parallel_loads
    tables = f"{dest_id}: {len(pending)} table(s) on {parallel} thread(s)"
    if run.ahead is not None:
        run.ahead.begin()
    with _step(tables), ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        for (table, _), rows in zip(pending, pool.map(load, pending), strict=True):
            run.state.record(target.segments, dest_id, table, ok=True, rows=rows,
                             run_id=run.run_id)  # fmt: skip


def _send(staged: DataFrame, columns: list[str], where: Path, run: _Run, target: _Target) -> None:
    """Deliver the destination's staged rows to its HTTP API (destinations/http.py), on
    Spark: rows partitioned by session key, so that a task owns each session (one request
    in flight per session, in order, on a cluster too). Events that could not be
    delivered go to failed/ with the API's answer. Progress records go to
    ``where``/sent (the destination's directory of the run)."""
    from eventpipe.destinations.http import HttpSettings, Progress

    dest_id, dest = target.id, target.config
    if run.state.table_ok(target.segments, dest_id, SENT_TABLE):
        return  # sent by an earlier try of this run
    present = set(columns)
    group = [c for c in (_group_column(g) for g in dest.group_by) if c in present]
    attrs = [c for c in columns if c not in group]
    spark = staged.sparkSession
    tasks = max(1, spark.sparkContext.defaultParallelism)
    ts = (
        F.unix_micros(F.col("_timestamp").cast("timestamp")) * F.lit(1000)
        if "_timestamp" in present
        else F.lit(None).cast("long")
    )
    info = F.to_json(F.struct(*(_ref(c) for c in group))) if group else F.lit("{}")
    key = F.concat_ws("\x1f", *(F.coalesce(_ref(c).cast("string"), F.lit("")) for c in group))
    rows = (
        staged.select(
            F.col(ROW).alias("row"),
            key.alias("key"),
            info.alias("info"),
            ts.alias("ts"),
            F.to_json(F.struct(*(_ref(c) for c in attrs))).alias("attrs"),
        )
        .repartition(tasks, "key")
        # Log order: a task's sessions fill side by side, their requests overlap.
        .sortWithinPartitions("row")
    )
    progress = where / "sent"
    hold = min(HOLD_SECONDS, dest.retry_max_elapsed_seconds)
    settings = HttpSettings(
        destination=dest_id, url=str(dest.url), headers=dict(dest.headers), format=dest.format,
        max_payload_bytes=dest.max_payload_bytes, max_lifetime_seconds=dest.max_lifetime_seconds,
        parallel=max(1, dest.max_parallel_requests // tasks),
        retry_initial_seconds=dest.retry_initial_seconds,
        retry_max_seconds=dest.retry_max_seconds,
        retry_max_elapsed_seconds=dest.retry_max_elapsed_seconds,
        max_buffer_bytes=dest.max_buffer_bytes, gzip=dest.gzip, progress=str(progress),
        run=run.run_id, hold_seconds=hold,
    )  # fmt: skip
    give_up_at: float | None = None
    backoff: Backoff | None = None
    stats: dict[str, float] = {}
    with _step(f"{dest_id}: send"):
        while True:
            shutdown.check(f"sending to {dest_id}")
            attempt = _send_attempt(rows, settings)
            _add_stats(stats, attempt)
            if not attempt["unsent"]:
                break
            # The API keeps failing: wait here, where no Spark slot is held, then send
            # what is left (progress records skip what was delivered).
            if give_up_at is None or backoff is None:  # from the failing request's first try
                give_up_at = time.time() - hold + dest.retry_max_elapsed_seconds
                settings = replace(settings, give_up_at=give_up_at)
                backoff = Backoff(dest.retry_initial_seconds, dest.retry_max_seconds,
                                  deadline=give_up_at)  # fmt: skip
            # Past the deadline: one last attempt at it, where the tasks give up.
            wait = backoff.wait(attempt["retry_after"])
            if wait is None:
                wait = max(0.0, give_up_at - time.time())
            log.warning("%s: %d event(s) wait for the API; sending again in %.1f s", dest_id,
                        attempt["unsent"], wait)  # fmt: skip
            run.pause(wait)
    # What was delivered and what failed, by this attempt and any earlier one of the run.
    totals = Progress(progress).totals()
    if totals.failed:
        frame = spark.createDataFrame([(f.row, f.error) for f in totals.failed],
                                      f"{ROW} long, {ERROR} string")  # fmt: skip
        _fail_once(frame, run, dest_id, "sent", table=None, stage=Stage.SENDING)
    run.report.loaded[(dest_id, SENT_TABLE)] = totals.delivered
    log.info(
        "%s: %d event(s) in %d request(s) (mean payload %.0f bytes), %d failed, %d possible "
        "duplicate(s); by this process: %d trimmed, %d retries, %d skipped as sent before, "
        "at most %d event bytes held by a task", dest_id, totals.delivered, totals.requests,
        totals.payload_bytes / max(totals.requests, 1), len(totals.failed),
        totals.possible_duplicates, stats.get("trimmed", 0), stats.get("retries", 0),
        stats.get("already_sent", 0), stats.get("peak_buffered_bytes", 0),
    )  # fmt: skip
    run.state.record(target.segments, dest_id, SENT_TABLE, ok=True, rows=totals.delivered,
                     run_id=run.run_id)  # fmt: skip


HOLD_SECONDS = 5.0
"""How long a Spark task retries a failing request before it hands the session back to
the driver, which waits without holding a slot (others' jobs need the cores)."""
_PEAKS = frozenset({"peak_buffered_bytes", "retry_after"})
"""Stats whose total over tasks and attempts is the largest, not the sum."""


def _send_attempt(rows: DataFrame, settings: HttpSettings) -> dict[str, float]:
    """One Spark job delivering ``rows``; the stats of its tasks, added up."""
    import orjson

    from eventpipe.destinations.http import deliver_batches

    outputs = rows.mapInArrow(
        lambda batches: deliver_batches(settings, batches), "stats string"
    ).collect()
    total: dict[str, float] = {}
    for output in outputs:
        _add_stats(total, orjson.loads(output["stats"]))
    return total


def _add_stats(total: dict[str, float], more: dict[str, float]) -> None:
    for name, value in more.items():
        before = total.get(name, 0)
        total[name] = max(before, value) if name in _PEAKS else before + value


def _group_column(field: str) -> str:
    """A ``group_by`` entry as its flattened column: ``a.b`` -> ``a_b``."""
    return column_name(tuple(field.split(".")))


def _type_mixes(
    batch: StagedTypes, run: _Run, target: _Target, schema: StructType, name: Column
) -> None:
    """Type the text columns that may be JSON bools mixed with numbers exactly.

    Spark reads such a mix as text (``"true"``, ``"1"``), and so it reads ``"1"`` sent as
    a string. For these few columns the run's files are read again with their fields
    declared VARIANT, which keeps each value's token kind, and the tables' types of those
    columns follow the lattice (inference.token_types). ``name`` gives each row its table.
    """
    from pyspark.sql.types import StringType, VariantType

    dest = target.config
    mapping = Mapping.from_config(dest.mappings)
    mapped, _ = mapping.apply(leaves(schema))
    sources = {
        column_name(leaf.path): leaf.source
        for leaf in mapped
        if leaf.source is not None and isinstance(leaf.spark_type, StringType)
    }
    wanted = {c for columns in batch.mixed.values() for c in columns if c in sources}
    if not wanted:
        return
    probe = schema
    for column in wanted:
        probe = with_type_at(probe, sources[column], VariantType())
    by_segment = target.segments != run.segments
    spark = run.originals.sparkSession
    frame = _multiplexed(read_events(spark, run.paths, schema=probe, by_segment=by_segment), dest)
    if by_segment:
        frame = _of_segments(frame, target, F.col(SEGMENT))
    frame = frame.drop(CORRUPT, FILE, SEGMENT).withColumn(TABLE, name)
    flat = flatten_mapped(frame, passthrough=(TABLE,), mapping=mapping).frame
    found = token_types(flat.select(TABLE, *(_ref(c) for c in sorted(wanted))), TABLE, wanted)
    for table, columns in batch.mixed.items():
        for column in columns & wanted:
            if column in found.get(table, {}):
                batch.types[table][column] = found[table][column]


def _stage_flat(flat: DataFrame, where: Path) -> tuple[DataFrame, dict[str, Any]]:
    """The destination's flattened rows, written once as Parquet partitioned by table
    (Spark's own types), and the counts of rows skipped (empty table name), filtered (by
    the namespace or transforms) and failed (template error, transform error) and the
    days of the rows (``days``), observed during that write.

    Each table then reads only its own partition; a resumed run reuses the files.
    """
    out, counts_file = where / "flat", where / "counts.json"
    if not (out / "_SUCCESS").exists() or not counts_file.exists():
        observed = Observation("counts")
        table = F.col(TABLE)
        # The UTC days of the rows that go to a table, seen during the write (no pass of
        # its own): what each day's rows were built with is recorded (day_versions).
        types = {f.name: f.dataType for f in flat.schema.fields}
        stamped = isinstance(types.get(TIMESTAMP), TimestampType)
        day = F.date_format(F.col(TIMESTAMP), "yyyy-MM-dd") if stamped else F.lit(None)
        loaded = table.isNotNull() & (table != F.lit("")) & (table != F.lit(FILTERED))
        with _step(f"{where.name}: enrich, map, flatten and stage"):
            flat_rows = flat.observe(
                observed,
                F.count_if(table == F.lit("")).alias("skipped"),
                F.count_if(table == F.lit(FILTERED)).alias("filtered"),
                F.count_if(table.isNull()).alias("failed"),
                F.collect_set(F.when(loaded, day)).alias("days"),
            )
            kept = flat_rows.filter((table != F.lit("")) & (table != F.lit(FILTERED)))
            _staging_writer(kept.drop(ERROR)).partitionBy(TABLE).parquet(str(out))
        write_file(counts_file, json.dumps(observed.get))
    counts: dict[str, Any] = json.loads(counts_file.read_text())
    spark = flat.sparkSession
    if not any(out.glob(f"{TABLE}=*")):
        return spark.createDataFrame([], flat.drop(ERROR).schema), counts
    return spark.read.parquet(str(out)), counts


def _staging_writer(frame: DataFrame) -> DataFrameWriter:
    """How the run's own Parquet copies are written (read back by the run, then removed).

    Without dictionary encoding: on the batch benchmark's staging write (1M events, five
    tables), dictionaries took 6.1-7.4 s against 4.2-4.7 s without, whatever the codec
    (snappy, none, lz4_raw, zstd). The copies are read once or twice and deleted; a
    Parquet destination's files (kept by users) keep Spark's defaults.
    """
    return frame.write.mode("overwrite").option("parquet.enable.dictionary", "false")


def _cast_explicit(frame: DataFrame, explicit: dict[str, DataType]) -> DataFrame:
    """Explicitly typed columns (mapping casts, seed 1's implicit casts) converted before
    staging, so that their staged values already have the type they load with. An event
    with a value that does not convert fails (ERROR names the column; no table)."""
    spark_types = {f.name: f.dataType for f in frame.schema.fields}
    to_cast = {
        c: t for c, t in explicit.items() if c in spark_types and spark_types[c] != SPARK_TYPES[t]
    }
    if not to_cast:
        return frame
    converted = {c: cast_to(_ref(c), t, spark_types[c]) for c, t in to_cast.items()}
    problems = [conversion_problem(_ref(c), c, t, converted[c]) for c, t in to_cast.items()]
    error = F.coalesce(F.col(ERROR), F.nullif(F.concat_ws("; ", *problems), F.lit("")))
    # One projection: every expression reads the values before conversion.
    return frame.withColumns(
        {**converted, ERROR: error, TABLE: F.when(error.isNull(), F.col(TABLE))}
    )


@dataclass(frozen=True)
class _StagedTable:
    name: str
    frame: DataFrame
    files: tuple[Path, ...]
    """Its partition's Parquet files, with every column of the destination's batch."""


def _staged_table(staged: DataFrame, where: Path, table: str) -> _StagedTable:
    """One table's rows of the staged frame (Spark reads only its partition)."""
    files = tuple(sorted((where / "flat" / f"{TABLE}={table}").glob("*.parquet")))
    return _StagedTable(table, staged.filter(F.col(TABLE) == F.lit(table)).drop(TABLE), files)


class _StaleSchema(Exception):
    """A load failed with a table schema kept in memory: read it again, retry once."""


def _load_table(
    staged: _StagedTable,
    run: _Run,
    target: _Target,
    batch_types: dict[str, DataType],
    flat: Flat,
) -> int:
    """Convert, patch and load one table; rows that fail go to failed/. When the load
    fails with the schema from memory (a stream's), the table's schema is read from the
    destination and the load retried once."""
    assert target.destination is not None  # a table destination
    described = target.schemas.describe(target.destination, staged.name)
    try:
        return _load_table_as(staged, run, target, batch_types, flat, described.table,
                              retry_stale=described.cached)  # fmt: skip
    except _StaleSchema as stale:
        log.warning("%s.%s: load failed with the schema kept in memory (%s); read again, "
                    "retrying once", target.id, staged.name, stale)  # fmt: skip
        target.schemas.forget(staged.name)
        fresh = target.schemas.describe(target.destination, staged.name)
        return _load_table_as(staged, run, target, batch_types, flat, fresh.table,
                              retry_stale=False)  # fmt: skip


def _load_table_as(
    staged: _StagedTable,
    run: _Run,
    target: _Target,
    batch_types: dict[str, DataType],
    flat: Flat,
    existing: Table | None,
    *,
    retry_stale: bool,
) -> int:
    """``_load_table`` for the table as ``existing``; raises _StaleSchema when
    ``retry_stale`` and the load fails (nothing written to failed/ yet)."""
    dest_id, dest = target.id, target.config
    layout, run_id = run.layout, run.run_id
    table, frame = staged.name, staged.frame

    wanted = {c: flat.explicit.get(c, t) for c, t in batch_types.items()}
    kept, overflow = _within_max_columns(wanted, existing, dest.max_columns, flat.explicit)
    targets = {c: (existing.columns.get(c, t) if existing else t) for c, t in kept.items()}
    spark_types = {f.name: f.dataType for f in frame.schema.fields}
    missing_key = [c for c in dest.primary_key if c not in targets]
    if (
        not overflow
        and not missing_key
        and all(spark_types[c] == SPARK_TYPES[t] for c, t in targets.items())
    ):
        # Staged with the types it loads with (the common case): the partition's own files
        # are loaded, without a conversion pass.
        return _load_files(staged, run, target, existing, targets, frame, retry_stale)
    converted = {c: cast_to(_ref(c), targets[c], spark_types[c]) for c in kept}
    if overflow:
        converted[UNMAPPED_COLUMN] = _with_overflow(frame, overflow, flat.pointers)
        targets[UNMAPPED_COLUMN] = DataType.STRING
    # A value that does not convert to its column's type sends its event to failed/,
    # naming the column (schema/diff.py); nothing is silently nulled.
    problems: list[Column] = [
        conversion_problem(_ref(c), c, targets[c], converted[c])
        for c in kept
        if spark_types[c] != SPARK_TYPES[targets[c]]
    ]
    if missing_key:
        problems.append(F.lit(f"primary key column(s) {', '.join(missing_key)} missing"))
    staging = layout.tmp / run_id / f"dst={dest_id}" / f"table={table}"
    ok = checked = staging_rows = frame
    observed = Observation()
    if problems:
        checked = frame.withColumn(ERROR, F.concat_ws("; ", *problems))
        ok = checked.filter(F.col(ERROR) == "")
        # The failed rows are counted during the write: none (the usual case), no pass.
        failing = F.count_if(F.col(ERROR) != "").alias("failed")
        staging_rows = checked.observe(observed, failing).filter(F.col(ERROR) == "")
    with _step(f"{dest_id}.{table}: convert and stage"):
        # With the row ids: rows a destination rejects are found by them (_load_files).
        rows = staging_rows.select(ROW, *(value.alias(c) for c, value in converted.items()))
        _staging_writer(rows).parquet(str(staging))
    files = tuple(sorted(staging.glob("*.parquet")))
    loaded = _load_files(_StagedTable(table, frame, files), run, target, existing, targets, ok,
                         retry_stale)  # fmt: skip
    if problems and observed.get["failed"]:
        # After the load: a load retried with a fresh schema converts them again.
        _fail_once(checked.filter(F.col(ERROR) != ""), run, dest_id, f"table={table}",
                   table=table, stage=Stage.LOADING)  # fmt: skip
    return loaded


def _load_files(
    staged: _StagedTable,
    run: _Run,
    target: _Target,
    existing: Table | None,
    targets: dict[str, DataType],
    ok: DataFrame,
    retry_stale: bool,
) -> int:
    """Patch the table (as ``existing``) for ``targets`` and load ``staged.files``; on a
    terminal error the events of ``ok`` go to failed/ with it (``retry_stale``: raise
    _StaleSchema instead)."""
    dest_id, dest, destination = target.id, target.config, target.destination
    assert destination is not None  # a table destination
    report, run_id, table = run.report, run.run_id, staged.name
    patch = diff(existing, Table(table, targets, dest.primary_key))
    destination.patch(patch)
    if not patch.empty:
        target.schemas.forget(table)  # read again next time: others may have added more
    request = LoadRequest(
        table, f"{run_id}:{dest_id}:{table}", staged.files, targets, dest.primary_key
    )
    parts = Parts(run.layout.tmp / run_id / f"dst={dest_id}" / f"table={table}.parts")
    if parts.started:  # an earlier try of the run was loading it in parts: go on
        return _load_in_parts(parts, request, run, target, ok, parts.error)
    try:
        with _step(f"{dest_id}.{table}: load"):
            result = destination.load(request)
    except TerminalError as exc:
        if retry_stale:
            raise _StaleSchema(exc.message) from exc
        return _load_in_parts(parts, request, run, target, ok, exc.message)
    report.loaded[(dest_id, table)] = result.rows
    log.info("%s.%s: %d rows%s", dest_id, table, result.rows,
             " (already loaded)" if result.already_loaded else "")  # fmt: skip
    if result.rejected:  # rows the destination could not store; the rest loaded
        ids = _row_ids(staged.files)
        rejected = F.broadcast(  # the smaller side of the join with the originals
            ok.sparkSession.createDataFrame(
                [(ids[position], why) for position, why in result.rejected],
                f"{ROW} long, {ERROR} string",
            )
        )
        _fail_once(rejected, run, dest_id, f"table={table}.rejected", table=table,
                   stage=Stage.LOADING)  # fmt: skip
    return result.rows


PART_ROWS = 50_000
"""Rows of the parts a refused load is first split into (each is then halved while it is
refused). Held in memory one at a time, read from the staged Parquet files."""


class PoisonLimitError(TransientError):
    """More events of one load were refused than ``max_poison_events``: the destination
    is taken as broken (a permission, a constraint on every row), not the events."""

    name = "poison_limit"


@dataclass(frozen=True)
class Parts:
    """Where a table's load in parts keeps its part files (and that it started)."""

    root: Path

    @property
    def started(self) -> bool:
        return (self.root / "started").exists()

    @property
    def error(self) -> str:
        """Why the whole batch was refused."""
        return (self.root / "started").read_text()

    def start(self, error: str) -> None:
        write_file(self.root / "started", error)

    def file(self, rows: pa.Table, first: int) -> Path:
        """``rows`` (from position ``first``) as a Parquet file, written once."""
        import pyarrow.parquet as pq

        path = self.root / f"rows-{first:012d}-{rows.num_rows}.parquet"
        if not path.exists():
            with replacing_path(path) as partial:
                pq.write_table(rows, partial)
        return path


def _load_in_parts(
    parts: Parts,
    whole: LoadRequest,
    run: _Run,
    target: _Target,
    ok: DataFrame,
    error: str,
) -> int:
    """Load a batch the destination refused (``error``) in parts, to find the events that
    cause it: the batch is split into parts of PART_ROWS, and a refused part into halves,
    down to single events; those go to failed/ with the destination's reason, the rest
    loads. Each part is a load of its own, idempotent by its batch id (the batch's and
    its rows), so a resumed run goes on where it stopped (``parts`` marks the batch as
    loading in parts: it is never loaded whole again, which could double rows). More
    refused events than ``max_poison_events``: PoisonLimitError (the destination stops).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    dest_id, dest, table = target.id, target.config, whole.table
    destination = target.destination
    assert destination is not None  # a table destination
    if not parts.started:
        log.warning("%s.%s: load refused (%s); loading it in parts to find the events "
                    "that cause it", dest_id, table, error)  # fmt: skip
        parts.start(error)
    loaded, loads = 0, 0
    poison: list[tuple[int, str]] = []

    def attempt(rows: pa.Table, first: int, refused: str | None) -> None:
        nonlocal loaded, loads
        if refused is None:
            shutdown.check(f"a part of {dest_id}.{table}")
            request = replace(whole, batch_id=f"{whole.batch_id}:rows={first}+{rows.num_rows}",
                              files=(parts.file(rows, first),))  # fmt: skip
            loads += 1
            try:
                result = destination.load(request)
            except TerminalError as exc:
                refused = exc.message
            else:
                loaded += result.rows
                ids = rows.column(ROW).to_pylist()
                poison.extend((ids[position], why) for position, why in result.rejected)
                return
        if rows.num_rows == 1:
            poison.append((rows.column(ROW)[0].as_py(), refused))
            if len(poison) > dest.max_poison_events:
                raise PoisonLimitError(
                    f"{table}: more than {dest.max_poison_events} events of one batch "
                    f"refused, the last: {refused}",
                    fix="repair the destination (or raise max_poison_events); the batch "
                    "goes on where it stopped",
                    table=table,
                )
            return
        half = rows.num_rows // 2
        attempt(rows.slice(0, half), first, None)
        attempt(rows.slice(half), first + half, None)

    total = sum(pq.ParquetFile(f).metadata.num_rows for f in whole.files)
    with _step(f"{dest_id}.{table}: load in parts"):
        first = 0
        for file in whole.files:
            for batch in pq.ParquetFile(file).iter_batches(batch_size=PART_ROWS):
                rows = pa.Table.from_batches([batch])
                # A batch that is one part is known refused: split it at once.
                attempt(rows, first, error if rows.num_rows == total else None)
                first += rows.num_rows
    log.warning("%s.%s: %d row(s) loaded in %d part(s); %d event(s) refused -> failed/",
                dest_id, table, loaded, loads, len(poison))  # fmt: skip
    run.report.loaded[(dest_id, table)] = loaded
    if poison:
        # At most max_poison_events rows: broadcast, so that Spark never builds its join
        # on the batch's originals (it did, and ran out of driver memory at 1M events).
        refused = F.broadcast(
            ok.sparkSession.createDataFrame(poison, f"{ROW} long, {ERROR} string")
        )
        _fail_once(refused, run, dest_id, f"table={table}.parts", table=table,
                   stage=Stage.LOADING)  # fmt: skip
    return loaded


def _row_ids(files: Sequence[Path]) -> list[int]:
    """The row id of each row of ``files``, in order (their ``__row`` column)."""
    import pyarrow.parquet as pq

    ids: list[int] = []
    for file in files:
        ids += pq.read_table(file, columns=[ROW]).column(ROW).to_pylist()
    return ids


def _within_max_columns(
    wanted: dict[str, DataType],
    existing: Table | None,
    max_columns: int,
    explicit: dict[str, DataType],
) -> tuple[dict[str, DataType], list[str]]:
    """(columns loaded as columns, columns packed into ``_unmapped_data``).

    The table's existing columns always stay columns. New ones are added while the table
    has room, explicitly typed columns first, then by name; one place is kept for
    ``_unmapped_data`` itself. The choice depends only on names, so every batch agrees.
    """
    present = set(existing.columns) if existing else set()
    new = sorted((c for c in wanted if c not in present and c != UNMAPPED_COLUMN),
                 key=lambda c: (c not in explicit, c))  # fmt: skip
    total = len(present | set(wanted))
    if total <= max_columns:
        return wanted, []
    room = max_columns - len(present) - (0 if UNMAPPED_COLUMN in present else 1)
    overflow = new[max(room, 0) :]
    return {c: t for c, t in wanted.items() if c not in overflow}, overflow


def _with_overflow(frame: DataFrame, overflow: list[str], pointers: dict[str, str]) -> Column:
    """``_unmapped_data`` with the overflow columns added, keyed by their JSON pointers."""
    packed = F.to_json(F.struct(*(_ref(c).alias(pointers.get(c, "/" + c)) for c in overflow)))
    if UNMAPPED_COLUMN not in frame.columns:
        return F.when(packed != F.lit("{}"), packed)
    current = _ref(UNMAPPED_COLUMN)
    # Both are JSON objects with distinct keys (pointers): join their members.
    merged = F.concat(F.expr(f"substring(`{UNMAPPED_COLUMN}`, 1, length(`{UNMAPPED_COLUMN}`) - 1)"),
                      F.lit(","), F.substring(packed, 2, 1 << 30))  # fmt: skip
    return (
        F.when(current.isNull(), F.when(packed != F.lit("{}"), packed))
        .when(packed == F.lit("{}"), current)
        .otherwise(merged)
    )


_COUNTS = threading.Lock()
"""Tables of a destination may load on several threads: shared counts and files change
under this lock."""


def _fail_once(
    frame: DataFrame, run: _Run, dest_id: str, what: str, *, table: str | None, stage: Stage
) -> None:
    """Write the failed events of ``frame`` (with their ERROR) to the destination's
    failed/ file once per run (``what`` names the write), and count them."""
    marker = run.layout.tmp / run.run_id / f"dst={dest_id}" / f"failed.{what}.done"
    count = _once(marker, lambda: _write_failed(frame, run, dest_id, table=table, stage=stage))
    with _COUNTS:
        run.report.failed[dest_id] += count


def _once(marker: Path, write: Callable[[], int]) -> int:
    """``write()`` (which appends failed events and returns how many) once per run: a
    resumed run finds ``marker`` and does not append the same EventErrors again. (A crash
    between the append and the marker still repeats them: a window of one file write.)"""
    if marker.exists():
        return int(marker.read_text())
    count = write()
    write_file(marker, str(count))
    return count


BROADCAST_FAILED = 50_000
"""Failed rows of one write up to which their (row id, error) pairs are broadcast to the
join that finds their events (about 100 bytes each)."""


def _write_failed(
    frame: DataFrame, run: _Run, dest_id: str, *, table: str | None, stage: Stage
) -> int:
    """Append each row's original event as an EventError line to the destination's
    failed/ file (a reprocess: to its own, :func:`rebuild_failures`); returns the count."""
    import orjson

    when = utc_now()
    failing = frame.select(ROW, ERROR)
    # Usually none, or a few: found first, they are the side of the join Spark broadcasts.
    # Left to its estimates, Spark broadcast the originals (all the batch's events as
    # JSON) whenever their Parquet was small on disk, and ran out of memory at 1M events.
    found = failing.limit(BROADCAST_FAILED + 1).collect()
    if not found:
        return 0
    originals = run.originals
    if len(found) <= BROADCAST_FAILED:
        failing = F.broadcast(frame.sparkSession.createDataFrame(found, failing.schema))
    else:  # a mass failure: a sort-merge join, nothing broadcast
        originals = originals.hint("merge")
    with_originals = failing.join(originals, ROW).select(RAW, ERROR, DAY)
    lines = []
    for row in with_originals.toLocalIterator():
        key = orjson.loads(row[0]).get("api_key")
        # The event's JSON as Spark wrote it, not parsed again: orjson would read an
        # integer beyond 64 bits as a float, and a replay would load it rounded.
        lines.append(event_error_line(
            event=orjson.Fragment(row[0]), error=row[1], stage=stage, when=when,
            destination=dest_id, table=table, api_key=key if isinstance(key, str) else None,
            day=row[2],
        ))  # fmt: skip
    if lines:
        failed = (
            rebuild_failures(run.layout, run.run_id, dest_id)
            if run.rebuild
            else run.layout.failed_destination(dest_id)
        )
        _append(failed, b"".join(lines))
    return len(lines)


def rebuild_failures(layout: DataLayout, run_id: str, dest_id: str) -> Path:
    """Where a reprocess run writes its failed events: they replace the failed/ records
    of its days when its rows are swapped in, not before."""
    return layout.tmp / run_id / f"failed.dst={dest_id}.log"


def _fail_corrupt(raw: DataFrame, layout: DataLayout) -> int:
    """Lines Spark could not parse: EventErrors in failed/failed.tok=<key>.log, raw kept."""
    from pyspark.sql import functions as F

    from eventpipe.paths import SegmentName

    rows = raw.filter(F.col(CORRUPT).isNotNull()).select(CORRUPT, FILE)
    by_key: dict[str, list[bytes]] = {}
    when = utc_now()
    for row in rows.toLocalIterator():
        parsed = SegmentName.parse(os.path.basename(row[FILE]))
        key = parsed.key_id if parsed else "unknown"
        by_key.setdefault(key, []).append(
            event_error_line(
                event=None, error="line is not a JSON object", stage=Stage.PROCESSING,
                when=when, api_key=key, raw=row[CORRUPT],
            )
        )  # fmt: skip
    for key, lines in by_key.items():
        _append(layout.failed_receiving(key), b"".join(lines))
    return sum(len(lines) for lines in by_key.values())


def _append(path: Path, data: bytes) -> None:
    with _COUNTS:  # one append at a time from the run's threads
        append_file(path, data)


def compress(sources: Sequence[Path], target: Path) -> None:
    """``sources`` gzipped one after the other into ``target`` (atomically, fsynced), then
    removed."""
    if not any(source.exists() for source in sources):
        return  # done by an earlier attempt
    # Level 3, measured on a 115 MB segment of the batch benchmark: 0.46 s to 12.9% of
    # the size; level 6 took 0.98 s (10.7%), level 9 (Python's default) 3.0 s.
    with replacing(target) as file, gzip.GzipFile(fileobj=file, mode="wb", compresslevel=3) as out:
        for source in sources:
            with source.open("rb") as src:
                shutil.copyfileobj(src, out, 1 << 20)
    for source in sources:
        source.unlink()
