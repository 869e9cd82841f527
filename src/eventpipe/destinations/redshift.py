"""Amazon Redshift (``type: redshift``): the destination protocol over PostgreSQL's wire
protocol (psycopg, eventpipe's PostgreSQL driver; Redshift speaks it), the batches'
files staged on S3 and loaded by Redshift's own ``COPY``.

* **Tables** in the configured schema (created if missing), typed by seed 1's Redshift
  column (schema.dialects.REDSHIFT: ``character varying(65535)``, ``numeric(38,18)``,
  ``bigint``, ``numeric(38,0)``, ``boolean``, ``timestamp`` holding UTC); with
  ``primary_key`` the key is declared (Redshift does not enforce it: the loads do).
  Redshift folds names to lower case, quoted or not: eventpipe's names are lower case
  already (schema/naming.py).
* **Patching** runs under the table lock of the data directory (Redshift has no
  advisory locks); the table is read again under it.
* **A load**:

  1. the batch's record in ``_eventpipe_loads`` is looked up: found, nothing loads;
  2. an in-memory DuckDB converts the batch to one Parquet file holding the table's whole
     row, column by column in the table's order (Redshift's Parquet ``COPY`` matches
     columns by position), each in the column's type (``numeric(38,18)`` a decimal of
     that scale); a value that does not convert leaves its row out with the reason
     (converted.py). Text is made storable (:func:`fit_text`): NUL becomes U+FFFD, and
     a value over the column's bytes (65,535) is cut at a character boundary and ends
     with :data:`TRUNCATED`, so the event still loads and the cut is visible;
  3. the file is uploaded to ``staging`` (``s3://bucket/prefix``) under a path of the
     batch's own (one PUT; a rerun puts it again);
  4. one transaction: ``LOCK`` the table (loads of one table from any host wait for
     each other), the record looked up again, ``COPY ... FROM 's3://...' IAM_ROLE ...
     FORMAT AS PARQUET``, the batch's record; ``COMMIT``. With a key the file is copied
     into a temporary table, each key's newest row chosen there, and it replaces the
     table's row unless that one is newer (``DELETE ... USING``, ``INSERT``); a source's
     changes go into the temporary table too and are applied by key from there
     (destinations/changes.py: each key's last change decides);
  5. the staged objects are deleted.

  A crash before the ``COMMIT`` leaves the table as it was; a rerun stages the file
  again.
* **Days replaced** (``eventpipe reprocess``): one transaction deletes the days' rows and
  moves the shadows' rows in, with its record; the shadows are dropped after it.
* **Errors**: a connection that fails or drops, the server's resource and serialisable
  isolation errors (``Serializable isolation violation``) are transient; a ``COPY`` that
  S3 or Redshift refuses and every other error are terminal for the batch, with
  Redshift's message. The DSN is never logged.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
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
from eventpipe.destinations.converted import beside, converted_rows
from eventpipe.destinations.postgres.destination import classified
from eventpipe.destinations.postgres.query import check_query
from eventpipe.errors import QueryError, TerminalError, TransientError, first_line, redacted
from eventpipe.locks import Locks
from eventpipe.objectstore import Location
from eventpipe.schema.dialects import REDSHIFT, TIMESTAMP_COLUMN
from eventpipe.schema.diff import Table, TablePatch
from eventpipe.schema.types import DataType

if TYPE_CHECKING:
    import psycopg

LOADS_TABLE = reserved.LOADS_TABLE
STAGE_TABLE = "_eventpipe_stage"
"""A load's temporary table (its session's own), with a key."""
CHOSEN_TABLE = "_eventpipe_chosen"
"""Each key's newest row of the stage (temporary too)."""
TRUNCATED = " [truncated by eventpipe]"
"""The end of a text cut to fit its column."""
RECORD_PART_BYTES = 60_000
"""The rejected rows' reasons are recorded in parts of this many bytes at most (a
``varchar`` holds 65,535)."""

