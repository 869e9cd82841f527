"""Snowflake (``type: snowflake``): the destination protocol through Snowflake's own
connector (``snowflake-connector-python``, the ``snowflake`` extra).

* **Tables** in the configured schema (created if missing), typed by seed 1's Snowflake
  column (schema.dialects.SNOWFLAKE: ``text``, ``numeric(38,18)``, ``bigint``,
  ``number(38,0)``, ``boolean``, ``timestamp_ntz`` holding UTC); with ``primary_key`` the
  key is declared (Snowflake does not enforce it: the loads do).
* **Patching** runs under the table lock of the data directory (Snowflake has no
  advisory locks); the table is read again under it.
* **A load**, under the same lock:

  1. the batch's record in ``_eventpipe_loads`` is looked up: found, nothing loads;
  2. the staged Parquet files are ``PUT`` to the schema's internal stage
     ``_eventpipe_stage`` under a path of the batch's own: as they are when their types
     fit the columns (:func:`fits`), otherwise first converted by an in-memory DuckDB to
     the columns' types (``TRY_CAST``: a value that does not convert, a text where a
     number goes or a number beyond ``numeric(38,18)``, leaves its row out with the
     reason) into one file (:func:`converted_rows`);
  3. one transaction: ``COPY INTO`` the table (``MATCH_BY_COLUMN_NAME``, purged once
     loaded) and the batch's record; ``COMMIT``. With a key the files go into a
     transient stage table first (before the transaction: Snowflake commits DDL at
     once), and the transaction moves each key's newest row in, replacing the table's
     row unless that one is newer (``DELETE ... USING`` and ``INSERT``, the way dlt's
     delete-insert merges); the stage table is dropped after.

  A crash before the ``COMMIT`` leaves the table as it was; a rerun puts the files again
  and builds the stage again.
* **Days replaced** (``eventpipe reprocess``): one transaction deletes the days' rows and
  moves the shadows' rows in, with its record; the shadows are dropped after it.
* **A source's changes** (``changes: apply``) go through the stage table too, and the
  transaction applies them by key (destinations/changes.py: each key's last change
  decides; a truncate empties the table), each key's last change a subquery rather than
  a temporary table, which would commit the transaction.
* **Errors**: a connection that fails or drops, Snowflake's 5xx and throttling (retried
  inside the connector first), a statement cancelled for its time are transient; wrong
  credentials stop with a configuration error naming the user, never the password; a
  value a column cannot take (SQLSTATE class 22) and every other error are terminal for
  the batch, with Snowflake's message.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eventpipe import reserved
from eventpipe.destinations import changes
from eventpipe.destinations.base import (
    ALL_SWAPPED,
    QUERY_TIMEOUT_SECONDS,
    DaySwap,
    LoadRequest,
    LoadResult,
    swap_days,
    table_lock,
)
from eventpipe.destinations.converted import beside, converted_rows, fits
from eventpipe.destinations.snowflake.query import check_query
from eventpipe.destinations.snowflake.rows import duckdb_type
from eventpipe.errors import ConfigError, QueryError, TerminalError, TransientError, first_line
from eventpipe.locks import Locks
from eventpipe.schema.dialects import SNOWFLAKE, TIMESTAMP_COLUMN
from eventpipe.schema.diff import Table, TablePatch
from eventpipe.schema.types import DataType

if TYPE_CHECKING:
    from snowflake.connector import SnowflakeConnection
    from snowflake.connector.cursor import SnowflakeCursor

LOADS_TABLE = reserved.LOADS_TABLE
STAGE = "_eventpipe_stage"
"""The schema's internal stage the batches' files are put to."""
STAGE_TABLE_PREFIX = "_eventpipe_stage_"
INT64_TYPE = "number(19,0)"
"""INT64's column: seed 1's ``bigint`` is ``NUMBER(38,0)`` in Snowflake, which INT128 is
too; 19 digits hold every 64-bit integer, and say which of the two the column is."""

_LATTICE = {
    "TEXT": DataType.STRING,
    "VARCHAR": DataType.STRING,
    "STRING": DataType.STRING,
    "CHAR": DataType.STRING,
    "VARIANT": DataType.STRING,
    "OBJECT": DataType.STRING,
    "ARRAY": DataType.STRING,
    "FLOAT": DataType.FLOAT64,
    "DOUBLE": DataType.FLOAT64,
    "REAL": DataType.FLOAT64,
    "BOOLEAN": DataType.BOOL,
    "TIMESTAMP_NTZ": DataType.TIMESTAMP,
    "TIMESTAMP_TZ": DataType.TIMESTAMP,
    "TIMESTAMP_LTZ": DataType.TIMESTAMP,
    "DATE": DataType.TIMESTAMP,
}
"""Snowflake's types back to the lattice (``NUMBER``: by its scale, :func:`_lattice`)."""

