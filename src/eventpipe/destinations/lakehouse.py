"""What the open table formats share (``type: iceberg``, ``type: delta``).

An Iceberg or Delta table is Parquet data files plus a transaction log that says which
files make the table at each version. A load, a schema change or a reprocess of days is
one commit: a reader sees the table before it or after it, never half of it.

How a batch is committed (the same for both formats, :class:`LakehouseDestination`):

1. The staged rows (Parquet files Spark wrote, one table's rows of the batch) are read
   by an in-memory DuckDB, each value converted to its column's type. A row with a
   value its column cannot take is left out with the reason, as in the other
   destinations. With a primary key, the newest ``_timestamp`` of each key is kept.
2. The rows, as Arrow, go to the format's library, which writes the data files and
   commits them with the batch's id in the commit itself (Iceberg: the snapshot's
   summary; Delta: an application transaction and the commit's metadata). A source's
   changes applied by key (``changes: apply``, docs/cdc.md) are a copy-on-write of the
   whole table: its rows read, the changes applied in DuckDB, the result committed in
   place of them (an ``overwrite``). Before that,
   the table's log is asked whether the batch's id is there: a retry after a crash
   between the commit and eventpipe's own record appends nothing twice. Data files of a
   commit that never happened are in no version of the table (``eventpipe lake expire``
   removes them).

Why the libraries write the files, not Spark: Spark's own Iceberg and Delta writers are
jars that would be downloaded at run time. The rows a batch loads into one table are
already in memory-sized staged files, and the measured cost is in docs/lakehouse.md.

New columns are committed with the rows that bring them: ``patch`` (the protocol's step
before ``load``) creates a missing table, but only notes the columns an existing one
lacks, and the load's commit adds them (Iceberg: a schema update in the same
transaction; Delta: the write's schema merge). ``describe`` includes the noted columns;
a failed commit keeps them for the next. Types never change: a
column keeps its type and a value that does not convert goes to failed/ (the lattice
only makes 64-bit integers and doubles, so Iceberg's int->long and float->double
promotions never arise).

Timestamps are stored as instants in UTC (Iceberg ``timestamptz``, Delta ``timestamp``):
the formats' zone-less types are less widely read (Delta's needs the timestampNtz table
feature). Partitioned by day of ``_timestamp`` (``partition_by: day``): Iceberg by its
hidden ``day`` transform, Delta by a ``_eventpipe_day`` column (a date) that eventpipe
adds and fills.
"""

from __future__ import annotations

import hashlib
import json
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from eventpipe.destinations import changes
from eventpipe.destinations.base import (
    QUERY_TIMEOUT_SECONDS,
    DaySwap,
    LoadRequest,
    LoadResult,
    day_ranges,
    table_lock,
)
from eventpipe.destinations.duckdb import read_only_query, rows_of, unconvertible_rows
from eventpipe.errors import EventpipeError, TerminalError, TransientError, first_line
from eventpipe.locks import Locks
from eventpipe.objectstore import Location
from eventpipe.reserved import LOADS_TABLE, SHADOW_PREFIX
from eventpipe.schema.dialects import DUCKDB
from eventpipe.schema.diff import Table, TablePatch
from eventpipe.schema.types import DataType

if TYPE_CHECKING:
    import pyarrow as pa

Rejected = tuple[tuple[int, str], ...]


def arrow_type(data_type: DataType) -> pa.DataType:
    import pyarrow as pa

    return {
        DataType.BOOL: pa.bool_(),
        DataType.INT64: pa.int64(),
        DataType.INT128: pa.decimal128(38, 0),
        DataType.FLOAT64: pa.float64(),
        DataType.TIMESTAMP: pa.timestamp("us", tz="UTC"),
        DataType.STRING: pa.string(),
    }[data_type]


def lattice_type(arrow: pa.DataType) -> DataType:
    """The lattice type of a column a table holds (written by eventpipe or widened by
    someone else: int32 is an INT64, float32 a FLOAT64, any decimal of scale 0 an INT128)."""
    import pyarrow as pa
    import pyarrow.types as is_

    if is_.is_boolean(arrow):
        return DataType.BOOL
    if is_.is_integer(arrow):
        return DataType.INT64
    if is_.is_decimal(arrow) and arrow.scale == 0:
        return DataType.INT128
    if is_.is_floating(arrow) or is_.is_decimal(arrow):
        return DataType.FLOAT64
    if is_.is_timestamp(arrow) or arrow == pa.date32():
        return DataType.TIMESTAMP
    return DataType.STRING


