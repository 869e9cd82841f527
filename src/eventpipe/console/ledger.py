"""The ledger: per batch run and destination, the events its segments held
(acknowledged: every one was answered 200) against where they went: rows loaded,
failed, skipped (an empty table name), filtered (namespace, transforms), dropped by a
schema contract (``discard_row``); and the events still waiting. A difference is flagged.

Counted from the run history and the log's files: a segment still in ``incoming/`` by
its lines, an archived one by its index (no event is read). A loaded row is an event (a
source's change applied counts one, as ``status`` counts); a metering destination's
replaced rows are not subtracted.

Stream destinations load micro-batches, not runs, and the state store folds the records
of older micro-batches into a row per UTC day: a stream destination has one line over its
micro-batches of a range of days (all of them without one), its acknowledged events being
the lines its micro-batches read (each micro-batch records them; one from before
eventpipe did makes the count unknown). A micro-batch recorded across midnight can count
its rows on one day and its lines on the other."""

from __future__ import annotations

from dataclasses import dataclass, fields

from eventpipe.config import Config
from eventpipe.state.store import StateStore

DROPPING = {"tables:discard_row", "columns:discard_row", "data_type:discard_row"}
STREAM = "stream"
"""The status of a stream destination's line (all its micro-batches)."""


@dataclass(frozen=True)
class WentTo:
    """Where a ledger's acknowledged events went."""

    loaded: int
    failed: int
    skipped: int
    filtered: int
    dropped: int

    @property
    def accounted(self) -> int:
        return self.loaded + self.failed + self.skipped + self.filtered + self.dropped


@dataclass(frozen=True)
class LedgerLine(WentTo):
    run_id: str
    started_at: str
    destination: str
    acknowledged: int | None
    """Events in the destination's segments of the run; None: a segment is gone."""
    status: str

    @property
    def difference(self) -> int | None:
        if self.acknowledged is None or self.status not in ("done", STREAM):
            return None
        return self.acknowledged - self.accounted


@dataclass(frozen=True)
class Total(WentTo):
    """One destination's lines of a ledger added up."""

    destination: str
    runs: int
    acknowledged: int | None
    """None: a segment of one of its runs is gone."""
    difference: int | None
    """The sum of its runs' differences; None where one of them is not known."""

    @classmethod
    def of(cls, destination: str, lines: list[LedgerLine]) -> Total:
        known = [line.acknowledged for line in lines]
        differences = [line.difference for line in lines]
        went = {f.name: sum(getattr(line, f.name) for line in lines) for f in fields(WentTo)}
        return cls(
            destination=destination,
            runs=len(lines),
            acknowledged=None if None in known else sum(k for k in known if k is not None),
            difference=None
            if None in differences
            else sum(d for d in differences if d is not None),
            **went,
        )


def totals(lines: list[LedgerLine]) -> list[Total]:
    """Per destination, its lines added up."""
    by_destination: dict[str, list[LedgerLine]] = {}
    for line in lines:
        by_destination.setdefault(line.destination, []).append(line)
    return [Total.of(d, mine) for d, mine in sorted(by_destination.items())]


@dataclass(frozen=True)
class Waiting:
    destination: str
    segments: int
    events: int


def ledger(
    config: Config,
    store: StateStore,
    limit: int = 20,
    since: str | None = None,
    until: str | None = None,
) -> tuple[list[LedgerLine], list[Waiting]]:
    """The last ``limit`` batch runs' lines (of the runs started in ``[since, until)``,
    ISO 8601 UTC), newest first, and what waits now."""
    from eventpipe.state.records import ALL_TABLES

    lines: list[LedgerLine] = []
    counted: dict[str, int | None] = {}
    for run in store.history(limit, since, until):
        plan = store.run_segments(run.run_id) or {}
        destinations = sorted({t.destination for t in run.tables} | {e[0] for e in run.events})
        for dest_id in destinations:
            if dest_id not in config.destinations or config.destinations[dest_id].mode != "batch":
                continue
            segments = plan.get(dest_id, plan.get("", ()))
            acknowledged = _events_in(config, segments, counted)
            loaded = sum(t.rows for t in run.tables
                         if t.destination == dest_id and t.table != ALL_TABLES
                         and t.status == "ok")  # fmt: skip
            skipped, failed, filtered = next(
                ((e[1], e[2], e[3]) for e in run.events if e[0] == dest_id), (0, 0, 0)
            )
            dropped = sum(c.events for c in run.contracts
                          if c.destination == dest_id and c.kind == "table"
                          and c.rule in DROPPING)  # fmt: skip
            lines.append(LedgerLine(
                run_id=run.run_id, started_at=run.started_at, destination=dest_id,
                acknowledged=acknowledged, loaded=loaded, failed=failed, skipped=skipped,
                filtered=filtered, dropped=dropped, status=run.status,
            ))  # fmt: skip
    return lines, _waiting(config, store, counted)


def streams(
    config: Config, store: StateStore, since: str | None = None, until: str | None = None
) -> list[LedgerLine]:
    """Per stream destination, one line over its micro-batches recorded in ``[since,
    until)`` (see the module's docstring): the lines they read against where those went."""
    from eventpipe.state.records import stream_run

    lines = []
    for dest_id, dest in config.destinations.items():
        if dest.mode != "stream":
            continue
        counts = store.stream_counts(dest_id, since, until)
        dropped = sum(c.events for c in counts.contracts
                      if c.kind == "table" and c.rule in DROPPING)  # fmt: skip
        lines.append(LedgerLine(
            run_id=stream_run(dest_id, "*"), started_at=counts.last_load or "",
            destination=dest_id, acknowledged=counts.events_read,
            loaded=counts.rows_loaded, failed=counts.failed, skipped=counts.skipped,
            filtered=counts.filtered, dropped=dropped, status=STREAM,
        ))  # fmt: skip
    return lines


def _events_in(config: Config, segments: tuple[str, ...], counted: dict[str, int | None]
               ) -> int | None:  # fmt: skip
    total = 0
    for name in segments:
        if name not in counted:
            counted[name] = _events_of(config, name)
        found = counted[name]
        if found is None:
            return None
        total += found
    return total


def _events_of(config: Config, name: str) -> int | None:
    """The events of the segment ``name``: its lines in incoming/, or its archive index."""
    from eventpipe.archive.files import ArchivedSegment, Index
    from eventpipe.log.tail import count_lines

    incoming = config.layout.incoming / name
    if incoming.exists():
        return count_lines(incoming, 0, incoming.stat().st_size)
    try:
        archived = ArchivedSegment.of(config.layout, name)
        return Index.read(archived.index).events
    except (OSError, ValueError):
        return None


def _waiting(config: Config, store: StateStore, counted: dict[str, int | None]) -> list[Waiting]:
    """Per batch destination: the sealed segments it has not finished, and their events
    (segments being written wait too: counted once sealed)."""
    sealed = config.layout.sealed_segments()
    found = []
    for dest_id, dest in config.destinations.items():
        if dest.mode != "batch":
            continue
        done = store.summary(dest_id).done_segments
        pending = [p.name for p in sealed if p.name not in done]
        events = _events_in(config, tuple(pending), counted) or 0
        found.append(Waiting(dest_id, len(pending), events))
    return found
