"""A batch's staged rows as ClickHouse Native blocks, converted to a table's types.

An in-memory DuckDB reads the staged Parquet files and converts each column to the
DuckDB type of its ClickHouse column (:func:`duckdb_type`), in one pass: a value that
does not convert (a text where a number goes) leaves its row out, with the reason. The
rows then go to the Native encoder (native.py), a block at a time; a value the ClickHouse
type cannot hold (a time outside ``DateTime``'s range, a null in a key column) leaves
its row out too. A row's position (across the files, from 0) is what names it to the
job, which finds its event (``LoadResult.rejected``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from eventpipe.destinations.base import LoadRequest
from eventpipe.destinations.clickhouse.native import UnencodableValue, encode_block
from eventpipe.schema.dialects import DUCKDB

BLOCK_ROWS = 262_144
"""Rows per Native block (one HTTP request each)."""

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
FILE = "_eventpipe_file"
ROW = "_eventpipe_file_row"
WHY = "_eventpipe_why"


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


def native_blocks(
    request: LoadRequest, types: dict[str, str], load_column: str
) -> Iterator[tuple[tuple[bytes, int] | None, dict[int, str]]]:
    """The batch's rows as Native blocks of the ``types`` columns (name -> ClickHouse
    type; ``load_column`` holds the batch id), each with the rows left out on the way:
    (position, reason). A block of None: only rows left out."""
    import duckdb
    import numpy as np
    import pyarrow as pa

    from eventpipe.destinations.duckdb import file_offsets

    files = [str(f) for f in request.files]
    if not files:
        return
    q = DUCKDB.quote
    converted = {c: duckdb_type(t) or "VARCHAR" for c, t in types.items() if c != load_column}
    casts = ", ".join(f"TRY_CAST({q(c)} AS {t}) AS {q(c)}" for c, t in converted.items())
    problems = ", ".join(
        f"CASE WHEN {q(c)} IS NOT NULL AND TRY_CAST({q(c)} AS {t}) IS NULL THEN "
        f"'column ' || {_literal(c)} || ' ({t}) cannot take ' || CAST({q(c)} AS VARCHAR) END"
        for c, t in converted.items()
    )
    offsets = file_offsets(files)
    db = duckdb.connect()
    try:
        db.execute("SET TimeZone = 'UTC'")
        reader = db.sql(
            f"SELECT {casts}, concat_ws('; ', {problems or 'NULL'}) AS {q(WHY)}, "
            f"filename AS {q(FILE)}, file_row_number AS {q(ROW)} FROM read_parquet($files, "
            "union_by_name = true, filename = true, file_row_number = true)",
            params={"files": files},
        ).to_arrow_reader(BLOCK_ROWS)
        for batch in reader:
            table = pa.Table.from_batches([batch])
            positions = _positions(table, offsets)
            left_out: dict[int, str] = {}
            why = table.column(WHY).to_numpy(zero_copy_only=False)
            bad = np.flatnonzero(why != "")
            if len(bad):
                left_out.update((int(positions[i]), f"clickhouse: {why[i]}") for i in bad)
                keep = np.setdiff1d(np.arange(len(table)), bad)
                table, positions = table.take(keep), positions[keep]
            table = table.append_column(load_column, pa.array([request.batch_id] * len(table)))
            block: tuple[bytes, int] | None = None
            while len(table):
                try:
                    block = (encode_block(table, types), len(table))
                    break
                except UnencodableValue as exc:
                    rows = np.array(exc.rows, dtype=np.int64)
                    left_out.update((int(positions[i]), f"clickhouse: column {exc.message}")
                                    for i in rows)  # fmt: skip
                    keep = np.setdiff1d(np.arange(len(table)), rows)
                    table, positions = table.take(keep), positions[keep]
            if block is not None or left_out:
                yield block, left_out
    finally:
        db.close()


def _positions(table: Any, offsets: dict[str, int]) -> Any:
    """Each row's position across the files (numpy), from its file and row number."""
    import numpy as np
    import pyarrow.compute as pc

    names = pc.dictionary_encode(table.column(FILE)).combine_chunks()
    first = np.array([offsets[str(n)] for n in names.dictionary.to_pylist()], dtype=np.int64)
    rows = table.column(ROW).to_numpy().astype(np.int64)
    return first[names.indices.to_numpy(zero_copy_only=False)] + rows


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
