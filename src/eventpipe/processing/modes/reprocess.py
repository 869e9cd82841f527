"""``eventpipe reprocess``: rebuild a destination's days from the raw archive.

A day is a UTC day of the events' ``_timestamp`` (late events belong to their own day,
whenever they arrived). Each run records, per destination x day, the code version its
rows were built with (state.store ``day_versions``, processing/batch/version.py). A day is
rebuilt when:

* a version other than the current one built some of its rows (a day with no version
  recorded, loaded before eventpipe recorded them, is rebuilt with ``--force`` only);
* an archive file a previous reprocess of it read has changed (its sha1 in the manifest
  differs from the one recorded);
* the destination does not hold the load of the run that recorded the day: its own load
  records (``_eventpipe_loads``, written in the transaction of every load) lack it, so
  its data was replaced, emptied or restored from an older copy since (a damaged DuckDB
  file moved away, say);
* ``--force``.

Rebuilding a day, for one destination:

1. inputs: the archived segments whose manifest says they may hold events of the day
   (``days``, a superset; files without it are always read), and the segments still in
   incoming/ that the destination has loaded (archived once every destination has);
2. the batch job runs over them for this destination only, keeping only the day's events
   (before lookups), and loads into *shadow tables* (``_eventpipe_rp_<run>_<table>``)
   shaped like the real ones, with everything a run does: typing, patching, loading in
   parts; events that fail go to a failed/ file of the run's own (under tmp/);
3. one transaction (``replace_days`` of the destination) deletes the day's rows from every
   table of the destination, moves the shadows' rows in (upsert with a primary key) and
   drops the shadows; it is recorded under the run id, so it happens once;
4. the destination's failed/ file loses the EventErrors of the day (the run handled those
   events again) and gains the run's own: an event is in the table or in failed/, once;
5. the day's record becomes the current version and the archive files read, with sha1.

Days are rebuilt one run after the other, the days read from the same files together
(a file whose events span a month is read once, not once a day), so a long reprocess
shows progress as runs finish, and when it is interrupted the days done stay done. A run
interrupted is resumed by the next reprocess under the same run id (its staged files and
shadow loads are reused; nothing loads twice) while its days, version and files are the
same; otherwise the old attempt is abandoned (its shadows dropped) and its days start
again.

Length (over 500 lines): the five steps above and the plan that groups days by the files
they read share the run's records (versions, files, shadows); apart, each would need the
others' internals.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import time
import uuid
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import date, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import lz4.frame
import orjson

from eventpipe import reserved
from eventpipe.archive.files import (
    SUFFIX,
    ArchiveFormatError,
    Manifest,
    day_dirs,
    segments_of_day,
)
from eventpipe.archive.remote import restore_missing
from eventpipe.archive.retention import pruned_through
from eventpipe.config import Config, LakehouseConfig, TableDestinationConfig
from eventpipe.destinations.base import (
    QUERY_TIMEOUT_SECONDS,
    DaySwap,
    Destination,
    LoadRequest,
    LoadResult,
    Replaceable,
)
from eventpipe.destinations.registry import REPLACES_DAYS, kind
from eventpipe.errors import ConfigError, TerminalError
from eventpipe.files import KeepOld, replacing
from eventpipe.processing.batch.failures import reprocess_failures
from eventpipe.processing.batch.job import run_job
from eventpipe.processing.batch.run import (
    Job,
    Reprocessing,
    RunReport,
    batch_destinations,
)
from eventpipe.processing.batch.version import code_version
from eventpipe.processing.runtime import shutdown
from eventpipe.processing.runtime.pipeline import Runtime
from eventpipe.schema.diff import Table, TablePatch, diff
from eventpipe.state.store import ALL_TABLES, DayVersion, StateStore

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("eventpipe.processing")

SHADOW_PREFIX = reserved.SHADOW_PREFIX
LOADS_TABLE = reserved.LOADS_TABLE


def shadow_name(run_id: str, table: str) -> str:
    """The shadow of ``table`` in the reprocess run ``run_id`` (at most 31 characters)."""
    return f"{shadow_prefix(run_id)}{zlib.crc32(table.encode()):08x}"


def shadow_prefix(run_id: str) -> str:
    return f"{SHADOW_PREFIX}{zlib.crc32(run_id.encode()):08x}_"


class Shadowed:
    """A destination whose tables are the run's shadows: ``describe``, ``patch`` and
    ``load`` of table T act on T's shadow, made on first use with T's columns and types
    (so that values meet the types they will be moved into)."""

    def __init__(self, inner: Destination, run_id: str) -> None:
        self.inner = inner
        self.run_id = run_id
        self.id = inner.id
        self.dialect = inner.dialect
        self.parallel_loads = inner.parallel_loads

    def shadow(self, table: str) -> str:
        return shadow_name(self.run_id, table)

    def describe(self, table: str) -> Table | None:
        found = self.inner.describe(self.shadow(table))
        if found is None:
            real = self.inner.describe(table)
            if real is None:
                return None
            self.inner.patch(diff(None, Table(self.shadow(table), real.columns, real.primary_key)))
            found = self.inner.describe(self.shadow(table))
            assert found is not None
        return Table(table, found.columns, found.primary_key)

    def patch(self, patch: TablePatch) -> None:
        self.inner.patch(replace(patch, table=self.shadow(patch.table)))

    def load(self, request: LoadRequest) -> LoadResult:
        return self.inner.load(replace(request, table=self.shadow(request.table)))

    def query(
        self, sql: str, *, timeout_seconds: float = QUERY_TIMEOUT_SECONDS
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        return self.inner.query(sql, timeout_seconds=timeout_seconds)


@dataclass(frozen=True)
class Source:
    """A file a day is rebuilt from."""

    name: str
    """The segment's name (as in incoming/)."""
    path: Path
    sha1: str
    """Of the archived ``.lz4`` (its manifest's); empty for incoming/ and legacy files."""