_LATTICE = {
    "character varying": DataType.STRING,
    "character": DataType.STRING,
    "text": DataType.STRING,
    "super": DataType.STRING,
    "double precision": DataType.FLOAT64,
    "real": DataType.FLOAT64,
    "bigint": DataType.INT64,
    "integer": DataType.INT64,
    "smallint": DataType.INT64,
    "boolean": DataType.BOOL,
    "timestamp without time zone": DataType.TIMESTAMP,
    "timestamp with time zone": DataType.TIMESTAMP,
    "date": DataType.TIMESTAMP,
}
"""Redshift's types back to the lattice (``numeric``: by its scale, :func:`_lattice`)."""

_DUCKDB = {
    "double precision": "DOUBLE",
    "real": "FLOAT",
    "bigint": "BIGINT",
    "integer": "INTEGER",
    "smallint": "SMALLINT",
    "boolean": "BOOLEAN",
    "timestamp without time zone": "TIMESTAMP",
    "timestamp with time zone": "TIMESTAMPTZ",
    "date": "DATE",
}
"""The DuckDB type whose Parquet type Redshift's COPY puts into each column type."""

_TRANSIENT_TEXT = re.compile(
    r"serializable isolation violation|conflict with concurrent transaction|"
    r"connection.*(reset|closed)|server closed the connection|out of memory",
    re.IGNORECASE,
)


class Column:
    """A column as Redshift describes it."""

    def __init__(self, name: str, sql_type: str, length: Any, precision: Any, scale: Any):
        self.name = name
        self.sql_type = sql_type
        self.length = int(length) if length is not None else None
        self.precision = int(precision) if precision is not None else None
        self.scale = int(scale) if scale is not None else None

    @property
    def lattice(self) -> DataType:
        if self.sql_type == "numeric":
            return DataType.FLOAT64 if self.scale else DataType.INT128
        return _LATTICE.get(self.sql_type, DataType.STRING)

    @property
    def duckdb(self) -> str:
        if self.sql_type == "numeric":
            return f"DECIMAL({self.precision or 18},{self.scale or 0})"
        return _DUCKDB.get(self.sql_type, "VARCHAR")


