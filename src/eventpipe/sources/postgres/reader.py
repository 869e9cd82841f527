"""The reader of a PostgreSQL source (the package's docstring says how it reads)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from eventpipe.config import Config, PostgresSourceConfig
from eventpipe.errors import TransientError, redacted
from eventpipe.events import format_timestamp, utc_now
from eventpipe.files import write_file
from eventpipe.log.segments import SegmentLog
from eventpipe.log.settings import LogSettings
from eventpipe.log.writers import host_id
from eventpipe.reserved import CHECKED
from eventpipe.sources.postgres.catalog import (
    Catalog,
    as_json,
    filled_without_changes,
    identifier,
    primary_key,
    table_columns,
    table_names,
    visible_point,
)
from eventpipe.sources.postgres.values import key_text, loads, lsn_int, wal_timestamp
from eventpipe.state.locks import open_locks

log = logging.getLogger("eventpipe.sources")

IDS = uuid.UUID("0c4c8f36-4a0c-4d61-9d0f-5b0e4a9f2c7e")
"""The namespace of the ids of a source's events."""
CHUNK = 5_000
"""Events appended (one fsync) at a time during the copy."""
WAL2JSON = ("format-version", "2", "include-lsn", "1", "include-pk", "1",
            "include-timestamp", "1", "include-types", "0")  # fmt: skip
OPS = {"I": "insert", "U": "update", "D": "delete", "T": "truncate"}


@dataclass
class Progress:
    """What the reader has done, kept in ``data_dir/sources/<id>.json`` (written whole)."""

    slot: str
    start: str | None = None
    """The slot's consistent point: where the copy's snapshot ends and its changes begin."""
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)
    """``schema.table`` -> ``{"state": "copy" | "sync", "rows": copied rows}``."""
    confirmed: str | None = None
    """The position the slot was last moved to."""
    changes: int = 0
    """Changes logged since the copy."""
    columns: dict[str, list[str]] = field(default_factory=dict)
    """``schema.table`` -> its columns at the last read (the copy's at first): one more
    is a column added since (:meth:`PostgresSource._backfill`)."""

    @property
    def copied(self) -> bool:
        return self.start is not None and all(t["state"] == "sync" for t in self.tables.values())


@dataclass
class ReadReport:
    copied: dict[str, int] = field(default_factory=dict)
    changes: int = 0
    transactions: int = 0