@dataclass(frozen=True)
class DayPlan:
    """Days of one destination rebuilt in one run: those read from the same files (every
    day of a file whose events span a month is rebuilt with one read of it)."""

    destination: str
    days: tuple[str, ...]
    reasons: tuple[str, ...]
    """Why each day is rebuilt."""
    sources: tuple[Source, ...]

    @property
    def label(self) -> str:
        if len(self.days) == 1:
            return self.days[0]
        return f"{self.days[0]}..{self.days[-1]} ({len(self.days)} days)"

    @property
    def reason(self) -> str:
        return "; ".join(dict.fromkeys(self.reasons))

    @property
    def inputs(self) -> dict[str, str]:
        return {s.name: s.sha1 for s in self.sources}

    def entry(self, version: str) -> str:
        """The run's name for this work: the same days, version and files, the same
        name (a run interrupted is found again by it)."""
        text = "\n".join(f"{s.name} {s.sha1}" for s in self.sources)
        digest = hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:12]
        return f"reprocess.dst={self.destination}/{','.join(self.days)}/{version}/{digest}"


def entry_days(entry: str) -> set[str]:
    """The days of a reprocess run's entry (:meth:`DayPlan.entry`)."""
    return set(entry.split("/")[1].split(","))


@dataclass
class Plan:
    version: str
    groups: list[DayPlan] = field(default_factory=list)
    up_to_date: list[str] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    """(day, why): days that cannot be rebuilt (their archive was pruned)."""


@dataclass(frozen=True)
class DayResult:
    plan: DayPlan
    run_id: str
    rows: dict[str, int]
    seconds: float
    resumed: bool
    report: RunReport | None


def replaceable(config: Config, destination_id: str) -> None:
    """Raise ConfigError unless ``destination_id`` is a batch destination whose days can
    be replaced."""
    dest = config.destination(destination_id)
    if dest.type not in REPLACES_DAYS:
        raise ConfigError(
            f"destination {destination_id!r} is of type {dest.type}: reprocess replaces a "
            "day's rows in one transaction or a day partition, which only "
            f"{', '.join(REPLACES_DAYS)} destinations do",
            fix=f"reprocess a {', '.join(REPLACES_DAYS[:-1])} or {REPLACES_DAYS[-1]} destination",
        )
    if not kind(dest).can_replace_days(dest):
        raise ConfigError(
            f"parquet destination {destination_id!r}: reprocess replaces day partitions "
            "by renaming directories, which needs a local path (an object store has no "
            "rename) and partition_by: day",
            fix="reprocess a local parquet destination partitioned by day, or keep the lake "
            "on S3 as iceberg or delta (a day replaced in one commit)",
        )
    if dest.metered is not None:
        raise ConfigError(
            f"destination {destination_id!r} meters usage: its rows are kept per key across "
            "days, which a reprocess by day does not rebuild yet",
            fix="reprocess the destinations without metering",
        )
    sources = sorted(s for s in config.sources if dest.only_keys is None or s in dest.only_keys)
    in_place = (isinstance(dest, TableDestinationConfig) and dest.changes == "apply"
                and not isinstance(dest, LakehouseConfig))  # fmt: skip
    if sources and in_place:
        raise ConfigError(
            f"destination {destination_id!r} applies the changes of source(s) "
            f"{', '.join(sources)} by key: a row is the last change of its key, whatever its "
            "day, so its days cannot be rebuilt alone",
            fix="fill a new destination from the log instead (docs/cdc.md)",
        )
    if dest.mode == "stream":
        raise ConfigError(
            f"destination {destination_id!r} is in mode stream: its rows of the days are "
            "written while a reprocess would replace them",
            fix="reprocess a batch destination",
        )
    replaying = sorted((config.layout.failed / "replay").glob(f"replaying.dst={destination_id}.*"))
    if replaying:
        raise ConfigError(
            f"destination {destination_id!r} has a replay of failed events under way "
            f"({replaying[0].name}): a reprocess could load its events a second time",
            fix=f"finish it with `eventpipe replay failed --destination {destination_id}`",
        )


