"""Typing: the lattice type of every column of every table in a batch, natively.

Spark's inferred type of each flattened column maps onto the lattice (schema.types):
boolean -> BOOL, integral -> INT64, fractional -> FLOAT64, timestamp -> TIMESTAMP; an
integer beyond int64 (Spark's DECIMAL(p, 0)) -> INT128. A string
column is TIMESTAMP in a table when every non-null value there has the RFC 3339 shape
*and* parses (so ``2026-02-30T00:00:00Z`` keeps a column STRING instead of becoming a
null), else STRING.

Types are per table (seed 1's BatchHeader); a column with no value in a table is not part
of that table's batch. Over a frame, one ``groupBy`` on the table column computes them
(:func:`column_types`). Over the job's staged Parquet, partitioned by table, the files'
footers answer most of it without reading values (:func:`staged_column_types`).

Spark reads a field whose JSON type is a bool in some events and a number in others as
text. Where a text column's bounds say it may be such a mix, the job reads those fields
again as VARIANT (which keeps each value's token kind) and :func:`token_types` types them
by the lattice. A table whose values of a field are all numbers while another table of
the batch has text there stays STRING (documented in docs/pipeline.md).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from eventpipe.processing.steps.fields import quoted
from eventpipe.schema.casts import EARLIEST, LATEST
from eventpipe.schema.types import TIMESTAMP_PATTERN, DataType, promote_all

_DIRECT: tuple[tuple[type[T.DataType], DataType], ...] = (
    (T.BooleanType, DataType.BOOL),
    (T.IntegralType, DataType.INT64),
    (T.FractionalType, DataType.FLOAT64),
    (T.TimestampType, DataType.TIMESTAMP),
    (T.TimestampNTZType, DataType.TIMESTAMP),
)


def _direct(spark_type: T.DataType) -> DataType | None:
    if isinstance(spark_type, T.DecimalType) and spark_type.scale == 0:
        return DataType.INT128  # integers beyond int64: Spark reads DECIMAL(20..38, 0)
    return next((t for cls, t in _DIRECT if isinstance(spark_type, cls)), None)


def timestamp_text(value: str) -> str:
    """Spark SQL, true where the text ``value`` (SQL) is an RFC 3339 / ISO-8601 date-time
    that Spark can parse, in years 1 to 9999 (schema/casts.py: ``EARLIEST`` to ``LATEST``,
    as ``within_range``). SQL text, so that an aggregation over many columns is one call
    into the JVM.

    The cheap tests go first: Spark's AND stops at the first false, so ordinary strings
    never reach the regex and the parse (typing was the slowest step of a 1M-event run).
    """
    return (
        f"(length({value}) >= 19 AND substring({value}, 5, 1) = '-' "
        f"AND {value} RLIKE '{TIMESTAMP_PATTERN}' "
        f"AND try_to_timestamp({value}) BETWEEN to_timestamp('{EARLIEST}') "
        f"AND to_timestamp('{LATEST}'))"
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
        direct = _direct(spark_types[name])
        if direct is None and name in known_text:
            direct = DataType.STRING
        if direct is None:  # strings (and anything else Spark gave us as text)
            stamps = timestamp_text(f"CAST({quoted(name)} AS STRING)")
            aggregates.append(F.expr(f"count_if({stamps})").alias(f"t{i}"))
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


_TIMESTAMP_SHAPE = re.compile(TIMESTAMP_PATTERN)
_TOKEN = re.compile(r"^(true|false|-?\d+(\.\d+)?([eE][+-]?\d+)?)$")
"""The text Spark gives a JSON bool or number token it read into a text column."""


@dataclass
class _Footer:
    """What the Parquet footers of one table's files say of one column."""

    present: int = 0
    """Non-null values."""
    low: str | None = None
    high: str | None = None
    known: bool = True
    """False when a file lacked a statistic that is needed (null count, or string bounds:
    Parquet writers leave out bounds longer than 4 KB); the values must then be read."""

    def add(self, rows: int, stats: Any, *, bounds: bool) -> None:
        """One column chunk; ``bounds``: its smallest and largest text are needed."""
        if stats is None or not stats.has_null_count or stats.null_count is None:
            self.known = False
            return
        values = rows - stats.null_count
        if not values:
            return
        self.present += values
        if not bounds:
            return
        low, high = (stats.min, stats.max) if stats.has_min_max else (None, None)
        if not isinstance(low, str) or not isinstance(high, str):
            self.known = False
            return
        self.low = low if self.low is None else min(self.low, low)
        self.high = high if self.high is None else max(self.high, high)

    def maybe_bool_mix(self) -> bool:
        """Whether the values may be JSON bools mixed with numbers, which Spark reads as
        text (``"true"``, ``"1"``): the largest is a bool and the smallest a bool or a
        number (text sorts digits and ``-`` before ``false`` before ``true``)."""
        if not self.known or self.low is None or self.high is None:
            return False
        return self.high in ("true", "false") and bool(_TOKEN.match(self.low))

    def maybe_timestamps(self) -> bool:
        """False when the bounds prove that some value is not timestamp text: were every
        value a timestamp, so would be the smallest and the largest."""
        if not self.known:
            return True
        return all(v is not None and _TIMESTAMP_SHAPE.match(v) for v in (self.low, self.high))