@dataclass(frozen=True)
class Commit:
    """What eventpipe records in a commit of its own: the batch (or swap) and its result."""

    batch_id: str
    rows: int
    rejected: Rejected = ()

    def properties(self) -> dict[str, str]:
        return {
            "eventpipe.batch-id": self.batch_id,
            "eventpipe.batch-key": batch_key(self.batch_id),
            "eventpipe.rows": str(self.rows),
            "eventpipe.rejected": json.dumps([list(r) for r in self.rejected]),
        }

    @classmethod
    def of(cls, properties: Mapping[str, Any]) -> Commit | None:
        if "eventpipe.batch-id" not in properties:
            return None
        rejected = json.loads(str(properties.get("eventpipe.rejected") or "[]"))
        return cls(
            str(properties["eventpipe.batch-id"]),
            int(properties.get("eventpipe.rows") or 0),
            tuple((int(i), str(why)) for i, why in rejected),
        )


def batch_key(batch_id: str) -> str:
    return hashlib.sha1(batch_id.encode()).hexdigest()


class LakehouseDestination(ABC):
    """A destination of Iceberg or Delta tables: the protocol's steps, each table change
    one commit of the format, through the hooks below."""

    dialect = DUCKDB  # the DuckDB that converts rows and runs queries over the tables
    parallel_loads = 2

    def __init__(
        self, destination_id: str, root: Path | Location, locks: Locks, partition_by: str = "day"
    ) -> None:
        self.id = destination_id
        self.location = root if isinstance(root, Location) else Location.of(root)
        """Where the tables live: a local directory or an S3 prefix (eventpipe.objectstore)."""
        self.locks = locks
        self.partition_by = partition_by
        self._pending: dict[str, dict[str, DataType]] = {}
        """Columns ``patch`` added to an existing table, committed with its next change."""
        self._pending_lock = threading.Lock()

    # The format's part ------------------------------------------------------------

    @abstractmethod
    def _schema(self, table: str) -> tuple[pa.Schema, tuple[str, ...]] | None:
        """The table's columns as Arrow (eventpipe's own day column left out) and its
        primary key; None if there is no such table."""

    @abstractmethod
    def _create(self, table: str, schema: pa.Schema, primary_key: tuple[str, ...]) -> None:
        """Create the table, partitioned as configured (one commit)."""

    @abstractmethod
    def _commits(self, table: str) -> Iterator[Commit]:
        """eventpipe's commits of the table that its log still holds, newest first."""

    @abstractmethod
    def _committed(self, table: str, batch_id: str) -> Commit | None:
        """The commit of ``batch_id`` if the table has one."""

    @abstractmethod
    def _append(self, table: str, rows: pa.Table, commit: Commit, add: pa.Schema | None) -> None:
        """Append ``rows`` in one commit, which adds the columns ``add`` (nullable) first."""

    @abstractmethod
    def _upsert(
        self,
        table: str,
        rows: pa.Table,
        primary_key: tuple[str, ...],
        commit: Commit,
        add: pa.Schema | None,
    ) -> None:
        """Insert or update by key, the newest ``_timestamp`` winning (``rows`` hold one
        row per key), in one commit that adds the columns ``add`` first."""

    @abstractmethod
    def _overwrite(self, table: str, rows: pa.Table, commit: Commit, add: pa.Schema | None) -> None:
        """Replace every row of the table by ``rows``, in one commit that adds the columns
        ``add`` first."""

    @abstractmethod
    def _replace(
        self, table: str, days: Sequence[str], rows: pa.Table, commit: Commit, add: pa.Schema | None
    ) -> None:
        """Delete the table's rows of ``days`` and append ``rows``, in one commit that
        adds the columns ``add`` first."""

    @abstractmethod
    def _read(self, table: str) -> Any:
        """The table's current version as an Arrow dataset or table (for DuckDB)."""

    @abstractmethod
    def _compact(self, table: str) -> tuple[int, int]:
        """Rewrite the small files of each partition into fewer, in one commit; (data
        files before, after)."""

    @abstractmethod
    def _expire(self, table: str, before: datetime) -> tuple[int, int]:
        """Forget the table's versions older than ``before`` (the current one is always
        kept) and delete the files no version left names that are older than it too;
        (versions forgotten, files deleted)."""

    @abstractmethod
    def tables(self) -> list[str]:
        """The tables (shadow tables of a reprocess included)."""

    @abstractmethod
    def _drop(self, table: str) -> None:
        """Remove the table and its files."""

    # The protocol ------------------------------------------------------------------

    @contextmanager
    def _format_errors(self, table: str) -> Iterator[None]:
        """What the format's library raises (its catalog unreachable, a file system that
        refuses, a commit that conflicts, a bug) is not the events' fault: a transient
        error, so the destination waits and retries with backoff instead of isolating
        its events one by one. Rows a column cannot take were left out before."""
        try:
            yield
        except EventpipeError:
            raise
        except Exception as exc:
            raise TransientError(
                f"{self.id}.{table}: {type(exc).__name__}: {first_line(exc)}",
                destination=self.id,
            ) from exc

    def describe(self, table: str) -> Table | None:
        """The table as committed, with the columns patched in since (committed with its
        next change)."""
        with self._format_errors(table):
            found = self._schema(table)
        if found is None:
            return None
        schema, key = found
        columns = {f.name: lattice_type(f.type) for f in schema}
        with self._pending_lock:
            pending = self._pending.get(table, {})
        return Table(table, {**columns, **{c: t for c, t in pending.items() if c not in columns}},
                     key)  # fmt: skip

    def patch(self, patch: TablePatch) -> None:
        """Create the table (its own commit), or note the columns to add: they are added
        in the same commit as the rows that bring them (``load``), so no version of the
        table has a new column without its rows."""
        import pyarrow as pa

        if patch.empty:
            return
        with table_lock(self.locks, self.id, patch.table), self._format_errors(patch.table):
            current = self.describe(patch.table)  # again, under the lock
            if current is None:
                columns = pa.schema([(c, arrow_type(t)) for c, t in patch.add_columns])
                self._create(patch.table, columns, patch.set_primary_key)
                return
            new = {c: t for c, t in patch.add_columns if c not in current.columns}
            if new:
                with self._pending_lock:
                    self._pending.setdefault(patch.table, {}).update(new)

    @contextmanager
    def _adding(self, table: str) -> Iterator[pa.Schema | None]:
        """The columns patched in and not yet committed (None: none), for the commit under
        way; kept for the next one if it fails."""
        import pyarrow as pa

        found = self._schema(table)
        committed = {f.name for f in found[0]} if found else set()
        with self._pending_lock:
            pending = self._pending.pop(table, {})
        add = {c: t for c, t in pending.items() if c not in committed}
        try:
            yield pa.schema([(c, arrow_type(t)) for c, t in add.items()]) if add else None
        except BaseException:
            with self._pending_lock:
                self._pending[table] = {**add, **self._pending.get(table, {})}
            raise

    def load(self, request: LoadRequest) -> LoadResult:
        with table_lock(self.locks, self.id, request.table):
            with self._format_errors(request.table):
                done = self._committed(request.table, request.batch_id)
            if done is not None:
                return LoadResult(rows=done.rows, already_loaded=True, rejected=done.rejected)
            table = self.describe(request.table)
            if table is None:
                raise TerminalError(
                    f"{self.id}.{request.table} does not exist (removed since it was patched?)",
                    table=request.table,
                )
            rows, rejected = self._rows(request, table)
            commit = Commit(request.batch_id, rows.num_rows, rejected)
            key = request.primary_key or table.primary_key
            with self._format_errors(request.table), self._adding(request.table) as add:
                if request.apply_changes:
                    current = self._applied(request.table, table, rows)
                    self._overwrite(request.table, current, commit, add)
                elif key:
                    self._upsert(request.table, rows, key, commit, add)
                else:
                    self._append(request.table, rows, commit, add)
        return LoadResult(rows=rows.num_rows, rejected=rejected)

    def _rows(self, request: LoadRequest, table: Table) -> tuple[pa.Table, Rejected]:
        """The request's rows with every column of ``table``, each of its type (the
        table's types win, as a database table's columns do), but the rows that do not
        convert; one row per key when there is one (the newest ``_timestamp``)."""
        q = DUCKDB.quote
        files = [str(f) for f in request.files]
        sql_types = {c: DUCKDB.sql_type(t) for c, t in table.columns.items()}
        db = duckdb.connect()
        try:
            db.execute("SET TimeZone = 'UTC'")
            rejected = unconvertible_rows(db, request, files, sql_types)
            select = ", ".join(
                f"CAST({q(c) if c in request.columns else 'NULL'} AS {t}) AS {q(c)}"
                for c, t in sql_types.items()
            )
            source, params = rows_of(select, files, rejected)
            key = request.primary_key or table.primary_key
            if key:
                order = (
                    f"{q('_timestamp')} DESC NULLS LAST" if "_timestamp" in table.columns else "1"
                )
                source = (
                    f"SELECT * FROM ({source}) QUALIFY row_number() OVER "
                    f"(PARTITION BY {', '.join(map(q, key))} ORDER BY {order}) = 1"
                )
            rows = db.sql(source, params=params).to_arrow_table()
        finally:
            db.close()
        return self._with_days(typed(rows, table)), rejected

    def _applied(self, name: str, table: Table, rows: pa.Table) -> pa.Table:
        """The table's rows with the changes in ``rows`` applied by key
        (destinations/changes.py, on a copy in an in-memory DuckDB): copy-on-write of the
        whole table, which the caller commits in place of it."""
        q = DUCKDB.quote
        db = duckdb.connect()
        try:
            db.execute("SET TimeZone = 'UTC'")
            db.register("present", self._read(name))
            present = set(db.sql("SELECT * FROM present LIMIT 0").columns)
            db.execute("CREATE TABLE t AS SELECT " + ", ".join(
                f"{q(c) if c in present else 'NULL'}::{DUCKDB.sql_type(d)} AS {q(c)}"
                for c, d in table.columns.items()
            ) + " FROM present")  # fmt: skip
            db.register("batch", rows)
            db.execute("CREATE TEMP TABLE eventpipe_changes AS SELECT * FROM batch")
            changes.apply(lambda sql: db.execute(sql).fetchall(), q, "t", "eventpipe_changes",
                          list(table.columns))  # fmt: skip
            current = db.sql("SELECT * FROM t").to_arrow_table()
        finally:
            db.close()
        return self._with_days(typed(current, table))

    def _with_days(self, rows: pa.Table) -> pa.Table:
        """``rows`` with the columns the format partitions by that are not events' own
        (Delta's day column); as they are by default."""
        return rows

    def partitioned(self, columns: Mapping[str, Any]) -> bool:
        return self.partition_by == "day" and "_timestamp" in columns

    def compact(self, table: str) -> tuple[int, int]:
        """``eventpipe lake compact``: a table's small files rewritten into fewer, per
        partition, in one commit, under the table's lock; (data files before, after)."""
        with table_lock(self.locks, self.id, table), self._format_errors(table):
            return self._compact(table)

    def expire(self, table: str, before: datetime) -> tuple[int, int]:
        """``eventpipe lake expire``: the table's versions older than ``before`` forgotten
        (no time travel to them; a batch committed before it is no longer recognised
        in the log, so keep it well beyond any retry) and unreferenced files older than
        it deleted, under the table's lock; (versions forgotten, files deleted)."""
        with table_lock(self.locks, self.id, table), self._format_errors(table):
            return self._expire(table, before)

    def drop(self, tables: list[str]) -> None:
        for table in tables:
            self._drop(table)

    def replace_days(self, swap: DaySwap) -> dict[str, int]:
        """Replace the rows of ``swap.days`` in each of ``swap.tables`` by its shadow's
        (none where it has no shadow), one commit per table recorded under
        ``swap.swap_id``: a table done by an earlier attempt is not done again. Tables
        are committed one after another (the formats have no commit across tables)."""
        moved: dict[str, int] = {}
        with ExitStack() as held:
            for table in sorted({*swap.tables, *swap.shadows}):
                held.enter_context(table_lock(self.locks, self.id, table))
            for table in sorted(swap.tables):
                current = self.describe(table)
                if current is None:
                    continue
                if "_timestamp" not in current.columns:
                    from eventpipe.destinations.base import no_timestamp

                    raise no_timestamp(self.id, table)
                record = f"{swap.swap_id}:{table}"
                done = self._committed(table, record)
                if done is not None:
                    moved[table] = done.rows
                    continue
                rows = self._shadow_rows(swap, table, current)
                with self._format_errors(table), self._adding(table) as add:
                    self._replace(table, swap.days, rows, Commit(record, rows.num_rows), add)
                moved[table] = rows.num_rows
            self.drop(sorted(s for s in swap.shadows.values() if self._schema(s) is not None))
        return {t: n for t, n in moved.items() if t in swap.shadows}

    def _shadow_rows(self, swap: DaySwap, table: str, current: Table) -> pa.Table:
        """The rows the days of ``table`` get: its shadow's, in the table's columns;
        with a key, those whose key has no newer row in the table outside the days."""
        import pyarrow as pa

        shadow = swap.shadows.get(table)
        empty = pa.schema([(c, arrow_type(t)) for c, t in current.columns.items()]).empty_table()
        if shadow is None or self._schema(shadow) is None:
            return self._with_days(empty)
        with self._duckdb() as db:
            q = DUCKDB.quote
            db.register("shadow", self._read(shadow))
            select = ", ".join(
                f"CAST({q(c)} AS {DUCKDB.sql_type(t)}) AS {q(c)}"
                for c, t in current.columns.items()
            )
            source = f"SELECT {select} FROM shadow"
            if swap.primary_key:
                db.register("present", self._read(table))
                key = " AND ".join(f"p.{q(c)} = s.{q(c)}" for c in swap.primary_key)
                ts = q("_timestamp")
                source = (
                    f"SELECT * FROM ({source}) AS s WHERE NOT EXISTS (SELECT 1 FROM present "
                    f"AS p WHERE {key} AND NOT ({of_days('p', swap.days)}) "
                    f"AND p.{ts} >= s.{ts})"
                )
            rows = db.sql(source).to_arrow_table()
        return self._with_days(typed(rows, current))

    @contextmanager
    def _duckdb(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """An in-memory DuckDB that reads no file (the tables are registered as Arrow)."""
        db = duckdb.connect(config={"enable_external_access": False})
        try:
            db.execute("SET TimeZone = 'UTC'")
            yield db
        finally:
            db.close()

    def query(
        self, sql: str, *, timeout_seconds: float = QUERY_TIMEOUT_SECONDS
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run SQL on the tables' current versions (each as an Arrow dataset, read as the
        query needs it) and the batches of the commits the tables' logs hold
        (``_eventpipe_loads``), in DuckDB, read-only. Each table is read at the version
        current when the query starts."""
        import pyarrow as pa

        # A reprocess's shadow tables are left out: they come and go while it runs.
        tables = [t for t in self.tables() if not t.startswith(SHADOW_PREFIX)]
        with self._duckdb() as db:
            for table in tables:
                db.register(table, self._read(table))
            loads = [
                {"batch_id": c.batch_id, "tbl": table, "rows": c.rows,
                 "rejected": json.dumps([list(r) for r in c.rejected])}
                for table in tables
                for c in self._commits(table)
            ]  # fmt: skip
            schema = pa.schema(
                [("batch_id", pa.string()), ("tbl", pa.string()), ("rows", pa.int64()),
                 ("rejected", pa.string())]
            )  # fmt: skip
            db.register(LOADS_TABLE, pa.Table.from_pylist(loads, schema=schema))
            return read_only_query(db, sql, timeout_seconds=timeout_seconds)


def typed(rows: pa.Table, table: Table) -> pa.Table:
    """``rows`` (from DuckDB) as the Arrow types the formats store ``table``'s columns in
    (timestamps in UTC)."""
    import pyarrow as pa

    schema = pa.schema([(c, arrow_type(t)) for c, t in table.columns.items()])
    return rows.select(list(table.columns)).cast(schema)


def day_bounds(days: Sequence[str]) -> list[tuple[datetime, datetime]]:
    """``days`` as [first, end) instants in UTC, consecutive days joined."""
    from datetime import UTC, time

    return [
        (datetime.combine(first, time(), UTC), datetime.combine(end, time(), UTC))
        for first, end in day_ranges(days)
    ]


def of_days(alias: str, days: Sequence[str]) -> str:
    """DuckDB SQL true for ``alias``'s rows whose ``_timestamp`` falls in ``days``."""
    ts = f"{alias}.{DUCKDB.quote('_timestamp')}"
    return " OR ".join(
        f"({ts} >= TIMESTAMPTZ '{a.isoformat()}' AND {ts} < TIMESTAMPTZ '{b.isoformat()}')"
        for a, b in day_bounds(days)
    )
