"""How eventpipe's tables are written in BigQuery's schema: each lattice type's column
type and back, the DuckDB type a column's values are converted to before a load, and
the primary key, which BigQuery keeps only as information: each key column's
description says its place in the key, and :func:`key_of` reads it back."""

from __future__ import annotations

import re
from typing import Any

from eventpipe.schema.types import DataType

KEY_DESCRIPTION = "eventpipe primary key, column {} of {}"
"""A key column's description: its place in the key (from 1) and the key's length."""

TYPES = {
    DataType.STRING: "STRING",
    DataType.FLOAT64: "FLOAT",
    DataType.INT64: "INTEGER",
    DataType.INT128: "BIGNUMERIC",
    DataType.BOOL: "BOOLEAN",
    DataType.TIMESTAMP: "TIMESTAMP",
}
"""Each lattice type's BigQuery column (seed 1's; INT128 as BIGNUMERIC)."""
LATTICE = {
    "STRING": DataType.STRING, "JSON": DataType.STRING, "BYTES": DataType.STRING,
    "FLOAT": DataType.FLOAT64, "FLOAT64": DataType.FLOAT64, "NUMERIC": DataType.FLOAT64,
    "INTEGER": DataType.INT64, "INT64": DataType.INT64,
    "BIGNUMERIC": DataType.INT128, "BIGDECIMAL": DataType.INT128,
    "BOOLEAN": DataType.BOOL, "BOOL": DataType.BOOL,
    "TIMESTAMP": DataType.TIMESTAMP, "DATETIME": DataType.TIMESTAMP, "DATE": DataType.TIMESTAMP,
}  # fmt: skip
"""BigQuery's types back to the lattice (what someone else made is read as its nearest)."""
DUCKDB_TYPES = {
    DataType.STRING: "VARCHAR",
    DataType.FLOAT64: "DOUBLE",
    DataType.INT64: "BIGINT",
    DataType.INT128: "DECIMAL(38,0)",
    DataType.BOOL: "BOOLEAN",
    DataType.TIMESTAMP: "TIMESTAMPTZ",  # Parquet's instant in UTC: BigQuery's TIMESTAMP
}
"""The DuckDB type each column's values are converted to before the load."""


def field(bigquery: Any, column: str, data_type: DataType, key: tuple[str, ...]) -> Any:
    """A column's schema field; a key column's description says its place in the key."""
    description = None
    if column in key:
        description = KEY_DESCRIPTION.format(key.index(column) + 1, len(key))
    return bigquery.SchemaField(column, TYPES[data_type], description=description)


def key_of(schema: Any) -> tuple[str, ...]:
    """The primary key the columns' descriptions say (:data:`KEY_DESCRIPTION`)."""
    pattern = re.compile(r"^eventpipe primary key, column (\d+) of (\d+)$")
    found = sorted((int(m[1]), f.name) for f in schema if (m := pattern.match(f.description or "")))
    return tuple(name for _, name in found)
