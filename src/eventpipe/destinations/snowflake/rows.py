"""The DuckDB type a Snowflake column's values are converted to when a load's staged
files do not fit its table as they are (destinations/converted.py)."""

from __future__ import annotations

from typing import Any


def duckdb_type(sql_type: str, precision: Any, scale: Any) -> str:
    """The DuckDB type a Snowflake column's values are converted to before the load."""
    name = sql_type.upper().split("(")[0].strip()
    if name in ("NUMBER", "DECIMAL", "NUMERIC", "INT", "INTEGER", "BIGINT"):
        digits = min(int(precision or 38), 38)
        return f"DECIMAL({digits},{int(scale or 0)})"
    if name in ("FLOAT", "DOUBLE", "REAL"):
        return "DOUBLE"
    if name == "BOOLEAN":
        return "BOOLEAN"
    if name.startswith("TIMESTAMP") or name == "DATE":
        return "TIMESTAMP"
    return "VARCHAR"