class RedshiftDestination:
    dialect = REDSHIFT
    parallel_loads = 2
    """Tables of a batch loaded at once, each on a connection of its own."""

    def __init__(
        self,
        destination_id: str,
        locks: Locks,
        *,
        dsn: str,
        staging: Location,
        iam_role: str,
        schema: str = "public",
        region: str | None = None,
        query_dsn: str | None = None,
        timeout_seconds: float = 300.0,
    ) -> None:
        self.id = destination_id
        self.locks = locks
        self.dsn = dsn
        self.staging = staging
        self.iam_role = iam_role
        self.schema = schema
        self.region = region
        self.query_dsn = query_dsn
        self.timeout_seconds = timeout_seconds
        self._ready = False

    def __repr__(self) -> str:
        return f"RedshiftDestination({self.id!r}, {redacted(self.dsn)}, {self.schema})"

    def _name(self, table: str) -> str:
        return self.dialect.name_of(table, self.schema)

    @contextmanager
    def _connect(
        self, table: str | None = None, *, dsn: str | None = None, timeout: float | None = None
    ) -> Iterator[psycopg.Connection[Any]]:
        """A connection in autocommit, statements stopped after ``timeout`` (the
        destination's by default)."""
        import psycopg

        dsn = dsn or self.dsn
        try:
            db = psycopg.connect(dsn, connect_timeout=10, application_name="eventpipe",
                                 autocommit=True)  # fmt: skip
        except psycopg.OperationalError as exc:
            raise TransientError(
                f"redshift {redacted(dsn)}: cannot connect: {first_line(exc)}",
                fix="check that the cluster is up and the dsn is right",
            ) from None
        try:
            milliseconds = max(1, round((timeout or self.timeout_seconds) * 1000))
            db.execute(f"SET statement_timeout TO {milliseconds}")
            yield db
        except psycopg.Error as exc:
            raise self._classified(exc, table) from exc
        finally:
            db.close()

    def _classified(self, exc: Exception, table: str | None) -> Exception:
        found = classified(exc, self.id, table, "redshift")
        if isinstance(found, TerminalError) and _TRANSIENT_TEXT.search(str(exc)):
            return TransientError(found.message, table=table)
        return found

    def _ensure_ready(self, db: psycopg.Connection[Any]) -> None:
        """The schema and the loads table, once per destination object."""
        if self._ready:
            return
        if not self._columns(db, LOADS_TABLE):
            # Two sessions' CREATE ... IF NOT EXISTS can both find the name free: one at
            # a time from this data directory.
            with table_lock(self.locks, self.id, LOADS_TABLE):
                db.execute(f"CREATE SCHEMA IF NOT EXISTS {self.dialect.quote(self.schema)}")
                db.execute(
                    f"CREATE TABLE IF NOT EXISTS {self._name(LOADS_TABLE)} (batch_id "
                    "varchar(512), tbl varchar(512), part integer, rows bigint, "
                    "rejected varchar(65535), loaded_at timestamp)"
                )
        self._ready = True

    # -- tables -------------------------------------------------------------------------

    def describe(self, table: str) -> Table | None:
        with self._connect(table) as db:
            self._ensure_ready(db)
            return self._describe(db, table)

    def _columns(self, db: psycopg.Connection[Any], table: str) -> list[Column]:
        rows = db.execute(
            "SELECT column_name, data_type, character_maximum_length, numeric_precision, "
            "numeric_scale FROM information_schema.columns WHERE table_schema = %s "
            "AND table_name = %s ORDER BY ordinal_position",
            [self.schema, table],
        ).fetchall()
        return [Column(*row) for row in rows]

    def _describe(self, db: psycopg.Connection[Any], table: str) -> Table | None:
        columns = self._columns(db, table)
        if not columns:
            return None
        key = db.execute(
            "SELECT k.column_name FROM information_schema.table_constraints c "
            "JOIN information_schema.key_column_usage k ON k.constraint_schema = "
            "c.constraint_schema AND k.constraint_name = c.constraint_name "
            "AND k.table_name = c.table_name "
            "WHERE c.constraint_type = 'PRIMARY KEY' AND c.table_schema = %s "
            "AND c.table_name = %s ORDER BY k.ordinal_position",
            [self.schema, table],
        ).fetchall()
        return Table(table, {c.name: c.lattice for c in columns}, tuple(n for (n,) in key))

    def patch(self, patch: TablePatch) -> None:
        if patch.empty:
            return
        d = self.dialect
        with self._connect(patch.table) as db, table_lock(self.locks, self.id, patch.table):
            self._ensure_ready(db)
            current = self._describe(db, patch.table)  # again, under the lock
            if current is None:
                db.execute(d.create_table(patch.table, patch.add_columns,
                                          patch.set_primary_key, self.schema))  # fmt: skip
                return
            for column, data_type in patch.add_columns:
                if column not in current.columns:
                    db.execute(d.add_column(patch.table, column, data_type, self.schema))
            key = d.add_primary_key(patch.table, patch.set_primary_key, self.schema)
            if patch.set_primary_key and not current.primary_key and key:
                db.execute(key)

    def tables(self) -> list[str]:
        with self._connect() as db:
            self._ensure_ready(db)
            rows = db.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s "
                "AND table_type = 'BASE TABLE' ORDER BY 1",
                [self.schema],
            ).fetchall()
            return [str(n) for (n,) in rows]

    def drop(self, tables: list[str]) -> None:
        with self._connect() as db:
            self._ensure_ready(db)
            for table in tables:
                db.execute(f"DROP TABLE IF EXISTS {self._name(table)}")

    # -- loads --------------------------------------------------------------------------

    def load(self, request: LoadRequest) -> LoadResult:
        staged = self.staging.join(self.id, _batch_path(request))
        with self._connect(request.table) as db:
            self._ensure_ready(db)
            done = self._recorded(db, request)
            if done is not None:
                self._unstage(staged)
                return done
            columns = self._columns(db, request.table)
            if not columns:
                raise TerminalError(f"{self.id}.{request.table} does not exist",
                                    table=request.table)  # fmt: skip
            types = {c.name: c.duckdb for c in columns}
            missing = [c for c in request.columns if c not in types]
            if missing:
                raise TerminalError(f"{self.id}.{request.table} has no column {missing[0]!r}",
                                    table=request.table)  # fmt: skip
            with tempfile.TemporaryDirectory(prefix="eventpipe-redshift-",
                                             dir=beside(request)) as work:  # fmt: skip
                converted = Path(work) / "part-0.parquet"
                rejected = converted_rows(request, types, converted, "redshift",
                                          [c.name for c in columns])  # fmt: skip
                if converted.exists():
                    fit_text(converted, {c.name: c.length for c in columns if c.length})
                    self._stage(converted, f"{staged}/{converted.name}", request.table)
                else:
                    staged = ""
            try:
                return self._commit(db, request, staged, tuple(sorted(rejected.items())))
            finally:
                if staged:
                    self._unstage(staged)

    def _commit(
        self,
        db: psycopg.Connection[Any],
        request: LoadRequest,
        staged: str,
        rejected: tuple[tuple[int, str], ...],
    ) -> LoadResult:
        """The staged file copied in and the batch recorded, in one transaction that
        holds the table's lock."""
        target = self._name(request.table)
        with db.transaction():
            db.execute(f"LOCK {target}")
            done = self._recorded(db, request)  # another host's load of it, meanwhile
            if done is not None:
                return done
            if not staged:
                rows = 0
            elif request.primary_key or request.apply_changes:
                stage = self.dialect.quote(STAGE_TABLE)
                db.execute(f"CREATE TEMPORARY TABLE {stage} (LIKE {target})")
                self._copy(db, stage, staged)
                if request.apply_changes:
                    rows = self._apply_changes(db, request, stage)
                else:
                    rows = self._move(db, request, stage)
                db.execute(f"DROP TABLE {stage}")
            else:
                rows = self._copy(db, target, staged)
            self._record(db, request.batch_id, request.table, rows, rejected)
        return LoadResult(rows=rows, rejected=rejected)

    def _copy(self, db: psycopg.Connection[Any], into: str, staged: str) -> int:
        """Redshift's COPY of the Parquet objects under ``staged`` into ``into``; the
        rows copied."""
        literal = self.dialect.literal
        role = "default" if self.iam_role == "default" else literal(self.iam_role)
        region = f" REGION {literal(self.region)}" if self.region else ""
        cursor = db.execute(
            f"COPY {into} FROM {literal(staged.rstrip('/') + '/')} IAM_ROLE {role} "
            f"FORMAT AS PARQUET{region}"
        )
        return max(cursor.rowcount, 0)

    def _move(self, db: psycopg.Connection[Any], request: LoadRequest, source: str) -> int:
        """``source``'s rows into the table: each key's newest row, replacing the
        table's unless that one is newer; the keys moved."""
        q = self.dialect.quote
        target = self._name(request.table)
        table = q(request.table)
        listed = ", ".join(q(c) for c in request.columns)
        keys = [q(c) for c in request.primary_key]
        ts = q(TIMESTAMP_COLUMN)
        has_time = TIMESTAMP_COLUMN in request.columns
        order = f"{ts} DESC NULLS LAST" if has_time else "1"
        chosen = q(CHOSEN_TABLE)
        db.execute(
            f"CREATE TEMPORARY TABLE {chosen} AS SELECT {listed} FROM (SELECT {listed}, "
            f"ROW_NUMBER() OVER (PARTITION BY {', '.join(keys)} ORDER BY {order}) AS "
            f"_eventpipe_n FROM {source}) AS s WHERE _eventpipe_n = 1"
        )
        matched = " AND ".join(f"{table}.{k} = {chosen}.{k}" for k in keys)
        older = (f" AND ({chosen}.{ts} >= {table}.{ts} OR {table}.{ts} IS NULL "
                 f"OR {chosen}.{ts} IS NULL)" if has_time else "")  # fmt: skip
        db.execute(f"DELETE FROM {target} USING {chosen} WHERE {matched}{older}")
        present = " AND ".join(f"present.{k} = c.{k}" for k in keys)
        db.execute(
            f"INSERT INTO {target} ({listed}) SELECT {listed} FROM {chosen} AS c "
            f"WHERE NOT EXISTS (SELECT 1 FROM {target} AS present WHERE {present})"
        )
        row = db.execute(f"SELECT count(*) FROM {chosen}").fetchone()
        db.execute(f"DROP TABLE {chosen}")
        return int(row[0]) if row else 0

    def _apply_changes(self, db: psycopg.Connection[Any], request: LoadRequest, stage: str) -> int:
        """A source's changes in ``stage`` applied by key (destinations/changes.py)."""

        def run(sql: str) -> list[tuple[Any, ...]]:
            cursor = db.execute(sql)
            return cursor.fetchall() if cursor.description else []

        return changes.apply(run, self.dialect.quote, self._name(request.table), stage,
                             list(request.columns), "TEMPORARY TABLE {}")  # fmt: skip

    def _recorded(self, db: psycopg.Connection[Any], request: LoadRequest) -> LoadResult | None:
        """The batch's load as recorded, or None if it was not loaded."""
        parts = db.execute(
            f"SELECT rows, rejected FROM {self._name(LOADS_TABLE)} "
            "WHERE batch_id = %s AND tbl = %s ORDER BY part",
            [request.batch_id, request.table],
        ).fetchall()
        if not parts:
            return None
        reasons = json.loads("".join(p[1] or "" for p in parts) or "[]")
        left_out = tuple((int(i), str(why)) for i, why in reasons)
        return LoadResult(rows=int(parts[0][0]), already_loaded=True, rejected=left_out)

    def _record(
        self,
        db: psycopg.Connection[Any],
        batch_id: str,
        table: str,
        rows: int,
        rejected: tuple[tuple[int, str], ...] = (),
    ) -> None:
        """The load's record: its rows, and the reasons of the rows left out in parts
        a ``varchar`` holds."""
        text = json.dumps([list(r) for r in rejected], ensure_ascii=True)
        parts = [text[i : i + RECORD_PART_BYTES] for i in range(0, len(text), RECORD_PART_BYTES)]
        now = datetime.now(UTC).replace(tzinfo=None)
        with db.cursor() as cursor:
            cursor.executemany(
                f"INSERT INTO {self._name(LOADS_TABLE)} (batch_id, tbl, part, rows, rejected, "
                "loaded_at) VALUES (%s, %s, %s, %s, %s, %s)",
                [(batch_id, table, n, rows, part, now) for n, part in enumerate(parts)],
            )

    def _stage(self, local: Path, staged: str, table: str) -> None:
        """``local`` put to ``staged``; a store that fails is retried with the run."""
        from eventpipe.destinations.storage import ObjectStorage

        try:
            ObjectStorage(self.staging).upload(local, staged)
        except OSError as exc:
            where = f"redshift ({self.id}.{table}): staging on {self.staging}"
            raise TransientError(f"{where}: {first_line(exc)}", table=table) from None

    def _unstage(self, staged: str) -> None:
        """The staged objects deleted; one left (a store gone) is deleted by a rerun."""
        with contextlib.suppress(OSError):
            self.staging.remove(staged)

    # -- days replaced ------------------------------------------------------------------

    def replace_days(self, swap: DaySwap) -> dict[str, int]:
        """Delete the rows of ``swap.days`` from ``swap.tables`` and move the shadows'
        rows in (by key with a primary key), in one transaction recorded under
        ``swap.swap_id``; the shadows dropped after it. The rows moved in per table."""
        q = self.dialect.quote
        with self._connect() as db:
            self._ensure_ready(db)
            done = db.execute(
                f"SELECT tbl, rows FROM {self._name(LOADS_TABLE)} WHERE batch_id = %s",
                [swap.swap_id],
            ).fetchall()
            if done:
                self._drop_shadows(db, swap)
                return {str(t): int(n) for t, n in done if t != ALL_SWAPPED}
            described = {t: self._describe(db, t) for t in {*swap.tables, *swap.shadows.values()}}
            with db.transaction():

                def delete(table: str, where: str) -> None:
                    db.execute(f"DELETE FROM {self._name(table)} WHERE {where}")

                def move(request: LoadRequest, shadow: str) -> int:
                    return self._moved_in(db, request, self._name(shadow))

                moved = swap_days(swap, q, described, delete, move, self.id)
                for table, count in [*moved.items(), (ALL_SWAPPED, 0)]:
                    self._record(db, swap.swap_id, table, count)
            self._drop_shadows(db, swap)
        return moved

    def _moved_in(self, db: psycopg.Connection[Any], request: LoadRequest, source: str) -> int:
        if request.primary_key:
            return self._move(db, request, source)
        listed = ", ".join(self.dialect.quote(c) for c in request.columns)
        cursor = db.execute(
            f"INSERT INTO {self._name(request.table)} ({listed}) SELECT {listed} FROM {source}"
        )
        return max(cursor.rowcount, 0)

    def _drop_shadows(self, db: psycopg.Connection[Any], swap: DaySwap) -> None:
        for shadow in sorted(swap.shadows.values()):
            db.execute(f"DROP TABLE IF EXISTS {self._name(shadow)}")

    # -- reads --------------------------------------------------------------------------

    def query(
        self, sql: str, *, timeout_seconds: float = QUERY_TIMEOUT_SECONDS
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run one read (destinations/postgres/query.py says which: Redshift's SQL is
        PostgreSQL's for reads) in a read-only transaction stopped after
        ``timeout_seconds``, in the destination's schema, as ``query_dsn``'s user when
        configured; column names and rows."""
        import psycopg

        check_query(sql)
        with self._connect(dsn=self.query_dsn or self.dsn, timeout=timeout_seconds) as db:
            db.execute(f"SET search_path TO {self.dialect.quote(self.schema)}")
            db.autocommit = False
            db.read_only = True
            try:
                cursor = db.execute(sql.strip().rstrip(";"))
                names = [d.name for d in cursor.description or []]
                rows = [tuple(r) for r in cursor.fetchall()] if cursor.description else []
            except psycopg.errors.QueryCanceled:
                raise QueryError(
                    f"the query ran longer than query_timeout_seconds ({timeout_seconds:g})"
                ) from None
            except psycopg.Error as exc:
                raise QueryError(first_line(exc)) from None
            db.rollback()
            return names, rows


def fit_text(path: Path, lengths: Mapping[str, int]) -> int:
    """Make the text of the Parquet file at ``path`` storable in columns of at most
    ``lengths`` bytes (column -> bytes): NUL, which Redshift's text cannot hold, as
    U+FFFD; a longer value cut at a character boundary, ending with
    :data:`TRUNCATED`. The file is rewritten only when a value changed; the values cut."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    texts = [f.name for f in pq.read_schema(path) if f.name in lengths
             and (pa.types.is_string(f.type) or pa.types.is_large_string(f.type))]  # fmt: skip
    if not texts:
        return 0
    read = pq.read_table(path, columns=texts)  # the text alone, to look at
    fixed: dict[str, Any] = {}
    cut = 0
    for name in texts:
        values = read.column(name)
        if _has_nul(values) and pc.any(pc.match_substring(values, "\0")).as_py():
            values = pc.replace_substring(values, "\0", "\ufffd")
            fixed[name] = values
        cap = lengths[name]
        if (pc.max(pc.binary_length(values)).as_py() or 0) > cap:
            listed = values.to_pylist()
            for at, text in enumerate(listed):
                if text is not None and len(text.encode("utf-8")) > cap:
                    listed[at] = _cut(text, cap)
                    cut += 1
            fixed[name] = pa.array(listed, pa.string())
    if fixed:
        table = pq.read_table(path)
        for name, values in fixed.items():
            at = table.schema.get_field_index(name)
            table = table.set_column(at, table.schema.field(at), values)
        pq.write_table(table, path)
    return cut


def _has_nul(values: Any) -> bool:
    """Whether a NUL may be in ``values``' text: a scan of the chunks' bytes (memchr),
    far quicker than a match of every value; true may be a byte of an unused slot."""
    return any(chunk.buffers()[2] is not None and b"\0" in bytes(chunk.buffers()[2])
               for chunk in values.chunks)  # fmt: skip


def _cut(text: str, cap: int) -> str:
    """``text`` in at most ``cap`` bytes, ending with :data:`TRUNCATED` when the column
    leaves room for it (a short ``varchar`` a user made keeps the text alone)."""
    marker = TRUNCATED if cap >= 4 * len(TRUNCATED) else ""
    kept = text.encode("utf-8")[: cap - len(marker)].decode("utf-8", "ignore")
    return kept + marker


def _batch_path(request: LoadRequest) -> str:
    """A load's folder under the staging prefix: the table's and the batch's own."""
    digest = hashlib.sha1(f"{request.table}\0{request.batch_id}".encode()).hexdigest()[:20]
    return f"{request.table}/{digest}"
