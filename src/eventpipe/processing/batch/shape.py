"""Shape per destination: its keys, table names, mapping, flattening and explicit casts;
then staged as Parquet partitioned by table, and typed."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql import Observation
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType, TimestampType

from eventpipe.config import DestinationConfig
from eventpipe.files import write_file
from eventpipe.processing.batch import stamps
from eventpipe.processing.batch.read import (
    of_segments,
    read_events,
    stage_in_driver,
    staging_writer,
)
from eventpipe.processing.batch.run import TIMESTAMP, RunContext, Target, ref, step
from eventpipe.processing.batch.stamps import Stamps
from eventpipe.processing.steps import lambdas, metering, transforms
from eventpipe.processing.steps.contracts import RuleTally, summary, tallied
from eventpipe.processing.steps.fields import (
    assign,
    quoted,
    set_path,
    with_type_at,
)
from eventpipe.processing.steps.flatten import Flat, flatten_mapped, leaves
from eventpipe.processing.steps.inference import StagedTypes, timestamp_text, token_types
from eventpipe.processing.steps.lookup import browser_of
from eventpipe.processing.steps.mapping import Mapping
from eventpipe.processing.steps.template import (
    rendered,
    sanitize_table_name,
    sanitized,
    table_names,
)
from eventpipe.reserved import (
    CORRUPT,
    DISCARD,
    ERROR,
    FILE,
    FILTERED,
    LOOKUP,
    ROW,
    SEGMENT,
    TABLE,
    TALLIED,
    UNCHECKED,
    VERDICT,
)
from eventpipe.schema.casts import SPARK_TYPES, cast_to, conversion_problem
from eventpipe.schema.diff import Table
from eventpipe.schema.naming import UNMAPPED_COLUMN, column_name, table_name
from eventpipe.schema.templates import Template
from eventpipe.schema.types import DataType

if TYPE_CHECKING:
    from collections.abc import Callable, Collection

    from pyspark.sql import Column, DataFrame

log = logging.getLogger("eventpipe.processing")


def _multiplexed(frame: DataFrame, dest: DestinationConfig) -> DataFrame:
    """The events of the destination's keys (``only_keys``; absent: all)."""
    if dest.only_keys is None:
        return frame
    return frame.filter(F.col("api_key").isin(list(dest.only_keys)))


def _checked(frame: DataFrame, error: Column, on_violation: str) -> tuple[DataFrame, Column]:
    """Each event's check against its plan in its ``eventn_ctx``: ``contract`` (the plan,
    null when no plan is for it) and ``contract_violations`` (JSON text; null when it
    met its plan), whatever the event had there (what the collector marked is checked
    again; what a client claimed is never kept); with ``reject``, an event that broke its
    plan fails, the summary of its violations its error."""
    verdict = F.col(VERDICT)
    frame = assign(frame, ("eventn_ctx", "contract"), verdict.getField("plan"))
    frame = assign(frame, ("eventn_ctx", "contract_violations"), verdict.getField("violations"))
    if on_violation == "reject":
        error = F.coalesce(error, summary(verdict))
    return frame, error


QUARANTINE_SUFFIX = "_quarantine"
"""What names the side table of the events that broke their plan (``on_violation:
quarantine``): ``checkout`` -> ``checkout_quarantine``."""


COUNTED = (UNCHECKED, TALLIED)
"""Columns the pass that stages a destination's rows counts, never staged or loaded."""


@dataclass(frozen=True)
class Flattened:
    """A destination's events as its tables take them (before typing per table)."""

    frame: DataFrame
    """The flat columns, explicit casts done, with TABLE (null: failed, ERROR says why;
    empty: skipped) and ROW."""
    flat: Flat
    event_schema: StructType
    """The events' schema as read (the destination's, before its lookups)."""
    name: Column
    """Each event's table name (an expression over the events as read)."""
    verdicts: DataFrame | None = None
    """The verdicts (column ``verdict``) of the destination's events, with plans."""
    tally: RuleTally | None = None
    """What counts the broken rules as the rows are staged (their items in TALLIED)."""

    @property
    def columns(self) -> list[str]:
        """The destination's columns (the flat ones, without the job's own)."""
        return [c for c in self.frame.columns if c not in (TABLE, ERROR, ROW, *COUNTED)]


