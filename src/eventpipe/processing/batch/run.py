"""What every step of a run shares: its report, its context, its destinations opened and
the step log."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

from eventpipe.config import Config, DestinationConfig, TableDestinationConfig
from eventpipe.destinations.base import Destination, Metered, Opened, Sink
from eventpipe.errors import EventpipeError, TransientError
from eventpipe.events import utc_now
from eventpipe.paths import DataLayout
from eventpipe.processing.batch.schema_cache import SchemaCache
from eventpipe.processing.runtime.pipeline import Runtime
from eventpipe.processing.steps import metering
from eventpipe.processing.steps.contracts import RuleTally, rule_tally
from eventpipe.processing.steps.fields import (
    reference,
)
from eventpipe.state.records import ContractCount
from eventpipe.state.store import StateStore

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from eventpipe.processing.steps.lookup import Lookups


log = logging.getLogger("eventpipe.processing")


TIMESTAMP = "_timestamp"


@dataclass
class RunReport:
    run_id: str
    segments: tuple[str, ...]
    resumed: bool
    loaded: dict[tuple[str, str], int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    filtered: dict[str, int] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)
    replaced: dict[str, int] = field(default_factory=dict)
    """Metering: rows of earlier runs removed because this run loaded a newer version of
    their key."""
    corrupt: int = 0
    archived: list[Path] = field(default_factory=list)
    held: dict[tuple[str, str, str], int] = field(default_factory=dict)
    """Events a table's schema contract held back, by (destination, table, what): what
    is ``<part>:<mode>`` (``columns:discard_row``; processing/batch/fit.py)."""

    def held_back(self, destination: str, table: str, counts: dict[str, int]) -> None:
        """Count what a load's contract held back (tables load on several threads)."""
        with COUNTS:
            for what, count in counts.items():
                if count:
                    key = (destination, table, what)
                    self.held[key] = self.held.get(key, 0) + count

    broken: dict[tuple[str, str, str], int] = field(default_factory=dict)
    """Events that broke their tracking plan, by (destination, plan, rule)."""

    def broke(self, destination: str, counts: dict[tuple[str, str], int]) -> None:
        """Count the destination's events that broke each (plan, rule) (replacing what
        an earlier try of the run counted)."""
        with COUNTS:
            for (plan, rule), count in counts.items():
                self.broken[(destination, plan, rule)] = count

    def contract_counts(self, destination: str) -> list[ContractCount]:
        """What the destination's contracts found or held back in this run."""
        return [
            ContractCount("plan", plan, rule, count, destination)
            for (dest, plan, rule), count in sorted(self.broken.items())
            if dest == destination
        ] + [
            ContractCount("table", table, what, count, destination)
            for (dest, table, what), count in sorted(self.held.items())
            if dest == destination
        ]


@dataclass(frozen=True)
class Reprocessing:
    """A reprocess run (processing/modes/reprocess.py): only the events of ``days`` (UTC days of
    their ``_timestamp``), loaded through ``shadow`` (the destination's shadow tables)."""

    days: tuple[str, ...]
    shadow: Callable[[Destination], Destination]


class Archiving(Protocol):
    """The archiving of a run's segments, begun ahead (archiving.ArchiveAhead)."""

    def begin(self) -> bool:
        """Start archiving, if it can start now; whether it started."""
        ...


@dataclass
class Job:
    """One pass of the job (job.run_job): the run's id, which destination takes which
    segments, the files it reads and the report it fills; and what differs between a
    batch run, a stream's micro-batch, a replay, a fill, a reprocess run and a part of
    an isolated run."""

    run_id: str
    plan: dict[str, tuple[str, ...]]
    paths: list[str]
    report: RunReport
    schemas: dict[str, SchemaCache] = field(default_factory=dict)
    """Tables' schemas by destination (a stream's live across micro-batches); else each
    destination's are read from it."""
    small: bool = False
    """A micro-batch or a small batch: read where it is, never staged first."""
    failing: dict[str, str] | None = None
    """A destination that stops (transient error) is put here and the others go on;
    None: the error is raised."""
    by_segment: bool = False
    """Destinations take different segments (the staged rows keep their segment's name)."""
    reprocessing: Reprocessing | None = None
    ahead: Archiving | None = None
    """The archiving to begin when the first table loads."""


