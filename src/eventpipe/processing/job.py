"""The batch job: sealed segments -> typed tables in every batch destination.

    read      Spark's JSON reader over the run's segments; unparseable lines -> failed/
    for each batch destination:
      multiplex   only the events of its keys (only_keys)
      table name  table_name_template as one expression; empty -> skipped, error -> failed/
      flatten     nested objects -> named columns (processing.flatten)
      type        lattice type per table and column (processing.typing)
      per table:  convert to the table's types (values that cannot be -> failed/),
                  stage as Parquet, patch the table under its lock, load atomically
    status    each segment x destination x table recorded; done segments archived

A run's segment list is stored before anything loads (state.store); after a crash the
same run resumes with the same segments and batch ids, and destinations load nothing
twice. Tables already recorded ok for the run are skipped.
"""

from __future__ import annotations

import gzip
import logging
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from eventpipe import locks
from eventpipe.config import Config, DestinationConfig
from eventpipe.destinations.base import Destination, LoadRequest
from eventpipe.destinations.duckdb import DuckDBDestination
from eventpipe.errors import TerminalError, TransientError
from eventpipe.events import Stage, event_error_line, utc_now
from eventpipe.paths import DataLayout
from eventpipe.processing.flatten import CORRUPT_COLUMN, flatten
from eventpipe.processing.template import Template, compile_template
from eventpipe.processing.typing import cast_to, column_types
from eventpipe.schema.diff import Table, diff
from eventpipe.schema.types import DataType
from eventpipe.state.store import ALL_TABLES, StateStore

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger("eventpipe.processing")

TABLE = "__table"
ERROR = "__error"
RAW = "__raw"
FILE = "__file"
ROW = "__row"

# Seed 1's implicit casts: `_timestamp` always, `eventn_ctx/utc_time` (sent by the browser
# SDK) too. Applied to the column whichever source sent the event; a table's existing
# column type still wins, and a value that does not convert sends its event to failed/.
IMPLICIT_CASTS = {"_timestamp": DataType.TIMESTAMP, "eventn_ctx_utc_time": DataType.TIMESTAMP}


@dataclass
class RunReport:
    run_id: str
    segments: tuple[str, ...]
    resumed: bool
    loaded: dict[tuple[str, str], int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)
    corrupt: int = 0
    archived: list[Path] = field(default_factory=list)


@dataclass(frozen=True)
class _Run:
    """What every step of one run shares."""

    run_id: str
    segments: tuple[str, ...]
    config: Config
    state: StateStore
    report: RunReport
    originals: DataFrame
    """(row id, the event's original JSON), computed only for rows that are asked for."""

    @property
    def layout(self) -> DataLayout:
        return self.config.layout


@dataclass(frozen=True)
class _Target:
    """One destination of a run, opened."""

    id: str
    config: DestinationConfig
    destination: Destination


def open_destination(dest_id: str, dest: DestinationConfig, layout: DataLayout) -> Destination:
    return DuckDBDestination(dest_id, dest.path or layout.warehouse, layout.locks)


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
    try:
        fd = locks.acquire(layout.locks / "pipeline.lock")
    except locks.LockHeldError as held:
        raise PipelineBusyError(
            f"another pipeline (pid {held.pid or '?'}) is processing {layout.root}",
            fix="wait for it, or stop it (eventpipe run includes one)",
        ) from None
    try:
        yield
    finally:
        os.close(fd)


def process_once(config: Config, spark: SparkSession, *, trigger: str = "once") -> RunReport | None:
    """Process every sealed segment not yet processed (or finish an interrupted run)."""
    with pipeline_lock(config.layout):
        return _process_once(config, spark, trigger)


