"""A batch's staged rows as ClickHouse Native blocks, converted to a table's types.

Staged files whose columns have the types the table's columns take are read as they are
(pyarrow). Otherwise an in-memory DuckDB reads them and converts each column to the
DuckDB type of its ClickHouse column (:func:`duckdb_type`), in one pass: a value that
does not convert (a text where a number goes) leaves its row out, with the reason. The
rows then go to the Native encoder (native.py), a block at a time; a value the ClickHouse
type cannot hold (a time outside ``DateTime``'s range, a null in a key column) leaves
its row out too. A row's position (across the files, from 0) is what names it to the
job, which finds its event (``LoadResult.rejected``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from eventpipe.destinations.base import LoadRequest, duckdb_casts
from eventpipe.destinations.clickhouse.native import UnencodableValue, block_parts
from eventpipe.destinations.clickhouse.types import decimal_of, duckdb_type, inner_type
from eventpipe.schema.dialects import DUCKDB

BLOCK_ROWS = 65_536
"""Rows per Native block (one HTTP request each): small enough that sending one overlaps
encoding the next, large enough for few parts (ClickHouse's advice: inserts of tens of
thousands of rows)."""

FILE = "_eventpipe_file"
ROW = "_eventpipe_file_row"
WHY = "_eventpipe_why"


def native_blocks(
    request: LoadRequest, types: dict[str, str], load_column: str
) -> Iterator[tuple[tuple[list[bytes], int] | None, dict[int, str]]]:
    """The batch's rows as Native blocks of the ``types`` columns (name -> ClickHouse
    type; ``load_column`` holds the batch id), each with the rows left out on the way:
    (position, reason). A block of None: only rows left out.

    Staged files whose columns already have the types the table's take (what the job
    stages for a table it typed) are read as they are, by pyarrow; otherwise DuckDB
    converts them (:func:`_converted`)."""
    import numpy as np
    import pyarrow as pa

    files = [str(f) for f in request.files]
    if not files:
        return
    columns = {c: t for c, t in types.items() if c != load_column}
    read = _as_they_are if _fit(files, columns) else _converted
    for table, positions, left_out in read(files, columns):
        table = table.append_column(load_column, pa.array([request.batch_id] * len(table)))
        block: tuple[list[bytes], int] | None = None
        while len(table):
            try:
                block = (block_parts(table, types), len(table))
                break
            except UnencodableValue as exc:
                rows = np.array(exc.rows, dtype=np.int64)
                left_out.update((int(positions[i]), f"clickhouse: column {exc.message}")
                                for i in rows)  # fmt: skip
                keep = np.setdiff1d(np.arange(len(table)), rows)
                table, positions = table.take(keep), positions[keep]
        if block is not None or left_out:
            yield block, left_out


Rows = Iterator[tuple[Any, Any, dict[int, str]]]
"""Tables of a block's rows, their positions (numpy) and the rows left out so far."""


def _fit(files: list[str], columns: dict[str, str]) -> bool:
    """Whether every file's columns have the Arrow types that ``columns`` take as they
    are (a column missing from a file is null there)."""
    import pyarrow.parquet as pq

    for name in files:
        schema = pq.read_schema(name)
        for column, sql_type in columns.items():
            index = schema.get_field_index(column)
            if index >= 0 and not _takes(sql_type, schema.field(index).type):
                return False
    return True


def _takes(sql_type: str, arrow_type: Any) -> bool:
    """Whether a ClickHouse column of ``sql_type`` takes ``arrow_type``'s values as they
    are (the Native encoder writes them without a conversion that could fail)."""
    import pyarrow as pa

    t = inner_type(sql_type)
    if t == "String":
        return bool(pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type))
    if t == "UInt8":
        return bool(pa.types.is_boolean(arrow_type))
    if t in ("Int64", "Float64"):
        return bool(arrow_type == (pa.int64() if t == "Int64" else pa.float64()))
    if (decimal := decimal_of(t)) is not None:
        return bool(arrow_type == pa.decimal128(*decimal))
    if t.startswith("DateTime"):
        return bool(pa.types.is_timestamp(arrow_type) and arrow_type.tz in (None, "UTC"))
    return False


def _as_they_are(files: list[str], columns: dict[str, str]) -> Rows:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    start = 0
    for name in files:
        parquet = pq.ParquetFile(name)
        present = [c for c in columns if parquet.schema_arrow.get_field_index(c) >= 0]
        for batch in parquet.iter_batches(batch_size=BLOCK_ROWS, columns=present):
            table = pa.Table.from_batches([batch])
            for column in columns:
                if column not in present:
                    table = table.append_column(column, pa.nulls(len(table), pa.string()))
            positions = np.arange(start, start + len(table), dtype=np.int64)
            start += len(table)
            yield table, positions, {}


def _converted(files: list[str], columns: dict[str, str]) -> Rows:
    """The files' columns converted by DuckDB to the DuckDB type of their ClickHouse
    column, in one pass with the reasons of the values that do not convert."""
    import duckdb
    import numpy as np
    import pyarrow as pa

    from eventpipe.destinations.duckdb import file_offsets

    q = DUCKDB.quote
    casts, why = duckdb_casts({c: duckdb_type(t) or "VARCHAR" for c, t in columns.items()})
    offsets = file_offsets(files)
    db = duckdb.connect()
    try:
        db.execute("SET TimeZone = 'UTC'")
        reader = db.sql(
            f"SELECT {casts}, {why} AS {q(WHY)}, "
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
            yield table, positions, left_out
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
