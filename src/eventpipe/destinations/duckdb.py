"""DuckDB, the embedded default warehouse (``type: duckdb``).

* The database file is opened only while patching or loading: DuckDB admits one writing
  process, and users keep querying it (``eventpipe query``, their own DuckDB) in between.
* A load is one transaction: the rows and a record of ``batch_id`` in
  ``_eventpipe_loads`` commit together, so a crash leaves either both or neither, and a
  retried batch finds its record and loads nothing twice.
* With ``primary_key``, the load is an upsert in which the newest ``_timestamp`` wins
  (ties: the row loaded last).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb

from eventpipe.destinations.base import LoadRequest, LoadResult, table_lock
from eventpipe.errors import TerminalError, TransientError
from eventpipe.schema.dialects import DUCKDB
from eventpipe.schema.diff import Table, TablePatch
from eventpipe.schema.types import DataType

LOADS_TABLE = "_eventpipe_loads"

# DuckDB types back to the lattice, for tables eventpipe did not create itself.
_LATTICE = {
    "VARCHAR": DataType.STRING,
    "DOUBLE": DataType.FLOAT64,
    "FLOAT": DataType.FLOAT64,
    "DECIMAL": DataType.FLOAT64,
    "BIGINT": DataType.INT64,
    "INTEGER": DataType.INT64,
    "SMALLINT": DataType.INT64,
    "TINYINT": DataType.INT64,
    "HUGEINT": DataType.INT64,
    "BOOLEAN": DataType.BOOL,
    "TIMESTAMP": DataType.TIMESTAMP,
    "TIMESTAMP WITH TIME ZONE": DataType.TIMESTAMP,
}


def _lattice(sql_type: str) -> DataType:
    return _LATTICE.get(sql_type.split("(")[0].upper(), DataType.STRING)


class DuckDBDestination:
    dialect = DUCKDB

    def __init__(self, destination_id: str, path: Path, lock_dir: Path) -> None:
        self.id = destination_id
        self.path = path
        self.lock_dir = lock_dir

    @contextmanager
    def _connect(self) -> Iterator[duckdb.DuckDBPyConnection]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            connection = duckdb.connect(str(self.path))
        except duckdb.IOException as exc:  # another process holds the file
            raise TransientError(
                f"cannot open {self.path}: {exc}", fix="close other writers of the file"
            ) from exc
        try:
            yield connection
        finally:
            connection.close()

    def describe(self, table: str) -> Table | None:
        if not self.path.exists():
            return None
        with self._connect() as db:
            return _describe(db, table)

    def patch(self, patch: TablePatch) -> None:
        if patch.empty:
            return
        q = self.dialect.quote
        with table_lock(self.lock_dir, self.id, patch.table), self._connect() as db:
            current = _describe(db, patch.table)  # again, under the lock
            db.execute("BEGIN")
            if current is None:
                columns = ", ".join(
                    f"{q(name)} {self.dialect.sql_type(t)}" for name, t in patch.add_columns
                )
                key = patch.set_primary_key
                key_sql = f", PRIMARY KEY ({', '.join(q(c) for c in key)})" if key else ""
                db.execute(f"CREATE TABLE {q(patch.table)} ({columns}{key_sql})")
            else:
                for name, data_type in patch.add_columns:
                    if name not in current.columns:
                        db.execute(
                            f"ALTER TABLE {q(patch.table)} ADD COLUMN {q(name)} "
                            f"{self.dialect.sql_type(data_type)}"
                        )
            db.execute("COMMIT")

    def load(self, request: LoadRequest) -> LoadResult:
        q = self.dialect.quote
        files = [str(f) for f in request.files]
        with table_lock(self.lock_dir, self.id, request.table), self._connect() as db:
            db.execute(
                f"CREATE TABLE IF NOT EXISTS {LOADS_TABLE} (batch_id VARCHAR, tbl VARCHAR, "
                "rows BIGINT, loaded_at TIMESTAMP DEFAULT current_timestamp, "
                "PRIMARY KEY (batch_id, tbl))"
            )
            db.execute("BEGIN")
            try:
                done = db.execute(
                    f"SELECT rows FROM {LOADS_TABLE} WHERE batch_id = ? AND tbl = ?",
                    [request.batch_id, request.table],
                ).fetchone()
                if done is not None:
                    db.execute("ROLLBACK")
                    return LoadResult(rows=int(done[0]), already_loaded=True)
                columns = ", ".join(q(c) for c in request.columns)
                source = f"SELECT {columns} FROM read_parquet(?, union_by_name = true)"
                if request.primary_key:
                    rows = _upsert(db, request, source, files)
                else:
                    inserted = db.execute(
                        f"INSERT INTO {q(request.table)} ({columns}) {source}", [files]
                    ).fetchone()
                    rows = int(inserted[0]) if inserted else 0  # DuckDB returns the count
                db.execute(
                    f"INSERT INTO {LOADS_TABLE} (batch_id, tbl, rows) VALUES (?, ?, ?)",
                    [request.batch_id, request.table, rows],
                )
                db.execute("COMMIT")
            except duckdb.ConversionException as exc:
                db.execute("ROLLBACK")
                raise TerminalError(f"{request.table}: {exc}", table=request.table) from exc
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return LoadResult(rows=rows)

    def query(self, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run SQL read-only and return column names and rows (``eventpipe query``)."""
        connection = duckdb.connect(str(self.path), read_only=True)
        try:
            cursor = connection.execute(sql)
            names = [d[0] for d in cursor.description or []]
            return names, cursor.fetchall()
        finally:
            connection.close()


def _describe(db: duckdb.DuckDBPyConnection, table: str) -> Table | None:
    rows = db.execute(
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = 'main' AND table_name = ? ORDER BY ordinal_position",
        [table],
    ).fetchall()
    if not rows:
        return None
    key_rows = db.execute(
        "SELECT constraint_column_names FROM duckdb_constraints() "
        "WHERE table_name = ? AND constraint_type = 'PRIMARY KEY'",
        [table],
    ).fetchall()
    primary_key = tuple(key_rows[0][0]) if key_rows else ()
    return Table(table, {name: _lattice(t) for name, t in rows}, primary_key)


def _upsert(
    db: duckdb.DuckDBPyConnection, request: LoadRequest, source: str, files: list[str]
) -> int:
    """Insert or update by primary key; the newest ``_timestamp`` wins, also within the batch."""
    q = DUCKDB.quote
    key = ", ".join(q(c) for c in request.primary_key)
    columns = list(request.columns)
    order = f"{q('_timestamp')} DESC NULLS LAST" if "_timestamp" in columns else "1"
    newest = (
        f"SELECT * FROM ({source}) QUALIFY row_number() OVER (PARTITION BY {key} "
        f"ORDER BY {order}) = 1"
    )
    updates = ", ".join(
        f"{q(c)} = excluded.{q(c)}" for c in columns if c not in request.primary_key
    )
    newer = (
        f" WHERE excluded.{q('_timestamp')} >= {q(request.table)}.{q('_timestamp')}"
        f" OR {q(request.table)}.{q('_timestamp')} IS NULL"
        if "_timestamp" in columns
        else ""
    )
    action = f"DO UPDATE SET {updates}{newer}" if updates else "DO NOTHING"
    db.execute(
        f"INSERT INTO {q(request.table)} ({', '.join(q(c) for c in columns)}) {newest} "
        f"ON CONFLICT ({key}) {action}",
        [files],
    )
    row = db.execute(f"SELECT count(*) FROM ({newest})", [files]).fetchone()
    return int(row[0]) if row else 0