def _process_once(config: Config, spark: SparkSession, trigger: str) -> RunReport | None:
    from pyspark.sql import functions as F

    layout = config.layout
    state = StateStore(layout.state)
    run = state.unfinished_run()
    if run is None:
        sealed = [p.name for p in layout.sealed_segments()]
        if not sealed:
            return None
        run = state.begin_run(sealed, trigger)
    report = RunReport(run.run_id, run.segments, run.resumed)
    log.info(
        "%s %s: %d segment(s)", "resuming" if run.resumed else "starting", run.run_id,
        len(run.segments),
    )  # fmt: skip
    paths = [str(layout.incoming / name) for name in run.segments]
    try:
        raw = (
            spark.read.option("mode", "PERMISSIVE")
            .option("columnNameOfCorruptRecord", CORRUPT_COLUMN)
            .json(paths)
            # The file of each line, taken at scan time (a cached frame no longer has it).
            .withColumn(FILE, F.col("_metadata.file_path"))
            # A row id, fixed by the cache: failed rows find their original event by it,
            # so the event's JSON is built for those rows only (measured: building it for
            # every row and caching it cost most of a 1M-event run).
            .withColumn(ROW, F.monotonically_increasing_id())
            .cache()
        )
        with _step(f"read {len(paths)} segment(s)"):
            raw.count()  # materialise the cache once, here, so the step is measured
        if CORRUPT_COLUMN in raw.columns:
            report.corrupt = _fail_corrupt(raw, layout)
            raw = raw.filter(F.col(CORRUPT_COLUMN).isNull()).drop(CORRUPT_COLUMN)
        raw = raw.drop(FILE)
        event_columns = [F.col(f"`{c}`") for c in raw.columns if c != ROW]
        originals = raw.select(ROW, F.to_json(F.struct(*event_columns)).alias(RAW))
        shared = _Run(run.run_id, run.segments, config, state, report, originals)
        for dest_id, dest in config.destinations.items():
            target = _Target(dest_id, dest, open_destination(dest_id, dest, layout))
            _process_destination(raw, shared, target)
        raw.unpersist()
    except BaseException as exc:
        state.finish_run(run.run_id, "interrupted", error=repr(exc)[:2000])
        raise
    done = state.segments_done(run.segments, list(config.destinations))
    report.archived = [_archive(layout, name) for name in done]
    state.finish_run(run.run_id, "done")
    shutil.rmtree(layout.tmp / run.run_id, ignore_errors=True)
    return report


def _process_destination(raw: DataFrame, run: _Run, target: _Target) -> None:
    from pyspark.sql import functions as F

    dest_id, dest, report = target.id, target.config, run.report
    failed_path = run.layout.failed_destination(dest_id)
    frame = raw
    if dest.only_keys is not None:  # multiplex
        frame = frame.filter(F.col("api_key").isin(list(dest.only_keys)))
    name, error = compile_template(Template.parse(dest.table_name_template), raw.schema)
    frame = frame.withColumn(TABLE, name).withColumn(ERROR, error)
    with _step(f"{dest_id}: table names"):
        report.failed[dest_id] = _write_failed(
            frame.filter(F.col(ERROR).isNotNull()), run, failed_path, dest_id, table=None,
            stage=Stage.PROCESSING,
        )  # fmt: skip
        skipped = frame.filter(F.col(ERROR).isNull() & (F.col(TABLE) == "")).count()
        report.skipped[dest_id] = skipped
    good = frame.filter(F.col(ERROR).isNull() & (F.col(TABLE) != "")).drop(ERROR)
    flat = flatten(good, passthrough=(TABLE, ROW)).cache()
    columns = [c for c in flat.columns if c not in (TABLE, ROW)]
    with _step(f"{dest_id}: flatten and type {len(columns)} column(s)"):
        table_types = column_types(flat, TABLE, columns)
    for table, types in sorted(table_types.items()):
        if run.state.table_ok(run.segments, dest_id, table):
            continue  # loaded by the interrupted attempt of this run
        rows = _load_table(flat.filter(F.col(TABLE) == table), run, target, table, types)
        run.state.record(run.segments, dest_id, table, ok=True, rows=rows, run_id=run.run_id)
    flat.unpersist()
    run.state.record(run.segments, dest_id, ALL_TABLES, ok=True, run_id=run.run_id)
    run.state.record_destination_run(
        run.run_id, dest_id, skipped=report.skipped[dest_id], failed=report.failed[dest_id]
    )


