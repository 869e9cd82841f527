"""Change data capture from PostgreSQL into the log (``eventpipe read SOURCE``).

A source reads a database the way seed 3's readers do: it copies the chosen tables,
then follows their changes, and writes each row and change to the log as an event,
under the source's id as key id, as a log writer of its own (``<host>-source-<id>``).

1. **Slot and snapshot.** On first use, a logical replication slot (``wal2json``) is
   created over a replication connection, exporting a snapshot: the slot's changes
   start exactly where the snapshot's view of the tables ends.
2. **Copy** (per table: ``copy``, then ``sync`` in the progress file). Each table whose
   ``schema.table`` matches ``tables`` is read in that snapshot, row by row, as events
   with ``_op: read``, after a ``truncate`` of the table: a copy cut short (the process
   died: the snapshot died with it) starts over with a new slot, and the writers that
   apply changes then start the table over too, so that a row copied before and
   deleted since does not stay.
3. **Sync.** The slot's changes are read (``pg_logical_slot_peek_changes``), whole
   transactions at a time: ``insert``, ``update``, ``delete`` and ``truncate``, each an
   event. Only after the log has fsynced them is the slot moved past them
   (``pg_replication_slot_advance``): a reader killed at any point resumes from the slot
   without losing a change, and the changes it logged but had not confirmed are logged
   again, with the same event ids.

An event is the row's columns as they are (numbers and booleans as JSON numbers and
booleans, ``bytea`` as hex digits, everything else as PostgreSQL's text: the forms
wal2json gives them in; a ``numeric`` that a float64 would not read back digit for digit
as PostgreSQL's text of it, :func:`loads`) and:

* ``_op``: ``read`` (the copy), ``insert``, ``update``, ``delete``, ``truncate``;
* ``_namespace``: ``schema.table``;
* ``_lsn`` and ``_seq``: the order of changes. ``_lsn`` is the WAL position of the
  change's commit (an integer; transactions come in the order they committed), ``_seq``
  its place in the transaction, from 1. The copy's rows carry the position just before
  the slot's starting point (where its first change may be), its truncate ``_seq`` 0;
* ``_key``: the row's primary key, its values as a JSON array in the key's column order
  (``[7]``, ``[7,"a"]``), the same text in the copy and in every change of the row;
  absent for a table without a primary key. A delete's is the key of the row deleted;
* ``_commit_time`` and ``_timestamp``: when the transaction committed (the copy: when
  it started);
* ``_old_key``: an update that changed the key: the key before (a delete's row is the
  replica identity: its key only, unless the table's identity is ``FULL``);
* ``src``: ``postgres``, ``api_key``: the source's id, ``eventn_ctx.event_id``: derived
  from the source, the slot, the change's position and its place in its transaction,
  so a change read twice has one id.

A value the WAL leaves out of an update (a large, TOASTed value the update did not
change) is read from the table by key: as it is when read, and a later change of it
follows in the changes, so the last change of every row is whole. The same holds for a
column added with a DEFAULT, which the rows that existed get without a change: each read
compares the tables' columns with the last read's, and a table given such a column is
read again whole (:meth:`PostgresSource._backfill`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
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
from eventpipe.log.segments import SegmentLog
from eventpipe.log.settings import LogSettings
from eventpipe.log.writers import host_id
from eventpipe.reserved import CHECKED
from eventpipe.state.locks import open_locks

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
                chosen = [t for t in _tables(db) if self.tables.search(t)]
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
        columns = _columns(db, table)
        key = _primary_key(db, table)
        query = sql.SQL("SELECT {} FROM {}").format(_as_json(columns), _identifier(table))
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
        sees every change before (:func:`_visible_point`), ``_seq`` 0: a column added with
        a DEFAULT gave the rows that existed their value without a change in the WAL, so
        the destinations would keep NULL there. Changes after that position follow in the
        log and decide, as for a TOASTed value read by key. A table without a primary key
        is append-only, where such rows would be copies: left as it is, with a warning."""
        key = _primary_key(db, table)
        if not key:
            log.warning("source %s: a column of %s was added with a DEFAULT; its rows that "
                        "existed keep NULL in the destinations (no primary key to apply "
                        "them by)", self.id, table)  # fmt: skip
            return 0
        columns = _columns(db, table)
        query = sql.SQL("SELECT {} FROM {}").format(_as_json(columns), _identifier(table))
        point = await _visible_point(db, self.id)
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
                commit_time, commit = _iso(change.get("timestamp")), lsn_int(change["lsn"])
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
            if new and _filled_without_changes(db, table, new):
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


class Catalog:
    """What the changes need of the source's tables beyond the WAL, on a connection:
    their columns, and the values an update left out."""

    def __init__(self, db: psycopg.Connection[Any]) -> None:
        self.db = db
        self.columns: dict[str, dict[str, str]] = {}
        """``schema.table`` -> its columns and their types, in order."""

    def whole(self, table: str, row: dict[str, Any], key: list[str]) -> dict[str, Any]:
        """``row`` of an update with the columns the WAL left out (unchanged TOASTed
        values) read from the table by key; as it is if the row is gone (a later change
        deletes or moves it)."""
        columns = self.columns.get(table)
        if columns is None or not columns.keys() >= row.keys():  # new, or it changed
            columns = self.columns[table] = dict(_columns(self.db, table))
        if len(row) >= len(columns):
            return row
        missing = [(name, t) for name, t in columns.items() if name not in row]
        if not missing:
            return row
        where = sql.SQL(" AND ").join(
            sql.SQL("{} = %s").format(_text(name, columns.get(name, "text"))) for name in key
        )
        found = self.db.execute(
            sql.SQL("SELECT {} FROM {} WHERE {}").format(
                _as_json(missing), _identifier(table), where
            ),
            [row[name] for name in key],
        ).fetchone()
        return {**row, **loads(found[0])} if found else row