class PostgresSource:
    """One PostgreSQL source of ``config``: copy, then follow its changes."""

    def __init__(self, config: Config, source_id: str) -> None:
        settings = config.source(source_id)
        assert isinstance(settings, PostgresSourceConfig)
        self.config = config
        self.id = source_id
        self.settings = settings
        self.slot = settings.slot or f"eventpipe_{source_id.replace('-', '_')}"
        self.tables = re.compile(settings.tables)
        self.path = config.layout.root / "sources" / f"{source_id}.json"

    def progress(self) -> Progress:
        if not self.path.exists():
            return Progress(self.slot)
        stored = json.loads(self.path.read_text())
        return Progress(**stored)

    def _save(self, progress: Progress) -> None:
        write_file(self.path, json.dumps(progress.__dict__, indent=1))

    def read(self, *, once: bool, stop: Callable[[], bool] = lambda: False) -> ReadReport:
        """Copy if not done, then log changes until ``stop()`` (``once``: until the slot
        has none). One reader per source: another one running is refused."""

        def busy(holder: str) -> Exception:
            return TransientError(
                f"source {self.id} is being read by another reader ({holder})",
                fix="one reader per source: stop the other one first",
            )

        with open_locks(self.config).holding(f"source.{self.id}", busy):
            return asyncio.run(self._read(once, stop))

    async def _read(self, once: bool, stop: Callable[[], bool]) -> ReadReport:
        segment_log = SegmentLog(self.config.layout, LogSettings.of(self.config),
                                 writer=f"{host_id()}-source-{self.id}")  # fmt: skip
        segment_log.open()
        await segment_log.start()
        report = ReadReport()
        try:
            progress = self.progress()
            if not progress.copied:
                progress = await self._copy(segment_log, report)
            while not stop():
                read = await self._sync(segment_log, progress, report)
                if not read:
                    if once:
                        break
                    await asyncio.sleep(self.settings.poll_seconds)
        except psycopg.OperationalError as exc:
            raise TransientError(f"source {self.id}: {redacted(str(exc))}") from exc
        finally:
            await segment_log.close()
        return report

    def _connect(self, **options: Any) -> psycopg.Connection[Any]:
        return psycopg.connect(self.settings.dsn, autocommit=True,
                               application_name=f"eventpipe source {self.id}",
                               **options)  # fmt: skip

    async def _copy(self, segment_log: SegmentLog, report: ReadReport) -> Progress:
        """A new slot exporting a snapshot, and every chosen table read in it."""
        with self._connect() as db:
            db.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                "WHERE slot_name = %s",
                [self.slot],
            )  # an earlier copy cut short: its snapshot is gone
        replication = self._connect(replication="database", cursor_factory=psycopg.ClientCursor)
        try:
            row = replication.execute(
                f"CREATE_REPLICATION_SLOT {self.slot} LOGICAL wal2json EXPORT_SNAPSHOT"
            ).fetchone()
            assert row is not None
            _, start, snapshot, _ = row
            started = utc_now()
            with self._connect() as db:
                db.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                db.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(snapshot))
                chosen = [t for t in table_names(db) if self.tables.search(t)]
                progress = Progress(self.slot, start,
                                    {t: {"state": "copy", "rows": 0} for t in chosen})  # fmt: skip
                self._save(progress)
                for table in chosen:
                    rows, columns = await self._copy_table(db, table, start, started, segment_log)
                    progress.tables[table] = {"state": "sync", "rows": rows}
                    progress.columns[table] = columns
                    report.copied[table] = rows
                    self._save(progress)
                    log.info("source %s: copied %s (%d rows)", self.id, table, rows)
                db.execute("COMMIT")
        finally:
            replication.close()
        progress.confirmed = start
        self._save(progress)
        return progress

    async def _copy_table(
        self, db: psycopg.Connection[Any], table: str, start: str, started: datetime,
        segment_log: SegmentLog,
    ) -> tuple[int, list[str]]:  # fmt: skip
        """The table's rows in the snapshot to the log; how many, and its columns."""
        columns = table_columns(db, table)
        key = primary_key(db, table)
        query = sql.SQL("SELECT {} FROM {}").format(as_json(columns), identifier(table))
        # Just before the slot's starting point: the first change may be at it. The
        # truncate first: a copy that starts over replaces what an earlier one logged.
        envelope = {"_namespace": table, "_lsn": lsn_int(start) - 1,
                    "_commit_time": format_timestamp(started)}  # fmt: skip
        ids = f"{self.id}:{self.slot}:{start}:{table}"
        truncate = {**envelope, "_op": "truncate", "_seq": 0}
        chunk = [self._event({}, truncate, str(uuid.uuid5(IDS, f"{ids}:truncate")))]
        rows = 0
        with db.cursor(name="eventpipe_copy") as cursor:
            cursor.itersize = CHUNK
            cursor.execute(query)
            for (text,) in cursor:
                row = loads(text)
                rows += 1
                read = {**envelope, "_op": "read", "_seq": rows}
                if key:
                    read["_key"] = key_text(row, key)
                chunk.append(self._event(row, read, str(uuid.uuid5(IDS, f"{ids}:{rows - 1}"))))
                if len(chunk) >= CHUNK:
                    await segment_log.append(self.id, b"".join(chunk))
                    chunk = []
        if chunk:
            await segment_log.append(self.id, b"".join(chunk))
        return rows, [name for name, _ in columns]

    async def _backfill(
        self, db: psycopg.Connection[Any], table: str, segment_log: SegmentLog
    ) -> int:
        """Every row of ``table`` as it is now, as an ``update`` at a WAL position the read
        sees every change before (:func:`catalog.visible_point`), ``_seq`` 0: a column added with
        a DEFAULT gave the rows that existed their value without a change in the WAL, so
        the destinations would keep NULL there. Changes after that position follow in the
        log and decide, as for a TOASTed value read by key. A table without a primary key
        is append-only, where such rows would be copies: left as it is, with a warning."""
        key = primary_key(db, table)
        if not key:
            log.warning("source %s: a column of %s was added with a DEFAULT; its rows that "
                        "existed keep NULL in the destinations (no primary key to apply "
                        "them by)", self.id, table)  # fmt: skip
            return 0
        columns = table_columns(db, table)
        query = sql.SQL("SELECT {} FROM {}").format(as_json(columns), identifier(table))
        point = await visible_point(db, self.id)
        envelope = {"_namespace": table, "_lsn": lsn_int(point), "_seq": 0,
                    "_op": "update", "_commit_time": format_timestamp(utc_now())}  # fmt: skip
        chunk: list[bytes] = []
        rows = 0
        with db.transaction(), db.cursor(name="eventpipe_backfill") as cursor:
            cursor.itersize = CHUNK
            cursor.execute(query)
            for (text,) in cursor:
                row = loads(text)
                rows += 1
                keyed = {**envelope, "_key": key_text(row, key)}
                ids = f"{self.id}:{self.slot}:{point}:backfill:{table}:{keyed['_key']}"
                chunk.append(self._event(row, keyed, str(uuid.uuid5(IDS, ids))))
                if len(chunk) >= CHUNK:
                    await segment_log.append(self.id, b"".join(chunk))
                    chunk = []
        if chunk:
            await segment_log.append(self.id, b"".join(chunk))
        log.info("source %s: a column added to %s with values for its rows: %d row(s) read "
                 "again", self.id, table, rows)  # fmt: skip
        return rows

    def _event(self, row: dict[str, Any], envelope: dict[str, Any], event_id: str) -> bytes:
        if CHECKED in row:  # the name of the collector's mark on a line: never a row's
            row = {name: value for name, value in row.items() if name != CHECKED}
        event = {**row, **envelope, "_timestamp": envelope["_commit_time"], "src": "postgres",
                 "api_key": self.id, "eventn_ctx": {"event_id": event_id}}  # fmt: skip
        # json, not orjson: numeric values beyond 64 bits stay digits.
        return json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"

    async def _sync(self, segment_log: SegmentLog, progress: Progress, report: ReadReport) -> int:
        """Tables given a column with values for their rows since the last read (read
        again, :meth:`_backfill`), then the slot's next whole transactions to the log, then
        the slot moved past them; the changes read."""
        known = {table: list(columns) for table, columns in progress.columns.items()}
        with self._connect() as db:
            backfilled = 0
            for table in self._columns_added(db, progress):
                backfilled += await self._backfill(db, table, segment_log)
            found = db.execute(
                "SELECT lsn::text, data FROM pg_logical_slot_peek_changes(%s, NULL, %s, "
                + ", ".join(["%s"] * len(WAL2JSON))
                + ")",
                [self.slot, self.settings.max_changes, *WAL2JSON],
            ).fetchall()
            events, confirmed, transactions = self._changes(found, Catalog(db))
            if events:
                await segment_log.append(self.id, b"".join(events))
            if confirmed is not None:
                db.execute(
                    "SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", [self.slot, confirmed]
                )
        if confirmed is None and not backfilled:
            if progress.columns != known:  # a table first seen: kept for the next read
                self._save(progress)
            return 0
        progress.confirmed = confirmed or progress.confirmed
        progress.changes += len(events) + backfilled
        report.changes += len(events) + backfilled
        report.transactions += transactions
        self._save(progress)
        return len(found) + backfilled

    def _changes(
        self, found: list[tuple[str, str]], catalog: Catalog
    ) -> tuple[list[bytes], str | None, int]:
        """The events of the whole transactions in ``found``, the position past the last
        one, and how many there were."""
        events: list[bytes] = []
        pending: list[bytes] = []
        confirmed = None
        transactions = 0
        commit_time, commit = "", 0
        seq = 0  # the change's place in its transaction: the same however it is read
        for _, data in found:
            change = loads(data)
            action = change["action"]
            if action == "B":
                pending, seq = [], 0
                commit_time, commit = wal_timestamp(change.get("timestamp")), lsn_int(change["lsn"])
            elif action == "C":
                events.extend(pending)
                pending = []
                confirmed = change["nextlsn"]
                transactions += 1
            elif action in OPS:
                seq += 1
                namespace = f"{change['schema']}.{change['table']}"
                if not self.tables.search(namespace):
                    continue
                envelope = {"_namespace": namespace, "_lsn": commit, "_seq": seq,
                            "_commit_time": commit_time}  # fmt: skip
                pending.append(self._change_event(change, envelope, catalog))
        return events, confirmed, transactions

    def _columns_added(self, db: psycopg.Connection[Any], progress: Progress) -> list[str]:
        """The chosen tables given a column since the last read whose values the rows
        that existed have without a change in the WAL (a DEFAULT, a generated column);
        every chosen table's columns kept in ``progress`` (a table first seen: as it is)."""
        rows = db.execute(
            "SELECT table_schema || '.' || table_name, array_agg(column_name::text ORDER BY "
            "ordinal_position) FROM information_schema.columns WHERE table_schema NOT IN "
            "('pg_catalog', 'information_schema') GROUP BY 1"
        ).fetchall()
        added = []
        for table, columns in rows:
            if not self.tables.search(table):
                continue
            known = progress.columns.get(table)
            progress.columns[table] = list(columns)
            new = [c for c in columns if known is not None and c not in known]
            if new and filled_without_changes(db, table, new):
                added.append(table)
        return added

    def _change_event(
        self, change: dict[str, Any], envelope: dict[str, Any], catalog: Catalog
    ) -> bytes:
        op = OPS[change["action"]]
        row = {c["name"]: c["value"] for c in change.get("columns", ())}
        old = {c["name"]: c["value"] for c in change.get("identity", ())}
        key = [c["name"] for c in change.get("pk", ())]
        envelope = {**envelope, "_op": op}
        if op == "delete":
            row = old
        if key and op != "truncate":
            envelope["_key"] = key_text(row, key)
            if op == "update" and old and (before := key_text(old, key)) != envelope["_key"]:
                envelope["_old_key"] = before
        if op == "update" and key:
            row = catalog.whole(envelope["_namespace"], row, key)
        event_id = uuid.uuid5(IDS, f"{self.id}:{self.slot}:{envelope['_lsn']}:{envelope['_seq']}")
        return self._event(row, envelope, str(event_id))