def plan(runtime: Runtime, destination_id: str, first: date, last: date, force: bool) -> Plan:
    """What ``reprocess --from first --to last`` would rebuild for one destination."""
    config, state = runtime.config, runtime.state
    replaceable(config, destination_id)
    layout = config.layout
    version = code_version(config, destination_id)
    result = Plan(version)
    recorded = state.day_versions(destination_id, first.isoformat(), last.isoformat())
    restore_missing(config.archive, config.layout)  # late events may be in any day
    archived = list(_archived(config, first, last))
    sealed = [p.name for p in layout.sealed_segments()]
    loaded = state.done_by(destination_id, sealed)
    waiting = _partly_loaded(state, destination_id, sealed, loaded)
    if waiting:
        raise TerminalError(
            f"{destination_id} has loaded only the first lines of {', '.join(waiting)} "
            "(log step / log ack): its days cannot be rebuilt until the rest is loaded",
            fix="run `eventpipe process --once` first",
        )
    in_incoming = [Source(n, layout.incoming / n, "") for n in sealed if n in loaded]
    # Without --force, the days with recorded versions; with it, also every day the
    # archive may hold (each day of the range when a file may hold any).
    days = sorted(recorded)
    held = None if force else _loads_held(runtime, destination_id)
    if force:
        hinted = {d for _, hint in archived if hint is not None for d in hint}
        if in_incoming or any(hint is None for _, hint in archived):
            hinted.update(_dates(first, last))
        days = sorted({*days, *hinted})
    pruned = pruned_through(layout)
    by_name = {s.name: s for s, _ in archived}
    groups: dict[tuple[Source, ...], list[tuple[str, str]]] = {}
    for day in days:
        sources = tuple([s for s, hint in archived if hint is None or day in hint] + in_incoming)
        why = _stale(day, recorded.get(day), version, by_name) or _lost(recorded.get(day), held)
        if force:
            why = why or "--force"
        if why is None:
            result.up_to_date.append(day)
            continue
        if pruned is not None and day <= pruned:
            result.refused.append((day, f"the archive was pruned through {pruned}"))
            continue
        if not sources:
            if day in recorded:
                result.refused.append((day, "no archived events of the day are left"))
            continue
        groups.setdefault(sources, []).append((day, why))
    for sources, stale in groups.items():
        days_of, reasons = zip(*stale, strict=True)
        result.groups.append(DayPlan(destination_id, days_of, reasons, sources))
    result.groups.sort(key=lambda group: group.days)
    return result


def _dates(first: date, last: date) -> Iterator[str]:
    day = first
    while day <= last:
        yield day.isoformat()
        day += timedelta(days=1)


def _stale(
    day: str, versions: list[DayVersion] | None, current: str, archived: dict[str, Source]
) -> str | None:
    """Why ``day`` must be rebuilt (None: it is up to date)."""
    if not versions:
        return "no code version recorded"
    old = sorted({v.code_version for v in versions} - {current})
    if old:
        return f"built with code version {', '.join(old)} (now {current})"
    for recorded in versions:
        for name, sha1 in sorted((recorded.inputs or {}).items()):
            now = archived.get(name)
            if sha1 and now is not None and now.sha1 and now.sha1 != sha1:
                return f"archive file {name} changed (sha1 {sha1[:12]} -> {now.sha1[:12]})"
    return None


def _loads_held(runtime: Runtime, destination_id: str) -> set[str] | None:
    """The batch ids in the destination's own load records; None where it keeps none
    yet (a new destination: nothing is concluded from its records then)."""
    opened = cast(Replaceable, runtime.open_destination(destination_id))
    dest_type = runtime.config.destinations[destination_id].type
    if LOADS_TABLE not in opened.tables() and dest_type in (
        "duckdb", "postgres",
    ):  # fmt: skip
        return set()
    _, rows = opened.query(f"SELECT DISTINCT batch_id FROM {LOADS_TABLE}")
    return {str(batch) for (batch,) in rows}