@dataclass(frozen=True)
class RunContext:
    """What every step of one run shares."""

    run_id: str
    segments: tuple[str, ...]
    """Every destination's, together (one destination's: Target.segments)."""
    runtime: Runtime
    """The run's: its config has the run's destinations only."""
    report: RunReport
    originals: DataFrame
    """(row id, the event's original JSON), computed only for rows that are asked for."""
    lookups: Lookups
    paths: tuple[str, ...]
    """The files the run reads (segments, or the events of a replay)."""
    catalogues: dict[str, list[metering.Product]]
    """Each metering destination's products, read once at the start of the run."""
    reprocessing: Reprocessing | None = None
    started: datetime = field(default_factory=utc_now)
    """When the run started here: metering's window and order of arrival count from it."""
    ahead: Archiving | None = None
    """The segments' archiving, begun when the run's Spark passes are done (load_tables)."""
    staged: bool = False
    """Whether the events are a staged copy (cheap to read again), not the JSON files."""
    few: bool = False
    """A micro-batch or a small batch of at most job.SMALL_BATCH_BYTES: its destinations'
    rows are staged by the driver (shape.stage_flat)."""

    @property
    def config(self) -> Config:
        return self.runtime.config

    @cached_property
    def tally(self) -> RuleTally | None:
        """What counts the broken rules of the run's tracking plans as a destination's
        rows are staged (their files read once a run; None without plans)."""
        return rule_tally(self.config) if self.config.contracts.plans else None

    @property
    def state(self) -> StateStore:
        return self.runtime.state

    @property
    def pause(self) -> Callable[[float], None]:
        """Waits between attempts (a stream's raises when the stream is stopping)."""
        return self.runtime.pause

    @property
    def layout(self) -> DataLayout:
        return self.config.layout


@dataclass(frozen=True)
class Target:
    """One destination of a run, opened."""

    id: str
    config: DestinationConfig
    segments: tuple[str, ...]
    """The segments it takes in this run (what its records are made for)."""
    destination: Opened
    """Its tables, or a sink (events are sent: destinations/base.py, Sink)."""
    schemas: SchemaCache
    """Its tables' schemas (a stream's lives across micro-batches; a batch run's is new)."""

    @property
    def tables(self) -> Destination:
        """The destination's tables (the load step's; a sink has none)."""
        assert self.config.tables, f"{self.id} is a sink: it has no tables"
        return cast(Destination, self.destination)

    @property
    def table_config(self) -> TableDestinationConfig:
        """The settings of a destination with tables."""
        assert isinstance(self.config, TableDestinationConfig), f"{self.id} is a sink"
        return self.config

    @property
    def sink(self) -> Sink:
        """The destination as a sink (the send step's)."""
        assert not self.config.tables, f"{self.id} has tables: they are loaded"
        return cast(Sink, self.destination)


def read_catalogues(runtime: Runtime) -> dict[str, list[metering.Product]]:
    """The products of each metering destination of the runtime's config."""
    return {
        dest_id: metering.read_catalogue(
            metered,
            cast("Metered", runtime.open_destination(dest_id)) if metered.products_table else None,
        )
        for dest_id, dest in runtime.config.destinations.items()
        if (metered := dest.metered) is not None
    }


@contextmanager
def step(what: str) -> Iterator[None]:
    """Log a step's start and duration: progress for long runs, and where the time goes."""
    started = time.perf_counter()
    log.info("%s ...", what)
    yield
    log.info("%s: %.1f s", what, time.perf_counter() - started)


class UncheckedEvents(EventpipeError):
    """Events of a type some tracking plan is for came without a mark made under the
    run's plans, in a run that read only the marks: the run starts again, checking their
    lines (caught in job.run_job; never raised out of it)."""

    name = "unchecked_events"


class DestinationsFailingError(TransientError):
    """Some destinations stopped on transient errors (a database that is down); the
    others finished their work. Their segments wait for them: try again later."""

    name = "destinations_failing"


def batch_destinations(config: Config) -> dict[str, DestinationConfig]:
    return {d: dest for d, dest in config.destinations.items() if dest.mode == "batch"}


def stream_ids(config: Config) -> list[str]:
    """The destinations in ``mode: stream`` (processing/modes/stream.py runs them)."""
    return [d for d, dest in config.destinations.items() if dest.mode == "stream"]


def ref(name: str) -> Column:
    return reference((name,))


COUNTS = threading.Lock()
"""Tables of a destination may load on several threads: shared counts and files change
under this lock."""