def flatten_for(events: DataFrame, run: RunContext, target: Target) -> Flattened:
    """Multiplex, name the tables, place the lookups, map, flatten, cast: every step
    before the tables are typed and loaded."""
    dest_id, dest = target.id, target.config
    frame = events
    if CORRUPT in frame.columns:
        frame = frame.filter(F.col(CORRUPT).isNull())
    frame = _multiplexed(frame, dest)
    if SEGMENT in frame.columns:
        frame = of_segments(frame, target, F.col(SEGMENT))
    verdicts = tally = None
    if VERDICT in frame.columns:
        verdicts = frame.select(F.col(VERDICT).alias("verdict"))
        # Counted as the rows are staged, where each event is one row to the end: not
        # where a Python transform may return rows of its own or metering multiplies them.
        if dest.metered is None and not any(t.python for t in dest.transforms):
            tally = run.tally
    lookup_columns = [c for c in frame.columns if c.startswith(LOOKUP)]
    event_schema = frame.drop(
        *lookup_columns, ROW, FILE, CORRUPT, SEGMENT, VERDICT, UNCHECKED
    ).schema
    template = Template.parse(dest.table_name_template)
    text, error = rendered(template, event_schema)
    quarantined = None
    if VERDICT in frame.columns and dest.on_violation == "quarantine":
        # An event that broke its plan: its table's side table (<table>_quarantine).
        quarantined = F.col(VERDICT).getField("violations").isNotNull()
        text = F.when(quarantined & (text != F.lit("")),
                      F.concat(text, F.lit(QUARANTINE_SUFFIX))).otherwise(text)  # fmt: skip
    if template.literal is not None:
        name = F.lit(table_name(template.literal))
        if quarantined is not None and template.literal:
            side = F.lit(table_name(template.literal + QUARANTINE_SUFFIX))
            name = F.when(quarantined, side).otherwise(name)
    elif run.staged:
        with step(f"{dest_id}: table names"):
            name = table_names(frame, text)
    else:
        # No pass over the JSON for the distinct names: each row is named natively, in
        # the pass that stages it (0.9 s less on the batch benchmark's 1M events).
        name = sanitized(template, event_schema) if quarantined is None else (
            sanitize_table_name(text))  # fmt: skip
    passthrough: tuple[str, ...] = (TABLE, ERROR, ROW)
    if UNCHECKED in frame.columns:  # counted as the rows are staged (stage_flat)
        passthrough += (UNCHECKED,)
    if tally is not None:
        frame = frame.withColumn(TALLIED, tally.item(F.col(VERDICT)))
        passthrough += (TALLIED,)
    if VERDICT in frame.columns:  # the run's tracking plans (steps/contracts.py)
        frame, error = _checked(frame, error, dest.on_violation)
        if dest.on_violation == "discard_value":
            frame = frame.withColumn(DISCARD, F.col(VERDICT).getField("pointers"))
            passthrough += (DISCARD,)
    frame = frame.withColumns({TABLE: F.when(error.isNull(), name), ERROR: error})
    frame = frame.drop(VERDICT)
    browser = browser_of(event_schema)
    for rule in run.lookups.for_destination(dest_id):
        if rule.column in frame.columns:
            condition = browser if rule.destinations is None else None
            frame = set_path(frame, rule.target, F.col(rule.column), condition)
    frame = frame.drop(*lookup_columns, FILE, CORRUPT, SEGMENT)
    frame = transforms.apply(frame, dest_id, dest)
    if (metered := dest.metered) is not None:
        cutoff = metered.window_start(run.started)
        arrival = run.started.strftime("%Y%m%d%H%M%S%f")
        frame = metering.route(frame, metered, run.catalogues[dest_id], cutoff, arrival)
    mapping = Mapping.from_config(dest.mappings)
    flat = flatten_mapped(frame, passthrough=passthrough, mapping=mapping)
    flat_frame = flat.frame
    if DISCARD in flat_frame.columns:
        flat_frame = _discarded(flat_frame, flat.sources)
    return Flattened(_cast_explicit(flat_frame, flat.explicit), flat, event_schema, name,
                     verdicts, tally)  # fmt: skip