_WRONG_CREDENTIALS = {390100, 390101, 390102, 390144, 390318}
"""The connector's codes of a login refused (incorrect user or password, locked...)."""
_CANCELLED = {604, 630}
"""A statement cancelled, or stopped by STATEMENT_TIMEOUT_IN_SECONDS."""


class Sessions:
    """Idle Snowflake connections, by their settings, shared by the destination objects
    of a process: a login costs a round trip or more (about a second against
    Snowflake), and each run (each stream micro-batch) opens its destinations anew.
    At most :data:`IDLE_PER_SETTINGS` wait per settings, none longer than
    :data:`IDLE_SECONDS` (well within the four hours a Snowflake session lives idle);
    all are closed when the process exits."""

    def __init__(self) -> None:
        self._idle: dict[tuple[Any, ...], list[tuple[float, SnowflakeConnection]]] = {}
        self._lock = threading.Lock()
        atexit.register(self.close)

    def take(self, key: tuple[Any, ...]) -> SnowflakeConnection | None:
        now = time.monotonic()
        stale: list[SnowflakeConnection] = []
        found = None
        with self._lock:
            idle = self._idle.get(key, [])
            while idle and found is None:
                since, connection = idle.pop()
                if now - since > IDLE_SECONDS or connection.is_closed():
                    stale.append(connection)
                else:
                    found = connection
        for connection in stale:
            with contextlib.suppress(Exception):
                connection.close()
        return found

    def give_back(self, key: tuple[Any, ...], connection: SnowflakeConnection) -> None:
        with self._lock:
            idle = self._idle.setdefault(key, [])
            if len(idle) < IDLE_PER_SETTINGS:
                idle.append((time.monotonic(), connection))
                return
        connection.close()

    def close(self) -> None:
        with self._lock:
            everything = [c for idle in self._idle.values() for _, c in idle]
            self._idle.clear()
        for connection in everything:
            with contextlib.suppress(Exception):
                connection.close()


IDLE_PER_SETTINGS = 4
IDLE_SECONDS = 600.0
SESSIONS = Sessions()


