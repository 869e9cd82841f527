"""A batch's rows converted for a warehouse's bulk load: an in-memory DuckDB reads the
staged Parquet files, converts each column to the type the table's column takes
(``TRY_CAST``), and writes the rows that convert to one Parquet file; a row with a value
that does not convert is left out with the reason, as in the other destinations
(Snowflake and BigQuery when the staged files do not fit the table as they are:
:func:`fits`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eventpipe.destinations.base import LoadRequest, duckdb_casts
from eventpipe.errors import TerminalError, first_line
from eventpipe.reserved import ROW
from eventpipe.schema.dialects import DUCKDB


def beside(request: LoadRequest) -> str | None:
    """Where a load's converted file is written: beside the staged files (the run's
    work directory), not wherever the system keeps temporary files."""
    return str(request.files[0].parent) if request.files else None


def joined(files: Sequence[Path], out: Path) -> Path:
    """The staged ``files`` as one Parquet file ``out``, their rows as they are (for a
    bulk load that takes one file, when they fit its table: :func:`fits`)."""
    import duckdb

    listed = [str(f) for f in files]
    with duckdb.connect() as db:
        db.execute("COPY (SELECT * FROM read_parquet($files, union_by_name = true)) TO $out "
                   "(FORMAT parquet)", {"files": listed, "out": str(out)})  # fmt: skip
    return out


def converted_rows(
    request: LoadRequest,
    types: dict[str, str],
    out: Path,
    where: str,
    every: Sequence[str] = (),
) -> dict[int, str]:
    """The batch's rows, each of ``request.columns`` converted by DuckDB to ``types``
    (column -> DuckDB type), written to ``out`` (nothing when no row is left); the rows
    left out: position across the files -> why (each reason after ``where``, the
    destination's type). ``every``: the file's columns in this order instead of the
    batch's (a table's whole row, for a load that matches columns by position), a column
    the batch lacks as NULLs of its type."""
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
        raise TerminalError(f"{where}: a staged file is not Parquet: {first_line(exc)}") from None
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
            listed = ", ".join(
                q(c) if c in wanted else f"CAST(NULL AS {types[c]}) AS {q(c)}"
                for c in every or wanted
            )
            db.execute(f"COPY (SELECT {listed} FROM batch WHERE why = '') TO $out "
                       "(FORMAT parquet)", {"out": str(out)})  # fmt: skip
    finally:
        db.close()
    return {offsets[str(name)] + int(row): f"{where}: {why}" for name, row, why in refused}


def fits(files: Sequence[Path], types: dict[str, str]) -> bool:
    """Whether the staged ``files`` can be loaded as they are into columns of ``types``
    (column -> DuckDB type) by a bulk load that matches columns by name: each column's
    Parquet type one its column takes whole (an integer for ``number(19,0)``, a text for
    ``text``, an instant for ``TIMESTAMPTZ``...), and floats finite and within their
    ``numeric(p,s)``; the run's row ids (``_eventpipe_row``, which no table has) are left
    to the load to ignore. Otherwise :func:`converted_rows` converts them first."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    for file in files:
        schema = pq.read_schema(file)
        bounded = []
        for field in schema:
            if field.name == ROW:
                continue
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
    if duckdb_type == "TIMESTAMPTZ":  # an instant: a Parquet timestamp adjusted to UTC
        return bool(pa.types.is_timestamp(arrow_type) and arrow_type.tz is not None)
    if duckdb_type == "BIGINT":
        return bool(pa.types.is_signed_integer(arrow_type))
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
