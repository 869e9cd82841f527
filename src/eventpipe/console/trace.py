"""Where is my event: given its ``eventn_ctx.event_id``, its path through eventpipe.

* **Stored**: the log segment and line it was written to (``incoming/``), or the
  archive file and line that keeps it once every destination took its segment (the
  archive's id index: one frame read; the days searched are those of the id's own time,
  for an id eventpipe made, a UUIDv7, else the archive's newest :data:`RECENT_DAYS` days:
  an SDK's message id, which the collector keeps as the event's id).
* **Per destination**: ``failed`` (its failed/ record and reason), ``loaded`` (the
  table that holds it, found by its id), ``processed`` (its segment done, yet in no
  table: filtered by the destination's namespace or transforms, skipped by an empty
  table name, or dropped by a schema contract's ``discard_row``), or ``waiting`` (its
  segment not sealed, or not loaded yet), with the run that processed it.

Nothing here runs Spark: files, the state store, and a read-only query per table of a
destination that has tables (at most a few seconds each)."""

from __future__ import annotations

import mmap
import re
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from eventpipe.config import Config
from eventpipe.paths import SegmentName
from eventpipe.state.store import StateStore

EVENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
"""What an id the console looks up may be: eventpipe's ids (UUIDv7) and a client's own
(letters, digits, ``. _ : -``); it goes into a query as a literal, so nothing else."""
DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")
"""An archive day directory's name."""
ID_COLUMN = "eventn_ctx_event_id"
QUERY_SECONDS = 5.0
RECENT_DAYS = 7
"""Days of the archive searched for an id that tells no time (an SDK's message id)."""


class BadEventId(ValueError):
    pass


@dataclass(frozen=True)
class Stored:
    where: str
    """``log`` (incoming/, a segment not archived yet) or ``archive``."""
    file: str
    line: int
    """0-based, as log positions ``<segment>:<line>`` count."""
    day: str | None = None
    """The archive's day directory (``archive``)."""


@dataclass(frozen=True)
class AtDestination:
    destination: str
    state: str
    """``loaded``, ``failed``, ``processed``, ``waiting`` or ``unknown``."""
    detail: str
    run_id: str | None = None
    table: str | None = None
    row: dict[str, Any] | None = None
    """The row it became (``loaded``): its columns that have a value, as the destination
    returns them (values it cannot give as JSON are shown as text)."""


@dataclass(frozen=True)
class Trace:
    event_id: str
    event: dict[str, Any] | None
    stored: list[Stored]
    destinations: list[AtDestination] = field(default_factory=list)
    searched: str = ""
    """Where it was looked for (said when it was not found)."""


def trace(config: Config, store: StateStore, event_id: str) -> Trace:
    """The path of the event ``event_id`` (BadEventId: not an id)."""
    logged = in_log(config, event_id)
    stored: list[Stored] = []
    event: dict[str, Any] | None = None
    found_in: Path | None = None
    if logged is not None:
        stored.append(logged[0])
        event, found_in = logged[1], logged[2]
    days = _days_of(event_id) or _recent_days(config)
    searched = "incoming/"
    if not stored:
        found = _in_archive(config, event_id, days)
        if found is not None:
            stored.append(found[0])
            event = _parsed(found[1])
        searched += (", archive/ days " + ", ".join(days)) if days else " (the archive is empty)"
    at = [_at_destination(config, store, d, event_id, stored, found_in)
          for d in config.destinations]  # fmt: skip
    return Trace(event_id, event, stored, at, searched)


def in_log(config: Config, event_id: str) -> tuple[Stored, dict[str, Any] | None, Path] | None:
    """Where the event ``event_id`` is in the log (incoming/): its place, the event, its
    segment's file; None: not there (BadEventId: not an id)."""
    found = _logged_line(config, event_id)
    return None if found is None else (found[0], _parsed(found[1]), found[2])


def stored_line(config: Config, event_id: str) -> tuple[Stored, bytes] | None:
    """The event ``event_id`` as it was stored, and where: in the log (a sealed or an
    active segment) or in the archive (its days as :func:`trace` searches them); None:
    in neither. No destination is asked."""
    logged = _logged_line(config, event_id)
    if logged is not None:
        return logged[0], logged[1]
    return _in_archive(config, event_id, _days_of(event_id) or _recent_days(config))


def _logged_line(config: Config, event_id: str) -> tuple[Stored, bytes, Path] | None:
    if not EVENT_ID.match(event_id):
        raise BadEventId("an event id is letters, digits and . _ : - (at most 128)")
    layout = config.layout
    wanted = b'"event_id":"' + event_id.encode() + b'"'
    for path in [*layout.sealed_segments(), *layout.active_segments()]:
        hit = _find_line(path, wanted)
        if hit is not None:
            return Stored("log", path.name, hit[0]), hit[1], path
    return None


def _find_line(path: Path, wanted: bytes) -> tuple[int, bytes] | None:
    try:
        with path.open("rb") as f:
            if f.seek(0, 2) == 0:
                return None
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                at = data.find(wanted)
                if at < 0:
                    return None
                start = data.rfind(b"\n", 0, at) + 1
                end = data.find(b"\n", at)
                line = data[start : end if end >= 0 else len(data)]
                return data[:start].count(b"\n"), bytes(line)
    except (FileNotFoundError, ValueError):  # sealed and archived meanwhile; empty
        return None


