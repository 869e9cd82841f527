"""The protocols destinations implement, and what they share.

A destination with tables (:class:`Destination`) is asked three things per batch and
table, in this order:

1. ``describe(table)``: the table as it is now (None if it does not exist);
2. ``patch(patch)``: create it or add columns (see eventpipe.schema.diff), under a lock
   keyed by destination and table, so that two pipelines cannot race;
3. ``load(request)``: put the batch's rows in, atomically, and idempotently per
   ``batch_id``: loading the same batch again changes nothing.

Failures are classified by the destination: TransientError (retry with backoff) or
TerminalError (the batch's events go to failed/ with the reason).

A destination without tables (:class:`Sink`) gets the batch's rows sent in Spark tasks,
with its own records of what was delivered (destinations/http/).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from eventpipe.errors import TerminalError
from eventpipe.locks import Locks
from eventpipe.paths import check_safe_id
from eventpipe.schema.dialects import Dialect
from eventpipe.schema.diff import Table, TablePatch
from eventpipe.schema.types import DataType


@dataclass(frozen=True)
class LoadRequest:
    table: str
    batch_id: str
    """Stable id of what is loaded (segments x destination x table): a retry reuses it."""
    files: tuple[Path, ...]
    """Parquet files with the batch's rows, column names as in ``columns``."""
    columns: Mapping[str, DataType]
    primary_key: tuple[str, ...] = ()
    apply_changes: bool = False
    """The rows are a source's changes, applied by key (destinations/changes.py)."""


@dataclass(frozen=True)
class LoadResult:
    rows: int
    already_loaded: bool = False
    rejected: tuple[tuple[int, str], ...] = ()
    """Rows the destination could not store, left out of the load: (position across
    ``files`` in order, from 0; the database's reason). The rest of the batch loaded."""


@dataclass(frozen=True)
class DaySwap:
    """Replace a destination's rows of some days by rows rebuilt in shadow tables, in one
    transaction (``eventpipe reprocess``, processing/modes/reprocess.py)."""

    swap_id: str
    """Recorded with the swap: a swap done once is not done again."""
    days: tuple[str, ...]
    """UTC days (``YYYY-MM-DD``) of ``_timestamp``."""
    tables: tuple[str, ...]
    """The destination's tables: their rows of ``days`` are deleted."""
    shadows: Mapping[str, str]
    """Table -> the shadow table holding its rebuilt rows (moved in, then dropped)."""
    primary_key: tuple[str, ...] = ()


ALL_SWAPPED = "*"

QUERY_TIMEOUT_SECONDS = 60.0
"""How long ``eventpipe query`` may run by default (``query_timeout_seconds``): a reader
holds what a load needs (a DuckDB file, a PostgreSQL table's lock) only this long."""
"""The loads-table record of a whole swap (beside one per table moved in)."""


def day_ranges(days: Sequence[str]) -> list[tuple[date, date]]:
    """``days`` as [first, end) ranges of consecutive days."""
    ranges: list[tuple[date, date]] = []
    for day in sorted({date.fromisoformat(d) for d in days}):
        if ranges and ranges[-1][1] == day:
            ranges[-1] = (ranges[-1][0], day + timedelta(days=1))
        else:
            ranges.append((day, day + timedelta(days=1)))
    return ranges


def of_days(quote: Callable[[str], str], days: Sequence[str]) -> str:
    """SQL true for rows whose ``_timestamp`` falls in ``days`` (UTC; the column holds
    UTC wall-clock time). The literals come from dates, never from input text."""
    ts = quote("_timestamp")
    return " OR ".join(
        f"({ts} >= TIMESTAMP '{first.isoformat()} 00:00:00' "
        f"AND {ts} < TIMESTAMP '{end.isoformat()} 00:00:00')"
        for first, end in day_ranges(days)
    )


def delete_days(
    swap: DaySwap,
    quote: Callable[[str], str],
    describe: Callable[[str], Table | None],
    delete: Callable[[str, str], object],
    destination_id: str,
) -> None:
    """Call ``delete(table, where)`` for each of ``swap.tables`` that exists, ``where``
    selecting the rows of ``swap.days``; a table without ``_timestamp`` is refused."""
    where = of_days(quote, swap.days)
    for table in swap.tables:
        current = describe(table)
        if current is None:
            continue
        if "_timestamp" not in current.columns:
            raise no_timestamp(destination_id, table)
        delete(table, where)


