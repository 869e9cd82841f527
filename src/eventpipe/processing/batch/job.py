"""The batch job: sealed segments -> typed tables in every batch destination, as a list
of named steps, each in a module of its own:

    plan        which sealed segments a run takes, recorded before anything loads
                (_run_pending, execute_run; state.store)
    read        the run's lines into one frame of events, looked up, staged (read.py)
    shape       per destination: its keys, table names, transforms, mapping, flattening,
                casts; staged by table and typed (shape.py, inference.py)
    deliver     a destination with tables: per table, patch under its lock, convert,
                one atomic idempotent load, poison events split out (load.py); a sink:
                rows sent from Spark tasks, the driver waiting out an API that is down
                (send.py). Which of the two is the registry's word, not the type's name
    record      each segment x destination x table recorded; failed events to failed/
                (failures.py); a run that fails twice on its data isolated (isolation.py)
    archive     segments every destination has loaded (archiving.py; close_run); a
                source's archived segments compacted past a size (log/compaction.py)

What they share is in run.py. A run's segment list is stored before anything loads; after
a crash the same run resumes with the same segments and batch ids, and destinations load
nothing twice. Tables already recorded ok for the run are skipped. Stream micro-batches
(stream.py), replays (replay.py), fills (fill.py) and reprocess runs (reprocess.py) call
:func:`run_job` with the pipeline's runtime (runtime/pipeline.py) and a Job.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

from pyspark.sql import functions as F

from eventpipe.archive import retention
from eventpipe.archive.remote import remote_of
from eventpipe.config import Config
from eventpipe.destinations.base import Destination
from eventpipe.errors import TransientError
from eventpipe.events import Stage
from eventpipe.files import write_file
from eventpipe.log import compaction
from eventpipe.log.recovery import recover_dead
from eventpipe.log.settings import LogSettings
from eventpipe.log.tail import count_lines as newlines
from eventpipe.paths import DataLayout, count_lines
from eventpipe.processing.batch.archiving import ArchiveAhead, archive_segments
from eventpipe.processing.batch.failures import fail_corrupt, fail_once, once
from eventpipe.processing.batch.isolation import Isolation, caused_by_data
from eventpipe.processing.batch.load import load_tables
from eventpipe.processing.batch.read import (
    CHECK_LINES,
    day_of,
    entry_file,
    event_json,
    events_copy,
    stage_events,
)
from eventpipe.processing.batch.run import (
    DestinationsFailingError,
    Job,
    RunContext,
    RunReport,
    Target,
    UncheckedEvents,
    batch_destinations,
    read_catalogues,
    step,
)
from eventpipe.processing.batch.schema_cache import SchemaCache
from eventpipe.processing.batch.send import send
from eventpipe.processing.batch.shape import flatten_for, stage_flat
from eventpipe.processing.batch.version import code_version
from eventpipe.processing.runtime import shutdown
from eventpipe.processing.runtime.pipeline import Runtime
from eventpipe.processing.steps import transforms
from eventpipe.processing.steps.contracts import broken_rules
from eventpipe.processing.steps.lookup import Lookups
from eventpipe.reserved import (
    CORRUPT,
    DAY,
    ERROR,
    RAW,
    ROW,
    UNCHECKED,
)
from eventpipe.state.store import (
    ALL_TABLES,
    Part,
    Run,
    StateStore,
    micro_batch,
    stream_run,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("eventpipe.processing")


SMALL_BATCH_BYTES = 8 << 20
"""A batch run of at most this much JSON is read where it is, like a stream's
micro-batch, without a staged copy of its events (stage_events): a cold ``process
--once`` of a few events took 0.7 s less (bench/cold_start.py)."""


@dataclass(frozen=True)
class Pending:
    """What a batch run would take, found without Spark: a scheduler's idle tick then
    starts no Spark session, and a small batch a JVM made for a short life."""

    segments: int
    """Sealed segments in incoming/ (after sealing what writers that are gone left)."""
    sealed_bytes: int
    unfinished: bool
    """A run that did not finish (its size is its plan's, not looked up here)."""

    @property
    def empty(self) -> bool:
        return not self.segments and not self.unfinished

    @property
    def small(self) -> bool:
        """At most SMALL_BATCH_BYTES, and no unfinished run."""
        return not self.unfinished and self.sealed_bytes <= SMALL_BATCH_BYTES


def pending(runtime: Runtime) -> Pending:
    """What a batch run of the runtime's config would take now (see Pending)."""
    config = runtime.config
    recover_dead(config.layout, LogSettings.of(config))
    sealed = config.layout.sealed_segments()
    size = sum(p.stat().st_size for p in sealed)
    return Pending(len(sealed), size, bool(runtime.state.unfinished_runs()))


def process_once(config: Config, spark: SparkSession, *, trigger: str = "once") -> RunReport | None:
    """Process every sealed segment not yet processed (and first finish interrupted
    runs); the report of the last run, None if there was nothing to do. See
    process_pending."""
    reports = process_pending(config, spark, trigger=trigger)
    return reports[-1] if reports else None


def process_pending(
    config: Config, spark: SparkSession, *, trigger: str = "once"
) -> list[RunReport]:
    """Finish the runs that did not finish, then process every sealed segment not yet
    processed, in a new run; the reports of the runs, in order.

    Destinations stop alone: one that fails with a transient error (its database is
    down) leaves its part of the run unfinished and takes no new segments, while the
    others finish and go on with new ones. Its unfinished runs are completed first,
    with their own segments and batch ids, when it works again. After the others are
    done, DestinationsFailingError names the ones that stopped (retry later)."""
    return run_pending(Runtime(config, spark), trigger=trigger)


def run_pending(runtime: Runtime, *, trigger: str = "once") -> list[RunReport]:
    """process_pending with a runtime built already (``eventpipe process`` keeps one)."""
    with runtime.pipeline_lock():
        sealed = [p.name for p in runtime.config.layout.sealed_segments()]
        ahead = ArchiveAhead(runtime.config, sealed)
        try:
            return _run_pending(runtime, trigger, ahead)
        finally:
            ahead.finish(cancel=True)


def _run_pending(runtime: Runtime, trigger: str, ahead: ArchiveAhead) -> list[RunReport]:
    config, state = runtime.config, runtime.state
    layout = config.layout
    batch = list(batch_destinations(config))
    failing: dict[str, str] = {}
    reports: list[RunReport] = []
    for run in state.unfinished_runs():
        shutdown.check("a run")
        plan = run.plan_for(batch)
        todo = {
            d: segs
            for d, segs in plan.items()
            if d not in failing  # stopped by an older run: that one comes first
            and not state.table_ok(segs, d, ALL_TABLES)
        }
        if todo:
            reports.append(execute_run(runtime, run, todo, failing, ahead))
        close_run(layout, state, run, plan, failing)
    # What writers that are gone left active: sealed, so that this run takes it.
    recover_dead(layout, LogSettings.of(config))
    sealed = [p.name for p in layout.sealed_segments()]
    plan = {}
    for dest_id in batch:
        if dest_id not in failing:
            done = state.done_by(dest_id, sealed)
            # A segment whose first lines it handled alone (log step, log ack): the rest.
            cursors = state.cursors(dest_id)
            pending = tuple(str(Part(s, cursors.get(s, 0))) for s in sealed if s not in done)
            if pending:
                plan[dest_id] = pending
    if plan:
        shutdown.check("a run")
        segments = list(dict.fromkeys(e for entries in plan.values() for e in entries))
        versions = {d: code_version(config, d) for d in plan}
        run = state.begin_run(segments, trigger, plan, versions)
        reports.append(execute_run(runtime, run, plan, failing, ahead))
        close_run(layout, state, run, plan, failing)
    # The archiving ahead's thread done first (what stopped it, if anything, raised).
    with step("archiving ahead: the rest") if ahead.running else nullcontext():
        ahead.finish()
    archived = archive_segments(config, state.segments_done(sealed, batch))
    if reports:
        reports[-1].archived = archived
    if config.archive.retention_days is not None or config.archive.max_bytes is not None:
        retention.prune(layout, config.archive.retention_days, config.archive.max_bytes,
                        remote=remote_of(config.archive))  # fmt: skip
    for source_id in config.sources:  # sources whose archive grew past compaction_bytes
        if compaction.due(config, source_id):
            with step(f"compacting source {source_id}'s archived segments"):
                compaction.compact(config, source_id)
    if failing:
        problems = "; ".join(f"{d}: {error}" for d, error in sorted(failing.items()))
        raise DestinationsFailingError(
            f"destination(s) stopped: {problems}",
            fix="their segments wait for them; the next run tries again",
            reports=reports,
        )
    return reports


def execute_run(
    runtime: Runtime,
    run: Run,
    plan: dict[str, tuple[str, ...]],
    failing: dict[str, str],
    ahead: ArchiveAhead | None = None,
) -> RunReport:
    """The destinations of ``plan`` through one run; those that stop are put in
    ``failing``. A run killed or stopped by anything else stays unfinished: resumed.
    ``ahead``: begun when the run's first table loads."""
    layout = runtime.config.layout
    report = RunReport(run.run_id, run.segments, run.resumed)
    log.info(
        "%s %s: %d segment(s) for %s", "resuming" if run.resumed else "starting", run.run_id,
        len(run.segments), ", ".join(plan),
    )  # fmt: skip
    wanted = {entry for entries in plan.values() for entry in entries}
    paths = [str(entry_file(layout, run.run_id, e)) for e in run.segments if e in wanted]
    # Destinations that take different segments tell them apart by a column of their own:
    # decided by the whole plan, so that every attempt of the run stages the same.
    by_segment = len({frozenset(segs) for segs in (run.plan or {}).values()}) > 1
    small = sum(Path(p).stat().st_size for p in paths) <= SMALL_BATCH_BYTES
    job = Job(run.run_id, plan, paths, report, failing=failing, by_segment=by_segment,
              ahead=ahead, small=small)  # fmt: skip
    try:
        run_job(runtime, job)
    except BaseException as exc:
        runtime.state.finish_run(run.run_id, "interrupted", error=repr(exc)[:2000])
        raise
    return report


def close_run(
    layout: DataLayout,
    state: StateStore,
    run: Run,
    plan: dict[str, tuple[str, ...]],
    failing: dict[str, str],
) -> None:
    """Mark the run done when every destination of its plan finished it (a part of a
    segment moves its destination's cursor in the segment: before the run is marked
    done, so that a crash in between repeats this step, not the load)."""
    left = [d for d, segs in plan.items() if not state.table_ok(segs, d, ALL_TABLES)]
    for dest_id, entries in plan.items():
        if dest_id not in left:
            for part in (Part.parse(e) for e in entries):
                if not part.whole:
                    end = None if part.count is None else part.start + part.count
                    source = layout.incoming / part.segment
                    # Archived already (this step repeated after a crash): it was done.
                    done = end is None or not source.exists() or end >= count_lines(source)
                    state.advance(dest_id, part.segment, end or 0, done=done, run_id=run.run_id)
    if left:
        errors = "; ".join(f"{d}: {failing.get(d, 'not finished')}" for d in left)
        state.finish_run(run.run_id, "interrupted", error=errors[:2000])
    else:
        state.finish_run(run.run_id, "done")
        shutil.rmtree(layout.tmp / run.run_id, ignore_errors=True)


def process_stream_batch(
    runtime: Runtime,
    epoch: int,
    lines: Sequence[Path],
    schemas: SchemaCache | None = None,
) -> RunReport:
    """One micro-batch of a stream destination (the runtime's only one), its log lines
    in the files ``lines``, through the same job as batch mode. The run id is the
    destination's and the micro-batch's, so a replayed micro-batch loads nothing twice.
    ``schemas``: the stream's, kept from one micro-batch to the next; the runtime's
    ``pause`` is how the job waits (for an HTTP API that is down)."""
    [dest_id] = runtime.config.destinations
    layout = runtime.config.layout
    run_id = stream_run(dest_id, epoch)
    name = micro_batch(dest_id, epoch)
    report = RunReport(run_id, (name,), resumed=(layout.tmp / run_id).exists())
    job = Job(run_id, {dest_id: (name,)}, [str(p) for p in lines], report,
              {dest_id: schemas or SchemaCache()}, small=True)  # fmt: skip
    try:
        run_job(runtime, job)
    except Exception as exc:
        if not caused_by_data(exc):
            raise
        # First time: raised, and the query starts again from its checkpoint (the same
        # micro-batch); second time: its events are isolated.
        isolation = Isolation(runtime, run_id, dest_id, report, run_job)
        if isolation.after(exc, (name,), lines):
            raise
    read = sum(newlines(path, 0, path.stat().st_size) for path in lines)  # whole lines
    runtime.state.record_read(run_id, dest_id, read)  # the ledger's acknowledged events
    runtime.state.fold_stream(dest_id, epoch)  # older micro-batches: one row per table
    shutil.rmtree(layout.tmp / run_id, ignore_errors=True)
    return report


def run_job(runtime: Runtime, job: Job) -> None:
    """Read the job's files once, then load every destination of its plan, each the
    segments the plan gives it (see Job). The runtime is narrowed to the plan's
    destinations here.

    HTTP sinks are sent on threads of their own beside the tables' loads: an API that is
    down for minutes delays no other destination of the run. A destination that fails
    with a TransientError is put in ``job.failing`` (and the state store) and the others
    go on; without it the error is raised. One that fails for what its events may cause
    is isolated (isolation.py)."""
    runtime = runtime.only(job.plan)
    config, state, spark = runtime.config, runtime.state, runtime.spark
    run_id, plan, report, failing, reprocessing = (
        job.run_id, job.plan, job.report, job.failing, job.reprocessing
    )  # fmt: skip
    transforms.check(spark, config)
    catalogues = read_catalogues(runtime)  # one that cannot be read stops the run here
    lookups = Lookups.plan(config)
    days = reprocessing.days if reprocessing else None

    def isolate(dest_id: str, exc: Exception) -> None:
        files = [entry_file(config.layout, run_id, e) for e in plan[dest_id]]
        isolation = Isolation(runtime, run_id, dest_id, report, run_job)
        stopped = isolation.after(exc, plan[dest_id], files)
        if stopped is not None and failing is not None:
            failing[dest_id] = stopped

    try:
        # A copy of the events pays when several destinations read them (one JSON read
        # and one lookup pass for all), or when the tracking plans check them (once, not
        # in every pass over them); one destination reads the JSON where it is.
        staged = not job.small and (len(config.destinations) > 1 or bool(config.contracts.plans))
        events = stage_events(spark, config, run_id, job.paths, lookups, staged=staged,
                              by_segment=job.by_segment, days=days,
                              marks_in_place=len(config.destinations) == 1)  # fmt: skip
        if CORRUPT in events.columns and reprocessing is None:
            report.corrupt = once(
                config.layout.tmp / run_id / "failed.corrupt.done",
                lambda: fail_corrupt(events, config.layout),
            )
    except Exception as exc:
        if failing is None or not caused_by_data(exc):
            raise
        for dest_id in config.destinations:  # the read is every destination's
            isolate(dest_id, exc)
        return
    originals = events.select(
        ROW,
        event_json(events).alias(RAW),
        day_of(events.schema).alias(DAY),
    )
    segments = tuple(dict.fromkeys(s for segs in plan.values() for s in segs))
    staged_copy = (events_copy(config.layout, run_id) / "_SUCCESS").exists()
    few = job.small and sum(Path(p).stat().st_size for p in job.paths) <= SMALL_BATCH_BYTES
    shared = RunContext(run_id, segments, runtime, report, originals, lookups,
                        tuple(job.paths), catalogues, reprocessing, ahead=job.ahead,
                        staged=staged_copy, few=few)  # fmt: skip

    def process(dest_id: str, open_target: Callable[[], Target]) -> None:
        shutdown.check(f"{dest_id}'s part of the run")
        try:
            _process_destination(events, shared, open_target())
        except UncheckedEvents:
            raise  # the whole run starts again (below)
        except TransientError as exc:
            if failing is None:
                raise
            log.error("%s stopped: %s; its segments wait for the next run", dest_id, exc)
            failing[dest_id] = exc.message
            state.record(plan[dest_id], dest_id, ALL_TABLES, ok=False, error=exc.message[:2000],
                         run_id=run_id)  # fmt: skip
        except Exception as exc:
            if failing is None or not caused_by_data(exc):
                raise
            isolate(dest_id, exc)

    def open_target(d: str) -> Callable[[], Target]:
        dest = config.destinations[d]
        cache = job.schemas.get(d) or SchemaCache()

        def opened() -> Target:  # on the destination's own turn (it may be down)
            destination = runtime.open_destination(d)
            if reprocessing is not None:  # a reprocess loads into shadow tables
                destination = reprocessing.shadow(cast(Destination, destination))
            return Target(d, dest, plan[d], destination, cache)

        return opened

    # A sink's part runs on a thread of its own: an API that is down for minutes
    # delays none of the tables.
    sinks = [d for d, dest in config.destinations.items() if not dest.tables]
    try:
        with ThreadPoolExecutor(max_workers=max(1, len(sinks)), thread_name_prefix="send") as pool:
            sending = [pool.submit(process, d, open_target(d)) for d in sinks]
            for dest_id in config.destinations:
                if dest_id not in sinks:
                    process(dest_id, open_target(dest_id))
            for future in sending:
                future.result()
    except UncheckedEvents:
        # Raised by a destination before it loaded or failed any of its events
        # (_process_destination); in a run of several, one before it may have loaded.
        folder = config.layout.tmp / run_id
        if (folder / CHECK_LINES).exists():
            raise
        log.info("run %s: some events came without a mark made under the run's plans; "
                 "the run starts again, checking their lines", run_id)  # fmt: skip
        for staged_rows in folder.glob("dst=*"):
            shutil.rmtree(staged_rows)
        write_file(folder / CHECK_LINES, "")
        run_job(runtime, job)


def _process_destination(events: DataFrame, run: RunContext, target: Target) -> None:
    dest_id, report = target.id, run.report
    flattened = flatten_for(events, run, target)
    where = run.layout.tmp / run.run_id / f"dst={dest_id}"
    to_stamp = target.schemas.stamped if run.few and target.config.tables else ()
    staged, counts = stage_flat(flattened.frame, where, in_driver=run.few, to_stamp=to_stamp)
    if counts.get("unchecked") or (UNCHECKED in events.columns and "unchecked" not in counts):
        raise UncheckedEvents(f"{dest_id}: events without a mark made under the run's plans")
    report.skipped[dest_id] = counts["skipped"]
    report.filtered[dest_id] = counts.get("filtered", 0)  # a resumed run's older counts
    report.failed[dest_id] = 0
    if counts["failed"]:
        fail_once(flattened.frame.filter(F.col(ERROR).isNotNull()), run, dest_id, "processing",
                   table=None, stage=Stage.PROCESSING)  # fmt: skip
    deliver = load_tables if target.config.tables else send  # by what it has, not its type
    verdicts = flattened.verdicts
    tallied = flattened.tally.counted(counts) if flattened.tally is not None else None
    if verdicts is None or tallied is not None:
        deliver(staged, flattened, counts, where, run, target)
        if tallied is not None:
            report.broke(dest_id, tallied)
    else:
        # Where the rows' pass could not count them (steps.contracts.RuleTally): counted
        # beside the loads, which wait on the destination more than on Spark (a pass
        # over the events' JSON where they were not staged: 3.3 s of a 20 s run of 1M
        # events, bench/contracts.py); the pool waits for it whatever the loads do.
        def count() -> dict[tuple[str, str], int]:
            with step(f"{dest_id}: count what broke its plans"):
                return broken_rules(verdicts)

        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="count") as pool:
            broken = pool.submit(count)
            deliver(staged, flattened, counts, where, run, target)
            report.broke(dest_id, broken.result())
    if run.reprocessing is None:  # a reprocess records its days when it swaps them in
        days = sorted(counts.get("days") or ())
        run.state.record_days(dest_id, days, code_version(run.config, dest_id), run.run_id)
    run.state.record(target.segments, dest_id, ALL_TABLES, ok=True, run_id=run.run_id)
    run.state.record_destination_run(
        run.run_id,
        dest_id,
        skipped=report.skipped[dest_id],
        failed=report.failed[dest_id],
        filtered=report.filtered[dest_id],
        contracts=report.contract_counts(dest_id),
    )