class SnowflakeDestination:
    dialect = SNOWFLAKE
    parallel_loads = 2
    """Tables of a batch loaded at once, each on a connection of its own."""

    def __init__(
        self,
        destination_id: str,
        locks: Locks,
        *,
        account: str,
        user: str,
        password: str,
        database: str,
        schema: str = "EVENTS",
        warehouse: str | None = None,
        role: str | None = None,
        query_role: str | None = None,
        host: str | None = None,
        port: int | None = None,
        protocol: str = "https",
        timeout_seconds: float = 300.0,
    ) -> None:
        self.id = destination_id
        self.locks = locks
        self.database = database
        self.schema = schema
        self.user = user
        self.query_role = query_role
        self.timeout_seconds = timeout_seconds
        self._settings: dict[str, Any] = {
            "account": account, "user": user, "password": password, "database": database,
            "warehouse": warehouse, "role": role, "host": host, "port": port,
            "protocol": protocol,
        }  # fmt: skip
        self._ready = False

    def __repr__(self) -> str:
        return f"SnowflakeDestination({self.id!r}, {self.database}.{self.schema})"

    def _name(self, table: str) -> str:
        return self.dialect.name_of(table, self.schema)

    @contextmanager
    def _connect(
        self, table: str | None = None, *, role: str | None = None, timeout: float | None = None
    ) -> Iterator[SnowflakeCursor]:
        """A cursor on a connection in autocommit, in the destination's database, with
        times in UTC: one of the pool's (:class:`Sessions`) when an idle one of the same
        settings is there, a new one otherwise; back to the pool after, closed instead
        when the work failed (it may have left the session in any state)."""
        try:
            import snowflake.connector
            from snowflake.connector.errors import Error
        except ImportError:
            raise ConfigError(
                f"{self.id}: the Snowflake connector is not installed",
                fix="pip install 'eventpipe[snowflake]'",
            ) from None
        settings = {k: v for k, v in self._settings.items() if v is not None}
        if role:
            settings["role"] = role
        seconds = max(1, round(timeout or self.timeout_seconds))
        key = (*sorted(settings.items()), seconds)
        connection = SESSIONS.take(key)
        if connection is None:
            try:
                connection = snowflake.connector.connect(
                    **settings, login_timeout=30, network_timeout=seconds + 30,
                    session_parameters={"TIMEZONE": "UTC", "QUERY_TAG": "eventpipe",
                                        "STATEMENT_TIMEOUT_IN_SECONDS": seconds},
                )  # fmt: skip
            except Error as exc:
                raise self._classified(exc, table) from None
        try:
            with connection.cursor() as cursor:
                yield cursor
        except BaseException as exc:
            connection.close()
            if isinstance(exc, Error):
                raise self._classified(exc, table) from exc
            raise
        SESSIONS.give_back(key, connection)

    def _classified(self, exc: Exception, table: str | None) -> Exception:
        from snowflake.connector.errors import DatabaseError, InterfaceError, OperationalError

        errno = getattr(exc, "errno", None) or 0
        state = str(getattr(exc, "sqlstate", None) or "")
        where = f"{self.id}.{table}" if table else self.id
        message = f"snowflake ({where}): {first_line(exc)}"
        if errno in _WRONG_CREDENTIALS or state == "28000":
            return ConfigError(
                f"Snowflake refused user {self.user!r}: {first_line(exc)}",
                fix="check the account, the user and the environment variable holding its password",
            )
        transient = (
            isinstance(exc, (OperationalError, InterfaceError))
            or state.startswith("08")
            or errno in _CANCELLED
            or (isinstance(exc, DatabaseError) and not state and not errno)
        )
        return TransientError(message, table=table) if transient else TerminalError(
            message, table=table
        )  # fmt: skip

    def _ensure_ready(self, db: SnowflakeCursor) -> None:
        """The schema, the loads table and the stage, once per destination object."""
        q = self.dialect.quote
        if not self._ready:
            db.execute(f"CREATE SCHEMA IF NOT EXISTS {q(self.database)}.{q(self.schema)}")
        db.execute(f"USE SCHEMA {q(self.database)}.{q(self.schema)}")
        if not self._ready:
            db.execute(
                f"CREATE TABLE IF NOT EXISTS {self._name(LOADS_TABLE)} (batch_id text, "
                "tbl text, rows bigint, rejected text, "
                "loaded_at timestamp_ntz DEFAULT CURRENT_TIMESTAMP())"
            )
            db.execute(f"CREATE STAGE IF NOT EXISTS {self._name(STAGE)}")
            self._ready = True

    # -- tables -------------------------------------------------------------------------

    def describe(self, table: str) -> Table | None:
        with self._connect(table) as db:
            self._ensure_ready(db)
            return self._describe(db, table)

    def _describe(self, db: SnowflakeCursor, table: str) -> Table | None:
        db.execute(
            "SELECT column_name, data_type, numeric_precision, numeric_scale "
            "FROM information_schema.columns WHERE table_schema = %s AND table_name = %s "
            "ORDER BY ordinal_position",
            (self.schema, table),
        )
        rows = db.fetchall()
        if not rows:
            return None
        db.execute(f"SHOW PRIMARY KEYS IN TABLE {self._name(table)}")
        names = [d[0].lower() for d in db.description or []]
        at = {name: names.index(name) for name in
              ("schema_name", "table_name", "column_name", "key_sequence")}  # fmt: skip
        # This table's rows only: the stand-in the tests run answers with a table of the
        # same name in another schema too.
        this = (self.schema, table)
        keys = sorted((int(r[at["key_sequence"]]), str(r[at["column_name"]]))
                      for r in db.fetchall()
                      if (r[at["schema_name"]], r[at["table_name"]]) == this)  # fmt: skip
        columns = {str(name): _lattice(str(t), precision, scale)
                   for name, t, precision, scale in rows}  # fmt: skip
        return Table(table, columns, tuple(name for _, name in keys))

    def patch(self, patch: TablePatch) -> None:
        if patch.empty:
            return
        d = self.dialect
        with self._connect(patch.table) as db, table_lock(self.locks, self.id, patch.table):
            self._ensure_ready(db)
            current = self._describe(db, patch.table)  # again, under the lock
            if current is None:
                own = {c: INT64_TYPE for c, t in patch.add_columns if t is DataType.INT64}
                db.execute(d.create_table(patch.table, patch.add_columns,
                                          patch.set_primary_key, self.schema, own))  # fmt: skip
                return
            for column, data_type in patch.add_columns:
                if column not in current.columns:
                    own_type = INT64_TYPE if data_type is DataType.INT64 else None
                    db.execute(d.add_column(patch.table, column, data_type, self.schema,
                                            own_type))  # fmt: skip
            key = d.add_primary_key(patch.table, patch.set_primary_key, self.schema)
            if patch.set_primary_key and not current.primary_key and key:
                db.execute(key)

    def tables(self) -> list[str]:
        """The schema's tables, but the loads' stage tables."""
        with self._connect() as db:
            self._ensure_ready(db)
            db.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s "
                "AND table_type = 'BASE TABLE' ORDER BY 1",
                (self.schema,),
            )
            return [str(n) for (n,) in db.fetchall() if not str(n).startswith(STAGE_TABLE_PREFIX)]

    def drop(self, tables: list[str]) -> None:
        with self._connect() as db:
            self._ensure_ready(db)
            for table in tables:
                db.execute(f"DROP TABLE IF EXISTS {self._name(table)}")

    # -- loads --------------------------------------------------------------------------

    def load(self, request: LoadRequest) -> LoadResult:
        with self._connect(request.table) as db, table_lock(self.locks, self.id, request.table):
            self._ensure_ready(db)
            loads = self._name(LOADS_TABLE)
            db.execute(f"SELECT rows, rejected FROM {loads} WHERE batch_id = %s AND tbl = %s",
                       (request.batch_id, request.table))  # fmt: skip
            done = db.fetchone()
            if done is not None:
                left_out = tuple((int(i), str(why)) for i, why in json.loads(done[1] or "[]"))
                return LoadResult(rows=int(done[0]), already_loaded=True, rejected=left_out)
            types = self._types(db, request.table)
            if not types:
                raise TerminalError(f"{self.id}.{request.table} does not exist",
                                    table=request.table)  # fmt: skip
            missing = [c for c in request.columns if c not in types]
            if missing:
                raise TerminalError(f"{self.id}.{request.table} has no column {missing[0]!r}",
                                    table=request.table)  # fmt: skip
            path = hashlib.sha1(f"{request.table}\0{request.batch_id}".encode()).hexdigest()[:20]
            with tempfile.TemporaryDirectory(prefix="eventpipe-snowflake-",
                                             dir=beside(request)) as work:  # fmt: skip
                rejected: dict[int, str] = {}
                files = list(request.files)
                if not fits(files, {c: types[c] for c in request.columns}):
                    converted = Path(work) / f"{path}.parquet"
                    rejected = converted_rows(request, types, converted, "snowflake")
                    files = [converted] if converted.exists() else []
                where = self._put(db, files, path)
            left_out = tuple(sorted(rejected.items()))
            # With a key or a source's changes, the rows go through a stage table, the
            # newest row or the last change per key chosen there; without, COPY puts them
            # in the table inside the transaction.
            staged = request.primary_key or request.apply_changes
            stage = self._name(STAGE_TABLE_PREFIX + path[:16]) if staged else None
            if stage is not None:
                db.execute(f"CREATE OR REPLACE TRANSIENT TABLE {stage} "
                           f"LIKE {self._name(request.table)}")  # fmt: skip
                if where:
                    self._copy(db, stage, where)
            try:
                db.execute("BEGIN")
                if stage is not None and request.apply_changes:
                    rows = self._apply_changes(db, request, stage)
                elif stage is not None:
                    rows = self._move(db, request, stage)
                else:
                    rows = self._copy(db, self._name(request.table), where) if where else 0
                reasons = json.dumps([list(r) for r in left_out])
                db.execute(
                    f"INSERT INTO {loads} (batch_id, tbl, rows, rejected) VALUES (%s, %s, %s, %s)",
                    (request.batch_id, request.table, rows, reasons),
                )
                db.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(Exception):  # a connection gone rolls back itself
                    db.execute("ROLLBACK")
                raise
            finally:
                if stage is not None:
                    db.execute(f"DROP TABLE IF EXISTS {stage}")
        return LoadResult(rows=rows, rejected=left_out)

    def _types(self, db: SnowflakeCursor, table: str) -> dict[str, str]:
        """The table's columns and the DuckDB type of each one's Snowflake type."""
        db.execute(
            "SELECT column_name, data_type, numeric_precision, numeric_scale "
            "FROM information_schema.columns WHERE table_schema = %s AND table_name = %s",
            (self.schema, table),
        )
        return {str(c): duckdb_type(str(t), p, s) for c, t, p, s in db.fetchall()}

    def _put(self, db: SnowflakeCursor, files: list[Path], path: str) -> str:
        """``files`` put under ``path`` in the stage, each in a folder of its own (two
        files of one name stay two); the location COPY reads, empty without files."""
        where = f"@{self._name(STAGE)}/{path}"
        for number, file in enumerate(files):
            local = str(file.resolve()).replace("\\", "\\\\").replace("'", "\\'")
            db.execute(f"PUT 'file://{local}' {where}/{number} AUTO_COMPRESS = FALSE "
                       "OVERWRITE = TRUE")  # fmt: skip
        return where if files else ""

    def _copy(self, db: SnowflakeCursor, into: str, where: str) -> int:
        """The files at ``where`` copied into ``into`` (by column name; purged once
        loaded); the rows loaded."""
        db.execute(
            f"COPY INTO {into} FROM {where} FILE_FORMAT = (TYPE = PARQUET) "
            "MATCH_BY_COLUMN_NAME = CASE_INSENSITIVE FORCE = TRUE PURGE = TRUE"
        )
        names = [d[0].lower() for d in db.description or []]
        loaded = names.index("rows_loaded") if "rows_loaded" in names else None
        return sum(int(r[loaded] or 0) for r in db.fetchall()) if loaded is not None else 0

    def _apply_changes(self, db: SnowflakeCursor, request: LoadRequest, stage: str) -> int:
        """A source's changes in ``stage`` applied by key (destinations/changes.py), each
        key's last change a subquery: a CREATE would commit the transaction."""

        def run(sql: str) -> list[tuple[Any, ...]]:
            db.execute(sql)
            return [tuple(row) for row in db.fetchall()] if db.description else []

        return changes.apply(run, self.dialect.quote, self._name(request.table), stage,
                             list(request.columns), temporary=None)  # fmt: skip

    def _move(self, db: SnowflakeCursor, request: LoadRequest, stage: str) -> int:
        """The stage's rows into the table (by key: the newest wins); the rows, or the
        keys, of the batch."""
        q = self.dialect.quote
        target = self._name(request.table)
        listed = ", ".join(q(c) for c in request.columns)
        if not request.primary_key:
            db.execute(f"INSERT INTO {target} ({listed}) SELECT {listed} FROM {stage}")
            return int(db.rowcount or 0)
        keys = [q(c) for c in request.primary_key]
        newest = _newest_per_key(keys, TIMESTAMP_COLUMN in request.columns)
        # Snowflake names DELETE's target by the table's own name (no alias).
        t = q(request.table)
        ts = q(TIMESTAMP_COLUMN)
        older = (f" AND (s.{ts} >= {t}.{ts} OR {t}.{ts} IS NULL OR s.{ts} IS NULL)"
                 if TIMESTAMP_COLUMN in request.columns else "")  # fmt: skip
        matched = " AND ".join(f"{t}.{k} = s.{k}" for k in keys)
        chosen = f"SELECT * FROM {stage} {newest}"
        db.execute(f"DELETE FROM {target} USING ({chosen}) AS s WHERE {matched}{older}")
        present = " AND ".join(f"present.{k} = s.{k}" for k in keys)
        db.execute(
            f"INSERT INTO {target} ({listed}) SELECT {listed} FROM {stage} AS s "
            f"WHERE NOT EXISTS (SELECT 1 FROM {target} AS present WHERE {present}) {newest}"
        )
        db.execute(f"SELECT count(*) FROM (SELECT DISTINCT {', '.join(keys)} FROM {stage})")
        (count,) = db.fetchone() or (0,)
        return int(count)

    # -- days replaced ------------------------------------------------------------------

    def replace_days(self, swap: DaySwap) -> dict[str, int]:
        """Delete the rows of ``swap.days`` from ``swap.tables`` and move the shadows'
        rows in (by key with a primary key), in one transaction recorded under
        ``swap.swap_id``; the shadows dropped after it. The rows moved in per table."""
        q = self.dialect.quote
        loads = self._name(LOADS_TABLE)
        with self._connect() as db:
            self._ensure_ready(db)
            db.execute(f"SELECT tbl, rows FROM {loads} WHERE batch_id = %s", (swap.swap_id,))
            done = db.fetchall()
            if done:
                self._drop_shadows(db, swap)
                return {str(t): int(n) for t, n in done if t != ALL_SWAPPED}
            described = {t: self._describe(db, t) for t in {*swap.tables, *swap.shadows.values()}}
            db.execute("BEGIN")
            try:

                def delete(table: str, where: str) -> None:
                    db.execute(f"DELETE FROM {self._name(table)} WHERE {where}")

                def move(request: LoadRequest, shadow: str) -> int:
                    return self._move(db, request, self._name(shadow))

                moved = swap_days(swap, q, described, delete, move, self.id)
                for table, count in [*moved.items(), (ALL_SWAPPED, 0)]:
                    db.execute(f"INSERT INTO {loads} (batch_id, tbl, rows) VALUES (%s, %s, %s)",
                               (swap.swap_id, table, count))  # fmt: skip
                db.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(Exception):  # a connection gone rolls back itself
                    db.execute("ROLLBACK")
                raise
            self._drop_shadows(db, swap)
        return moved

    def _drop_shadows(self, db: SnowflakeCursor, swap: DaySwap) -> None:
        for shadow in sorted(swap.shadows.values()):
            db.execute(f"DROP TABLE IF EXISTS {self._name(shadow)}")

    # -- reads --------------------------------------------------------------------------

    def query(
        self, sql: str, *, timeout_seconds: float = QUERY_TIMEOUT_SECONDS
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run one read (:func:`check_query`) in the destination's schema, as
        ``query_role`` when configured, stopped after ``timeout_seconds``
        (``STATEMENT_TIMEOUT_IN_SECONDS``); column names and rows."""
        check_query(sql)
        q = self.dialect.quote
        try:
            with self._connect(role=self.query_role, timeout=timeout_seconds) as db:
                db.execute(f"USE SCHEMA {q(self.database)}.{q(self.schema)}")
                db.execute(sql.strip().rstrip(";"))
                names = [d[0] for d in db.description or []]
                return names, [tuple(r) for r in db.fetchall()]
        except TransientError as exc:
            if "timeout" in exc.message.lower() or "cancel" in exc.message.lower():
                raise QueryError(
                    f"the query ran longer than query_timeout_seconds ({timeout_seconds:g})"
                ) from None
            raise
        except TerminalError as exc:
            raise QueryError(exc.message) from None


def _lattice(sql_type: str, precision: Any, scale: Any) -> DataType:
    """A column's Snowflake type as the lattice's: ``NUMBER`` with a scale is FLOAT64;
    without, INT64 up to 19 digits (:data:`INT64_TYPE`), INT128 beyond."""
    name = sql_type.upper().split("(")[0].strip()
    if name in ("NUMBER", "DECIMAL", "NUMERIC", "INT", "INTEGER", "BIGINT"):
        if scale:
            return DataType.FLOAT64
        return DataType.INT64 if precision and int(precision) <= 19 else DataType.INT128
    return _LATTICE.get(name, DataType.STRING)


def _newest_per_key(keys: list[str], has_timestamp: bool) -> str:
    """A QUALIFY clause keeping, of each key's rows, the newest (by ``_timestamp``)."""
    order = f"{SNOWFLAKE.quote(TIMESTAMP_COLUMN)} DESC NULLS LAST" if has_timestamp else "1"
    return f"QUALIFY ROW_NUMBER() OVER (PARTITION BY {', '.join(keys)} ORDER BY {order}) = 1"