def swap_days(
    swap: DaySwap,
    quote: Callable[[str], str],
    described: Mapping[str, Table | None],
    delete: Callable[[str, str], object],
    move: Callable[[LoadRequest, str], int],
    destination_id: str,
) -> dict[str, int]:
    """The statements of a day swap, for the caller's transaction: the rows of
    ``swap.days`` deleted from each table (:func:`delete_days`), then each shadow's rows
    moved into its table by ``move(request, shadow)`` (the request names the table, the
    shadow's columns and the key); the rows moved per table. ``described``: each table's
    and shadow's description (None: not there)."""
    delete_days(swap, quote, described.get, delete, destination_id)
    moved: dict[str, int] = {}
    for table, shadow in sorted(swap.shadows.items()):
        current = described.get(shadow)
        if current is None:
            continue
        request = LoadRequest(table, swap.swap_id, (), current.columns, swap.primary_key)
        moved[table] = move(request, shadow)
    return moved


def newest_only(
    tables: Sequence[str],
    name: Callable[[str], str],
    quote: Callable[[str], str],
    cutoff: datetime,
) -> list[str]:
    """DELETEs that leave, of each key whose rows are in the window (``cutoff`` on), only
    the rows of its newest version across ``tables`` (metering: a correction replaces the
    rows of its key, classified or not; docs/metering.md). Rows before ``cutoff`` are
    neither compared nor removed. ``name``: a table's SQL name; ``quote``: a column's.
    Run them in one transaction."""
    from eventpipe.reserved import METER_ARRIVAL as ARRIVAL
    from eventpipe.reserved import METER_KEY as KEY
    from eventpipe.reserved import METER_ORDER_AT as ORDER_AT
    from eventpipe.reserved import METER_WINDOW_AT as WINDOW_AT

    since = f"TIMESTAMP '{cutoff.replace(tzinfo=None).isoformat(sep=' ')}'"
    key, order, arrival, window = (quote(c) for c in (KEY, ORDER_AT, ARRIVAL, WINDOW_AT))
    versions = " UNION ALL ".join(
        f"SELECT {key} AS k, {order} AS o, {arrival} AS a FROM {name(t)} WHERE {window} >= {since}"
        for t in tables
    )
    deletes = []
    for table in tables:
        row = name(table)
        deletes.append(
            f"DELETE FROM {row} WHERE {window} >= {since} AND EXISTS (SELECT 1 FROM "
            f"({versions}) AS v WHERE v.k = {row}.{key} AND (v.o > {row}.{order} OR "
            f"(v.o IS NOT DISTINCT FROM {row}.{order} AND v.a > {row}.{arrival})))"
        )
    return deletes


def duckdb_casts(columns: Mapping[str, str]) -> tuple[str, str]:
    """For an in-memory DuckDB that converts a batch's columns to the types a destination
    takes (column -> DuckDB type): the select list of the converted columns
    (``TRY_CAST``), and an expression that says why a row's values do not convert
    (``column n (BIGINT) cannot take abc``; empty when they all do)."""
    from eventpipe.schema.dialects import DUCKDB

    q = DUCKDB.quote
    casts = ", ".join(f"TRY_CAST({q(c)} AS {t}) AS {q(c)}" for c, t in columns.items())
    problems = ", ".join(
        f"CASE WHEN {q(c)} IS NOT NULL AND TRY_CAST({q(c)} AS {t}) IS NULL THEN "
        f"{DUCKDB.literal(f'column {c} ({t}) cannot take ')} || CAST({q(c)} AS VARCHAR) END"
        for c, t in columns.items()
    )
    return casts, f"concat_ws('; ', {problems or 'NULL'})"


def no_timestamp(destination_id: str, table: str) -> TerminalError:
    return TerminalError(
        f"{destination_id}.{table} has no _timestamp column: its rows cannot be told apart "
        "by day, so none of its days can be replaced",
        fix="keep _timestamp in the destination's mapping to reprocess it",
        table=table,
    )


