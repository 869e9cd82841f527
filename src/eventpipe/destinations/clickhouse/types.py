"""ClickHouse's types, both ways: a column's lattice type (``describe``), the type a
staged column is converted to before it is encoded (DuckDB's), the dialect a server
takes (``DateTime64`` or not), and the types a destination's mapping names as written.
"""

from __future__ import annotations

import re

from eventpipe.config import MappingConfig
from eventpipe.destinations.clickhouse.client import ServerFeatures
from eventpipe.schema.dialects import CLICKHOUSE, Dialect
from eventpipe.schema.types import DataType

_WRAPPERS = re.compile(r"^(?:Nullable|LowCardinality)\((.*)\)$")
_DECIMAL = re.compile(r"^Decimal\((\d+),\s*(\d+)\)$")
_DUCKDB = {
    "String": "VARCHAR",
    "Int8": "TINYINT",
    "Int16": "SMALLINT",
    "Int32": "INTEGER",
    "Int64": "BIGINT",
    "UInt8": "BOOLEAN",  # eventpipe's booleans (schema/dialects.py)
    "UInt16": "USMALLINT",
    "UInt32": "UINTEGER",
    "UInt64": "UBIGINT",
    "Float32": "FLOAT",
    "Float64": "DOUBLE",
}
DATETIME = "DateTime('UTC')"
"""The timestamp type of servers without ``DateTime64``."""

_INT64 = frozenset({"Int8", "Int16", "Int32", "Int64", "UInt16", "UInt32"})
_WIDE = frozenset({"UInt64", "Int128", "UInt128", "Int256", "UInt256"})


def lattice(sql_type: str) -> DataType:
    """The lattice type of a ClickHouse column (for tables eventpipe did not make too)."""
    t = inner_type(sql_type)
    if t in ("UInt8", "Bool"):
        return DataType.BOOL
    if t in _INT64:
        return DataType.INT64
    if t in _WIDE:
        return DataType.INT128
    if (decimal := decimal_of(t)) is not None:
        return DataType.INT128 if decimal[1] == 0 else DataType.FLOAT64
    if t.startswith("Float"):
        return DataType.FLOAT64
    if t.startswith(("DateTime", "Date")):
        return DataType.TIMESTAMP
    return DataType.STRING


def inner_type(sql_type: str) -> str:
    """``sql_type`` without ``Nullable(...)`` and ``LowCardinality(...)``."""
    while (found := _WRAPPERS.match(sql_type)) is not None:
        sql_type = found.group(1)
    return sql_type


def decimal_of(sql_type: str) -> tuple[int, int] | None:
    """Precision and scale of a ``Decimal(P, S)``."""
    found = _DECIMAL.match(sql_type)
    return (int(found.group(1)), int(found.group(2))) if found else None


def duckdb_type(sql_type: str) -> str | None:
    """The DuckDB type a staged column is converted to for a ClickHouse column, or None
    for types a load does not write (they stay at their default)."""
    t = inner_type(sql_type)
    if t in _DUCKDB:
        return _DUCKDB[t]
    if (decimal := decimal_of(t)) is not None:
        return f"DECIMAL({decimal[0]}, {decimal[1]})"
    if t.startswith("DateTime"):
        return "TIMESTAMP"
    return None


def dialect_for(features: ServerFeatures) -> Dialect:
    """The ClickHouse dialect with the timestamp type this server has."""
    if features.datetime64:
        return CLICKHOUSE
    from dataclasses import replace
    from types import MappingProxyType

    return replace(CLICKHOUSE, types=MappingProxyType({**CLICKHOUSE.types,
                                                       DataType.TIMESTAMP: DATETIME}))  # fmt: skip


_OWN = (
    "LowCardinality|Nullable|String|FixedString|UInt8|UInt16|UInt32|UInt64|UInt128|UInt256|"
    "Int8|Int16|Int32|Int64|Int128|Int256|Float32|Float64|Decimal|DateTime64|DateTime|"
    "Date32|Date|UUID|Enum8|Enum16|IPv4|IPv6|Bool"
)
_OWN_TYPE = re.compile(rf"^\s*({_OWN})\b", re.IGNORECASE)
_FAMILY = re.compile(rf"\b({_OWN})\b", re.IGNORECASE)
_CANONICAL = {name.lower(): name for name in _OWN.split("|")}


def own_type(text: str) -> str | None:
    """``text`` as a ClickHouse type if it names one of ClickHouse's own (a mapping's
    ``type: LowCardinality(String)``), its families spelled as ClickHouse does (seed 1
    writes ``Lowcardinality``); None for eventpipe's lattice names (``INT64``,
    ``String``: each destination's type for them) and other SQL names."""
    if _OWN_TYPE.match(text) is None or text.strip().upper() in DataType.__members__:
        return None  # eventpipe's own names (INT64, STRING...): the lattice's type
    return _FAMILY.sub(lambda m: _CANONICAL[m.group(1).lower()], text.strip())


def mapped_types(mappings: MappingConfig) -> dict[str, str]:
    """Column -> ClickHouse type, of the mapping rules whose type is ClickHouse's own:
    the column is made with that type instead of its lattice type's."""
    from eventpipe.schema.naming import column_name
    from eventpipe.schema.pointers import parse_pointer

    found = {}
    for i, rule in enumerate(mappings.fields):
        sql_type = own_type(rule.type) if rule.type else None
        path = rule.src if rule.action == "cast" else rule.dst
        if sql_type is not None and path is not None:
            found[column_name(parse_pointer(path, where=f"mappings.fields[{i}]"))] = sql_type
    return found


def column_type(sql_type: str, *, required: bool) -> str:
    """A mapped type as a column's: ``Nullable`` unless ``required`` (a key's column,
    ``_timestamp``) or already; inside ``LowCardinality`` (ClickHouse refuses
    ``Nullable(LowCardinality(...))``)."""
    if required or sql_type.startswith("Nullable("):
        return sql_type
    if sql_type.startswith("LowCardinality(") and sql_type.endswith(")"):
        inner = sql_type[len("LowCardinality(") : -1]
        return sql_type if inner.startswith("Nullable(") else f"LowCardinality(Nullable({inner}))"
    return f"Nullable({sql_type})"


def without_low_cardinality(sql_type: str) -> str:
    """The type a column's values are encoded in (the server makes them LowCardinality)."""
    while sql_type.startswith("LowCardinality(") and sql_type.endswith(")"):
        sql_type = sql_type[len("LowCardinality(") : -1]
    return sql_type
