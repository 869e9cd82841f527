"""The state store's records (its rows as Python values) and the names it keeps for
itself: tables a destination never has, the ids of a stream's micro-batches."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

REPROCESS = "reprocess"
"""The trigger of reprocess runs: not resumed by ``process`` (``reprocess`` resumes them)."""
ALL_TABLES = "*"
SENT_TABLE = "*sent*"
"""The table name an http sink's deliveries are recorded under."""
ACKED_TABLE = "*acked*"
"""The table name of segments marked handled without loading (``eventpipe log ack``)."""


def micro_batch(destination: str, epoch: int) -> str:
    """The name a stream destination's micro-batch is recorded under (like a segment)."""
    return f"queue.dst={destination}/batch-{epoch:012d}"


def stream_run(destination: str, epoch: int | str) -> str:
    """The run id of a stream destination's micro-batch (``folded``: of the older ones)."""
    return f"stream-{destination}-{epoch}"


def now_text() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class Part:
    """An entry of a run's plan: a whole segment (``<name>``), its lines from ``start``
    on (``<name>@<start>``: a destination that handled the first ones alone, with
    ``eventpipe log step`` or ``log ack``), or ``count`` lines from ``start``
    (``<name>@<start>+<count>``: a step)."""

    segment: str
    start: int = 0
    count: int | None = None

    @classmethod
    def parse(cls, entry: str) -> Part:
        segment, _, lines = entry.partition("@")
        if not lines:
            return cls(segment)
        start, _, count = lines.partition("+")
        return cls(segment, int(start), int(count) if count else None)

    @property
    def whole(self) -> bool:
        return self.start == 0 and self.count is None

    def __str__(self) -> str:
        if self.whole:
            return self.segment
        return f"{self.segment}@{self.start}" + ("" if self.count is None else f"+{self.count}")


@dataclass(frozen=True)
class Run:
    run_id: str
    segments: tuple[str, ...]
    trigger: str
    resumed: bool = False
    plan: dict[str, tuple[str, ...]] | None = None
    """Destination -> the segments it loads in this run (None: a run recorded before
    plans existed; every batch destination loads every segment)."""

    def segments_of(self, destination: str, destinations: Sequence[str]) -> tuple[str, ...]:
        """What ``destination`` loads in this run (``destinations``: the batch ones now)."""
        if self.plan is None:
            return self.segments if destination in destinations else ()
        return self.plan.get(destination, ())

    def plan_for(self, destinations: Sequence[str]) -> dict[str, tuple[str, ...]]:
        """Each of ``destinations`` (the batch ones now) that has segments in this run,
        with them."""
        return {d: segs for d in destinations if (segs := self.segments_of(d, destinations))}


@dataclass(frozen=True)
class TableRun:
    destination: str
    table: str
    status: str
    rows: int
    error: str | None


@dataclass(frozen=True)
class ContractCount:
    """Events of one run a contract found or held back at one destination."""

    kind: str
    """``plan`` (a tracking plan's violations) or ``table`` (a table's schema contract)."""
    subject: str
    """The plan's id, or the table."""
    rule: str
    """The plan's rule that failed (``required``, ``type``...), or what the table's
    contract did (``columns:freeze``, ``data_type:discard_value``...)."""
    events: int
    destination: str = ""

    def __str__(self) -> str:
        return f"{self.kind} {self.subject}: {self.rule} {self.events:,}"


@dataclass(frozen=True)
class RunRecord:
    """One run of the history (``eventpipe status --history``)."""

    run_id: str
    trigger: str
    started_at: str
    finished_at: str | None
    status: str
    segments: int
    error: str | None
    code_versions: dict[str, str]
    tables: tuple[TableRun, ...]
    events: tuple[tuple[str, int, int, int], ...]
    """Per destination: events skipped (empty table name), failed, and filtered (by its
    namespace or transforms)."""
    contracts: tuple[ContractCount, ...] = ()
    """What the destinations' contracts found or held back (each with its destination)."""


@dataclass(frozen=True)
class DayVersion:
    """One code version some of a destination's rows of a day were built with."""

    day: str
    code_version: str
    inputs: dict[str, str] | None
    """Archive file -> sha1, for a day rebuilt by a reprocess; None: loaded by runs."""
    run_id: str | None = None
    """The first run that loaded rows of the day with this version (its loads are recorded
    in the destination under its id)."""


@dataclass(frozen=True)
class DestinationSummary:
    last_load: str | None
    rows_loaded: int
    skipped: int
    failed: int
    done_segments: frozenset[str]
    filtered: int = 0
    """Events the destination's namespace or transforms dropped."""


@dataclass(frozen=True)
class StreamCounts:
    """What a stream destination's micro-batches recorded over a range of time."""

    last_load: str | None
    rows_loaded: int
    skipped: int
    failed: int
    filtered: int
    events_read: int | None
    """The lines its micro-batches read; None where one did not record them."""
    contracts: tuple[ContractCount, ...]


@dataclass(frozen=True)
class SchemaChange:
    """A change eventpipe made to a destination's table: ``create`` (one per column it
    was created with), ``add`` (a column added), ``primary_key`` (its columns, comma
    separated, in ``column``)."""

    destination: str
    table: str
    change: str
    column: str
    data_type: str
    run_id: str
    at: str


@dataclass(frozen=True)
class TableProgress:
    table: str
    batches_ok: int
    """Segments (and stream micro-batches) recorded loaded."""
    rows: int
    batches_failed: int
    last_update: str
    last_error: str | None
