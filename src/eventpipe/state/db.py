"""The two databases the state store runs on: SQLite (a file under ``data/``, the
embedded default) and PostgreSQL (``state: {type: postgres}``).

The store's queries are written once, in the SQL both understand, with ``?``
placeholders. The differences are kept here:

* placeholders: ``?`` for SQLite, ``%s`` for psycopg (and ``%`` doubled);
* column types: ``BIGINT`` for counts and ``COLLATE "C"`` for text in PostgreSQL, so
  that text compares byte by byte, as in SQLite (segment names are compared by range);
* SQLite's implicit ``rowid`` orders runs started in the same millisecond; PostgreSQL's
  ``runs`` table has a ``rowid`` identity column of that name for the same queries;
* one writer at a time: SQLite's ``BEGIN IMMEDIATE``; in PostgreSQL a transaction-scoped
  advisory lock taken first in every transaction, so the store's read-then-write steps
  see what SQLite's would (the store is small and its transactions short).
"""

from __future__ import annotations

import contextlib
import functools
import re
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from eventpipe.errors import TransientError, first_line

if TYPE_CHECKING:
    import psycopg

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    trigger TEXT NOT NULL,
    started_at TEXT NOT NULL,
    finished_at TEXT,
    status TEXT NOT NULL,
    segments TEXT NOT NULL,
    error TEXT,
    plan TEXT,
    code_versions TEXT
);
CREATE TABLE IF NOT EXISTS run_tables (
    run_id TEXT NOT NULL,
    destination TEXT NOT NULL,
    tbl TEXT NOT NULL,
    status TEXT NOT NULL,
    rows INTEGER NOT NULL,
    error TEXT,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (run_id, destination, tbl)
);
CREATE TABLE IF NOT EXISTS segment_status (
    segment TEXT NOT NULL,
    destination TEXT NOT NULL,
    tbl TEXT NOT NULL,
    status TEXT NOT NULL,
    rows INTEGER NOT NULL DEFAULT 0,
    error TEXT,
    attempts INTEGER NOT NULL DEFAULT 1,
    run_id TEXT,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (segment, destination, tbl)
);
CREATE INDEX IF NOT EXISTS segment_status_run ON segment_status (run_id);
CREATE TABLE IF NOT EXISTS cursors (
    destination TEXT NOT NULL,
    segment TEXT NOT NULL,
    next_line INTEGER NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (destination, segment)
);
CREATE TABLE IF NOT EXISTS day_versions (
    destination TEXT NOT NULL,
    day TEXT NOT NULL,
    code_version TEXT NOT NULL,
    inputs TEXT,
    run_id TEXT,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (destination, day, code_version)
);
CREATE TABLE IF NOT EXISTS destination_runs (
    run_id TEXT NOT NULL,
    destination TEXT NOT NULL,
    skipped INTEGER NOT NULL,
    failed INTEGER NOT NULL,
    finished_at TEXT NOT NULL,
    filtered INTEGER NOT NULL DEFAULT 0,
    events INTEGER,
    PRIMARY KEY (run_id, destination)
);
CREATE TABLE IF NOT EXISTS contract_counts (
    run_id TEXT NOT NULL,
    destination TEXT NOT NULL,
    kind TEXT NOT NULL,
    subject TEXT NOT NULL,
    rule TEXT NOT NULL,
    events INTEGER NOT NULL,
    PRIMARY KEY (run_id, destination, kind, subject, rule)
);
CREATE TABLE IF NOT EXISTS schema_changes (
    destination TEXT NOT NULL,
    tbl TEXT NOT NULL,
    change TEXT NOT NULL,
    col TEXT NOT NULL,
    data_type TEXT NOT NULL,
    run_id TEXT NOT NULL,
    at TEXT NOT NULL,
    PRIMARY KEY (destination, tbl, change, col)
);
"""

ADDED_COLUMNS = {
    "runs": (("plan", "TEXT"), ("code_versions", "TEXT")),
    "destination_runs": (("filtered", "INTEGER NOT NULL DEFAULT 0"), ("events", "INTEGER")),
}
"""Columns added after a table was first released (name, type): added to a store made
before. New tables list them in SCHEMA too."""


class Transaction(Protocol):
    """One transaction of the state store, in SQL with ``?`` placeholders."""

    def execute(self, sql: str, params: Sequence[Any] = (), /) -> Any:
        """Run one statement; the result has ``fetchone``, ``fetchall`` and iteration."""
        ...

    def executemany(self, sql: str, params: Iterable[Any], /) -> Any: ...


class Database(Protocol):
    where: str
    """For messages: the file, or ``host:port/dbname`` (never a password)."""

    def transaction(self) -> Any:
        """A context manager giving a :class:`Transaction`: committed when the block
        ends, rolled back when it raises."""
        ...


class SqliteDatabase:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.where = str(path)
        # executescript commits on its own, so the schema is made outside transaction().
        with _sqlite_errors(self.where):
            self._make_schema(path)

    @staticmethod
    def _make_schema(path: Path) -> None:
        connection = sqlite3.connect(path, timeout=30)
        try:
            # WAL is kept in the file: set once here. Set on every connection, it failed
            # with "database is locked" while another connection wrote (busy handlers do
            # not cover it; found by test_concurrent_writers_lose_no_update).
            (mode,) = connection.execute("PRAGMA journal_mode").fetchone()
            if mode != "wal":
                connection.execute("PRAGMA journal_mode=WAL")
            connection.executescript(SCHEMA)
            for table, added in ADDED_COLUMNS.items():
                columns = {row[1] for row in connection.execute(f"PRAGMA table_info({table})")}
                for column, sql_type in added:
                    if column not in columns:
                        connection.execute(f"ALTER TABLE {table} ADD COLUMN {column} {sql_type}")
            connection.commit()
        finally:
            connection.close()

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """One transaction. A failure of SQLite itself (a full disk, a locked or
        unreadable file) is a TransientError: the command says so in one line and exits
        75, instead of a traceback and 1; the transaction is rolled back."""
        with _sqlite_errors(self.where):
            connection = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            try:
                connection.execute("PRAGMA synchronous=FULL")
                connection.execute("BEGIN IMMEDIATE")
                try:
                    yield connection
                except BaseException:
                    with contextlib.suppress(sqlite3.Error):  # SQLite may have rolled back
                        connection.execute("ROLLBACK")
                    raise
                connection.execute("COMMIT")
            finally:
                connection.close()


@contextmanager
def _sqlite_errors(where: str) -> Iterator[None]:
    try:
        yield
    except sqlite3.OperationalError as exc:
        fix = "free space on its disk" if "full" in str(exc) else "check the file and its disk"
        raise TransientError(f"state store {where}: {first_line(exc)}", fix=fix) from exc


_MADE: set[tuple[str, str]] = set()
"""(dsn, schema) of the PostgreSQL stores this process has made (or found) up to date."""


class PostgresDatabase:
    def __init__(self, dsn: str, schema: str) -> None:
        from eventpipe.errors import redacted

        self.dsn = dsn
        self.schema = schema
        self.where = f"postgres {redacted(dsn)} schema {schema}"
        if (dsn, schema) in _MADE:  # a stream opens its store every micro-batch
            return
        with self.transaction() as db:
            db.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
            for statement in filter(str.strip, SCHEMA.split(";")):
                db.execute(_postgres_ddl(statement))
            for table, added in ADDED_COLUMNS.items():
                for column, sql_type in added:
                    db.execute(_postgres_ddl(
                        f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {sql_type}"
                    ))  # fmt: skip
        _MADE.add((dsn, schema))

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        import psycopg

        try:
            connection = psycopg.connect(
                self.dsn, connect_timeout=10, application_name="eventpipe-state"
            )
        except psycopg.OperationalError as exc:
            raise TransientError(
                f"state store {self.where}: cannot connect: {first_line(exc)}",
                fix="check that the server is up and state.dsn is right",
            ) from None
        try:
            with connection.transaction():
                # The schema is created under the lock too: CREATE ... IF NOT EXISTS
                # races with itself in two sessions.
                connection.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                                   [f"eventpipe:state:{self.schema}"])  # fmt: skip
                connection.execute(f'SET LOCAL search_path TO "{self.schema}"')
                yield _PostgresTransaction(connection)
        finally:
            connection.close()


class _PostgresTransaction:
    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        self.connection = connection

    def execute(self, sql: str, params: Sequence[Any] = (), /) -> Any:
        # Always with params, even none: psycopg then reads %% as %.
        return self.connection.execute(_postgres(sql), tuple(params))

    def executemany(self, sql: str, params: Iterable[Sequence[Any]], /) -> None:
        with self.connection.cursor() as cursor:
            cursor.executemany(_postgres(sql), [tuple(p) for p in params])


@functools.lru_cache(maxsize=256)
def _postgres(sql: str) -> str:
    """A query of the store in psycopg's placeholders (no ``?`` in its literals)."""
    return sql.replace("%", "%%").replace("?", "%s")


def _postgres_ddl(statement: str) -> str:
    """A CREATE of :data:`SCHEMA` in PostgreSQL's types."""
    ddl = re.sub(r"\bTEXT\b", 'TEXT COLLATE "C"', statement)
    ddl = re.sub(r"\bINTEGER\b", "BIGINT", ddl)
    if "CREATE TABLE IF NOT EXISTS runs " in ddl:  # the insertion order SQLite has as rowid
        ddl = ddl.replace("(\n", "(\n    rowid BIGINT GENERATED ALWAYS AS IDENTITY,\n", 1)
    return ddl


class Store:
    """A state store's database and its transactions: what each kind of record's queries
    (state/runs.py, progress.py, days.py, summaries.py) run on."""

    def __init__(self, where: Path | Database) -> None:
        """The store in the SQLite file ``where``, or in the database ``where``."""
        self.db: Database = SqliteDatabase(where) if isinstance(where, Path) else where

    def _db(self) -> AbstractContextManager[Transaction]:
        return cast("AbstractContextManager[Transaction]", self.db.transaction())