def _parsed(line: bytes) -> dict[str, Any] | None:
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _days_of(event_id: str) -> list[str]:
    """The UTC day of a UUIDv7's time and the next (a segment sealed after midnight is
    archived under its seal's day); none for another id."""
    try:
        parsed = uuid.UUID(event_id)
    except ValueError:
        return []
    if parsed.version != 7:
        return []
    at = datetime.fromtimestamp((parsed.int >> 80) / 1000, UTC)
    return [d.date().isoformat() for d in (at, at + timedelta(days=1))]


def _recent_days(config: Config) -> list[str]:
    """The archive's newest days (its day directories), newest first."""
    archive = config.layout.archive
    if not archive.is_dir():
        return []
    days = sorted((p.name for p in archive.iterdir() if DAY.match(p.name)), reverse=True)
    return days[:RECENT_DAYS]


def _in_archive(config: Config, event_id: str, days: list[str]) -> tuple[Stored, bytes] | None:
    from eventpipe.archive.read import find

    for day in days:
        directory = config.layout.archive / day
        if not directory.is_dir():
            continue
        for match in find(directory, event_id):
            return Stored("archive", match.segment.data.name, match.line, day), match.event
    return None


def _at_destination(
    config: Config,
    store: StateStore,
    dest_id: str,
    event_id: str,
    stored: list[Stored],
    segment: Path | None,
) -> AtDestination:
    from eventpipe.state.records import ALL_TABLES

    failed = _failed_record(config.layout.failed_destination(dest_id), event_id)
    if failed is not None:
        return AtDestination(dest_id, "failed", str(failed.get("error") or ""),
                             table=failed.get("table"))  # fmt: skip
    if not stored:
        return AtDestination(dest_id, "unknown", "not found in the log or the archive")
    place = stored[0]
    dest = config.destinations[dest_id]
    run_id = None
    if place.where == "archive":  # every destination took its segment: which run did
        segment_file = place.file.removesuffix(".lz4").removesuffix(".gz")
        records = store.segment_statuses(segment_file)
        done = [r for r in records if r[0] == dest_id and r[1] == ALL_TABLES and r[2] == "ok"]
        run_id = done[0][3] if done else None
    elif place.where == "log":
        parsed = SegmentName.parse(place.file)
        if dest.mode == "stream":
            if not _streamed(config, dest_id, segment, place.line):
                return AtDestination(dest_id, "waiting", "not loaded by the stream yet")
        elif parsed is None or parsed.sealed is None:
            return AtDestination(
                dest_id,
                "waiting",
                "its segment is not sealed yet: a batch "
                "destination loads it once it is (eventpipe rotate seals now)",
            )
        else:
            records = store.segment_statuses(place.file)
            done = [r for r in records if r[0] == dest_id and r[1] == ALL_TABLES]
            if not done or done[0][2] != "ok":
                why = done[0][4] if done and done[0][4] else "its segment is not loaded yet"
                return AtDestination(dest_id, "waiting", why)
            run_id = done[0][3]
    table = _table_holding(config, dest_id, event_id)
    if isinstance(table, tuple) and len(table) == 2:
        name, row = table
        return AtDestination(dest_id, "loaded", f"a row of table {name}", run_id, name, row)
    detail = ("in no table: filtered (namespace, transforms), skipped (an empty table "
              "name) or dropped by a schema contract's discard_row")  # fmt: skip
    if table is not None:
        detail = f"processed; its table not looked up: {table[0]}"
    return AtDestination(dest_id, "processed", detail, run_id)


def _shown(value: Any) -> Any:
    """A value of a row as JSON can show it (others as their text)."""
    return value if isinstance(value, (str, int, float, bool)) else str(value)


def _streamed(config: Config, dest_id: str, segment: Path | None, line: int) -> bool:
    from eventpipe.log.tail import count_lines, identity, read_progress

    if segment is None or (ident := identity(segment)) is None:
        return False
    loaded_to = read_progress(config.layout, dest_id).offsets.get(ident, 0)
    return count_lines(segment, 0, loaded_to) > line


def _failed_record(path: Path, event_id: str) -> dict[str, Any] | None:
    """The newest record of the failed/ file whose event has ``event_id``."""
    hit = None
    wanted = b'"event_id":"' + event_id.encode() + b'"'
    try:
        with path.open("rb") as lines:
            for line in lines:
                if wanted in line:
                    hit = line
    except FileNotFoundError:
        return None
    return _parsed(hit) if hit is not None else None


def _table_holding(
    config: Config, dest_id: str, event_id: str
) -> tuple[str, dict[str, Any]] | tuple[str] | None:
    """(the table whose row has the id, the row); None: none has; (why,): not looked
    up."""
    from eventpipe.console.destinations import open_for_reading

    dest = config.destinations[dest_id]
    if not dest.tables:
        return ("a sink: what it sent is not kept",)
    try:
        opened = open_for_reading(config, dest_id)
        for table in opened.tables():
            described = opened.describe(table)
            if described is None or ID_COLUMN not in described.columns:
                continue
            quote = opened.dialect.quote
            sql = (f"SELECT * FROM {quote(table)} WHERE {quote(ID_COLUMN)} = '{event_id}' "
                   "LIMIT 1")  # fmt: skip
            columns, rows = opened.query(sql, timeout_seconds=QUERY_SECONDS)
            if rows:
                row = {c: _shown(v) for c, v in zip(columns, rows[0], strict=True)
                       if v is not None}  # fmt: skip
                return str(table), row
    except Exception as exc:  # noqa: BLE001 - shown: the rest of the trace stands
        return (f"{type(exc).__name__}: {exc}"[:300],)
    return None
