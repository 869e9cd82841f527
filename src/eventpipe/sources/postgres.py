"""Change data capture from PostgreSQL into the log (``eventpipe read SOURCE``).

A source reads a database the way seed 3's readers do: it copies the chosen tables,
then follows their changes, and writes each row and change to the log as an event,
under the source's id as key id, as a log writer of its own (``<host>-source-<id>``).

1. **Slot and snapshot.** On first use, a logical replication slot (``wal2json``) is
   created over a replication connection, exporting a snapshot: the slot's changes
   start exactly where the snapshot's view of the tables ends.
2. **Copy** (per table: ``copy``, then ``sync`` in the progress file). Each table whose
   ``schema.table`` matches ``tables`` is read in that snapshot, row by row, as events
   with ``_op: read``. A copy cut short (the process died: the snapshot died with it)
   starts over with a new slot; rows copied before are logged again, with new ids
   (writers apply them by key).
3. **Sync.** The slot's changes are read (``pg_logical_slot_peek_changes``), whole
   transactions at a time: ``insert``, ``update``, ``delete`` and ``truncate``, each an
   event. Only after the log has fsynced them is the slot moved past them
   (``pg_replication_slot_advance``): a reader killed at any point resumes from the slot
   without losing a change, and the changes it logged but had not confirmed are logged
   again, with the same event ids.

An event is the row's columns as they are (numbers and booleans as JSON numbers and
booleans, everything else as PostgreSQL's text) and:

* ``_op``: ``read`` (the copy), ``insert``, ``update``, ``delete``, ``truncate``;
* ``_namespace``: ``schema.table``; ``_lsn``: the change's position in the WAL (an
  integer, increasing; the copy's rows carry the position just before the slot's
  starting point, where its first change may be);
* ``_commit_time`` and ``_timestamp``: when the transaction committed (the copy: when
  it started);
* ``_old_key``: the old key of an update that changed it and of a delete (a delete's
  row is its key only);
* ``src``: ``postgres``, ``api_key``: the source's id, ``eventn_ctx.event_id``: derived
  from the source, the slot, the change's position and its place in its transaction,
  so a change read twice has one id.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import sql

from eventpipe.config import Config, PostgresSourceConfig
from eventpipe.errors import TransientError, redacted
from eventpipe.events import format_timestamp, utc_now
from eventpipe.files import write_file
from eventpipe.log.segments import LogSettings, SegmentLog
from eventpipe.log.writers import host_id

log = logging.getLogger("eventpipe.sources")

IDS = uuid.UUID("0c4c8f36-4a0c-4d61-9d0f-5b0e4a9f2c7e")
"""The namespace of the ids of a source's events."""
CHUNK = 5_000
"""Events appended (one fsync) at a time during the copy."""
WAL2JSON = ("format-version", "2", "include-lsn", "1", "include-pk", "1",
            "include-timestamp", "1", "include-types", "0")  # fmt: skip
NATIVE = frozenset({"smallint", "integer", "bigint", "numeric", "real", "double precision",
                    "boolean"})  # fmt: skip
"""Column types whose values are JSON numbers or booleans (the rest are text)."""
OPS = {"I": "insert", "U": "update", "D": "delete", "T": "truncate"}


