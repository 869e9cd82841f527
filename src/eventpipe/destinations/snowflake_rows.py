"""A Snowflake load's files: the staged Parquet files as they are when their types fit
the table's columns (:func:`fits`), otherwise converted by an in-memory DuckDB to the
columns' types (destinations/converted.py), the rows whose values do not convert left
out with the reason."""

from __future__ import annotations

from pathlib import Path
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


def fits(files: list[Path], types: dict[str, str]) -> bool:
    """Whether the staged ``files`` can be copied as they are into columns of ``types``
    (column -> DuckDB type): each column's Parquet type one its column takes whole (an
    integer for ``number(19,0)``, a text for ``text``...), and floats finite and within
    their ``numeric(p,s)``. Otherwise :func:`converted_rows` converts them first."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    for file in files:
        schema = pq.read_schema(file)
        bounded = []
        for field in schema:
            wanted = types.get(field.name)
            if wanted is None or not _takes(wanted, field.type):
                return False
            if wanted.startswith("DECIMAL") and _is_float(field.type):
                bounded.append(field.name)
        if bounded:
            table = pq.read_table(file, columns=bounded)
            for name in bounded:
                precision, scale = _decimal(types[name])
                values = pc.drop_null(table.column(name))
                if len(values) and (
                    not pc.all(pc.is_finite(values)).as_py()
                    or pc.max(pc.abs(values)).as_py() >= 10 ** (precision - scale)
                ):
                    return False
    return True


def _is_float(arrow_type: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_floating(arrow_type))


def _decimal(duckdb_type: str) -> tuple[int, int]:
    precision, scale = duckdb_type[len("DECIMAL(") : -1].split(",")
    return int(precision), int(scale)


def _takes(duckdb_type: str, arrow_type: Any) -> bool:
    """Whether a column of ``duckdb_type`` takes every value of ``arrow_type`` as it is
    (floats into a decimal: checked for range by :func:`fits`)."""
    import pyarrow as pa

    if duckdb_type == "VARCHAR":
        return bool(pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type))
    if duckdb_type == "BOOLEAN":
        return bool(pa.types.is_boolean(arrow_type))
    if duckdb_type == "TIMESTAMP":
        return bool(pa.types.is_timestamp(arrow_type))
    if duckdb_type == "DOUBLE":
        return bool(pa.types.is_floating(arrow_type))
    if duckdb_type.startswith("DECIMAL"):
        precision, scale = _decimal(duckdb_type)
        if pa.types.is_floating(arrow_type):
            return scale > 0
        if pa.types.is_signed_integer(arrow_type):
            return precision - scale >= 19
        if pa.types.is_decimal(arrow_type):
            digits = arrow_type.precision - arrow_type.scale
            return bool(arrow_type.scale <= scale and digits <= precision - scale)
    return False
