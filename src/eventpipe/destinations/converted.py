"""A batch's rows converted for a warehouse's bulk load: an in-memory DuckDB reads the
staged Parquet files, converts each column to the type the table's column takes
(``TRY_CAST``), and writes the rows that convert to one Parquet file; a row with a value
that does not convert is left out with the reason, as in the other destinations
(Snowflake when its files do not fit as they are, BigQuery always)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from eventpipe.destinations.base import LoadRequest, duckdb_casts
from eventpipe.errors import TerminalError, first_line
from eventpipe.schema.dialects import DUCKDB


def beside(request: LoadRequest) -> str | None:
    """Where a load's converted file is written: beside the staged files (the run's
    work directory), not wherever the system keeps temporary files."""
    return str(request.files[0].parent) if request.files else None


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