def lsn_int(lsn: str) -> int:
    """``16/B374D848`` as the 64-bit position it stands for."""
    high, low = lsn.split("/")
    return (int(high, 16) << 32) | int(low, 16)


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
        has none)."""
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
                chosen = [t for t in _tables(db) if self.tables.search(t)]
                progress = Progress(self.slot, start,
                                    {t: {"state": "copy", "rows": 0} for t in chosen})  # fmt: skip
                self._save(progress)
                for table in chosen:
                    rows = await self._copy_table(db, table, start, started, segment_log)
                    progress.tables[table] = {"state": "sync", "rows": rows}
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
    ) -> int:  # fmt: skip
        schema, name = table.split(".", 1)
        columns = db.execute(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
            [schema, name],
        ).fetchall()
        values = sql.SQL(", ").join(
            sql.SQL("{}, {}").format(
                sql.Literal(c),
                sql.Identifier(c) if t in NATIVE else sql.SQL("{}::text").format(sql.Identifier(c)),
            )
            for c, t in columns
        )
        query = sql.SQL("SELECT json_build_object({})::text FROM {}.{}").format(
            values, sql.Identifier(schema), sql.Identifier(name)
        )
        # Just before the slot's starting point: the first change may be at it.
        envelope = {"_op": "read", "_namespace": table, "_lsn": lsn_int(start) - 1,
                    "_commit_time": format_timestamp(started)}  # fmt: skip
        chunk: list[bytes] = []
        rows = 0
        with db.cursor(name="eventpipe_copy") as cursor:
            cursor.itersize = CHUNK
            cursor.execute(query)
            for (text,) in cursor:
                event_id = uuid.uuid5(IDS, f"{self.id}:{self.slot}:{start}:{table}:{rows}")
                chunk.append(self._event(json.loads(text), envelope, str(event_id)))
                rows += 1
                if len(chunk) >= CHUNK:
                    await segment_log.append(self.id, b"".join(chunk))
                    chunk = []
        if chunk:
            await segment_log.append(self.id, b"".join(chunk))
        return rows

    def _event(self, row: dict[str, Any], envelope: dict[str, Any], event_id: str) -> bytes:
        event = {**row, **envelope, "_timestamp": envelope["_commit_time"], "src": "postgres",
                 "api_key": self.id, "eventn_ctx": {"event_id": event_id}}  # fmt: skip
        # json, not orjson: numeric values beyond 64 bits stay digits.
        return json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"

    async def _sync(self, segment_log: SegmentLog, progress: Progress, report: ReadReport) -> int:
        """The slot's next whole transactions to the log, then the slot moved past them;
        the changes read."""
        with self._connect() as db:
            found = db.execute(
                "SELECT lsn::text, data FROM pg_logical_slot_peek_changes(%s, NULL, %s, "
                + ", ".join(["%s"] * len(WAL2JSON))
                + ")",
                [self.slot, self.settings.max_changes, *WAL2JSON],
            ).fetchall()
            events, confirmed, transactions = self._changes(found)
            if confirmed is None:
                return 0
            if events:
                await segment_log.append(self.id, b"".join(events))
            db.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", [self.slot, confirmed])
        progress.confirmed = confirmed
        progress.changes += len(events)
        report.changes += len(events)
        report.transactions += transactions
        self._save(progress)
        return len(found)

    def _changes(self, found: list[tuple[str, str]]) -> tuple[list[bytes], str | None, int]:
        """The events of the whole transactions in ``found``, the position past the last
        one, and how many there were."""
        events: list[bytes] = []
        pending: list[bytes] = []
        confirmed = None
        transactions = 0
        commit_time = ""
        index = 0  # the change's place in its transaction: the same however it is read
        for _, data in found:
            change = json.loads(data)
            action = change["action"]
            if action == "B":
                pending, commit_time, index = [], _iso(change.get("timestamp")), 0
            elif action == "C":
                events.extend(pending)
                pending = []
                confirmed = change["nextlsn"]
                transactions += 1
            elif action in OPS:
                index += 1
                namespace = f"{change['schema']}.{change['table']}"
                if not self.tables.search(namespace):
                    continue
                pending.append(self._change_event(change, namespace, commit_time, index))
        return events, confirmed, transactions

    def _change_event(
        self, change: dict[str, Any], namespace: str, commit_time: str, index: int
    ) -> bytes:
        op = OPS[change["action"]]
        row = {c["name"]: c["value"] for c in change.get("columns", ())}
        old = {c["name"]: c["value"] for c in change.get("identity", ())}
        if op == "delete":
            row = dict(old)
        envelope: dict[str, Any] = {"_op": op, "_namespace": namespace,
                                    "_lsn": lsn_int(change["lsn"]),
                                    "_commit_time": commit_time}  # fmt: skip
        if old:
            envelope["_old_key"] = old
        event_id = uuid.uuid5(IDS, f"{self.id}:{self.slot}:{change['lsn']}:{index}")
        return self._event(row, envelope, str(event_id))


def _tables(db: psycopg.Connection[Any]) -> list[str]:
    rows = db.execute(
        "SELECT table_schema || '.' || table_name FROM information_schema.tables "
        "WHERE table_type = 'BASE TABLE' AND table_schema NOT IN ('pg_catalog', "
        "'information_schema') ORDER BY 1"
    ).fetchall()
    return [name for (name,) in rows]


def _iso(stamp: str | None) -> str:
    """wal2json's commit time (``2026-11-24 12:00:00.123456+00``) as eventpipe writes
    timestamps; now if it has none."""
    if not stamp:
        return format_timestamp(utc_now())
    text = stamp.replace(" ", "T", 1)
    if re.search(r"[+-]\d\d$", text):
        text += ":00"
    return format_timestamp(datetime.fromisoformat(text).astimezone(UTC))
