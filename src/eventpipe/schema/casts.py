"""The lattice on Spark: the Spark type that holds each lattice type's values, and the
exact conversion of a value to a column's type (null where it is not exact, so that the
caller reports exactly those values; docs/pipeline.md, Type conflicts).

Used by the pipeline and by the Spark Parquet destination, which converts values to the
types of a table that exists.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

from eventpipe.schema.types import DataType

SPARK_TYPES: dict[DataType, T.DataType] = {
    DataType.BOOL: T.BooleanType(),
    DataType.INT64: T.LongType(),
    DataType.INT128: T.DecimalType(38, 0),
    DataType.FLOAT64: T.DoubleType(),
    DataType.STRING: T.StringType(),
    DataType.TIMESTAMP: T.TimestampType(),
}
"""The Spark type that holds each lattice type's values as loaded."""

ISO_TIMESTAMP = "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX"


def cast_to(column: Column, data_type: DataType, source: T.DataType | None = None) -> Column:
    """A column's values as ``data_type`` where the conversion is exact; null where it is
    not (ANSI casts would raise), so that the caller can report exactly those values.

    ``source`` is the column's Spark type. Exact means: any value as text (a timestamp as
    RFC 3339); bools as 1 and 0, and ``true``/``false`` text as bools or as 1 and 0 (JSON
    bools that Spark read into text); integers as floats; a float as an integer only when
    it has no fraction; 0 and 1 as bools; text as a number or timestamp when it parses
    (as a float, only with no more digits than the float holds: :func:`reads_back`).
    Never: a timestamp as a number (that would silently be epoch seconds), a number as a
    timestamp, a fraction truncated, 5 as ``true``.
    """
    target = SPARK_TYPES[data_type]
    if source is not None and source == target:
        return within_range(column) if data_type is DataType.TIMESTAMP else column
    if isinstance(source, T.TimestampNTZType) and data_type is DataType.TIMESTAMP:
        # Wall-clock time read as UTC, the session's zone.
        return within_range(column.cast(target))
    if isinstance(source, T.TimestampType | T.TimestampNTZType):
        if data_type is DataType.STRING:
            return F.date_format(column, ISO_TIMESTAMP)
        return F.lit(None).cast(target)
    if data_type is DataType.STRING:
        return column.try_cast(target)
    text = isinstance(source, T.StringType)
    numeric = isinstance(source, T.NumericType)
    if data_type is DataType.TIMESTAMP:
        if text or source is None:
            return within_range(F.try_to_timestamp(column))
        return F.lit(None).cast(target)
    if data_type is DataType.BOOL:
        if text:
            truth = F.when(column == F.lit("true"), True).when(column == F.lit("false"), False)
            return truth.cast(target)
        if numeric:
            return F.when(column == 1, True).when(column == 0, False).cast(target)
        return column.try_cast(target)
    # INT64, INT128 or FLOAT64
    if text:
        number = column.try_cast(target)
        if data_type is DataType.INT128:  # a decimal cast would round "1.5" to 2
            number = F.when(column.rlike(_INTEGER_TEXT), number)
        if data_type is DataType.FLOAT64:  # "1e400" and "Infinity" are no number JSON has
            finite = F.abs(number) < F.lit(float("inf"))
            number = F.when(finite & reads_back(column, number), number)
        return (
            F.when(column == F.lit("true"), F.lit(1).cast(target))
            .when(column == F.lit("false"), F.lit(0).cast(target))
            .otherwise(number)
        )
    converted = column.try_cast(target)
    if data_type is not DataType.FLOAT64 and isinstance(source, T.FractionalType):
        return F.when(converted.cast("double") == column, converted)  # no fraction lost
    if isinstance(source, T.DecimalType):
        return F.when(converted.try_cast(source) == column, converted)  # no digit lost
    return converted


_INTEGER_TEXT = r"^\s*[+-]?[0-9]{1,38}\s*$"
_NUMBER_PARTS = r"^\s*[-+]?0*([0-9]*?)\.?([0-9]*?)0*(?:[eE][-+]?[0-9]+)?\s*$"


def significant(number: Column) -> Column:
    """The significant digits of a number's text (``-0012.3400e5``: ``1234``)."""
    text = number.cast("string")
    digits = F.concat(
        F.regexp_extract(text, _NUMBER_PARTS, 1), F.regexp_extract(text, _NUMBER_PARTS, 2)
    )
    return F.regexp_replace(digits, "^0+|0+$", "")


def reads_back(text: Column, number: Column) -> Column:
    """Whether ``number`` (the float ``text`` reads as), printed to as many significant
    digits as ``text`` has, gives the text's digits: the text is a float64 exactly
    (``24.571428571428571428`` has more digits than a float64 holds, and would load
    rounded; ``5e-324`` is the smallest float64). eventpipe.sources.postgres.exact_number
    is the same rule in Python."""
    digits = significant(text)
    precision = F.greatest(F.length(digits), F.lit(1)) - 1
    printed = F.printf(F.concat(F.lit("%."), precision.cast("string"), F.lit("e")), number)
    return significant(printed) == digits


EARLIEST = "0001-01-01T00:00:00Z"
LATEST = "9999-12-31T23:59:59.999999Z"
"""The times every destination stores and every client reads back: years 1 to 9999.
PostgreSQL stored a ``_timestamp`` in year 10000, after which every query reading the
column failed in Python's clients ("timestamp too large")."""


def within_range(stamp: Column) -> Column:
    """``stamp`` where it is between :data:`EARLIEST` and :data:`LATEST`; null (a value
    that does not convert, reported by the caller) elsewhere."""
    earliest = F.to_timestamp(F.lit(EARLIEST))
    latest = F.to_timestamp(F.lit(LATEST))
    return F.when(stamp.between(earliest, latest), stamp)


def conversion_problem(value: Column, name: str, data_type: DataType, converted: Column) -> Column:
    """Text naming the column, its type and the value, where ``value`` (column ``name``)
    did not convert (``converted``, from :func:`cast_to`, is null); null elsewhere."""
    return F.when(
        value.isNotNull() & converted.isNull(),
        F.concat(F.lit(f"column {name} ({data_type}) cannot take "), value.cast("string")),
    )