def _discarded(frame: DataFrame, sources: dict[str, str]) -> DataFrame:
    """``on_violation: discard_value``: each column's value dropped (null) where it broke
    the event's plan: where a violation's JSON pointer (DISCARD) is the column's place
    in the event as sent, inside it (an array, kept as one JSON text column: all of it),
    or above it (an object that broke a rule: each of its columns). A violation of the
    event as a whole (``required``) drops nothing: its row carries it, as flagged."""
    broken = F.col(DISCARD)
    dropped = {
        column: F.when(
            broken.isNull() | ~lambdas.exists(broken, _breaks(place), "pointer"), ref(column)
        )
        for column, place in sources.items()
        if column in frame.columns and column not in (TABLE, ERROR, ROW)
    }
    return frame.withColumns(dropped).drop(DISCARD)


def _breaks(place: str) -> Callable[[Column], Column]:
    """Whether a violation's pointer is ``place``, inside it or above it."""
    return lambda at: (
        (at == F.lit(place))
        | at.startswith(place + "/")
        | F.lit(place).startswith(F.concat(at, F.lit("/")))
    )


def type_mixes(
    batch: StagedTypes, run: RunContext, target: Target, schema: StructType, name: Column
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
        frame = of_segments(frame, target, F.col(SEGMENT))
    frame = frame.drop(CORRUPT, FILE, SEGMENT).withColumn(TABLE, name)
    flat = flatten_mapped(frame, passthrough=(TABLE,), mapping=mapping).frame
    found = token_types(flat.select(TABLE, *(ref(c) for c in sorted(wanted))), TABLE, wanted)
    for table, columns in batch.mixed.items():
        for column in columns & wanted:
            if column in found.get(table, {}):
                batch.types[table][column] = found[table][column]


MAX_COUNTED_TEXTS = 12
"""The most text columns whose timestamps :func:`stage_flat` counts: planning the counts
costs the micro-batch about what the typing's read would (`bench/micro_batch.py --widths
0,50 --nested`: 25 text columns, 1.45x the narrow micro-batch against 1.17x without)."""


def stage_flat(
    flat: DataFrame, where: Path, *, in_driver: bool = False, to_stamp: Collection[str] = ()
) -> tuple[DataFrame, dict[str, Any]]:
    """The destination's flattened rows, written once as Parquet partitioned by table
    (Spark's own types), and the counts of rows skipped (empty table name), filtered (by
    the namespace or transforms) and failed (template error, transform error) and the
    days of the rows (``days``), observed during that write; with tracking plans, the
    events without a trusted verdict (UNCHECKED) and those that broke their plans
    (TALLIED, steps.contracts.tallied). ``in_driver``: few rows, collected and written by
    the driver (read.stage_in_driver) where their types allow; and for each text column,
    its values and those that are timestamp text (``texts``: ``{column: [values,
    timestamps]}``, every row's, staged or not), which spares a small batch the Spark job
    that would read them again to type the column (inference.staged_column_types).
    ``to_stamp``: text columns converted to timestamps as they are staged, written aside by
    the driver, their values that do not convert counted (``stamps``: stamps.py).

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
        # Dates per row, formatted once each in the aggregate: date_format on every row
        # cost 0.1-0.2 s of the write of 1M events, to_date nothing measurable (both in
        # the session's time zone, UTC). Formatted by Spark, not by Python, which has no
        # year 0 (a timestamp of 0000-01-01 is one).
        day = F.to_date(F.col(TIMESTAMP)) if stamped else F.lit(None).cast("date")
        loaded = table.isNotNull() & (table != F.lit("")) & (table != F.lit(FILTERED))
        days = F.collect_set(F.when(loaded, day))
        # Events whose verdict is still to be made (read.stage_events): counted here,
        # where every row passes, before anything is loaded.
        planned = [F.count_if(F.col(UNCHECKED)).alias("unchecked")] if UNCHECKED in types else []
        if TALLIED in types:
            planned.append(tallied(F.col(TALLIED)))
        texts = [n for n, t in types.items() if isinstance(t, StringType) and n not in
                 (TABLE, ERROR, *COUNTED)] if in_driver else []  # fmt: skip
        if texts and len(texts) <= MAX_COUNTED_TEXTS:  # a small batch's (one call)
            pairs = ", ".join(
                f"array(count({quoted(n)}), count_if({timestamp_text(quoted(n))}))" for n in texts
            )
            planned.append(F.expr(f"array({pairs})").alias("texts"))
        converting = stamps.twins(types, to_stamp) if in_driver else {}
        if converting:
            planned.append(F.array(*map(stamps.unconverted, converting)).alias("stamps"))
        with step(f"{where.name}: enrich, map, flatten and stage"):
            flat_rows = flat.observe(
                observed,
                F.count_if(table == F.lit("")).alias("skipped"),
                F.count_if(table == F.lit(FILTERED)).alias("filtered"),
                F.count_if(table.isNull()).alias("failed"),
                lambdas.transform(days, _day_text, "day").alias("days"),
                *planned,
            )
            kept = flat_rows.filter((table != F.lit("")) & (table != F.lit(FILTERED)))
            rows = kept.drop(ERROR, *COUNTED)
            with_twins, aside = rows, None
            if converting:
                with_twins = rows.withColumns({t: stamps.converted(c)
                                               for c, t in converting.items()})  # fmt: skip
                aside = (where / stamps.ASIDE, list(converting.values()))
            if not (in_driver and stage_in_driver(with_twins, out, TABLE, aside)):
                staging_writer(rows).partitionBy(TABLE).parquet(str(out))
        found = observed.get
        if "texts" in found:
            found["texts"] = {n: list(pair) for n, pair in zip(texts, found["texts"], strict=True)}
        if "stamps" in found:
            found["stamps"] = stamps.counted(converting, found["stamps"])
        write_file(counts_file, json.dumps(found))
    counts: dict[str, Any] = json.loads(counts_file.read_text())
    spark = flat.sparkSession
    written = flat.drop(ERROR, *COUNTED).schema
    if not any(out.glob(f"{TABLE}=*")):
        return spark.createDataFrame([], written), counts
    # Read with the schema it was written with (the table last, as a partition column
    # comes back), not one inferred from the files' footers: 0.08 s less of a stream's
    # micro-batch of 1,300 events (0.10 s against 0.02 s, this 2-core machine).
    staged = StructType([*(f for f in written.fields if f.name != TABLE),
                         StructField(TABLE, StringType())])  # fmt: skip
    return spark.read.schema(staged).parquet(str(out)), counts


def _day_text(day: Column) -> Column:
    return F.date_format(day, "yyyy-MM-dd")


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
    converted = {c: cast_to(ref(c), t, spark_types[c]) for c, t in to_cast.items()}
    problems = [conversion_problem(ref(c), c, t, converted[c]) for c, t in to_cast.items()]
    error = F.coalesce(F.col(ERROR), F.nullif(F.concat_ws("; ", *problems), F.lit("")))
    # One projection: every expression reads the values before conversion.
    return frame.withColumns(
        {**converted, ERROR: error, TABLE: F.when(error.isNull(), F.col(TABLE))}
    )


@dataclass(frozen=True)
class StagedTable:
    name: str
    frame: DataFrame
    files: tuple[Path, ...]
    """Its partition's Parquet files, with every column of the destination's batch."""
    stamps: Stamps | None = None
    """Its text columns converted to timestamps as they were staged."""


def staged_table(
    staged: DataFrame, where: Path, table: str, counts: dict[str, Any] | None = None
) -> StagedTable:
    """One table's rows of the staged frame (Spark reads only its partition)."""
    files = tuple(sorted((where / "flat" / f"{TABLE}={table}").glob("*.parquet")))
    frame = staged.filter(F.col(TABLE) == F.lit(table)).drop(TABLE)
    return StagedTable(table, frame, files, stamps.stamps_of(where, table, counts or {}))


def within_max_columns(
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


def with_overflow(frame: DataFrame, overflow: list[str], pointers: dict[str, str]) -> Column:
    """``_unmapped_data`` with the overflow columns added, keyed by their JSON pointers."""
    packed = F.to_json(F.struct(*(ref(c).alias(pointers.get(c, "/" + c)) for c in overflow)))
    if UNMAPPED_COLUMN not in frame.columns:
        return F.when(packed != F.lit("{}"), packed)
    current = ref(UNMAPPED_COLUMN)
    # Both are JSON objects with distinct keys (pointers): join their members.
    merged = F.concat(F.expr(f"substring(`{UNMAPPED_COLUMN}`, 1, length(`{UNMAPPED_COLUMN}`) - 1)"),
                      F.lit(","), F.substring(packed, 2, 1 << 30))  # fmt: skip
    return (
        F.when(current.isNull(), F.when(packed != F.lit("{}"), packed))
        .when(packed == F.lit("{}"), current)
        .otherwise(merged)
    )