_DIGITS = re.compile(r"^[-+]?0*([0-9]*?)\.?([0-9]*?)0*(?:[eE].*)?$")


def _significant(number: str) -> str:
    """The significant digits of a number's text (``-0012.3400e5`` -> ``1234``)."""
    found = _DIGITS.match(number)
    return (found[1] + found[2]).strip("0") if found else number


def exact_number(text: str) -> float | str:
    """A JSON number with a fraction or exponent: the float64 that reads back as the same
    digits, else its text (``24.57142857142857142857`` has more digits than a float64
    holds: kept as text, which the destinations store by the lattice as text or refuse
    for a column of numbers, never rounded)."""
    number = float(text)
    # A text of 16 characters has a "." or an "e": at most 15 digits, which a float64
    # always reads back (the common case, without the regular expressions).
    if len(text) <= 16 or _significant(repr(number)) == _significant(text):
        return number
    return text


_DECODER = json.JSONDecoder(parse_float=exact_number)
"""One decoder: ``json.loads`` with an option builds one per call (3.5x slower per row)."""


def loads(text: str) -> Any:
    """JSON as a source reads it: integers of any size (Python's), numbers with a
    fraction exact (:func:`exact_number`)."""
    return _DECODER.decode(text)


VISIBLE_WAIT_SECONDS = 60.0
"""How long a table read again waits for the transactions open when it began."""


async def _visible_point(db: psycopg.Connection[Any], source_id: str) -> str:
    """A WAL position such that a read started after this returns sees every transaction
    that committed before it: the position now, then a wait until every transaction that
    had an id by then has ended (one may have written its commit before the position and
    not be visible yet). Changes after the position sort after what the read returns."""
    point = db.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    horizon = db.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text").fetchone()
    assert point is not None
    assert horizon is not None
    deadline = time.monotonic() + VISIBLE_WAIT_SECONDS
    while True:
        ended = db.execute(
            "SELECT pg_snapshot_xmin(pg_current_snapshot()) >= %s::xid8", [horizon[0]]
        ).fetchone()
        if ended and ended[0]:
            return str(point[0])
        if time.monotonic() > deadline:
            raise TransientError(
                f"source {source_id}: a table read again waits for transactions open for "
                f"more than {VISIBLE_WAIT_SECONDS:g} s",
                fix="end the long transactions (pg_stat_activity); the reader tries again",
            )
        await asyncio.sleep(0.05)


def _filled_without_changes(db: psycopg.Connection[Any], table: str, columns: list[str]) -> bool:
    """Whether any of ``columns`` (added to ``table``) has values in rows that existed
    before it that no change carried: a ``DEFAULT`` (PostgreSQL 11 keeps a constant one
    aside, a volatile one rewrites the table; neither is in the WAL's row changes) or a
    generated column."""
    found = db.execute(
        "SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass(%s) "
        "AND attname = ANY(%s) AND (atthasdef OR atthasmissing OR attgenerated <> '')",
        [_identifier(table).as_string(db), columns],
    ).fetchone()
    return bool(found and found[0])


def key_text(row: dict[str, Any], key: list[str]) -> str:
    """The key of ``row`` as writers compare it: its values as a JSON array."""
    return json.dumps([row.get(name) for name in key], ensure_ascii=False, separators=(",", ":"))


def _identifier(table: str) -> sql.Composable:
    schema, name = table.split(".", 1)
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(name))


def _columns(db: psycopg.Connection[Any], table: str) -> list[tuple[str, str]]:
    """The table's columns and their types, in order."""
    schema, name = table.split(".", 1)
    rows = db.execute(
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
        [schema, name],
    ).fetchall()
    return [(str(c), str(t)) for c, t in rows]


def _primary_key(db: psycopg.Connection[Any], table: str) -> list[str]:
    """The table's primary key columns, in the key's order (as wal2json lists them)."""
    rows = db.execute(
        "SELECT a.attname FROM pg_index i CROSS JOIN unnest(i.indkey) WITH ORDINALITY "
        "AS k(attnum, n) JOIN pg_attribute a ON a.attrelid = i.indrelid "
        "AND a.attnum = k.attnum WHERE i.indrelid = %s::regclass AND i.indisprimary "
        "ORDER BY k.n",
        [_identifier(table).as_string(db)],
    ).fetchall()
    return [str(name) for (name,) in rows]


def _text(column: str, data_type: str) -> sql.Composable:
    """A column's value as wal2json gives it: numbers and booleans as they are, ``bytea``
    as hex digits, the rest as PostgreSQL's text."""
    name = sql.Identifier(column)
    if data_type in NATIVE:
        return name
    if data_type == "bytea":
        return sql.SQL("encode({}, 'hex')").format(name)
    return sql.SQL("{}::text").format(name)


def _as_json(columns: list[tuple[str, str]]) -> sql.Composable:
    """The columns as one JSON object's text, each value as :func:`_text` gives it.
    ``json_build_object`` takes
    100 arguments: a wider table's columns are built in parts, joined as ``jsonb``."""
    parts = [
        sql.SQL("json_build_object({})").format(sql.SQL(", ").join(
            sql.SQL("{}, {}").format(
                sql.Literal(c),
                _text(c, t),
            )
            for c, t in columns[i : i + 50]
        ))
        for i in range(0, max(len(columns), 1), 50)
    ]  # fmt: skip
    if len(parts) == 1:
        return sql.SQL("{}::text").format(parts[0])
    return sql.SQL("({})::text").format(
        sql.SQL(" || ").join(sql.SQL("{}::jsonb").format(p) for p in parts)
    )


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