def _lost(versions: list[DayVersion] | None, held: set[str] | None) -> str | None:
    """Why a day is not loaded although recorded: the destination lacks the load of the
    run that recorded it (``<run>:<destination>:<table>...``, per table). Days a reprocess
    rebuilt are checked by their archive files instead (a Parquet destination records
    its swaps apart from its loads)."""
    if held is None:
        return None
    prefixes = {p.split(":", 1)[0] for p in held}
    for version in versions or ():
        if version.inputs is None and version.run_id is not None and version.run_id not in prefixes:
            return (
                f"the destination does not hold run {version.run_id}'s load of the day "
                "(its data replaced or restored since)"
            )
    return None


def _archived(
    config: Config, first: date, last: date
) -> Iterator[tuple[Source, frozenset[str] | None]]:
    """Every archived segment that may hold events of ``first``..``last``, with the days
    its manifest names (None: any day). Late events are archived after their day, and a
    clock ahead puts some before: all of the archive is looked at (manifests only)."""
    low, high = first.isoformat(), last.isoformat()
    for day_dir in day_dirs(config.layout):
        for segment in segments_of_day(day_dir):
            days = None
            sha1 = ""
            if not segment.legacy:
                try:
                    manifest = Manifest.read(segment.manifest)
                except (OSError, ArchiveFormatError) as exc:
                    log.warning("%s: %s; read for every day", segment.manifest, exc)
                else:
                    sha1 = manifest.compressed.sha1
                    if manifest.days is not None:
                        days = frozenset(d for d in manifest.days if low <= d <= high)
                        if not days:
                            continue
            yield Source(segment.segment_file, segment.data, sha1), days


def _partly_loaded(
    state: StateStore, destination_id: str, sealed: list[str], loaded: set[str]
) -> list[str]:
    cursors = state.cursors(destination_id)
    return [s for s in sealed if s not in loaded and cursors.get(s, 0) > 0]


def reprocess(
    spark: SparkSession,
    config: Config,
    destination_id: str,
    first: date,
    last: date,
    *,
    force: bool = False,
    progress: Callable[[str], None] = log.info,
) -> tuple[Plan, list[DayResult]]:
    """Rebuild the days of ``first``..``last`` of one destination that need it (see the
    module's docstring), one run after the other; the plan and each run's result."""
    runtime = Runtime(config, spark)
    return run_reprocess(runtime, destination_id, first, last, force=force, progress=progress)


def run_reprocess(
    runtime: Runtime,
    destination_id: str,
    first: date,
    last: date,
    *,
    force: bool = False,
    progress: Callable[[str], None] = log.info,
) -> tuple[Plan, list[DayResult]]:
    """reprocess with a runtime built already (the CLI's plans all destinations first)."""
    with runtime.pipeline_lock():
        _clean_tmp(runtime)
        todo = plan(runtime, destination_id, first, last, force)
        results = []
        for number, group in enumerate(todo.groups, 1):
            shutdown.check(f"the reprocess of {group.label}")
            progress(
                f"{destination_id} {group.label} ({number}/{len(todo.groups)}): "
                f"{group.reason}; {len(group.sources)} file(s)"
            )
            results.append(reprocess_group(runtime, group, todo.version))
            done = results[-1]
            progress(
                f"{destination_id} {group.label}: {sum(done.rows.values()):,} row(s) in "
                f"{len(done.rows)} table(s), {done.seconds:.1f} s"
                + (" (resumed)" if done.resumed else "")
            )
        return todo, results


