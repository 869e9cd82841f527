"""Read and look up: a run's log lines into one frame of events (schema inferred once,
arrays kept as JSON text, internal names escaped), with the lookups every destination
asks for, staged as Parquet with a row id per event."""

from __future__ import annotations

import itertools
import json
import logging
import shutil
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

from pyspark.sql import functions as F
from pyspark.sql import types as T

from eventpipe import reserved
from eventpipe.config import Config
from eventpipe.files import replacing, write_file
from eventpipe.paths import DataLayout
from eventpipe.processing.batch import segment_schemas
from eventpipe.processing.batch.glance import glance
from eventpipe.processing.batch.run import TIMESTAMP, Target, step
from eventpipe.processing.batch.segment_schemas import json_reader
from eventpipe.processing.steps.contracts import MARK_TYPE, mark_type, plan_check
from eventpipe.processing.steps.fields import (
    has_arrays,
    json_object,
    json_text_arrays,
    projected,
    quoted,
)
from eventpipe.processing.steps.lookup import Lookups
from eventpipe.reserved import (
    CHECKED,
    CORRUPT,
    FILE,
    LINE,
    ROW,
    SEGMENT,
    UNCHECKED,
    VERDICT,
)
from eventpipe.schema.casts import cast_to
from eventpipe.schema.types import DataType
from eventpipe.state.store import (
    Part,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, DataFrameReader, DataFrameWriter, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger("eventpipe.processing")


def entry_file(layout: DataLayout, run_id: str, entry: str) -> Path:
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


CHECK_LINES = "check-lines"
"""In a run's directory: some of its events came without a mark made under its plans,
so every attempt checks their lines (the marks of the others are taken)."""


def events_copy(layout: DataLayout, run_id: str) -> Path:
    """Where a run writes its staged copy of its events (whole once ``_SUCCESS`` is in it)."""
    return layout.tmp / run_id / "events"


def stage_events(
    spark: SparkSession,
    config: Config,
    run_id: str,
    paths: Sequence[str],
    lookups: Lookups,
    *,
    staged: bool = True,
    by_segment: bool = False,
    days: Sequence[str] | None = None,
    marks_in_place: bool = False,
    trust_marks: bool = True,
) -> DataFrame:
    """The run's events with their row ids and lookups: read once (Spark's JSON reader)
    into Parquet under tmp/<run>/ when ``staged``, else read where they are.

    ``staged`` (a run whose events several destinations read): every destination reads
    this columnar copy, lookups run once for all of them, and an interrupted run resumes
    from it without parsing JSON again. Nothing is cached in memory, so memory stays
    bounded whatever the batch size.

    Not ``staged`` (one destination, a stream's micro-batch, a small batch): the JSON is
    read where it is, by each step that needs it, which costs less than a copy (on the
    batch benchmark, 1M events into one destination: 1.5 s of 17; 0.25 s of a 1 s
    micro-batch). Row ids stay fixed on every attempt of the run: the files are read in
    a session whose split settings the run recorded (:func:`run_session`). Lines Spark
    cannot parse still get a copy: Spark refuses queries on the corrupt-record column
    of raw JSON.

    The schema is Spark's inference of the files, or, where the service's wait kept one
    for each of the run's segments, those merged (segment_schemas.py: exactly what the
    inference would give, else inferred here), or for a small run, inferred by the driver
    from the lines (glance.py: exactly Spark's, else left to Spark).

    ``by_segment``: each row keeps its segment's name (SEGMENT), for destinations that
    take only some of the run's segments. ``days``: only the events of these UTC days
    (by ``_timestamp``, read as the pipeline reads it), before any lookup (a reprocess).

    With tracking plans, where the events carry the collector's marks (docs/contracts.md)
    their verdicts are read from them, and each event of a planned type without one
    made under the run's plans is flagged in UNCHECKED. Staged, the copy is then looked
    at: where any event is flagged, the events are staged again, those lines checked.
    Not staged (or ``marks_in_place``: a run with one destination, whose copy would only
    have served the verdicts), the events stay where they are, UNCHECKED with them: the
    pass that stages a destination's rows counts the flagged ones (shape.stage_flat),
    and if any, the run starts again, checking lines (:data:`CHECK_LINES`).
    """
    layout = config.layout
    out = events_copy(layout, run_id)
    if not (out / "_SUCCESS").exists():
        # Kept by the service's wait for each segment (none for a scheduler's run).
        kept = segment_schemas.kept_schema(spark, layout, paths)
        how = "merge the kept schemas"
        # A small run's lines read here first: whether any is a browser event, and
        # (none kept) their schema where it can be told exactly without Spark's job.
        glanced = glance(paths, infer=kept is None)
        if kept is None:
            kept = glanced.schema
            how = "infer the schema" if kept is None else "infer the schema in the driver"
        if not staged or marks_in_place:
            spark = run_session(spark, layout.tmp / run_id)
        with_plans = bool(config.contracts.plans)
        trust_marks = trust_marks and not (layout.tmp / run_id / CHECK_LINES).exists()
        with step(f"{how} of {len(paths)} segment(s)"):
            raw = read_events(spark, paths, inferred=kept, by_segment=by_segment,
                              marks=with_plans)  # fmt: skip
        check = plan_check(config, raw.schema) if with_plans else None
        extra: dict[str, Column] = {}
        if check is not None:
            # Marks made under the run's plans stand for the check (read with the events,
            # in Spark alone); only when some event may lack one are the lines read too.
            marks = trust_marks and CHECKED in raw.columns and check.marked(paths)
            if marks:
                extra[UNCHECKED] = check.unchecked(F.col(CHECKED))
                extra[VERDICT] = check.of_marks(F.col(CHECKED))
            else:
                raw = read_events(spark, paths, schema=raw.schema, by_segment=by_segment,
                                  lines=True, marks=True)  # fmt: skip
                mark = F.col(CHECKED) if CHECKED in raw.columns else F.lit(None).cast(MARK_TYPE)
                extra[VERDICT] = F.coalesce(
                    check.of_marks(mark), check.of_lines(F.when(check.unchecked(mark), F.col(LINE)))
                )
        if days is not None:
            raw = raw.filter(day_of(raw.schema).isin(list(days)))
        extra = {ROW: F.monotonically_increasing_id(),
                 **lookups.computed(raw.schema, browser_events=glanced.browser_events),
                 **extra}  # fmt: skip
        in_place = not staged or (marks_in_place and UNCHECKED in extra)
        if in_place and CORRUPT not in raw.columns:
            return raw.withColumns(extra).drop(LINE, CHECKED)
        with step(f"read {len(paths)} segment(s) and look up"):
            staging_writer(raw.withColumns(extra).drop(LINE, CHECKED)).parquet(str(out))
    events = spark.read.parquet(str(out))
    if UNCHECKED not in events.columns:
        return events
    if events.filter(F.col(UNCHECKED)).isEmpty():
        return events.drop(UNCHECKED)
    log.info("run %s: some events came without a mark made under the run's plans; their "
             "lines are read and checked", run_id)  # fmt: skip
    shutil.rmtree(out)
    return stage_events(spark, config, run_id, paths, lookups, staged=staged,
                        by_segment=by_segment, days=days, trust_marks=False)  # fmt: skip


SPLIT_SETTINGS = (
    "spark.sql.files.maxPartitionBytes",
    "spark.sql.files.openCostInBytes",
    "spark.sql.files.minPartitionNum",
    "spark.sql.files.maxPartitionNum",
)
"""What decides how Spark splits a run's files into partitions, besides the files."""

_run_sessions: weakref.WeakKeyDictionary[SparkSession, dict[str, SparkSession]] = (
    weakref.WeakKeyDictionary()
)
"""Per session, its run sessions by their split settings (few: one per cluster size)."""
_run_sessions_lock = threading.Lock()


def run_session(spark: SparkSession, folder: Path) -> SparkSession:
    """The session a run reads its log files in, so that they split into the same
    partitions on every attempt, and each event gets the same row id
    (``monotonically_increasing_id`` numbers rows by partition).

    How Spark splits files depends on the session's settings and on the cluster's cores
    (``minPartitionNum`` defaults to them). The first attempt records its values in
    ``folder``/splits.json; every attempt reads in a session with those values, whatever
    the cluster is when the run resumes. Row ids that changed between attempts would send
    a failed row's neighbour to failed/ in its place.

    With Spark Connect, ``spark`` itself (a Connect session cannot be cloned with its
    settings here): a run that resumes on a server with other settings may number rows
    otherwise.
    """
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        return spark
    record = folder / "splits.json"
    if record.exists():
        splits: dict[str, str] = json.loads(record.read_text())
    else:
        splits = {key: value for key in SPLIT_SETTINGS
                  if (value := spark.conf.get(key, None)) is not None}  # fmt: skip
        if "spark.sql.files.minPartitionNum" not in splits:
            splits["spark.sql.files.minPartitionNum"] = str(
                spark.conf.get("spark.sql.leafNodeDefaultParallelism", None)
                or spark.sparkContext.defaultParallelism
            )
        write_file(record, json.dumps(splits, sort_keys=True))
    key = json.dumps(splits, sort_keys=True)
    with _run_sessions_lock:
        sessions = _run_sessions.setdefault(spark, {})
        session = sessions.get(key)
        if session is None:
            # A new session starts from the context's settings: the ones set on this
            # session since (eventpipe's runtime settings) are copied, then the splits.
            session = spark.newSession()
            for name, value in spark.conf.getAll.items():
                if name not in splits and spark.conf.isModifiable(name):
                    session.conf.set(name, value)
            for name in SPLIT_SETTINGS:  # unset when recorded: Spark's default then
                if name in splits:
                    session.conf.set(name, splits[name])
                else:
                    session.conf.unset(name)
            sessions[key] = session
    return session


def read_events(
    spark: SparkSession,
    paths: Sequence[str],
    *,
    schema: StructType | None = None,
    inferred: StructType | None = None,
    by_segment: bool = False,
    lines: bool = False,
    marks: bool = False,
) -> DataFrame:
    """The events of the log files ``paths`` as Spark's JSON reader reads them (with
    ``schema``, the events' schema as this function returned it before; else with
    ``inferred``, what Spark's inference gives these files (segment_schemas.kept_schema);
    else inferred here).

    Top-level keys that look like eventpipe's own names are escaped
    (:func:`eventpipe.reserved.escape`), so the job's columns can never meet an event's.
    Lines that are not JSON objects have their text in CORRUPT and their file in FILE.
    ``by_segment``: each row's segment name in SEGMENT. ``lines``: each event's line
    too, in LINE (read as text, then parsed by ``from_json``, which parses as the JSON
    reader does; blank lines, which that reader skips, are skipped). ``marks``: the
    collector's mark of each line it checked against its plan in CHECKED (null where
    there is none; no such column where no line has one); else the marks are not read.
    A mark is never an event's field.
    """
    from pyspark.sql.types import StringType, StructField, StructType

    # Spark's reader matches its corrupt-record column against every line's keys (an
    # event with that key as a number failed every run): a name no event can know.
    corrupt = reserved.unguessable(CORRUPT)

    def reader() -> DataFrameReader:
        return json_reader(spark, corrupt)

    if schema is None:
        if inferred is None:
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
    schema = _with_marks(schema, marks)
    # Beside an event's fields while they are read: names no event can know.
    line, meta, event = (reserved.unguessable(n) for n in (LINE, "_eventpipe_meta", "_event"))
    if lines:
        text = spark.read.text(list(paths))
        options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": corrupt}
        raw = (
            text.filter(F.length(F.trim(F.col("value"))) > 0)
            .select(F.from_json(F.col("value"), schema, options).alias(event),
                    F.col("value").alias(line), text.metadataColumn("_metadata").alias(meta))
            .select(f"{event}.*", line, meta)
        )  # fmt: skip
        metadata = F.col(meta)
    else:
        raw = reader().schema(schema).json(list(paths))
        # Read from the scan itself: an event's own "_metadata" key hides the plain name.
        metadata = raw.metadataColumn("_metadata")
    # A URI: the "|" of a writer's segment name comes as %7C.
    path = F.url_decode(metadata.getField("file_path"))
    internal = (corrupt, line, meta, CHECKED)
    # One projection (fields.projected: one call, where one per column cost a tenth of a
    # wide event's micro-batch).
    columns: list[tuple[str, Column | str]] = [
        (reserved.escape(c), quoted(c)) for c in raw.columns if c not in internal
    ]
    if corrupt in raw.columns:
        columns.append((CORRUPT, quoted(corrupt)))
        columns.append((FILE, F.when(F.col(corrupt).isNotNull(), path)))
    if by_segment:
        columns.append((SEGMENT, F.regexp_extract(path, r"([^/]+)$", 1)))
    if lines:
        columns.append((LINE, quoted(line)))
    if marks and CHECKED in raw.columns:
        columns.append((CHECKED, quoted(CHECKED)))
    return projected(raw, columns)


def _with_marks(schema: StructType, marks: bool) -> StructType:
    """``schema`` with the lines' marks read as MARK_TYPE (``marks``), else not read."""
    from pyspark.sql.types import StructField, StructType

    if CHECKED not in schema.fieldNames():
        return schema
    fields = [f for f in schema.fields if f.name != CHECKED]
    if marks:
        fields.append(StructField(CHECKED, mark_type()))
    return StructType(fields)


def event_json(frame: DataFrame) -> Column:
    """Each event of a frame from :func:`read_events` as JSON text, under its own keys
    (what a failed/ record keeps, and a replay reads again)."""
    names = {c: reserved.unescape(c) for c in frame.columns if not reserved.is_internal(c)}
    return json_object(frame.schema, names)


def day_of(schema: StructType) -> Column:
    """Each raw event's UTC day (``yyyy-MM-dd``) by its ``_timestamp`` converted as the
    pipeline converts it (null where it does not convert: such events load nowhere)."""
    if TIMESTAMP not in schema.fieldNames():
        return F.lit(None).cast("string")
    source = schema[TIMESTAMP].dataType
    return F.date_format(cast_to(F.col(TIMESTAMP), DataType.TIMESTAMP, source), "yyyy-MM-dd")


def of_segments(frame: DataFrame, target: Target, column: Column) -> DataFrame:
    """The rows of ``frame`` from the target's segments (``column``: the row's segment)."""
    return frame.filter(column.isin(list(target.segments)))


def staging_writer(frame: DataFrame) -> DataFrameWriter:
    """How the run's own Parquet copies are written (read back by the run, then removed).

    Without dictionary encoding: on the batch benchmark's staging write (1M events, five
    tables), dictionaries took 6.1-7.4 s against 4.2-4.7 s without, whatever the codec
    (snappy, none, lz4_raw, zstd). The copies are read once or twice and deleted; a
    Parquet destination's files (kept by users) keep Spark's defaults.
    """
    return frame.write.mode("overwrite").option("parquet.enable.dictionary", "false")


def stage_in_driver(
    rows: DataFrame,
    out: Path,
    partition: str | None,
    aside: tuple[Path, Sequence[str]] | None = None,
) -> bool:
    """``rows`` collected by the driver as Arrow and written there as the run's Parquet
    copy, laid out as Spark's writer partitioned by ``partition`` lays it out
    (``<partition>=<value>/``, values of ``[a-z0-9_]``: table names; None: one file in
    ``out``); False (nothing written) where a column's type is not one both write alike
    (:func:`_plain`). ``aside``: a directory and columns written there instead, in the
    same layout, each file with the row ids (ROW) of its twin in ``out``, in the same
    order (stamps.py).

    For a micro-batch's few rows (job.run_job decides): Spark's writer and its commit
    (a temporary directory renamed, Hadoop starting ``chmod`` for each directory and
    file without its native library) cost about 0.1 s of a 0.6 s micro-batch of 1,000
    events here, against a few ms for the driver's write of them (docs/stream.md).
    """
    import pyarrow.compute as pc

    if not all(_plain(f.dataType) for f in rows.schema.fields):
        return False
    directory, moved = aside if aside is not None else (None, ())
    for place in (out, directory):
        if place is not None and place.exists():  # from an attempt that stopped part way
            shutil.rmtree(place)
    out.mkdir(parents=True)
    arrow = rows.toArrow()
    parts = [("", arrow)]
    if partition is not None:
        values = arrow.column(partition)
        columns = arrow.drop_columns([partition])
        parts = [(f"{partition}={value}", columns.filter(pc.equal(values, value)))
                 for value in pc.unique(values).to_pylist()]  # fmt: skip
    for name, part in parts:
        (out / name).mkdir(exist_ok=True)
        write_staged(part.drop_columns(moved), out / name / "part-00000.parquet")
        if directory is not None:
            (directory / name).mkdir(parents=True, exist_ok=True)
            write_staged(part.select([ROW, *moved]), directory / name / "part-00000.parquet")
    (out / "_SUCCESS").touch()
    return True


def write_staged(rows: pa.Table, path: Path) -> None:
    """``rows`` written by the driver as a staged Parquet file: without dictionaries, as
    :func:`staging_writer` has Spark write them."""
    import pyarrow.parquet as pq

    pq.write_table(rows, path, use_dictionary=False)


def _plain(data_type: T.DataType) -> bool:
    """Whether Arrow and Parquet written by pyarrow carry ``data_type`` as Spark's own
    Parquet writer does (Spark reads it back as it wrote it): not a variant, an
    interval, a null type or a user-defined type."""
    if isinstance(data_type, T.ArrayType):
        return _plain(data_type.elementType)
    if isinstance(data_type, T.MapType):
        return _plain(data_type.keyType) and _plain(data_type.valueType)
    if isinstance(data_type, T.StructType):
        return all(_plain(f.dataType) for f in data_type.fields)
    return isinstance(data_type, _PLAIN_TYPES)


_PLAIN_TYPES = (
    T.StringType, T.BooleanType, T.ByteType, T.ShortType, T.IntegerType, T.LongType,
    T.FloatType, T.DoubleType, T.DecimalType, T.DateType, T.TimestampType,
    T.TimestampNTZType, T.BinaryType,
)  # fmt: skip