def _footers(
    directory: Path, table_column: str, columns: Collection[str], texts: Collection[str]
) -> dict[str, dict[str, _Footer]]:
    """``{table: {column: _Footer}}`` from the footers of ``directory/<table_column>=<t>/``;
    bounds are kept for the ``texts`` columns."""
    import pyarrow.parquet as pq

    wanted = set(columns)
    found: dict[str, dict[str, _Footer]] = {}
    for part in sorted(directory.glob(f"{table_column}=*")):
        table = unquote(part.name.split("=", 1)[1])
        by_column = found.setdefault(table, {})
        for file in sorted(part.glob("*.parquet")):
            metadata = pq.ParquetFile(file).metadata
            for g in range(metadata.num_row_groups):
                group = metadata.row_group(g)
                for c in range(group.num_columns):
                    chunk = group.column(c)
                    name = chunk.path_in_schema
                    if name in wanted:
                        by_column.setdefault(name, _Footer()).add(
                            group.num_rows, chunk.statistics, bounds=name in texts
                        )
    return found


@dataclass(frozen=True)
class StagedTypes:
    types: dict[str, dict[str, DataType]]
    """``{table: {column: type}}``."""
    mixed: dict[str, set[str]]
    """``{table: columns}`` typed STRING here that may hold JSON bools mixed with numbers
    (see :func:`token_types`)."""


def staged_column_types(
    directory: Path,
    frame: DataFrame,
    table_column: str,
    columns: Sequence[str],
    *,
    known_text: Collection[str] = (),
    texts: Mapping[str, Sequence[int]] | None = None,
) -> StagedTypes:
    """:func:`column_types` of ``frame``, which Spark wrote under ``directory`` partitioned
    by ``table_column``, mostly from the files' footers.

    The footers give each table's non-null count of each column, and for a string column
    its smallest and largest value. Only where those bounds both look like timestamps
    (or a footer lacks a statistic) are the values read, for those tables and columns only:
    a batch of ordinary strings is typed without reading a value. Text columns whose
    bounds say they may be bools mixed with numbers are listed in ``mixed``. ``texts``:
    per text column, its values and those that are timestamp text in every row of the
    batch (staged or not: a superset of each table's), counted while they were staged
    (shape.stage_flat, for a small batch): where all or none are, no value is read.
    """
    spark_types = {f.name: f.dataType for f in frame.schema.fields}
    direct: dict[str, DataType | None] = {}
    for name in columns:
        direct[name] = _direct(spark_types[name])
        if direct[name] is None and name in known_text:
            direct[name] = DataType.STRING
    strings = {name for name, found in direct.items() if found is None}
    counted = texts or {}
    types: dict[str, dict[str, DataType]] = {}
    to_read: dict[str, set[str]] = {}
    mixed: dict[str, set[str]] = {}
    for table, footers in _footers(directory, table_column, columns, strings).items():
        types[table] = {}
        for name in columns:
            footer = footers.get(name)
            if footer is None:
                continue  # not in this table's files
            maybe_timestamps = name in strings and footer.present and footer.maybe_timestamps()
            if maybe_timestamps and footer.known and name in counted:
                values, stamps = counted[name]
                if stamps == values:  # all the batch's are: this table's too
                    types[table][name] = DataType.TIMESTAMP
                    continue
                maybe_timestamps = stamps > 0  # none is: text, as the footer says below
            if not footer.known or maybe_timestamps:
                to_read.setdefault(table, set()).add(name)
            elif footer.present:
                types[table][name] = direct[name] or DataType.STRING
                if name in strings and footer.maybe_bool_mix():
                    mixed.setdefault(table, set()).add(name)
    if to_read:
        tables = sorted(to_read)
        read = column_types(
            frame.filter(F.col(table_column).isin(tables)), table_column,
            sorted(set().union(*to_read.values())), known_text=known_text,
        )  # fmt: skip
        for table, names in to_read.items():
            for name in sorted(names):
                if name in read.types.get(table, {}):
                    types[table][name] = read.types[table][name]
    order = {name: i for i, name in enumerate(columns)}
    ordered = {
        t: dict(sorted(found.items(), key=lambda kv: order[kv[0]])) for t, found in types.items()
    }
    return StagedTypes(ordered, mixed)


def token_types(
    frame: DataFrame, table_column: str, columns: Collection[str]
) -> dict[str, dict[str, DataType]]:
    """The lattice type per table of ``columns``, which ``frame`` holds as VARIANT (Spark's
    JSON reader keeps each value's token kind there): bools, integers and decimals promote
    along the lattice; any string, object or array makes the column STRING."""
    aggregates: list[Column] = []
    for i, name in enumerate(sorted(columns)):
        kind = F.schema_of_variant(F.col(f"`{name}`"))
        aggregates += [
            F.count_if(kind.isNotNull() & (kind != F.lit("VOID"))).alias(f"n{i}"),
            F.count_if(kind == F.lit("BOOLEAN")).alias(f"b{i}"),
            F.count_if(kind.isin("TINYINT", "SMALLINT", "INT", "BIGINT")).alias(f"i{i}"),
            F.count_if(kind.rlike(r"^DECIMAL\(\d+,\s*0\)$")).alias(f"h{i}"),
            F.count_if(kind.startswith("DECIMAL") | kind.isin("FLOAT", "DOUBLE")).alias(f"f{i}"),
        ]
    found: dict[str, dict[str, DataType]] = {}
    for row in frame.groupBy(table_column).agg(*aggregates).collect():
        table = row[table_column]
        if not table:
            continue
        types = found.setdefault(table, {})
        for i, name in enumerate(sorted(columns)):
            present, bools, ints, huge, decimals = (row[f"{x}{i}"] for x in "nbihf")
            floats = decimals - huge
            if not present:
                continue
            if bools + ints + huge + floats < present:
                types[name] = DataType.STRING
            else:
                types[name] = (
                    promote_all(
                        [DataType.BOOL] * bool(bools)
                        + [DataType.INT64] * bool(ints)
                        + [DataType.INT128] * bool(huge)
                        + [DataType.FLOAT64] * bool(floats)
                    )
                    or DataType.STRING
                )
    return found
