"""A Snowflake load's files: the staged Parquet files as they are when their types fit
the table's columns (:func:`fits`), otherwise converted by an in-memory DuckDB to the
columns' types, the rows whose values do not convert left out with the reason
(:func:`converted_rows`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eventpipe.destinations.base import LoadRequest, duckdb_casts
from eventpipe.errors import TerminalError, first_line
from eventpipe.schema.dialects import DUCKDB


def beside(request: LoadRequest) -> str | None:
    """Where a load's converted file is written: beside the staged files (the run's
    work directory), not wherever the system keeps temporary files."""
    return str(request.files[0].parent) if request.files else None


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


def converted_rows(request: LoadRequest, types: dict[str, str], out: Path) -> dict[int, str]:
    """The batch's rows, each of ``request.columns`` converted by DuckDB to ``types``
    (column -> DuckDB type), written to ``out`` (nothing when no row is left); the rows
    left out: position across the files -> why."""
    import duckdb

    from eventpipe.destinations.duckdb import file_offsets

    files = [str(f) for f in request.files]
    if not files:
        return {}
    q = DUCKDB.quote
    wanted = {c: types[c] for c in request.columns}
    casts, why = duckdb_casts(wanted)
    try:
        offsets = file_offsets(files)
    except Exception as exc:  # noqa: BLE001 - pyarrow's errors for a file that is not Parquet
        raise TerminalError(f"snowflake: a staged file is not Parquet: {first_line(exc)}") from None
    db = duckdb.connect()
    try:
        db.execute("SET TimeZone = 'UTC'")
        db.execute(
            f"CREATE TABLE batch AS SELECT {casts}, {why} AS why, "
            "filename, file_row_number FROM read_parquet($files, union_by_name = true, "
            "filename = true, file_row_number = true)",
            {"files": files},
        )
        refused = db.execute(
            "SELECT filename, file_row_number, why FROM batch WHERE why <> ''"
        ).fetchall()
        (kept,) = db.execute("SELECT count(*) FROM batch WHERE why = ''").fetchone() or (0,)
        if kept:
            listed = ", ".join(q(c) for c in wanted)
            db.execute(f"COPY (SELECT {listed} FROM batch WHERE why = '') TO $out "
                       "(FORMAT parquet)", {"out": str(out)})  # fmt: skip
    finally:
        db.close()
    return {offsets[str(name)] + int(row): f"snowflake: {why}" for name, row, why in refused}
