"""DuckDB, the embedded default warehouse (``type: duckdb``).

* The database file is opened only while patching or loading: DuckDB admits one writing
  process, and users keep querying it (``eventpipe query``, their own DuckDB) in between.
  While a reader holds the file, opening it waits (past ``query_timeout_seconds``, polling)
  instead of failing: readers come and go, a stream loads every second.
* A load is one transaction: the rows and a record of ``batch_id`` in
  ``_eventpipe_loads`` commit together, so a crash leaves either both or neither, and a
  retried batch finds its record and loads nothing twice.
* With ``primary_key``, the load is an upsert in which the newest ``_timestamp`` wins
  (ties: the row loaded last).
* A source's changes (``_op``, ``_key``...) are applied by key: upserts, deletes and
  truncates (destinations/changes.py).
* A row with a value its column cannot take is left out with the reason
  (``LoadResult.rejected``, found with ``TRY_CAST``), and the rest loads.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb

from eventpipe import reserved
from eventpipe.destinations import changes
from eventpipe.destinations.base import (
    ALL_SWAPPED,
    QUERY_TIMEOUT_SECONDS,
    DaySwap,
    LoadRequest,
    LoadResult,
    delete_days,
    newest_only,
    table_lock,
)
from eventpipe.errors import QueryError, TerminalError, TransientError, first_line
from eventpipe.locks import Locks
from eventpipe.schema.dialects import DUCKDB
from eventpipe.schema.diff import Table, TablePatch
from eventpipe.schema.types import DataType

LOADS_TABLE = reserved.LOADS_TABLE

LOCK_WAIT_SECONDS = 30.0
"""How long opening the file for writing waits at least for other processes (readers) to
let go, before the load fails as transient (and is retried later with backoff)."""


def lock_wait(query_timeout_seconds: float) -> float:
    """How long a load waits for readers: past the destination's query time limit, so
    that an ``eventpipe query`` (interrupted by then) never fails a load."""
    return max(LOCK_WAIT_SECONDS, query_timeout_seconds + 15)


# DuckDB types back to the lattice, for tables eventpipe did not create itself.
_LATTICE = {
    "VARCHAR": DataType.STRING,
    "DOUBLE": DataType.FLOAT64,
    "FLOAT": DataType.FLOAT64,
    "DECIMAL": DataType.FLOAT64,  # with a fraction; DECIMAL(p,0) is INT128 (_lattice)
    "BIGINT": DataType.INT64,
    "INTEGER": DataType.INT64,
    "SMALLINT": DataType.INT64,
    "TINYINT": DataType.INT64,
    "UINTEGER": DataType.INT64,
    "USMALLINT": DataType.INT64,
    "UTINYINT": DataType.INT64,
    "UBIGINT": DataType.INT128,
    "HUGEINT": DataType.INT128,
    "BOOLEAN": DataType.BOOL,
    "TIMESTAMP": DataType.TIMESTAMP,
    "TIMESTAMP WITH TIME ZONE": DataType.TIMESTAMP,
}


def _lattice(sql_type: str) -> DataType:
    name, _, parameters = sql_type.upper().partition("(")
    if name == "DECIMAL" and parameters.replace(" ", "").endswith(",0)"):
        return DataType.INT128
    return _LATTICE.get(name, DataType.STRING)


class DuckDBDestination:
    dialect = DUCKDB
    parallel_loads = 2
    """One process writes a DuckDB file at a time, and its connections load tables side
    by side: appends to different tables commit beside each other. One insert into a
    DuckDB file keeps one core busy (threads=1 is as fast), so two tables load in about
    the time of one. Where the run still compresses its segments for the archive beside
    the loads, they take one thread fewer and leave it a core (processing/batch/load.py); where
    the service's wait compressed them, the loads take both (docs/pipeline.md)."""

    def __init__(
        self,
        destination_id: str,
        path: Path,
        locks: Locks,
        query_timeout_seconds: float = QUERY_TIMEOUT_SECONDS,
    ) -> None:
        self.id = destination_id
        self.path = path
        self.locks = locks
        self.query_timeout_seconds = query_timeout_seconds

    @contextmanager
    def _connect(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A writing connection. The file's own failures (truncated, damaged, unreadable:
        DuckDB's IO, internal and fatal errors) are the destination's, not its events':
        a TransientError, so the destination waits with its backlog while the others
        load, instead of its events going to failed/ one by one (isolation takes any
        other failure for the events')."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        connection = _open_for_writing(self.path, lock_wait(self.query_timeout_seconds))
        try:
            yield connection
        except duckdb.Error as exc:
            if not _damaged_file(exc):
                raise
            raise TransientError(
                f"{self.id}: {self.path} cannot be read or written: {first_line(exc)}",
                fix="restore the file from a backup or move it aside; `eventpipe reprocess "
                "--force --destination` rebuilds its days from the archive",
            ) from exc
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
        d = self.dialect
        with table_lock(self.locks, self.id, patch.table), self._connect() as db:
            current = _describe(db, patch.table)  # again, under the lock
            db.execute("BEGIN")
            if current is None:
                db.execute(d.create_table(patch.table, patch.add_columns, patch.set_primary_key))
            else:
                for name, data_type in patch.add_columns:
                    if name not in current.columns:
                        db.execute(d.add_column(patch.table, name, data_type))
            db.execute("COMMIT")

    def load(self, request: LoadRequest) -> LoadResult:
        files = [str(f) for f in request.files]
        with table_lock(self.locks, self.id, request.table), self._connect() as db:
            _ensure_loads_table(db)
            try:
                return self._load_once(db, request, files, ())
            except (duckdb.CatalogException, duckdb.BinderException) as exc:
                # The table or a column is not what the request says (changed by someone
                # else since it was described): the job reads it again (a stream) or
                # the rows go to failed/.
                raise TerminalError(f"{request.table}: {exc}", table=request.table) from exc
            except duckdb.ConstraintException as exc:
                # A constraint of the table (CHECK, NOT NULL, UNIQUE made by its owner)
                # refuses rows: the job loads the batch in parts to find them.
                raise TerminalError(f"{request.table}: {exc}", table=request.table) from exc
            except duckdb.ConversionException as exc:
                # Values the table's columns cannot take: those rows are left out, and
                # the rest loads (TRY_CAST finds them, without a second failure).
                rejected = _unconvertible(db, request, files)
                if not rejected:
                    raise TerminalError(f"{request.table}: {exc}", table=request.table) from exc
                return self._load_once(db, request, files, rejected)

    def _load_once(
        self,
        db: duckdb.DuckDBPyConnection,
        request: LoadRequest,
        files: list[str],
        rejected: tuple[tuple[int, str], ...],
    ) -> LoadResult:
        """One transaction: the rows (but the ``rejected`` positions) and the batch's
        record, or nothing."""
        q = self.dialect.quote
        db.execute("BEGIN")
        try:
            done = db.execute(
                f"SELECT rows, rejected FROM {LOADS_TABLE} WHERE batch_id = ? AND tbl = ?",
                [request.batch_id, request.table],
            ).fetchone()
            if done is not None:  # loaded before; what it left out is remembered too
                db.execute("ROLLBACK")
                left_out = tuple((int(i), str(why)) for i, why in json.loads(done[1] or "[]"))
                return LoadResult(rows=int(done[0]), already_loaded=True, rejected=left_out)
            columns = ", ".join(q(c) for c in request.columns)
            source, params = rows_of(columns, files, rejected)
            if request.apply_changes:
                rows = _apply_changes(db, request, source, params)
            elif request.primary_key:
                rows = _upsert(db, request, source, params)
            else:
                inserted = db.execute(
                    f"INSERT INTO {q(request.table)} ({columns}) {source}", params
                ).fetchone()
                rows = int(inserted[0]) if inserted else 0  # DuckDB returns the count
            db.execute(
                f"INSERT INTO {LOADS_TABLE} (batch_id, tbl, rows, rejected) VALUES (?, ?, ?, ?)",
                [request.batch_id, request.table, rows, json.dumps([list(r) for r in rejected])],
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return LoadResult(rows=rows, rejected=rejected)

    def tables(self) -> list[str]:
        """The names of the tables in the database (its main schema)."""
        if not self.path.exists():
            return []
        with self._connect() as db:
            rows = db.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = 'main' AND table_type = 'BASE TABLE' ORDER BY 1"
            ).fetchall()
        return [name for (name,) in rows]

    def drop(self, tables: list[str]) -> None:
        with self._connect() as db:
            for table in tables:
                db.execute(f"DROP TABLE IF EXISTS {self.dialect.quote(table)}")

    def replace_days(self, swap: DaySwap) -> dict[str, int]:
        """Delete the rows of ``swap.days`` from ``swap.tables`` and move the shadows'
        rows in (an upsert with a primary key), in one transaction recorded under
        ``swap.swap_id``; the rows moved in per table."""
        q = self.dialect.quote
        with contextlib.ExitStack() as held:
            for table in sorted({*swap.tables, *swap.shadows}):
                held.enter_context(table_lock(self.locks, self.id, table))
            db = held.enter_context(self._connect())
            _ensure_loads_table(db)
            db.execute("BEGIN")
            try:
                done = db.execute(
                    f"SELECT tbl, rows FROM {LOADS_TABLE} WHERE batch_id = ?", [swap.swap_id]
                ).fetchall()
                if done:
                    db.execute("ROLLBACK")
                    return {t: int(n) for t, n in done if t != ALL_SWAPPED}
                delete_days(swap, q, lambda t: _describe(db, t),
                            lambda t, where: db.execute(f"DELETE FROM {q(t)} WHERE {where}"),
                            self.id)  # fmt: skip
                moved: dict[str, int] = {}
                for table, shadow in sorted(swap.shadows.items()):
                    described = _describe(db, shadow)
                    if described is None:
                        continue
                    columns = ", ".join(q(c) for c in described.columns)
                    source = f"SELECT {columns} FROM {q(shadow)}"
                    if swap.primary_key:
                        request = LoadRequest(
                            table, swap.swap_id, (), described.columns, swap.primary_key
                        )
                        moved[table] = _upsert(db, request, source, {})
                    else:
                        row = db.execute(f"INSERT INTO {q(table)} ({columns}) {source}").fetchone()
                        moved[table] = int(row[0]) if row else 0
                    db.execute(f"DROP TABLE {q(shadow)}")
                db.executemany(
                    f"INSERT INTO {LOADS_TABLE} (batch_id, tbl, rows) VALUES (?, ?, ?)",
                    [[swap.swap_id, t, n] for t, n in [*moved.items(), (ALL_SWAPPED, 0)]],
                )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return moved

    def keep_newest(self, tables: Sequence[str], cutoff: datetime) -> int:
        """Metering: of each key in the window, only its newest version's rows stay
        (destinations/base.py newest_only), in one transaction; the rows removed."""
        q = self.dialect.quote
        with contextlib.ExitStack() as held:
            for table in sorted(tables):
                held.enter_context(table_lock(self.locks, self.id, table))
            db = held.enter_context(self._connect())
            found = [t for t in tables if _describe(db, t) is not None]
            if not found:
                return 0
            removed = 0
            db.execute("BEGIN")
            try:
                for delete in newest_only(found, q, q, cutoff):
                    row = db.execute(delete).fetchone()
                    removed += int(row[0]) if row else 0
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            return removed

    def rows(self, table: str, columns: Sequence[str]) -> list[dict[str, Any]]:
        listed = ", ".join(map(self.dialect.quote, columns))
        with self._connect() as db:
            found = db.execute(f"SELECT {listed} FROM {self.dialect.quote(table)}").fetchall()
        return [dict(zip(columns, row, strict=True)) for row in found]

    def query(
        self, sql: str, *, timeout_seconds: float = QUERY_TIMEOUT_SECONDS
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run SQL read-only and return column names and rows (``eventpipe query``): the
        database opened read-only, without access to any other file, for at most
        ``timeout_seconds`` (a reader holds the file, so a load waits for it)."""
        connection = duckdb.connect(
            str(self.path), read_only=True, config={"enable_external_access": False}
        )
        try:
            return read_only_query(connection, sql, timeout_seconds=timeout_seconds)
        finally:
            connection.close()


QUERY_STATEMENTS = frozenset({duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN})


def read_only_query(
    connection: duckdb.DuckDBPyConnection,
    sql: str,
    *,
    timeout_seconds: float = QUERY_TIMEOUT_SECONDS,
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """``sql`` on ``connection`` if it is one query (SELECT, EXPLAIN): column names and
    rows. Anything else (several statements, COPY, ATTACH, SET, a write) is refused with a
    QueryError before it runs. With external access off (the caller's), a query reads
    no file beyond what the connection allows. DuckDB has no statement timeout: a timer
    interrupts the query after ``timeout_seconds``, fetching included."""
    try:
        statements = connection.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryError(first_line(exc)) from None
    if len(statements) != 1 or statements[0].type not in QUERY_STATEMENTS:
        kinds = ", ".join(s.type.name for s in statements) or "nothing"
        raise QueryError(f"eventpipe query runs one SELECT (or EXPLAIN); this is {kinds}")
    timer = threading.Timer(timeout_seconds, connection.interrupt)
    timer.daemon = True
    timer.start()
    try:
        cursor = connection.execute(sql)
        names = [d[0] for d in cursor.description or []]
        return names, cursor.fetchall()
    except duckdb.InterruptException:
        raise QueryError(
            f"the query ran longer than query_timeout_seconds ({timeout_seconds:g})"
        ) from None
    except duckdb.Error as exc:
        raise QueryError(first_line(exc)) from None
    finally:
        timer.cancel()


_loads_table_lock = threading.Lock()
"""Creating or altering the loads table while another load's transaction writes to it
conflicts in DuckDB's catalog: each is done only when needed, one thread at a time."""


def _ensure_loads_table(db: duckdb.DuckDBPyConnection) -> None:
    if _has_loads_table(db):
        return
    with _loads_table_lock:
        if _has_loads_table(db):  # made by another thread meanwhile
            return
        db.execute(
            f"CREATE TABLE IF NOT EXISTS {LOADS_TABLE} (batch_id VARCHAR, tbl VARCHAR, "
            "rows BIGINT, loaded_at TIMESTAMP DEFAULT current_timestamp, "
            "PRIMARY KEY (batch_id, tbl))"
        )
        db.execute(f"ALTER TABLE {LOADS_TABLE} ADD COLUMN IF NOT EXISTS rejected VARCHAR")


def _has_loads_table(db: duckdb.DuckDBPyConnection) -> bool:
    """Whether the loads table exists with every column this version writes."""
    found = db.execute(
        "SELECT count(*) FROM duckdb_columns() WHERE schema_name = 'main' "
        "AND table_name = ? AND column_name = 'rejected'",
        [LOADS_TABLE],
    ).fetchone()
    return bool(found and found[0])


def _damaged_file(exc: duckdb.Error) -> bool:
    """Whether DuckDB failed on its file itself (IO, a failed checksum, its own internal
    or fatal state), not on what a statement asked."""
    damaged = (duckdb.IOException, duckdb.InternalException, duckdb.FatalException)
    return isinstance(exc, damaged) or "Corrupt database file" in str(exc)


def _open_for_writing(path: Path, wait: float) -> duckdb.DuckDBPyConnection:
    """A writing connection to ``path``, waiting up to ``wait`` seconds while another
    process holds the file, or this one a read-only connection to it (``eventpipe
    query`` beside a stream, in one process), polling from 10 ms up to 0.25 s apart."""
    deadline = time.monotonic() + wait
    pause = 0.01
    while True:
        try:
            return duckdb.connect(str(path))
        except (duckdb.IOException, duckdb.ConnectionException) as exc:
            held = "Could not set lock" in str(exc) or "different configuration" in str(exc)
            if not held or time.monotonic() + pause > deadline:
                raise TransientError(
                    f"cannot open {path}: {exc}",
                    fix="close other connections to the file (readers included)"
                    if held
                    else "check the file and its directory",
                ) from exc
        time.sleep(pause)
        pause = min(pause * 2, 0.25)


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
    db: duckdb.DuckDBPyConnection, request: LoadRequest, source: str, params: dict[str, Any]
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
        params,
    )
    # The batch's rows after deduplication: its distinct keys (reads the key columns only).
    row = db.execute(
        f"SELECT count(*) FROM (SELECT DISTINCT {key} FROM ({source}))", params
    ).fetchone()
    return int(row[0]) if row else 0


def _apply_changes(
    db: duckdb.DuckDBPyConnection, request: LoadRequest, source: str, params: dict[str, Any]
) -> int:
    """A source's changes applied by key (destinations/changes.py), from a temporary
    copy of the batch."""
    db.execute(f"CREATE TEMP TABLE eventpipe_changes AS {source}", params)
    try:
        return changes.apply(
            lambda sql: db.execute(sql).fetchall(), DUCKDB.quote, DUCKDB.quote(request.table),
            "eventpipe_changes", list(request.columns),
        )  # fmt: skip
    finally:
        db.execute("DROP TABLE IF EXISTS eventpipe_changes")


def _unconvertible(
    db: duckdb.DuckDBPyConnection, request: LoadRequest, files: list[str]
) -> tuple[tuple[int, str], ...]:
    """The rows of ``files`` with a value their table's column cannot take: (position
    across the files, from 0; which column, its type and the value)."""
    sql_types = dict(
        db.execute(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = 'main' AND table_name = ?",
            [request.table],
        ).fetchall()
    )
    return unconvertible_rows(db, request, files, sql_types)


def unconvertible_rows(
    db: duckdb.DuckDBPyConnection,
    request: LoadRequest,
    files: list[str],
    sql_types: dict[str, str],
) -> tuple[tuple[int, str], ...]:
    """The rows of ``files`` with a value that ``TRY_CAST`` to its column's DuckDB type in
    ``sql_types`` cannot take (position across the files, from 0; the reason)."""
    q = DUCKDB.quote
    problems = [
        f"CASE WHEN {q(c)} IS NOT NULL AND TRY_CAST({q(c)} AS {sql_types[c]}) IS NULL "
        f"THEN {DUCKDB.literal(f'column {c} ({sql_types[c]}) cannot take ')} "
        f"|| CAST({q(c)} AS VARCHAR) END"
        for c in request.columns
        if c in sql_types
    ]
    if not problems:
        return ()
    found = db.execute(
        f"SELECT filename, file_row_number, concat_ws('; ', {', '.join(problems)}) AS why "
        "FROM read_parquet($files, union_by_name = true, filename = true, "
        "file_row_number = true) WHERE why <> ''",
        {"files": files},
    ).fetchall()
    offsets = file_offsets(files)
    return tuple(sorted((offsets[name] + int(row), f"duckdb: {why}") for name, row, why in found))


def file_offsets(files: list[str]) -> dict[str, int]:
    """Each file's first position across ``files``."""
    import pyarrow.parquet as pq

    offsets, position = {}, 0
    for name in files:
        offsets[name] = position
        position += pq.ParquetFile(name).metadata.num_rows
    return offsets


def _row_keys(files: list[str], positions: list[int]) -> list[str]:
    """``filename#row`` keys (DuckDB's read_parquet columns) of positions across files."""
    offsets = sorted(file_offsets(files).items(), key=lambda kv: kv[1])
    keys = []
    for position in positions:
        name, start = next((n, o) for n, o in reversed(offsets) if o <= position)
        keys.append(f"{name}#{position - start}")
    return keys


def rows_of(
    select: str, files: list[str], rejected: tuple[tuple[int, str], ...]
) -> tuple[str, dict[str, Any]]:
    """A query of ``select`` over ``files`` (by column name), without the ``rejected``
    positions, and its parameters."""
    source = f"SELECT {select} FROM read_parquet($files, union_by_name = true"
    params: dict[str, Any] = {"files": files}
    if not rejected:
        return source + ")", params
    params["skip"] = _row_keys(files, [position for position, _ in rejected])
    source += (
        ", filename = true, file_row_number = true) WHERE NOT "
        "list_contains($skip, filename || '#' || file_row_number::VARCHAR)"
    )
    return source, params