class Destination(Protocol):
    id: str
    dialect: Dialect
    parallel_loads: int
    """Tables of a batch the job may load at once (each load on its own connection)."""

    def describe(self, table: str) -> Table | None: ...

    def patch(self, patch: TablePatch) -> None: ...

    def load(self, request: LoadRequest) -> LoadResult: ...

    def query(
        self, sql: str, *, timeout_seconds: float = QUERY_TIMEOUT_SECONDS
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run SQL read-only (``eventpipe query``), for at most ``timeout_seconds``:
        column names and rows."""
        ...


class SinkSettings(Protocol):
    """What a sink's Spark tasks need to deliver (picklable: it travels to executors)."""

    @property
    def hold_seconds(self) -> float | None:
        """How long a task retries a failing request before it hands its session back to
        the driver, which waits without holding a Spark slot."""
        ...

    def deliver(self, batches: Iterator[Any]) -> Iterator[Any]:
        """One Spark task (``mapInArrow``): rows ``row, key, info, ts, attrs`` in, one row
        of this attempt's stats (JSON text, column ``stats``) out."""
        ...

    def until(self, give_up_at: float) -> SinkSettings:
        """The same, a transient failure final after ``give_up_at`` (``time.time()``)."""
        ...


class SinkOutcome(Protocol):
    """What a run's deliveries add up to, over every attempt (the progress records)."""

    @property
    def delivered(self) -> int: ...

    @property
    def requests(self) -> int: ...

    @property
    def payload_bytes(self) -> int: ...

    @property
    def possible_duplicates(self) -> int: ...

    @property
    def failed(self) -> Sequence[Any]:
        """Each refused event's ``row`` and ``error``."""
        ...


@dataclass(frozen=True)
class SinkRetries:
    """How the driver waits out an API that keeps failing."""

    initial_seconds: float
    max_seconds: float
    max_elapsed_seconds: float


class Sink(Protocol):
    """A destination without tables: the job sends its rows from Spark tasks, a task per
    group of sessions, through what ``settings`` returns (the HTTP sink,
    destinations/http/), and reads what happened from ``outcome``."""

    @property
    def id(self) -> str: ...

    @property
    def sessions(self) -> tuple[str, ...]:
        """The fields whose values make a session (requests in order, one at a time)."""
        ...

    @property
    def retries(self) -> SinkRetries: ...

    def settings(
        self, *, progress: str, run: str, tasks: int, hold_seconds: float
    ) -> SinkSettings: ...

    def outcome(self, progress: str) -> SinkOutcome:
        """What the run's attempts delivered and failed, from their records in
        ``progress``."""
        ...


Opened = Destination | Sink
"""A destination as the registry opens it: tables, or a sink."""


class Replaceable(Destination, Protocol):
    """A destination that can replace its rows of some days in one transaction
    (``eventpipe reprocess``)."""

    def tables(self) -> list[str]: ...

    def drop(self, tables: list[str]) -> None: ...

    def replace_days(self, swap: DaySwap) -> dict[str, int]: ...


class Metered(Destination, Protocol):
    """A destination that can hold a metering destination's tables (docs/metering.md)."""

    def keep_newest(self, tables: Sequence[str], cutoff: datetime) -> int:
        """Of each key in the window, only its newest version's rows stay (newest_only),
        in one transaction; returns the rows removed."""
        ...

    def rows(self, table: str, columns: Sequence[str]) -> list[dict[str, Any]]:
        """Every row of a small table (a product catalogue), as column -> value."""
        ...


@contextmanager
def table_lock(locks: Locks, destination_id: str, table: str) -> Iterator[None]:
    """An exclusive lock keyed by destination and table, held across processes (and the
    hosts of one state store: eventpipe.state.locks).

    For destinations without a lock of their own (files, DuckDB); PostgreSQL uses its
    advisory locks instead.
    """
    check_safe_id(destination_id, "destination id")
    # Table names are sanitised ([a-z0-9_], at most 63 characters) before they get here.
    with locks.waiting(f"patch.dst={destination_id}.table={table}"):
        yield
