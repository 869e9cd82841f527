"""PostgreSQL (``type: postgres``): the same contract as DuckDB, on a server.

* Identifiers are always quoted, and everything eventpipe creates (tables, its
  ``_eventpipe_loads`` record) is inside the configured ``schema``.
* Patching runs under a transaction-scoped advisory lock keyed by destination, schema and
  table, so that two pipelines (on any machines) patching the same table wait for each
  other; the table is read again under the lock. Types are seed 1's Postgres column
  (schema.dialects.POSTGRES).
* A load is one transaction under the same lock: the batch's Parquet files are streamed
  into the table with ``COPY ... FROM STDIN (FORMAT csv)`` (pyarrow writes the CSV, a
  chunk ahead, in a thread), and ``batch_id`` is recorded in ``_eventpipe_loads``; a
  retried batch finds its record and loads nothing twice. With ``primary_key`` the COPY
  goes into a temporary table, then ``INSERT ... ON CONFLICT DO UPDATE`` in which the
  newest ``_timestamp`` wins, within the batch too. A source's changes (``_op``,
  ``_key``...) go into the temporary table too, and are applied by key from there
  (destinations/changes.py), the table's ``_key`` under a unique index.
* A row the server cannot store (a data error that COPY names by line) is left out and
  the load runs again without it (``LoadResult.rejected``), at most
  ``MAX_REJECTED_ROWS`` times.
* Text cannot hold NUL in PostgreSQL: a NUL character is stored as U+FFFD (the
  replacement character), so the load never fails on it and the value shows that
  something was there. Lone surrogates never reach a destination (the collector's JSON
  parser refuses them).
* Errors: a lost connection, a serialisation failure, a deadlock or a server shutting
  down are transient (the run is retried); other errors are terminal for the batch.
* The DSN is never logged: messages name the host, port and database only.

Length (over 500 lines): the destination protocol in full for one database (describe,
patch under advisory locks, COPY loads, upserts, day swaps, metering), all on the same
connection handling and error classification; the rows a COPY sends and leaves out are
in rows.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

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
)
from eventpipe.destinations.postgres.query import check_query
from eventpipe.destinations.postgres.rows import (
    MAX_REJECTED_ROWS,
    ahead,
    copy_line,
    csv_chunks,
    inexact_rows,
    position_of,
    reason_of,
)
from eventpipe.errors import QueryError, TerminalError, TransientError, first_line, redacted
from eventpipe.retry import Backoff
from eventpipe.schema.dialects import POSTGRES
from eventpipe.schema.diff import Table, TablePatch
from eventpipe.schema.types import DataType

if TYPE_CHECKING:
    import psycopg

LOADS_TABLE = reserved.LOADS_TABLE

# PostgreSQL types back to the lattice, for tables eventpipe did not create itself.
_LATTICE = {
    "text": DataType.STRING,
    "character varying": DataType.STRING,
    "character": DataType.STRING,
    "json": DataType.STRING,
    "jsonb": DataType.STRING,
    "uuid": DataType.STRING,
    "numeric": DataType.FLOAT64,  # with a fraction or none declared; scale 0 is INT128
    "double precision": DataType.FLOAT64,
    "real": DataType.FLOAT64,
    "bigint": DataType.INT64,
    "integer": DataType.INT64,
    "smallint": DataType.INT64,
    "numeric(p,0)": DataType.INT128,
    "boolean": DataType.BOOL,
    "timestamp without time zone": DataType.TIMESTAMP,
    "timestamp with time zone": DataType.TIMESTAMP,
}

# SQLSTATE classes and codes that a retry can cure.
_TRANSIENT_CLASSES = ("08", "53", "57")  # connection, resources, operator intervention
_TRANSIENT_CODES = {"40001", "40P01", "55P03"}  # serialization, deadlock, lock timeout

DDL_PATIENCE_SECONDS = 60.0
"""How long a table change keeps trying to get its table's lock from readers."""