def reprocess_group(runtime: Runtime, group: DayPlan, version: str) -> DayResult:
    """Rebuild one destination's days of ``group`` (the module's docstring, steps 1-4)."""
    started = time.monotonic()
    dest_id = group.destination
    runtime = runtime.only([dest_id])
    config, state = runtime.config, runtime.state
    dest = config.destinations[dest_id]
    key = dest.primary_key if isinstance(dest, TableDestinationConfig) else ()
    entry = group.entry(version)
    # A destination whose days can be replaced (plan() checked its type).
    destination = cast(Replaceable, runtime.open_destination(dest_id))
    run_id = None
    for older, older_entry in state.unfinished_reprocesses(f"reprocess.dst={dest_id}/"):
        if older_entry == entry and run_id is None:
            run_id = older
        elif entry_days(older_entry) & set(group.days):
            # The same days, but the version, the files or the grouping changed: it will
            # never be finished.
            _drop_shadows(destination, older)
            state.abandon_run(older, "superseded: the code version or the archive changed")
    resumed = run_id is not None
    run_id = run_id or f"reprocess-{uuid.uuid4().hex[:12]}"
    state.begin_reprocess(run_id, entry, dest_id, version)
    report = None
    if not state.table_ok([entry], dest_id, ALL_TABLES):
        paths = [str(p) for p in spark_inputs(config, run_id, group.sources)]
        report = RunReport(run_id, (entry,), resumed)
        into = Reprocessing(group.days, lambda d: Shadowed(d, run_id))
        run_job(runtime, Job(run_id, {dest_id: (entry,)}, paths, report, reprocessing=into))
    shutdown.check(f"the swap of {group.label}")
    loaded = state.loaded_tables(entry, dest_id)
    shadows = {t: shadow_name(run_id, t) for t in loaded}
    for table, shadow in shadows.items():  # columns the rebuilt rows have and the table not
        built = destination.describe(shadow)
        if built is not None:
            current = destination.describe(table)
            destination.patch(diff(current, Table(table, built.columns, key)))
    tables = tuple(sorted({*state.destination_tables(dest_id), *loaded}))
    swap = DaySwap(run_id, group.days, tables, shadows, key)
    rows = destination.replace_days(swap)
    found = reprocess_failures(config.layout, run_id, dest_id)
    _supersede_failed(config, dest_id, group.days, found)
    state.reprocessed_days(dest_id, group.days, version, group.inputs, run_id)
    shutil.rmtree(config.layout.tmp / run_id, ignore_errors=True)
    return DayResult(group, run_id, rows, time.monotonic() - started, resumed, report)


def _supersede_failed(config: Config, dest_id: str, days: tuple[str, ...], found: Path) -> None:
    """The destination's failed/ file without the EventErrors of ``days`` and with the
    rebuild's own (``found``). Written whole and renamed over the old one, so a death
    leaves one or the other; done again by a resumed run, it gives the same file.

    EventErrors without a ``day`` (of events whose ``_timestamp`` does not convert, which
    no day holds, or written before EventErrors had days) stay.
    """
    path = config.layout.failed_destination(dest_id)
    wanted = set(days)
    dropped = 0
    added = found.read_bytes() if found.exists() else b""
    with replacing(path) as out:
        if path.exists():
            with path.open("rb") as lines:
                for line in lines:
                    if _failed_day(line) in wanted:
                        dropped += 1
                    else:
                        out.write(line if line.endswith(b"\n") else line + b"\n")
        if not dropped and not added:
            raise KeepOld  # the same file: left as it is
        out.write(added)
    if not dropped and not added:
        return
    log.info("%s: failed/: %d event(s) of the rebuilt days replaced by the %d that "
             "failed again", dest_id, dropped, added.count(b"\n"))  # fmt: skip


def _failed_day(line: bytes) -> str | None:
    """The ``day`` of one EventError line (None: none, or a line that is not one)."""
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    day = record.get("day") if isinstance(record, dict) else None
    return day if isinstance(day, str) else None


def _clean_tmp(runtime: Runtime) -> None:
    """Remove the tmp/ files of reprocess runs that finished (a death between the swap's
    record and their removal leaves them) or were abandoned."""
    reprocesses = runtime.state.unfinished_reprocesses("reprocess.dst=")
    unfinished = {run_id for run_id, _ in reprocesses}
    for directory in runtime.config.layout.tmp.glob("reprocess-*"):
        if directory.name not in unfinished:
            shutil.rmtree(directory, ignore_errors=True)


def _drop_shadows(destination: Replaceable, run_id: str) -> None:
    prefix = shadow_prefix(run_id)
    left = [t for t in destination.tables() if t.startswith(prefix)]
    if left:
        destination.drop(left)


def spark_inputs(config: Config, run_id: str, sources: Sequence[Source]) -> list[Path]:
    """The files Spark reads: archived ``.lz4`` segments decompressed under the run's
    tmp/ (Spark's LZ4 codec reads Hadoop's block format, not frames); gzip and
    incoming/ segments where they are. Decompressed once: a resumed run reuses them."""
    out = config.layout.tmp / run_id / "inputs"
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for source in sources:
        if not source.path.name.endswith(SUFFIX):
            paths.append(source.path)
            continue
        target = out / source.name
        if not target.exists():
            with lz4.frame.open(source.path, "rb") as data, replacing(target) as copy:
                shutil.copyfileobj(data, copy, 8 << 20)
        paths.append(target)
    return paths


def batch_ids(config: Config) -> list[str]:
    """The destinations reprocess takes by default: every batch one it can replace."""
    return [
        d
        for d, dest in batch_destinations(config).items()
        if kind(dest).can_replace_days(dest) and dest.metered is None
    ]
