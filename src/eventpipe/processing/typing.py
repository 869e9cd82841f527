"""Typing: the lattice type of every column of every table in a batch, natively.

Spark's inferred type of each flattened column maps onto the lattice (schema.types):
boolean -> BOOL, integral -> INT64, fractional or decimal -> FLOAT64, timestamp ->
TIMESTAMP. A string column is TIMESTAMP in a table when every non-null value there has
the RFC 3339 shape *and* parses (so ``2026-02-30T00:00:00Z`` keeps a column STRING instead
of becoming a null), else STRING.

Types are per table (seed 1's BatchHeader), from one ``groupBy`` over the table column; a
column with no value in a table is not part of that table's batch.

Known gap (docs/pipeline.md): Spark merges a JSON bool and number in one field into a
string, so such a column is STRING here where the lattice says INT64 or FLOAT64.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from eventpipe.schema.types import TIMESTAMP_PATTERN, DataType

_DIRECT: tuple[tuple[type[T.DataType], DataType], ...] = (
    (T.BooleanType, DataType.BOOL),
    (T.IntegralType, DataType.INT64),
    (T.FractionalType, DataType.FLOAT64),
    (T.TimestampType, DataType.TIMESTAMP),
    (T.TimestampNTZType, DataType.TIMESTAMP),
)


def is_timestamp_text(column: Column) -> Column:
    """True where a string is an RFC 3339 / ISO-8601 date-time that Spark can parse.

    The cheap tests go first: Spark's AND stops at the first false, so ordinary strings
    never reach the regex and the parse (typing was the slowest step of a 1M-event run).
    """
    return (
        (F.length(column) >= 19)
        & (F.substring(column, 5, 1) == "-")
        & column.rlike(TIMESTAMP_PATTERN)
        & F.try_to_timestamp(column).isNotNull()
    )


@dataclass(frozen=True)
class BatchTypes:
    types: dict[str, dict[str, DataType]]
    """``{table: {column: type}}`` for every table with rows."""
    rows: dict[str | None, int]
    """Rows per value of the table column, including null and ``""`` (no table)."""


def column_types(
    frame: DataFrame,
    table_column: str,
    columns: Sequence[str],
    *,
    known_text: Collection[str] = (),
) -> BatchTypes:
    """The lattice types of ``columns`` per table of a flattened frame, in one aggregation.

    Rows whose table is null or ``""`` are counted, not typed. ``known_text`` columns are
    text by construction (lookup results: city, user agent family) and skip the timestamp
    test, which measured about 0.3 s per string column per million rows.
    """
    spark_types = {f.name: f.dataType for f in frame.schema.fields}
    aggregates: list[Column] = [F.count(F.lit(1)).alias("rows")]
    plan: list[tuple[str, DataType | None, int]] = []
    for i, name in enumerate(columns):
        ref = F.col(f"`{name}`")
        aggregates.append(F.count(ref).alias(f"n{i}"))
        direct = next((t for cls, t in _DIRECT if isinstance(spark_types[name], cls)), None)
        if direct is None and name in known_text:
            direct = DataType.STRING
        if direct is None:  # strings (and anything else Spark gave us as text)
            aggregates.append(F.count_if(is_timestamp_text(ref.cast("string"))).alias(f"t{i}"))
        plan.append((name, direct, i))
    result = BatchTypes({}, {})
    for row in frame.groupBy(table_column).agg(*aggregates).collect():
        table = row[table_column]
        result.rows[table] = row["rows"]
        if table is None or table == "":
            continue
        types: dict[str, DataType] = {}
        for name, direct, i in plan:
            present = row[f"n{i}"]
            if not present:
                continue
            if direct is not None:
                types[name] = direct
            else:
                all_stamps = row[f"t{i}"] == present
                types[name] = DataType.TIMESTAMP if all_stamps else DataType.STRING
        result.types[table] = types
    return result


def cast_to(column: Column, data_type: DataType) -> Column:
    """A column's values as ``data_type``; null where a value does not convert (ANSI casts
    would raise), so that the caller can report exactly those values."""
    if data_type is DataType.TIMESTAMP:
        return F.try_to_timestamp(column.cast("string"))
    spark_type = {
        DataType.BOOL: T.BooleanType(),
        DataType.INT64: T.LongType(),
        DataType.FLOAT64: T.DoubleType(),
        DataType.STRING: T.StringType(),
    }[data_type]
    return column.try_cast(spark_type)