class PostgresDestination:
    dialect = POSTGRES
    parallel_loads = 2
    """Tables of a batch loaded at once, each on a connection of its own (the job reads
    this; DuckDB takes one writer at a time and loads one by one)."""

    def __init__(
        self,
        destination_id: str,
        dsn: str,
        schema: str = "public",
        *,
        query_dsn: str | None = None,
        lock_timeout_seconds: float = 5.0,
    ) -> None:
        self.id = destination_id
        self.dsn = dsn
        self.schema = schema
        self.query_dsn = query_dsn
        """``eventpipe query`` connects with this (a user with SELECT only), if given."""
        self.lock_timeout_seconds = lock_timeout_seconds
        """How long a table change waits for a reader's lock before it tries again."""

    def _name(self, table: str) -> str:
        q = self.dialect.quote
        return f"{q(self.schema)}.{q(table)}"

    @contextmanager
    def _connect(
        self, table: str | None = None, *, dsn: str | None = None
    ) -> Iterator[psycopg.Connection[Any]]:
        import psycopg

        dsn = dsn or self.dsn
        try:
            connection = psycopg.connect(dsn, connect_timeout=10, application_name="eventpipe")
        except psycopg.OperationalError as exc:
            raise TransientError(
                f"postgres {redacted(dsn)}: cannot connect: {first_line(exc)}",
                fix="check that the server is up and the dsn is right",
            ) from None
        try:
            yield connection
        except psycopg.Error as exc:
            raise classified(exc, self.id, table) from exc
        finally:
            connection.close()

    def _lock(self, db: psycopg.Connection[Any], table: str) -> None:
        """The advisory lock of this destination's table, until the transaction ends."""
        _advisory_lock(db, f"eventpipe:{self.id}:{self.schema}.{table}")

    def _lock_ddl(self, db: psycopg.Connection[Any]) -> None:
        """The lock under which tables of the schema are created or changed. One for the
        schema: a table's row type and array type share pg_type's names with every other
        table's (``_eventpipe_loads`` has the array type ``__eventpipe_loads``, an escaped
        event table's name), and two CREATE TABLEs racing for one name fail with a
        unique violation instead of waiting."""
        _advisory_lock(db, f"eventpipe:ddl:{self.schema}")

    def _ensure_schema(self, db: psycopg.Connection[Any]) -> None:
        """Create the schema if missing. ``CREATE SCHEMA IF NOT EXISTS`` races with
        itself (two sessions can both find it missing), so it runs under a lock of its
        own, held to the end of the transaction."""
        found = db.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", [self.schema])
        if found.fetchone() is None:
            _advisory_lock(db, f"eventpipe:schema:{self.schema}")
            db.execute(f"CREATE SCHEMA IF NOT EXISTS {self.dialect.quote(self.schema)}")

    def describe(self, table: str) -> Table | None:
        with self._connect() as db:
            return self._describe(db, table)

    def _describe(self, db: psycopg.Connection[Any], table: str) -> Table | None:
        rows = db.execute(
            "SELECT column_name, CASE WHEN data_type = 'numeric' AND numeric_scale = 0 "
            "THEN 'numeric(p,0)' ELSE data_type END FROM information_schema.columns "
            "WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
            [self.schema, table],
        ).fetchall()
        if not rows:
            return None
        key = db.execute(
            "SELECT a.attname FROM pg_index i "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
            "WHERE i.indrelid = to_regclass(%s) AND i.indisprimary "
            "ORDER BY array_position(i.indkey, a.attnum)",
            [self._name(table)],
        ).fetchall()
        columns = {name: _LATTICE.get(sql_type, DataType.STRING) for name, sql_type in rows}
        return Table(table, columns, tuple(name for (name,) in key))

    def patch(self, patch: TablePatch) -> None:
        """Create or change the table under the locks. A change waits for readers'
        locks (an ``eventpipe query``, a dashboard) ``lock_timeout_seconds`` at a time,
        and tries again for up to :data:`DDL_PATIENCE_SECONDS` before the run gives up
        with a transient error: it never queues behind a long reader holding every
        later load of the table behind it."""
        import psycopg

        if patch.empty:
            return
        backoff = Backoff(initial=0.2, maximum=5.0, max_elapsed=DDL_PATIENCE_SECONDS)
        while True:
            try:
                return self._patch_once(patch)
            except TransientError as exc:
                if not isinstance(exc.__cause__, psycopg.errors.LockNotAvailable):
                    raise
                wait = backoff.wait()
                if wait is None:
                    raise
                time.sleep(wait)

    def _patch_once(self, patch: TablePatch) -> None:
        with self._connect(patch.table) as db, db.transaction():
            self._lock(db, patch.table)
            self._lock_ddl(db)
            # Set after the advisory locks, which wait for other loads as long as they take.
            milliseconds = max(1, round(self.lock_timeout_seconds * 1000))
            db.execute(f"SET LOCAL lock_timeout = {milliseconds}")
            self._ensure_schema(db)
            current = self._describe(db, patch.table)  # again, under the lock
            d, table, schema = self.dialect, patch.table, self.schema
            if current is None:
                db.execute(d.create_table(table, patch.add_columns, patch.set_primary_key, schema))
                return
            for column, data_type in patch.add_columns:
                if column not in current.columns:
                    db.execute(d.add_column(table, column, data_type, schema))
            key_sql = d.add_primary_key(table, patch.set_primary_key, schema)
            if patch.set_primary_key and not current.primary_key and key_sql:
                db.execute(key_sql)

    def load(self, request: LoadRequest) -> LoadResult:
        import psycopg

        with self._connect(request.table) as db:
            self._ensure_loads_table(db)
            rejected = self._inexact_rows(db, request)
            while True:
                try:
                    return self._load_once(db, request, rejected)
                except psycopg.errors.DataError as exc:
                    # A value this server cannot store (numeric overflow, say): the row
                    # is left out and the load runs again without it.
                    line = copy_line(exc)
                    if line is None or len(rejected) >= MAX_REJECTED_ROWS:
                        raise
                    rejected[position_of(line, rejected)] = reason_of(exc)

    def _inexact_rows(self, db: psycopg.Connection[Any], request: LoadRequest) -> dict[int, str]:
        """Rows with a float that its ``numeric(p,s)`` column would round
        (rows.py, inexact_rows), each to be left out with the reason."""
        floats = [c for c, t in request.columns.items() if t is DataType.FLOAT64]
        if not floats or not request.files:
            return {}
        with db.transaction():  # its own: the load's transaction must be the outermost
            scales = dict(
                db.execute(
                    "SELECT column_name, numeric_scale FROM information_schema.columns "
                    "WHERE table_schema = %s AND table_name = %s AND data_type = 'numeric' "
                    "AND numeric_scale IS NOT NULL",
                    [self.schema, request.table],
                ).fetchall()
            )
        checked = {c: int(scales[c]) for c in floats if c in scales}
        return inexact_rows(request.files, checked) if checked else {}

    def _ensure_loads_table(self, db: psycopg.Connection[Any]) -> None:
        with db.transaction():
            self._lock_ddl(db)
            self._ensure_schema(db)
            db.execute(
                f"CREATE TABLE IF NOT EXISTS {self._name(LOADS_TABLE)} (batch_id text, "
                "tbl text, rows bigint, rejected jsonb, loaded_at timestamptz DEFAULT now(), "
                "PRIMARY KEY (batch_id, tbl))"
            )

    def _load_once(
        self, db: psycopg.Connection[Any], request: LoadRequest, rejected: dict[int, str]
    ) -> LoadResult:
        """One attempt, one transaction: COPY the rows (but the ``rejected`` ones) into
        the table, or into a temporary table and upsert from there when there is a key;
        record the batch and what it left out."""
        from psycopg.types.json import Jsonb

        q = self.dialect.quote
        loads = self._name(LOADS_TABLE)
        with db.transaction():
            self._lock(db, request.table)
            done = db.execute(
                f"SELECT rows, rejected FROM {loads} WHERE batch_id = %s AND tbl = %s",
                [request.batch_id, request.table],
            ).fetchone()
            if done is not None:  # loaded before; what it left out is remembered too
                left_out = tuple((int(i), str(why)) for i, why in done[1] or [])
                return LoadResult(rows=int(done[0]), already_loaded=True, rejected=left_out)
            listed = ", ".join(q(c) for c in request.columns)
            # Without a key, COPY goes straight into the table: the transaction makes it
            # atomic. An upsert stages in a temporary table first.
            into = self._name(request.table)
            applying = request.apply_changes
            if request.primary_key or applying:
                into = "eventpipe_stage"
                db.execute(
                    f"CREATE TEMP TABLE eventpipe_stage ON COMMIT DROP AS "
                    f"SELECT {listed} FROM {self._name(request.table)} WITH NO DATA"
                )
            rows = 0
            with db.cursor().copy(f"COPY {into} ({listed}) FROM STDIN (FORMAT csv)") as copy:
                for chunk, count in ahead(csv_chunks(request, skip=set(rejected))):
                    copy.write(chunk)
                    rows += count
            if applying:
                rows = self._apply_changes(db, request)
            elif request.primary_key:
                rows = self._upsert(db, request, listed)
            left_out = tuple(sorted(rejected.items()))
            db.execute(
                f"INSERT INTO {loads} (batch_id, tbl, rows, rejected) VALUES (%s, %s, %s, %s)",
                [request.batch_id, request.table, rows, Jsonb([list(r) for r in left_out])],
            )
        return LoadResult(rows=rows, rejected=left_out)

    def _apply_changes(self, db: psycopg.Connection[Any], request: LoadRequest) -> int:
        """A source's changes in the temporary table applied by key
        (destinations/changes.py), with a unique index on the key to find rows by."""
        import hashlib

        q = self.dialect.quote
        target = self._name(request.table)
        index = "eventpipe_key_" + hashlib.sha1(request.table.encode()).hexdigest()[:16]
        db.execute(f"CREATE UNIQUE INDEX IF NOT EXISTS {q(index)} ON {target} ({q(changes.KEY)})")

        def run(sql: str) -> list[tuple[Any, ...]]:
            cursor = db.execute(sql)
            return cursor.fetchall() if cursor.description else []

        return changes.apply(run, q, target, "eventpipe_stage", list(request.columns))

    def _upsert(self, db: psycopg.Connection[Any], request: LoadRequest, listed: str) -> int:
        """Rows of the temporary table into the table by key, the newest ``_timestamp``
        winning; returns the batch's distinct keys."""
        q = self.dialect.quote
        target = self._name(request.table)
        key = ", ".join(q(c) for c in request.primary_key)
        has_ts = "_timestamp" in request.columns
        order = f"{key}, {q('_timestamp')} DESC NULLS LAST" if has_ts else key
        updates = ", ".join(
            f"{q(c)} = excluded.{q(c)}" for c in request.columns if c not in request.primary_key
        )
        newer = (
            f" WHERE excluded.{q('_timestamp')} >= {target}.{q('_timestamp')}"
            f" OR {target}.{q('_timestamp')} IS NULL"
            if has_ts
            else ""
        )
        action = f"DO UPDATE SET {updates}{newer}" if updates else "DO NOTHING"
        db.execute(
            f"INSERT INTO {target} ({listed}) SELECT DISTINCT ON ({key}) {listed} "
            f"FROM eventpipe_stage ORDER BY {order} ON CONFLICT ({key}) {action}"
        )
        row = db.execute(
            f"SELECT count(*) FROM (SELECT DISTINCT {key} FROM eventpipe_stage) k"
        ).fetchone()
        return int(row[0]) if row else 0

    def tables(self) -> list[str]:
        """The names of the tables in the destination's schema."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s "
                "AND table_type = 'BASE TABLE' ORDER BY 1",
                [self.schema],
            ).fetchall()
        return [name for (name,) in rows]

    def drop(self, tables: list[str]) -> None:
        with self._connect() as db, db.transaction():
            for table in tables:
                db.execute(f"DROP TABLE IF EXISTS {self._name(table)}")

    def keep_newest(self, tables: Sequence[str], cutoff: datetime) -> int:
        """Metering: of each key in the window, only its newest version's rows stay
        (destinations/base.py newest_only), in one transaction; the rows removed."""
        removed = 0
        with self._connect() as db, db.transaction():
            for table in sorted(tables):
                self._lock(db, table)
            found = [t for t in tables if self._describe(db, t) is not None]
            for delete in newest_only(found, self._name, self.dialect.quote, cutoff):
                removed += max(db.execute(delete).rowcount, 0)
        return removed

    def rows(self, table: str, columns: Sequence[str]) -> list[dict[str, Any]]:
        listed = ", ".join(map(self.dialect.quote, columns))
        with self._connect(table) as db:
            cursor = db.execute(f"SELECT {listed} FROM {self._name(table)}")
            return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]

    def replace_days(self, swap: DaySwap) -> dict[str, int]:
        """Delete the rows of ``swap.days`` from ``swap.tables`` and move the shadows'
        rows in (an upsert with a primary key), in one transaction recorded under
        ``swap.swap_id``; the rows moved in per table."""
        loads = self._name(LOADS_TABLE)
        with self._connect() as db:
            self._ensure_loads_table(db)
            return self._replace_days(db, swap, loads)

    def _replace_days(
        self, db: psycopg.Connection[Any], swap: DaySwap, loads: str
    ) -> dict[str, int]:
        from psycopg.types.json import Jsonb

        q = self.dialect.quote
        with db.transaction():
            for table in sorted({*swap.tables, *swap.shadows}):
                self._lock(db, table)
            done = db.execute(
                f"SELECT tbl, rows FROM {loads} WHERE batch_id = %s", [swap.swap_id]
            ).fetchall()
            if done:
                return {t: int(n) for t, n in done if t != ALL_SWAPPED}
            delete_days(swap, q, lambda t: self._describe(db, t),
                        lambda t, where: db.execute(f"DELETE FROM {self._name(t)} WHERE {where}"),
                        self.id)  # fmt: skip
            moved: dict[str, int] = {}
            for table, shadow in sorted(swap.shadows.items()):
                described = self._describe(db, shadow)
                if described is None:
                    continue
                listed = ", ".join(q(c) for c in described.columns)
                if swap.primary_key:
                    db.execute(
                        f"CREATE TEMP TABLE eventpipe_stage ON COMMIT DROP AS "
                        f"SELECT {listed} FROM {self._name(shadow)}"
                    )
                    request = LoadRequest(
                        table, swap.swap_id, (), described.columns, swap.primary_key
                    )
                    moved[table] = self._upsert(db, request, listed)
                    db.execute("DROP TABLE eventpipe_stage")
                else:
                    cursor = db.execute(
                        f"INSERT INTO {self._name(table)} ({listed}) "
                        f"SELECT {listed} FROM {self._name(shadow)}"
                    )
                    moved[table] = cursor.rowcount
                db.execute(f"DROP TABLE {self._name(shadow)}")
            records = [(swap.swap_id, t, n, Jsonb([])) for t, n in moved.items()]
            records.append((swap.swap_id, ALL_SWAPPED, 0, Jsonb([])))
            with db.cursor() as cursor:
                cursor.executemany(
                    f"INSERT INTO {loads} (batch_id, tbl, rows, rejected) VALUES (%s, %s, %s, %s)",
                    records,
                )
        return moved

    def query(
        self, sql: str, *, timeout_seconds: float = QUERY_TIMEOUT_SECONDS
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run one read (destinations/postgres/query.py says which) in a read-only
        transaction with a statement and a lock timeout, as ``query_dsn``'s user when
        configured, and return column names and rows. It is parsed first, and sent as a
        prepared statement (the extended protocol), which the server refuses to hold
        several statements."""
        import psycopg

        check_query(sql)
        milliseconds = max(1, round(timeout_seconds * 1000))
        with self._connect(dsn=self.query_dsn or self.dsn) as db:
            db.read_only = True
            db.execute(f"SET LOCAL statement_timeout = {milliseconds}")
            db.execute(f"SET LOCAL lock_timeout = {milliseconds}")
            db.execute(f"SET LOCAL search_path TO {self.dialect.quote(self.schema)}")
            try:
                cursor = db.execute(sql, prepare=True)
                names = [d.name for d in cursor.description or []]
                rows = [tuple(r) for r in cursor.fetchall()] if cursor.description else []
            except (psycopg.errors.QueryCanceled, psycopg.errors.LockNotAvailable):
                raise QueryError(
                    f"the query ran longer than query_timeout_seconds ({timeout_seconds:g})"
                ) from None
            except psycopg.Error as exc:
                raise QueryError(first_line(exc)) from None
            db.rollback()
            return names, rows


def _advisory_lock(db: psycopg.Connection[Any], key: str) -> None:
    """A transaction-scoped advisory lock on ``key``, held until the transaction ends."""
    db.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [key])


def classified(
    exc: Exception, destination_id: str, table: str | None, server: str = "postgres"
) -> Exception:
    """A psycopg error as eventpipe's TransientError or TerminalError (``server``: what
    the message calls the server; Redshift speaks PostgreSQL's protocol too)."""
    import psycopg

    state = getattr(exc, "sqlstate", None) or ""
    where = f"{destination_id}.{table}" if table else destination_id
    message = f"{server} ({where}): {first_line(exc)}"
    if (
        (isinstance(exc, psycopg.OperationalError) and not state)
        or state[:2] in _TRANSIENT_CLASSES
        or state in _TRANSIENT_CODES
    ):
        return TransientError(message, table=table)
    return TerminalError(message, table=table)
