"""The one type lattice of eventpipe (seed 1, Type Promotion).

Each JSON value has a type; a column's type is the least common ancestor, in this
graph, of the types of all its values in a batch::

               STRING
            /    |     \\
       INT128  FLOAT64  TIMESTAMP
            \\    |
               INT64
                 |
                BOOL

So BOOL + INT64 = INT64, INT64 + FLOAT64 = FLOAT64, INT64 + INT128 = INT128, and
INT128 + FLOAT64 = STRING (a double cannot hold 38 digits, nor a decimal a fraction),
FLOAT64 + TIMESTAMP = STRING, and any type + STRING = STRING. Nulls have no type and
change nothing. Arrays are stored as the JSON text they were sent as, so they are STRING.
Strings that are RFC 3339 / ISO-8601 date-times are TIMESTAMP.

Integers are exact. An integer within int64 is INT64. One beyond it, up to 38 digits (the
collector refuses longer ones), is INT128: DECIMAL(38,0) or NUMERIC(38,0) where the
destination has it, its digits as text where it has not. Spark reads a field where such
integers meet fractions as a double (the documented exception: the log and the archive
keep the digits, for a reprocess). A column that exists keeps its type: an INT64 or
FLOAT64 column takes an INT128 value only where the conversion is exact; otherwise the
event goes to failed/ naming the column.

A column is never narrowed: :func:`promote` only ever moves up the graph.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from enum import StrEnum
from typing import Any

from eventpipe.errors import ConfigError


class DataType(StrEnum):
    BOOL = "BOOL"
    INT64 = "INT64"
    INT128 = "INT128"
    """An integer beyond int64, of at most 38 digits (DECIMAL(38,0))."""
    FLOAT64 = "FLOAT64"
    TIMESTAMP = "TIMESTAMP"
    STRING = "STRING"


# Each type's ancestors, itself first and nearer ones before farther ones: the first of
# ``a``'s that is also ``b``'s is their least common ancestor (INT64 has two parents, and
# no type has both, so the order between them never decides).
_ANCESTORS: dict[DataType, tuple[DataType, ...]] = {
    DataType.BOOL: (
        DataType.BOOL,
        DataType.INT64,
        DataType.INT128,
        DataType.FLOAT64,
        DataType.STRING,
    ),
    DataType.INT64: (DataType.INT64, DataType.INT128, DataType.FLOAT64, DataType.STRING),
    DataType.INT128: (DataType.INT128, DataType.STRING),
    DataType.FLOAT64: (DataType.FLOAT64, DataType.STRING),
    DataType.TIMESTAMP: (DataType.TIMESTAMP, DataType.STRING),
    DataType.STRING: (DataType.STRING,),
}


def promote(a: DataType | None, b: DataType | None) -> DataType | None:
    """The least common ancestor of ``a`` and ``b``; None (a null) is the identity."""
    if a is None:
        return b
    if b is None or a is b:
        return a
    b_path = _ANCESTORS[b]
    return next(t for t in _ANCESTORS[a] if t in b_path)


def promote_all(types: Iterable[DataType | None]) -> DataType | None:
    result: DataType | None = None
    for t in types:
        result = promote(result, t)
    return result


def fits(value_type: DataType, column_type: DataType) -> bool:
    """Whether values of ``value_type`` go into a ``column_type`` column without widening
    it (``column_type`` is ``value_type`` or one of its ancestors)."""
    return column_type in _ANCESTORS[value_type]


# RFC 3339 date-time, and the ISO-8601 variants clients commonly send: a space instead of
# T, no seconds fraction, no zone (read as UTC), a zone without a colon. ASCII digits
# only, written without backslashes: Java's regex and Python's read it alike, and it is a
# Spark SQL string literal as it stands (whatever the session's escaping of literals).
_TIMESTAMP = re.compile(
    "^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(?:[.][0-9]{1,9})?"
    "(?:[Zz]|[+-][0-9]{2}:?[0-9]{2})?$"
)
TIMESTAMP_PATTERN = _TIMESTAMP.pattern
"""Also used as a Spark SQL ``rlike`` pattern (Java regex accepts the same syntax)."""


def is_timestamp(text: str) -> bool:
    return bool(_TIMESTAMP.match(text)) and _plausible_date(text)


def _plausible_date(text: str) -> bool:
    month, day = int(text[5:7]), int(text[8:10])
    hour, minute, second = int(text[11:13]), int(text[14:16]), int(text[17:19])
    return 1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60 and second < 61


def json_type(value: Any) -> DataType | None:
    """The lattice type of one JSON leaf value (objects are flattened, not typed)."""
    if value is None:
        return None
    if value is True or value is False:
        return DataType.BOOL
    if isinstance(value, int):
        return DataType.INT64 if -(2**63) <= value < 2**63 else DataType.INT128
    if isinstance(value, float):
        return DataType.FLOAT64
    if isinstance(value, str):
        return DataType.TIMESTAMP if is_timestamp(value) else DataType.STRING
    if isinstance(value, list):
        return DataType.STRING
    raise TypeError(f"{type(value).__name__} is not a JSON leaf value")


_TYPE_ALIASES: dict[DataType, tuple[str, ...]] = {
    DataType.BOOL: ("bool", "boolean"),
    DataType.INT64: ("int64", "int", "integer", "bigint", "long", "smallint", "tinyint",
                     "int8", "int16", "int32", "uint8", "uint16", "uint32"),
    DataType.INT128: ("int128", "hugeint", "bignumeric", "uint64", "uint128", "int256",
                      "uint256"),
    DataType.FLOAT64: ("float64", "float", "double", "double precision", "real", "numeric",
                       "decimal", "float32"),
    DataType.TIMESTAMP: ("timestamp", "timestamptz", "datetime", "timestamp with time zone",
                         "datetime64", "date", "date32"),
    DataType.STRING: ("string", "text", "varchar", "character varying", "json", "jsonb",
                      "fixedstring", "uuid", "enum8", "enum16"),
}  # fmt: skip
_BY_ALIAS = {alias: t for t, aliases in _TYPE_ALIASES.items() for alias in aliases}
_PARAMETERS = re.compile(r"\s*\(.*\)\s*$")
_WRAPPED = re.compile(r"^\s*(?:lowcardinality|nullable)\s*\((.*)\)\s*$", re.IGNORECASE)
"""ClickHouse's ``LowCardinality(T)`` and ``Nullable(T)``: of T's lattice type."""
_WHOLE_DECIMAL = re.compile(r"^(numeric|decimal)\s*\(\s*\d+\s*,\s*0\s*\)$")
"""``numeric(38,0)``: a decimal without a fraction holds integers (INT128)."""


def parse_type(text: str, *, where: str = "type") -> DataType:
    """A lattice type from a name: ``INT64``, ``bigint``, ``varchar(255)``, ``numeric(38,18)``.

    Parameters in parentheses are accepted and ignored: eventpipe picks each destination's
    SQL type for the lattice type (docs/pipeline.md). The one exception: a decimal of
    scale 0 (``numeric(38,0)``) is INT128, any other decimal FLOAT64. A destination may
    take a type of its own as written (ClickHouse's ``LowCardinality(String)``,
    destinations/clickhouse/); its lattice type is the one of the type it wraps.
    """
    if (wrapped := _WRAPPED.match(text)) is not None:
        return parse_type(wrapped.group(1), where=where)
    if _WHOLE_DECIMAL.match(text.strip().lower()):
        return DataType.INT128
    key = _PARAMETERS.sub("", text).strip().lower()
    if key not in _BY_ALIAS:
        known = ", ".join(t.value for t in DataType)
        raise ConfigError(f"{where}: unknown type {text!r} (use one of {known}, or a SQL alias)")
    return _BY_ALIAS[key]
