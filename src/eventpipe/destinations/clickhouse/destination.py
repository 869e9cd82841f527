"""ClickHouse (``type: clickhouse``): the destination protocol over the HTTP interface.

* **Tables** are made by the dialect (schema/dialects.py): ``MergeTree`` partitioned by
  month of ``_timestamp`` and ordered by it; with ``primary_key``,
  ``ReplacingMergeTree(_timestamp)`` ordered by the key and not partitioned, so a key's
  newest row wins when ClickHouse merges; a source's changes, ``MergeTree`` without
  partitions or sorting key (changes.py). Every table eventpipe makes has one more column,
  :data:`LOAD_COLUMN`: the load that brought each row (like dlt's ``_dlt_load_id``);
  ``describe`` leaves it out.
* **Types** follow the server: ``DateTime64(6, 'UTC')`` where it has that type,
  ``DateTime('UTC')`` (whole seconds, 1970 to 2106) where it has not (before 20.1).
* **Patching** runs under the table lock of the data directory (ClickHouse has no locks
  of its own), the table read again under it.
* **A load** never shows half a batch and never loads one twice:

  1. under the table lock, its record in ``_eventpipe_loads`` is looked up: found, the
     batch was loaded;
  2. a stage table ``AS`` the table is filled with the batch's rows (read as they are,
     or converted to the columns' types by an in-memory DuckDB: rows.py; sent in
     ClickHouse's Native format, in blocks; readers never see the stage);
  3. an ``attaching`` record is written, then each of the stage's partitions is attached
     to the table (``ATTACH PARTITION ... FROM``: atomic per partition; a batch that spans
     months is visible a month at a time while it attaches), or a source's changes are
     applied (changes.py), then the ``done`` record;
  4. a rerun that finds ``attaching`` without ``done`` (a crash in step 3) attaches only
     the partitions that hold none of the batch's rows (:data:`LOAD_COLUMN` says which).

  With ``merge_after_load`` (the default) a keyed table's touched partitions are merged
  at once (``OPTIMIZE ... FINAL``), so every reader sees one row per key.
* **Rows a column cannot take** (a text where a number goes, a time before 1970 in a
  ``DateTime``, a null in a key column) are left out with the reason
  (``LoadResult.rejected``) and the rest loads.
* **Days replaced** (``eventpipe reprocess``): each month holding a replaced day is
  rebuilt in a table of its own (the month's other days, then the shadow's rows) and
  swapped in with ``REPLACE PARTITION``: a reader sees the old month or the new, never a
  day missing or doubled.
* **A cluster** (``cluster``; one shard and its replicas): every table made ``ON
  CLUSTER``, replicated; the loads as above on the replica at ``url`` (cluster.py).
* **Errors** are classified by the client (client.py): transient, refused credentials, or
  the server's own message.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx

import eventpipe.destinations.clickhouse.changes as changes
import eventpipe.destinations.clickhouse.cluster as clusters
from eventpipe import reserved
from eventpipe.destinations.base import (
    ALL_SWAPPED,
    QUERY_TIMEOUT_SECONDS,
    DaySwap,
    LoadRequest,
    LoadResult,
    day_ranges,
    no_timestamp,
    table_lock,
)
from eventpipe.destinations.changes import are_changes
from eventpipe.destinations.clickhouse.client import (
    ClickHouseClient,
    ServerError,
    ServerFeatures,
    error_code,
)
from eventpipe.destinations.clickhouse.query import check_query
from eventpipe.destinations.clickhouse.rows import native_blocks
from eventpipe.destinations.clickhouse.types import (
    column_type,
    dialect_for,
    duckdb_type,
    lattice,
    without_low_cardinality,
)
from eventpipe.errors import ConfigError, QueryError, TerminalError, TransientError
from eventpipe.locks import Locks
from eventpipe.schema.dialects import CLICKHOUSE, TIMESTAMP_COLUMN
from eventpipe.schema.diff import Table, TablePatch

LOADS_TABLE = reserved.LOADS_TABLE
LOAD_COLUMN = "_eventpipe_load"
"""The load (batch id) that brought a row: how a rerun tells which partitions are in."""
STAGE_PREFIX = "_eventpipe_stage_"
REBUILD_PREFIX = "_eventpipe_rebuild_"

TIMEOUT_EXCEEDED = 159
"""The code of a query stopped by ``max_execution_time``."""
UNKNOWN_DATABASE = 81

MAX_REJECTED_ROWS = 10_000
"""Rows one load leaves out at most; beyond, the batch fails as a whole."""
MERGE_TRIES = 6
"""How often a replica is asked to merge a keyed partition after a load (cluster.py)."""

log = logging.getLogger("eventpipe.destinations")


literal = CLICKHOUSE.literal


class ClickHouseDestination:
    dialect = CLICKHOUSE
    """Quoting and the lattice's types; tables are made with :func:`dialect_for` the
    server."""
    parallel_loads = 2
    """Tables of a batch loaded at once (each load is a few statements on the server)."""

    def __init__(
        self,
        destination_id: str,
        url: str,
        locks: Locks,
        *,
        database: str = "default",
        user: str = "default",
        password: str = "",
        query_user: str | None = None,
        query_password: str = "",
        merge_after_load: bool = True,
        timeout_seconds: float = 300.0,
        column_types: Mapping[str, str] | None = None,
        cluster: str | None = None,
    ) -> None:
        self.id = destination_id
        self.url = url
        self.locks = locks
        self.database = database
        self.cluster = cluster
        """Tables made replicated on every host of this cluster (cluster.py)."""
        self.merge_after_load = merge_after_load
        self.column_types = dict(column_types or {})
        """Column -> ClickHouse type as written (a mapping's ``type``, types.mapped_types):
        made so instead of with the column's lattice type."""
        self._login = (user, password)
        self.timeout_seconds = timeout_seconds
        self._query_login = (query_user or user, query_password if query_user else password)
        self._query_user = query_user is not None
        self._features: ServerFeatures | None = None
        self._ready = threading.Event()
        """Set once the database and the loads table exist."""

    def __repr__(self) -> str:
        return f"ClickHouseDestination({self.id!r}, {self.url!r}, database={self.database!r})"

    def _client(self) -> ClickHouseClient:
        """A client for one call (a load, a patch): the destination keeps no connection
        open between calls. No database header: the database may not exist yet (patch
        makes it), so every name is qualified."""
        user, password = self._login
        return ClickHouseClient(self.url, user=user, password=password,
                                timeout_seconds=self.timeout_seconds)  # fmt: skip

    @property
    def features(self) -> ServerFeatures:
        if self._features is None:
            with self._client() as ch:
                self._features = ch.features()
        return self._features

    def _name(self, table: str) -> str:
        return CLICKHOUSE.name_of(table, self.database)

    # -- tables -------------------------------------------------------------------------

    def _columns(self, ch: ClickHouseClient, table: str) -> dict[str, str]:
        """The table's columns and their ClickHouse types, in order; empty if none."""
        _, rows = ch.query(
            "SELECT name, type FROM system.columns "
            f"WHERE database = {literal(self.database)} AND table = {literal(table)}"
        )
        return {str(name): str(sql_type) for name, sql_type in rows}

    def describe(self, table: str) -> Table | None:
        with self._client() as ch:
            return self._describe(ch, table)

    def _describe(self, ch: ClickHouseClient, table: str) -> Table | None:
        columns = self._columns(ch, table)
        if not columns:
            return None
        columns.pop(LOAD_COLUMN, None)
        return Table(table, {c: lattice(t) for c, t in columns.items()}, self._key(ch, table))

    def _key(self, ch: ClickHouseClient, table: str) -> tuple[str, ...]:
        """The key of a ``ReplacingMergeTree`` (its sorting key's columns); none for
        other engines, whose sorting key only orders rows."""
        _, rows = ch.query(
            "SELECT engine, sorting_key FROM system.tables "
            f"WHERE database = {literal(self.database)} AND name = {literal(table)}"
        )
        if not rows or not str(rows[0][0]).endswith("ReplacingMergeTree"):
            return ()
        key = str(rows[0][1]).strip()
        if key.startswith("(") and key.endswith(")"):  # today's servers: "(id)"
            key = key[1:-1]
        return tuple(c.strip().strip("`") for c in key.split(",") if c.strip())

    def _ensure_ready(self, ch: ClickHouseClient) -> None:
        """The database and the loads table, once per destination object."""
        if self._ready.is_set():
            return
        if self.cluster:
            clusters.check(ch, self.cluster)
        everywhere = clusters.on_cluster(self.cluster)
        ch.execute(f"CREATE DATABASE IF NOT EXISTS {CLICKHOUSE.quote(self.database)}{everywhere}")
        ch.execute(
            f"CREATE TABLE IF NOT EXISTS {self._name(LOADS_TABLE)}{everywhere} (batch_id String, "
            "tbl String, state String, rows UInt64, rejected String, "
            "loaded_at DateTime DEFAULT now()) "
            f"ENGINE = {self._engine('MergeTree ORDER BY (tbl, batch_id)', LOADS_TABLE)}"
        )
        self._ready.set()

    def _engine(self, engine: str, table: str) -> str:
        """``engine`` for ``table``, replicated on a cluster."""
        return clusters.replicated(engine, self.database, table) if self.cluster else engine

    def _made_like(self, ch: ClickHouseClient, table: str) -> str:
        """What a stage or rebuild table ``AS`` ``table`` is made with after its name: on
        a cluster, the table's engine less the replication (a table of this replica
        only); otherwise nothing (the same engine)."""
        if not self.cluster:
            return ""
        _, rows = ch.query(
            "SELECT create_table_query FROM system.tables "
            f"WHERE database = {literal(self.database)} AND name = {literal(table)}"
        )
        return f" ENGINE = {clusters.local_engine(str(rows[0][0]))}" if rows else ""

    def patch(self, patch: TablePatch) -> None:
        if patch.empty:
            return
        with self._client() as ch, table_lock(self.locks, self.id, patch.table):
            self._ensure_ready(ch)
            current = self._describe(ch, patch.table)  # again, under the lock
            d, table = dialect_for(self.features), patch.table
            required = {*patch.set_primary_key, *(current.primary_key if current else ()),
                        TIMESTAMP_COLUMN}  # fmt: skip
            own = {c: column_type(t, required=c in required) for c, t in self.column_types.items()}
            settings = self._ddl_settings(own.values())
            if current is None:
                # A source's changes: a table without partitions, rebuilt per batch.
                engine = (
                    changes.ENGINE
                    if are_changes(dict(patch.add_columns))
                    else d.clickhouse_engine(patch.add_columns, patch.set_primary_key)
                )
                made = d.create_table(table, patch.add_columns, patch.set_primary_key,
                                      self.database, own, self._engine(engine, table),
                                      self.cluster)  # fmt: skip
                ch.execute(made, settings=settings)
                self._add_load_column(ch, table)
                return
            for column, data_type in patch.add_columns:
                if column not in current.columns:
                    ch.execute(d.add_column(table, column, data_type, self.database,
                                            own.get(column), self.cluster),
                               settings=settings)  # fmt: skip
            if patch.set_primary_key and tuple(patch.set_primary_key) != current.primary_key:
                raise TerminalError(
                    f"{self.id}.{table} exists without the key {list(patch.set_primary_key)}: "
                    "ClickHouse fixes a table's key when the table is made",
                    fix="rename or drop the table to have eventpipe make it with the key",
                    table=table,
                )

    def _ddl_settings(self, sql_types: Iterable[str]) -> dict[str, str | int]:
        """What a server needs to make columns of ``sql_types``: before 19.x,
        ``LowCardinality`` is experimental there."""
        low = any("LowCardinality" in t for t in sql_types)
        experimental = low and self.features.low_cardinality_is_experimental
        return {"allow_experimental_low_cardinality_type": 1} if experimental else {}

    def _add_load_column(self, ch: ClickHouseClient, table: str) -> None:
        ch.execute(
            f"ALTER TABLE {self._name(table)}{clusters.on_cluster(self.cluster)} "
            f"ADD COLUMN {CLICKHOUSE.quote(LOAD_COLUMN)} String"
        )

    def tables(self) -> list[str]:
        """The database's tables, but a load's or a rebuild's own."""
        with self._client() as ch:
            _, rows = ch.query(
                f"SELECT name FROM system.tables WHERE database = {literal(self.database)} "
                f"AND NOT startsWith(name, {literal(STAGE_PREFIX)}) "
                f"AND NOT startsWith(name, {literal(REBUILD_PREFIX)}) ORDER BY name"
            )
        return [str(name) for (name,) in rows]

    def drop(self, tables: list[str]) -> None:
        with self._client() as ch:
            for table in tables:
                self._drop(ch, table)

    def _drop(self, ch: ClickHouseClient, table: str) -> None:
        """A table eventpipe made (on every host of a cluster)."""
        ch.execute(f"DROP TABLE IF EXISTS {self._name(table)}{clusters.on_cluster(self.cluster)}")

    # -- loads --------------------------------------------------------------------------

    def _record(
        self, ch: ClickHouseClient, batch_id: str, table: str
    ) -> dict[str, tuple[int, str]]:
        """The states recorded for a batch's load of ``table``: state -> (rows, rejected)."""
        _, rows = ch.query(
            f"SELECT state, rows, rejected FROM {self._name(LOADS_TABLE)} "
            f"WHERE batch_id = {literal(batch_id)} AND tbl = {literal(table)}"
        )
        return {str(state): (int(n), str(why)) for state, n, why in rows}

    def _write_record(
        self,
        ch: ClickHouseClient,
        batch_id: str,
        table: str,
        state: str,
        rows: int,
        rejected: str = "[]",
    ) -> None:
        values = ", ".join([literal(batch_id), literal(table), literal(state), str(int(rows)),
                            literal(rejected)])  # fmt: skip
        ch.execute(
            f"INSERT INTO {self._name(LOADS_TABLE)} (batch_id, tbl, state, rows, rejected) "
            f"VALUES ({values})"
        )

    def load(self, request: LoadRequest) -> LoadResult:
        with self._client() as ch, table_lock(self.locks, self.id, request.table):
            self._ensure_ready(ch)
            done = self._record(ch, request.batch_id, request.table).get("done")
            if done is not None:
                left_out = tuple((int(i), str(why)) for i, why in json.loads(done[1]))
                return LoadResult(rows=done[0], already_loaded=True, rejected=left_out)
            types = self._columns(ch, request.table)
            if not types:
                raise TerminalError(f"{self.id}.{request.table} does not exist",
                                    table=request.table)  # fmt: skip
            if LOAD_COLUMN not in types:  # a table eventpipe did not make
                self._add_load_column(ch, request.table)
                types[LOAD_COLUMN] = "String"
            stage = (
                STAGE_PREFIX
                + hashlib.sha1(f"{request.table}\0{request.batch_id}".encode()).hexdigest()[:16]
            )
            try:
                rows, rejected = self._stage(ch, request, types, stage)
                if request.primary_key:  # an upsert counts keys, as the other destinations
                    keys = ", ".join(CLICKHOUSE.quote(c) for c in request.primary_key)
                    [(rows,)] = ch.query(f"SELECT uniqExact({keys}) FROM {self._name(stage)}")[1]
                reasons = json.dumps([list(r) for r in rejected])
                self._write_record(ch, request.batch_id, request.table, "attaching", rows, reasons)
                if request.apply_changes:
                    rebuild = REBUILD_PREFIX + hashlib.sha1(request.table.encode()).hexdigest()[:16]
                    rows = changes.apply(ch, self.database, self._name, request.table, stage,
                                         rebuild, list(request.columns),
                                         (LOAD_COLUMN, request.batch_id),
                                         self._made_like(ch, request.table))  # fmt: skip
                else:
                    self._attach(ch, request, stage)
                self._write_record(ch, request.batch_id, request.table, "done", rows, reasons)
            finally:  # a stage left by a server gone away is dropped by the retry
                with contextlib.suppress(TransientError):
                    ch.execute(f"DROP TABLE IF EXISTS {self._name(stage)}")
                    ch.execute(f"DROP TABLE IF EXISTS {self._name(stage + '_plain')}")
        return LoadResult(rows=rows, rejected=rejected)

    def _stage(
        self, ch: ClickHouseClient, request: LoadRequest, types: dict[str, str], stage: str
    ) -> tuple[int, tuple[tuple[int, str], ...]]:
        """The batch's rows, converted to the table's types, into a new ``stage`` table
        made like the table; the rows staged and those left out (position, reason).

        ``LowCardinality`` columns are sent as the type they wrap: today's servers
        convert Native input; before 19.x the rows go through a ``Memory`` table of the
        plain types, then into the stage with ``INSERT ... SELECT``."""
        missing = [c for c in request.columns if c not in types]
        if missing:
            raise TerminalError(f"{self.id}.{request.table} has no column {missing[0]!r}",
                                table=request.table)  # fmt: skip
        settings = self._ddl_settings(types.values())
        ch.execute(f"DROP TABLE IF EXISTS {self._name(stage)}")
        ch.execute(f"CREATE TABLE {self._name(stage)} AS {self._name(request.table)}"
                   f"{self._made_like(ch, request.table)}", settings=settings)  # fmt: skip
        written = {c: without_low_cardinality(types[c]) for c in request.columns
                   if duckdb_type(types[c])}  # fmt: skip
        written[LOAD_COLUMN] = types[LOAD_COLUMN]
        listed = ", ".join(CLICKHOUSE.quote(c) for c in written)
        into = self._name(stage)
        if settings:  # an old server with LowCardinality columns: through plain types
            into = self._name(stage + "_plain")
            ch.execute(f"DROP TABLE IF EXISTS {into}")
            columns = ", ".join(f"{CLICKHOUSE.quote(c)} {t}" for c, t in written.items())
            ch.execute(f"CREATE TABLE {into} ({columns}) ENGINE = Memory")
        insert = f"INSERT INTO {into} ({listed}) FORMAT Native"
        rows = 0
        rejected: dict[int, str] = {}
        # A block is sent while the next is read and encoded: the server's insert and
        # this side's work overlap (the request releases the GIL while it waits).
        sending: Future[bytes] | None = None
        with ThreadPoolExecutor(max_workers=1) as sender:
            for block, left_out in native_blocks(request, written, LOAD_COLUMN):
                rejected.update(left_out)
                if len(rejected) > MAX_REJECTED_ROWS:
                    raise TerminalError(
                        f"{self.id}.{request.table}: more than {MAX_REJECTED_ROWS} rows its "
                        f"columns cannot take, the first: {next(iter(rejected.values()))}",
                        table=request.table,
                    )
                if block is None:
                    continue
                if sending is not None:
                    sending.result()
                sending = sender.submit(ch.execute, insert, data=block[0])
                rows += block[1]
            if sending is not None:
                sending.result()
        if into != self._name(stage):
            ch.execute(f"INSERT INTO {self._name(stage)} ({listed}) SELECT {listed} FROM {into}",
                       settings=settings)  # fmt: skip
            ch.execute(f"DROP TABLE {into}")
        return rows, tuple(sorted(rejected.items()))

    def _attach(self, ch: ClickHouseClient, request: LoadRequest, stage: str) -> None:
        """Each of the stage's partitions into the table, but those a crashed attempt
        attached already; then, for a keyed table, merged if configured."""
        _, found = ch.query(
            "SELECT DISTINCT partition_id FROM system.parts "
            f"WHERE database = {literal(self.database)} AND table = {literal(stage)} AND active"
        )
        partitions = sorted(str(p) for (p,) in found)
        if "attaching" in self._record(ch, request.batch_id, request.table) and len(partitions) > 0:
            _, present = ch.query(
                f"SELECT _partition_id FROM {self._name(request.table)} "
                f"WHERE {CLICKHOUSE.quote(LOAD_COLUMN)} = {literal(request.batch_id)} "
                "GROUP BY _partition_id"  # DISTINCT of a virtual column crashes 18.16
            )
            # Recorded before this attempt's own record: only a crashed attempt's rows.
            attached = {str(p) for (p,) in present}
        else:
            attached = set()
        target = self._name(request.table)
        for partition in partitions:
            if partition not in attached:
                ch.execute(
                    f"ALTER TABLE {target} ATTACH PARTITION ID {literal(partition)} "
                    f"FROM {self._name(stage)}"
                )
        if request.primary_key and self.merge_after_load:
            self._merge(ch, request.table, partitions)

    def _merge(self, ch: ClickHouseClient, table: str, partitions: Iterable[str]) -> None:
        """A keyed table's ``partitions`` merged into one part each, so that a key has
        one row. On a replica, a merge asked for while a part just attached is still
        in the replication queue may do nothing, and say nothing: there the replica
        works off its queue first, and the merge is asked again (a few times, briefly)
        until one part is left."""
        target = self._name(table)
        for partition in partitions:
            for attempt in range(MERGE_TRIES):
                if self.cluster:
                    ch.execute(f"SYSTEM SYNC REPLICA {target}")
                ch.execute(f"OPTIMIZE TABLE {target} PARTITION ID {literal(partition)} FINAL")
                if not self.cluster:
                    break
                _, [(parts,)] = ch.query(
                    "SELECT count() FROM system.parts WHERE active AND database = "
                    f"{literal(self.database)} AND table = {literal(table)} "
                    f"AND partition_id = {literal(partition)}"
                )
                if int(parts) <= 1:
                    break
                time.sleep(0.05 * 2**attempt)
            else:
                log.warning("%s.%s: partition %s not merged after %d tries: read with FINAL "
                            "until ClickHouse merges it", self.id, table, partition,
                            MERGE_TRIES)  # fmt: skip

    # -- days replaced ------------------------------------------------------------------

    def replace_days(self, swap: DaySwap) -> dict[str, int]:
        """Each month holding one of ``swap.days`` rebuilt (its other days, then the
        shadow's rows of it) and swapped in whole, per table; the shadows dropped; all
        recorded under ``swap.swap_id``. A rerun after a crash rebuilds the months again
        from the table as it is (the days replaced once are replaced again, the same)."""
        with self._client() as ch:
            self._ensure_ready(ch)
            return self._replace_days(ch, swap)

    def _replace_days(self, ch: ClickHouseClient, swap: DaySwap) -> dict[str, int]:
        done = self._record(ch, swap.swap_id, ALL_SWAPPED).get("done")
        if done is not None:
            _, rows = ch.query(
                f"SELECT tbl, rows FROM {self._name(LOADS_TABLE)} "
                f"WHERE batch_id = {literal(swap.swap_id)} AND state = 'done'"
            )
            return {str(t): int(n) for t, n in rows if t != ALL_SWAPPED}
        moved: dict[str, int] = {}
        for table in sorted(set(swap.tables) | set(swap.shadows)):
            with table_lock(self.locks, self.id, table):
                count = self._replace_table_days(ch, swap, table)
            if table in swap.shadows and count is not None:
                moved[table] = count
        for table, count in moved.items():
            self._write_record(ch, swap.swap_id, table, "done", count)
        self._write_record(ch, swap.swap_id, ALL_SWAPPED, "done", 0)
        for shadow in sorted(swap.shadows.values()):
            self._drop(ch, shadow)
        return moved

    def _replace_table_days(self, ch: ClickHouseClient, swap: DaySwap, table: str) -> int | None:
        """The rows of ``swap.days`` in ``table`` replaced by its shadow's; the shadow's
        rows moved in, None if neither exists."""
        columns = self._columns(ch, table)
        shadow = swap.shadows.get(table)
        shadow_columns = self._columns(ch, shadow) if shadow else {}
        if not columns:
            return None
        if TIMESTAMP_COLUMN not in columns:
            raise no_timestamp(self.id, table)
        q = CLICKHOUSE.quote
        ts = q(TIMESTAMP_COLUMN)
        days = " OR ".join(
            f"({ts} >= toDateTime('{first.isoformat()} 00:00:00', 'UTC') "
            f"AND {ts} < toDateTime('{end.isoformat()} 00:00:00', 'UTC'))"
            for first, end in day_ranges(swap.days)
        )
        # A table partitioned by month is rebuilt a month at a time; one without
        # partitions (a keyed table) whole.
        by_month = changes.partition_key(ch, self.database, table) == (
            f"toYYYYMM({TIMESTAMP_COLUMN})"
        )
        months = sorted({day[:7].replace("-", "") for day in swap.days})
        parts = (
            [(m, f"toYYYYMM({ts}) = {int(m)}") for m in months] if by_month
            else [(changes.UNPARTITIONED, "1")]
        )  # fmt: skip
        target = self._name(table)
        rebuild = self._name(REBUILD_PREFIX + hashlib.sha1(table.encode()).hexdigest()[:16])
        moved = 0
        made_like = self._made_like(ch, table)
        for month, in_month in parts:
            ch.execute(f"DROP TABLE IF EXISTS {rebuild}")
            ch.execute(f"CREATE TABLE {rebuild} AS {target}{made_like}")
            ch.execute(
                f"INSERT INTO {rebuild} SELECT * FROM {target} WHERE {in_month} AND NOT ({days})"
            )
            if shadow is not None and shadow_columns:
                listed = ", ".join(q(c) for c in shadow_columns if c in columns)
                rows_of_days = f"FROM {self._name(shadow)} WHERE {in_month} AND ({days})"
                ch.execute(f"INSERT INTO {rebuild} ({listed}) SELECT {listed} {rows_of_days}")
                [(count,)] = ch.query(f"SELECT count() {rows_of_days}")[1]
                moved += int(count)
            # Atomic: readers see the month (or table) before or after, never between.
            changes.swap_partition(ch, target, month, rebuild)
            if swap.primary_key and self.merge_after_load:
                self._merge(ch, table, [month])
            ch.execute(f"DROP TABLE {rebuild}")
        return moved

    # -- reads --------------------------------------------------------------------------

    def query(
        self, sql: str, *, timeout_seconds: float = QUERY_TIMEOUT_SECONDS
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run one read (:func:`check_query`) in the destination's database, and return
        column names and rows. As ``query_user`` when configured: a user in a
        ``readonly`` profile, which may not change settings, so its profile's
        ``max_execution_time`` holds and the client gives up after ``timeout_seconds``.
        Otherwise as the loading user, with ``readonly=1`` (which it cannot lift inside
        the query) and ``max_execution_time``."""
        check_query(sql)
        user, password = self._query_login
        settings = {} if self._query_user else {
            "readonly": 1, "max_execution_time": max(1, round(timeout_seconds))
        }  # fmt: skip
        with ClickHouseClient(self.url, user=user, password=password, database=self.database,
                              timeout_seconds=timeout_seconds + 5) as reader:  # fmt: skip
            try:
                return reader.query(sql.strip().rstrip(";"), settings=settings)
            except (ServerError, ConfigError) as exc:  # a reader without a table's grant
                if isinstance(exc, ServerError) and exc.code == UNKNOWN_DATABASE:
                    raise QueryError(
                        f"database {self.database} does not exist yet: nothing was loaded "
                        "into this destination"
                    ) from None
                raise QueryError(exc.message) from None
            except TransientError as exc:
                timed_out = error_code(exc.message) == TIMEOUT_EXCEEDED or isinstance(
                    exc.__cause__, httpx.TimeoutException
                )
                if not timed_out:
                    raise
                raise QueryError(
                    f"the query ran longer than query_timeout_seconds ({timeout_seconds:g})"
                ) from None