def _load_table(
    frame: DataFrame, run: _Run, target: _Target, table: str, batch_types: dict[str, DataType]
) -> int:
    from pyspark.sql import functions as F

    dest_id, dest, destination = target.id, target.config, target.destination
    layout, report, run_id = run.layout, run.report, run.run_id

    missing_key = [c for c in dest.primary_key if c not in batch_types]
    existing = destination.describe(table)
    wanted = {c: IMPLICIT_CASTS.get(c, t) for c, t in batch_types.items()}
    targets = {c: (existing.columns.get(c, t) if existing else t) for c, t in wanted.items()}
    converted = {c: cast_to(F.col(f"`{c}`"), targets[c]) for c in batch_types}
    # A value that does not convert to its column's type sends its event to failed/,
    # naming the column (schema/diff.py); nothing is silently nulled.
    problems: list[Column] = [
        F.when(
            F.col(f"`{c}`").isNotNull() & converted[c].isNull(),
            F.concat(
                F.lit(f"column {c} ({targets[c]}) cannot take "), F.col(f"`{c}`").cast("string")
            ),
        )
        for c in batch_types
        if targets[c] is not batch_types[c]
    ]
    if missing_key:
        problems.append(F.lit(f"primary key column(s) {', '.join(missing_key)} missing"))
    checked = frame.withColumn(ERROR, F.concat_ws("; ", *problems) if problems else F.lit(""))
    failed = _write_failed(
        checked.filter(F.col(ERROR) != ""), run, layout.failed_destination(dest_id), dest_id,
        table=table, stage=Stage.LOADING,
    )  # fmt: skip
    report.failed[dest_id] = report.failed.get(dest_id, 0) + failed
    staging = layout.tmp / run_id / f"dst={dest_id}" / f"table={table}"
    ok = checked.filter(F.col(ERROR) == "").select(*(converted[c].alias(c) for c in targets))
    with _step(f"{dest_id}.{table}: convert and stage"):
        ok.write.mode("overwrite").parquet(str(staging))
    files = tuple(sorted(staging.glob("*.parquet")))
    destination.patch(diff(existing, Table(table, targets, dest.primary_key)))
    try:
        with _step(f"{dest_id}.{table}: load"):
            result = destination.load(
                LoadRequest(table, f"{run_id}:{dest_id}:{table}", files, targets, dest.primary_key)
            )
    except TerminalError as exc:
        report.failed[dest_id] += _write_failed(
            checked.filter(F.col(ERROR) == "").withColumn(ERROR, F.lit(exc.message)), run,
            layout.failed_destination(dest_id), dest_id, table=table, stage=Stage.LOADING,
        )  # fmt: skip
        return 0
    report.loaded[(dest_id, table)] = result.rows
    log.info("%s.%s: %d rows%s", dest_id, table, result.rows,
             " (already loaded)" if result.already_loaded else "")  # fmt: skip
    return result.rows


def _write_failed(
    frame: DataFrame, run: _Run, path: Path, dest_id: str, *, table: str | None, stage: Stage
) -> int:
    """Append each row's original event as an EventError line to ``path``; returns count."""
    import orjson

    when = utc_now()
    with_originals = frame.select(ROW, ERROR).join(run.originals, ROW).select(RAW, ERROR)
    lines = [
        event_error_line(
            event=orjson.loads(row[0]), error=row[1], stage=stage, when=when,
            destination=dest_id, table=table,
        )
        for row in with_originals.toLocalIterator()
    ]  # fmt: skip
    if lines:
        _append(path, b"".join(lines))
    return len(lines)


def _fail_corrupt(raw: DataFrame, layout: DataLayout) -> int:
    """Lines Spark could not parse: EventErrors in failed/failed.tok=<key>.log, raw kept."""
    from pyspark.sql import functions as F

    from eventpipe.paths import SegmentName

    rows = raw.filter(F.col(CORRUPT_COLUMN).isNotNull()).select(CORRUPT_COLUMN, FILE)
    by_key: dict[str, list[bytes]] = {}
    when = utc_now()
    for row in rows.toLocalIterator():
        parsed = SegmentName.parse(os.path.basename(row[FILE]))
        key = parsed.key_id if parsed else "unknown"
        by_key.setdefault(key, []).append(
            event_error_line(
                event=None, error="line is not a JSON object", stage=Stage.PROCESSING,
                when=when, api_key=key, raw=row[CORRUPT_COLUMN],
            )
        )  # fmt: skip
    for key, lines in by_key.items():
        _append(layout.failed_receiving(key), b"".join(lines))
    return sum(len(lines) for lines in by_key.values())


def _append(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())


def _archive(layout: DataLayout, name: str) -> Path:
    """Compress a processed segment into archive/YYYY-MM-DD/ and remove it from incoming/."""
    source = layout.incoming / name
    target = layout.archived_segment(name)
    if not source.exists():
        return target  # archived by an earlier attempt
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    with source.open("rb") as src, gzip.open(partial, "wb") as out:
        shutil.copyfileobj(src, out)
    with partial.open("rb") as written:
        os.fsync(written.fileno())
    os.replace(partial, target)
    source.unlink()
    return target
