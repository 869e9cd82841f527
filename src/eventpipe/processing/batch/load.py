"""Load: per table, the patch under the table's lock, values converted to the table's
types, one atomic idempotent load; a load the database refuses is split to find the
events that cause it (poison events)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from pyspark.sql import Observation
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from eventpipe.config import MeteringConfig
from eventpipe.destinations import changes
from eventpipe.destinations.base import Destination, LoadRequest, Metered
from eventpipe.errors import TerminalError, TransientError
from eventpipe.events import Stage
from eventpipe.files import replacing_path, write_file
from eventpipe.processing.batch.failures import fail_once
from eventpipe.processing.batch.fit import contract_of, fit_columns, refused_table, row_rules
from eventpipe.processing.batch.halving import halve
from eventpipe.processing.batch.read import stage_in_driver, staging_writer
from eventpipe.processing.batch.run import RunContext, Target, step
from eventpipe.processing.batch.shape import (
    Flattened,
    StagedTable,
    staged_table,
    type_mixes,
    with_overflow,
    within_max_columns,
)
from eventpipe.processing.batch.stamps import with_stamps
from eventpipe.processing.runtime import shutdown
from eventpipe.processing.steps import metering
from eventpipe.processing.steps.flatten import Flat
from eventpipe.processing.steps.inference import staged_column_types
from eventpipe.reserved import (
    ERROR,
    ROW,
    TABLE,
)
from eventpipe.schema.casts import SPARK_TYPES
from eventpipe.schema.diff import Table, TablePatch, diff
from eventpipe.schema.naming import UNMAPPED_COLUMN
from eventpipe.schema.types import DataType
from eventpipe.state.records import SchemaChange, now_text

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

log = logging.getLogger("eventpipe.processing")


def keep_newest(destination: Destination, metered: MeteringConfig, started: datetime) -> int:
    """Metering: of each key in the window, only the newest version's rows stay, across
    the destination's two tables; returns the rows removed. The columns it compares by
    are added where a batch left them out (all null: an event with no time is before
    every window)."""
    tables = (metered.table, metered.unclassified_table)
    wanted = {
        metering.KEY: DataType.STRING,
        metering.ORDER_AT: DataType.TIMESTAMP,
        metering.WINDOW_AT: DataType.TIMESTAMP,
        metering.ARRIVAL: DataType.STRING,
    }
    for table in tables:
        if (current := destination.describe(table)) is not None:
            destination.patch(diff(current, Table(table, wanted)))
    with step(f"{destination.id}: keep each key's newest version"):
        removed = cast("Metered", destination).keep_newest(tables, metered.window_start(started))
    log.info("%s: %d row(s) of older versions removed", destination.id, removed)
    return removed


def load_tables(
    staged: DataFrame,
    flattened: Flattened,
    counts: dict[str, Any],
    where: Path,
    run: RunContext,
    target: Target,
) -> None:
    """Type the destination's staged rows per table, then patch and load each table (a
    metering destination then keeps the newest version of each key)."""
    dest_id = target.id
    columns = flattened.columns
    with step(f"{dest_id}: type {len(columns)} column(s)"):
        batch = staged_column_types(
            where / "flat", staged, TABLE, columns,
            known_text=run.lookups.text_columns(dest_id), texts=counts.get("texts"),
        )  # fmt: skip
    if batch.mixed:
        with step(f"{dest_id}: bool/number mixes in {len(batch.mixed)} table(s)"):
            type_mixes(batch, run, target, flattened.event_schema, flattened.name)
    pending = [
        (table, types)
        for table, types in sorted(batch.types.items())
        if not run.state.table_ok(target.segments, dest_id, table)  # else loaded by an earlier try
    ]

    def load(item: tuple[str, dict[str, DataType]]) -> int | TableRefused:
        table, types = item
        shutdown.check(f"the load of {dest_id}.{table}")
        try:
            return _load_table(
                staged_table(staged, where, table, counts), run, target, types, flattened.flat
            )
        except TableRefused as refused:
            return refused

    # Tables are independent batches: a destination that takes loads in parallel gets
    # them on that many threads (their Spark work and their connections). The state
    # store is written here, in order, by this thread only.
    parallel = target.tables.parallel_loads
    # The archive's compression beside the loads is a thread of the driver's too: the
    # loads leave it a core (two DuckDB loads beside it took 1 s more than one on the
    # batch benchmark). When the service's wait compressed the segments, none is left.
    if run.ahead is not None and run.ahead.begin():
        parallel = max(1, parallel - 1)
    tables = f"{dest_id}: {len(pending)} table(s) on {parallel} thread(s)"
    with step(tables), ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        for (table, _), rows in zip(pending, pool.map(load, pending), strict=True):
            if isinstance(rows, TableRefused):  # its events in failed/; the others go on
                run.state.record(target.segments, dest_id, table, ok=False,
                                 error=rows.message[:2000], run_id=run.run_id)  # fmt: skip
                continue
            run.state.record(target.segments, dest_id, table, ok=True, rows=rows,
                             run_id=run.run_id)  # fmt: skip
    if (metered := target.config.metered) is not None:
        run.report.replaced[dest_id] = keep_newest(target.tables, metered, run.started)


class _StaleSchema(Exception):
    """A load failed with a table schema kept in memory: read it again, retry once."""


class TableRefused(TerminalError):
    """The destination refused to create or change a table (past the database's column
    limit, DDL it does not permit): that table's events of the batch went to failed/
    with the reason; the destination's other tables, and the other destinations, load."""

    name = "table_refused"


def _load_table(
    staged: StagedTable,
    run: RunContext,
    target: Target,
    batch_types: dict[str, DataType],
    flat: Flat,
) -> int:
    """Convert, patch and load one table; rows that fail go to failed/. When the load
    fails with the schema from memory (a stream's), the table's schema is read from the
    destination and the load retried once."""
    described = target.schemas.describe(target.tables, staged.name)
    try:
        return _load_table_as(staged, run, target, batch_types, flat, described.table,
                              retry_stale=described.cached)  # fmt: skip
    except _StaleSchema as stale:
        log.warning("%s.%s: load failed with the schema kept in memory (%s); read again, "
                    "retrying once", target.id, staged.name, stale)  # fmt: skip
        target.schemas.forget(staged.name)
        fresh = target.schemas.describe(target.tables, staged.name)
        return _load_table_as(staged, run, target, batch_types, flat, fresh.table,
                              retry_stale=False)  # fmt: skip


def _load_table_as(
    staged: StagedTable,
    run: RunContext,
    target: Target,
    batch_types: dict[str, DataType],
    flat: Flat,
    existing: Table | None,
    *,
    retry_stale: bool,
) -> int:
    """``_load_table`` for the table as ``existing``; raises _StaleSchema when
    ``retry_stale`` and the load fails (nothing written to failed/ yet)."""
    dest_id, dest = target.id, target.table_config
    layout, run_id = run.layout, run.run_id
    table, frame = staged.name, staged.frame

    contract = contract_of(dest, table)
    if existing is None and contract.tables != "evolve":
        return _no_new_table(staged, run, target, contract.tables)
    wanted = {c: flat.explicit.get(c, t) for c, t in batch_types.items()}
    fit = fit_columns(contract, table, existing, wanted)
    kept, overflow = within_max_columns(fit.wanted, existing, dest.max_columns, flat.explicit)
    targets = {c: (existing.columns.get(c, t) if existing else t) for c, t in kept.items()}
    spark_types = {f.name: f.dataType for f in frame.schema.fields}
    missing_key = [c for c in dest.primary_key if c not in targets]
    staging = layout.tmp / run_id / f"dst={dest_id}" / f"table={table}"
    if run.few:  # a stream's next micro-batches convert these while they stage (stamps.py)
        target.schemas.note_stamped(c for c, t in targets.items() if t is DataType.TIMESTAMP
                                    and isinstance(spark_types[c], StringType))  # fmt: skip
    if not overflow and not missing_key and not fit.changes_rows:
        if all(spark_types[c] == SPARK_TYPES[t] for c, t in targets.items()):
            # Staged with the types it loads with (the common case): the partition's own
            # files are loaded, without a conversion pass.
            return load_files(staged, run, target, existing, targets, frame, retry_stale)
        stamped = with_stamps(staged.files, staged.stamps, targets, wanted, spark_types,
                              staging)  # fmt: skip
        if stamped is not None:  # converted as they were staged: no pass either
            return load_files(StagedTable(table, frame, stamped), run, target, existing,
                              targets, frame, retry_stale)  # fmt: skip
    # A value that does not convert to its column's type sends its event to failed/,
    # naming the column (schema/diff.py), unless the table's contract says otherwise;
    # nothing is silently nulled.
    rules = row_rules(fit, existing, wanted, targets, spark_types)
    converted, targets, problems = rules.converted, rules.targets, rules.problems
    if overflow:
        converted[UNMAPPED_COLUMN] = with_overflow(frame, overflow, flat.pointers)
        targets[UNMAPPED_COLUMN] = DataType.STRING
    if missing_key:
        problems.append(F.lit(f"primary key column(s) {', '.join(missing_key)} missing"))
    ok = checked = staging_rows = frame
    observed = Observation()
    observing = bool(problems or rules.discards or rules.counted)
    if observing:
        error = F.concat_ws("; ", *problems) if problems else F.lit("")
        checked = frame.withColumn(ERROR, error)
        kept_rows = F.col(ERROR) == ""  # a row that fails is not also counted as dropped
        for discard in rules.discards:
            kept_rows &= ~F.coalesce(discard, F.lit(False))
        ok = checked.filter(kept_rows)
        # Counted during the write: none failed (the usual case) costs no pass.
        counts = [F.count_if(F.col(ERROR) != "").alias("failed")]
        for name, condition in rules.counted.items():
            holds = F.coalesce(condition, F.lit(False))
            if not name.endswith(":freeze"):  # what failed for another reason is not held
                holds &= F.col(ERROR) == ""
            counts.append(F.count_if(holds).alias(name))
        staging_rows = checked.observe(observed, *counts).filter(kept_rows)
    with step(f"{dest_id}.{table}: convert and stage"):
        # With the row ids: rows a destination rejects are found by them (load_files).
        rows = staging_rows.select(ROW, *(value.alias(c) for c, value in converted.items()))
        if not (run.few and stage_in_driver(rows, staging, None)):  # a micro-batch's few
            staging_writer(rows).parquet(str(staging))
    files = tuple(sorted(staging.glob("*.parquet")))
    loaded = load_files(StagedTable(table, frame, files), run, target, existing, targets, ok,
                         retry_stale)  # fmt: skip
    if rules.counted:
        held = {n: observed.get[n] for n in rules.counted}
        run.report.held_back(dest_id, table, held)
    if observing and observed.get["failed"]:
        # After the load: a load retried with a fresh schema converts them again.
        fail_once(checked.filter(F.col(ERROR) != ""), run, dest_id, f"table={table}",
                   table=table, stage=Stage.LOADING)  # fmt: skip
    return loaded


def _no_new_table(staged: StagedTable, run: RunContext, target: Target, mode: str) -> int:
    """A table its destination lacks and may not create (``tables: freeze`` or
    ``discard_row``): its events fail with the reason, or are dropped; counted. Nothing
    loads."""
    dest_id, table = target.id, staged.name
    count = staged.frame.count()
    if mode == "freeze":
        why = refused_table(table, dest_id)
        log.warning("%s; its events of the batch go to failed/", why)
        fail_once(staged.frame.withColumn(ERROR, F.lit(why)), run, dest_id,
                  f"table={table}.contract", table=table, stage=Stage.LOADING)  # fmt: skip
    else:
        log.warning("%s.%s: no such table; %d event(s) dropped (schema_contract.tables: "
                    "discard_row)", dest_id, table, count)  # fmt: skip
    run.report.held_back(dest_id, table, {f"tables:{mode}": count})
    return 0


def _changes(patch: TablePatch, dest_id: str, run_id: str) -> list[SchemaChange]:
    """What ``patch`` changed, for the state store's history of the destination's tables
    (the console's destinations page)."""
    at = now_text()
    change = "create" if patch.create else "add"
    made = [SchemaChange(dest_id, patch.table, change, column, str(data_type), run_id, at)
            for column, data_type in patch.add_columns]  # fmt: skip
    if patch.set_primary_key:
        key = ",".join(patch.set_primary_key)
        made.append(SchemaChange(dest_id, patch.table, "primary_key", key, "", run_id, at))
    return made


def load_files(
    staged: StagedTable,
    run: RunContext,
    target: Target,
    existing: Table | None,
    targets: dict[str, DataType],
    ok: DataFrame,
    retry_stale: bool,
) -> int:
    """Patch the table (as ``existing``) for ``targets`` and load ``staged.files``; on a
    terminal error the events of ``ok`` go to failed/ with it (``retry_stale``: raise
    _StaleSchema instead)."""
    dest_id, dest, destination = target.id, target.table_config, target.tables
    report, run_id, table = run.report, run.run_id, staged.name
    patch = diff(existing, Table(table, targets, dest.primary_key))
    try:
        destination.patch(patch)
        run.state.record_schema_changes(_changes(patch, dest_id, run_id))
    except TerminalError as exc:
        if retry_stale:  # a schema from memory: the table may be otherwise by now
            raise _StaleSchema(exc.message) from exc
        message = f"{dest_id} refused to create or change table {table}: {exc.message}"
        log.error("%s; its events of the batch go to failed/, the other tables load", message)
        fail_once(ok.withColumn(ERROR, F.lit(message)), run, dest_id, f"table={table}.refused",
                   table=table, stage=Stage.LOADING)  # fmt: skip
        raise TableRefused(message, table=table) from exc
    if not patch.empty:
        target.schemas.forget(table)  # read again next time: others may have added more
    request = LoadRequest(
        table, f"{run_id}:{dest_id}:{table}", staged.files, targets, dest.primary_key,
        apply_changes=dest.changes == "apply" and changes.are_changes(targets),
    )  # fmt: skip
    parts = Parts(run.layout.tmp / run_id / f"dst={dest_id}" / f"table={table}.parts")
    if parts.started:  # an earlier try of the run was loading it in parts: go on
        return _load_in_parts(parts, request, run, target, ok, parts.error)
    try:
        with step(f"{dest_id}.{table}: load"):
            result = destination.load(request)
    except TerminalError as exc:
        if retry_stale:
            raise _StaleSchema(exc.message) from exc
        return _load_in_parts(parts, request, run, target, ok, exc.message)
    report.loaded[(dest_id, table)] = result.rows
    log.info("%s.%s: %d rows%s", dest_id, table, result.rows,
             " (already loaded)" if result.already_loaded else "")  # fmt: skip
    if result.rejected:  # rows the destination could not store; the rest loaded
        ids = _row_ids(staged.files)
        rejected = F.broadcast(  # the smaller side of the join with the originals
            ok.sparkSession.createDataFrame(
                [(ids[position], why) for position, why in result.rejected],
                f"{ROW} long, {ERROR} string",
            )
        )
        fail_once(rejected, run, dest_id, f"table={table}.rejected", table=table,
                   stage=Stage.LOADING)  # fmt: skip
    return result.rows


PART_ROWS = 50_000
"""Rows of the parts a refused load is first split into (each is then halved while it is
refused). Held in memory one at a time, read from the staged Parquet files."""


class PoisonLimitError(TransientError):
    """More events of one load were refused than ``max_poison_events``: the destination
    is taken as broken (a permission, a constraint on every row), not the events."""

    name = "poison_limit"


@dataclass(frozen=True)
class Parts:
    """Where a table's load in parts keeps its part files (and that it started)."""

    root: Path

    @property
    def started(self) -> bool:
        return (self.root / "started").exists()

    @property
    def error(self) -> str:
        """Why the whole batch was refused."""
        return (self.root / "started").read_text()

    def start(self, error: str) -> None:
        write_file(self.root / "started", error)

    def file(self, rows: pa.Table, first: int) -> Path:
        """``rows`` (from position ``first``) as a Parquet file, written once."""
        import pyarrow.parquet as pq

        path = self.root / f"rows-{first:012d}-{rows.num_rows}.parquet"
        if not path.exists():
            with replacing_path(path) as partial:
                pq.write_table(rows, partial)
        return path


def _load_in_parts(
    parts: Parts,
    whole: LoadRequest,
    run: RunContext,
    target: Target,
    ok: DataFrame,
    error: str,
) -> int:
    """Load a batch the destination refused (``error``) in parts (:func:`split_load`): the
    refused events go to failed/ with the destination's reason, the rest loads."""
    dest_id, table = target.id, whole.table
    if not parts.started:
        log.warning("%s.%s: load refused (%s); loading it in parts to find the events "
                    "that cause it", dest_id, table, error)  # fmt: skip

    def check() -> None:
        shutdown.check(f"a part of {dest_id}.{table}")

    with step(f"{dest_id}.{table}: load in parts"):
        poison_limit = target.table_config.max_poison_events
        split = split_load(parts, whole, target.tables, poison_limit, error, check)
    log.warning("%s.%s: %d row(s) loaded in %d part(s); %d event(s) refused -> failed/",
                dest_id, table, split.loaded, split.loads, len(split.poison))  # fmt: skip
    run.report.loaded[(dest_id, table)] = split.loaded
    if split.poison:
        # At most max_poison_events rows: broadcast, so that Spark never builds its join
        # on the batch's originals (it did, and ran out of driver memory at 1M events).
        refused = F.broadcast(
            ok.sparkSession.createDataFrame(split.poison, f"{ROW} long, {ERROR} string")
        )
        fail_once(refused, run, dest_id, f"table={table}.parts", table=table,
                  stage=Stage.LOADING)  # fmt: skip
    return split.loaded


@dataclass(frozen=True)
class Split:
    loaded: int
    """Rows loaded by the parts (this time: a resumed split counts what it loads now)."""
    loads: int
    """Loads tried."""
    poison: list[tuple[int, str]]
    """(row id, the destination's reason) of each event refused alone."""


def split_load(
    parts: Parts,
    whole: LoadRequest,
    destination: Destination,
    max_poison_events: int,
    error: str,
    check: Callable[[], None] = lambda: None,
) -> Split:
    """Load ``whole``, which ``destination`` refused (``error``), in parts, to find the
    events that cause it: parts of PART_ROWS, and a refused part in halves, down to single
    events. Each part is a load of its own, idempotent by its batch id (the batch's and
    its rows), so a resumed split goes on where it stopped (``parts`` marks the batch as
    loading in parts: it is never loaded whole again, which could double rows). More
    refused events than ``max_poison_events``: PoisonLimitError. ``check`` runs before
    each part (a graceful stop raises there)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = whole.table
    if not parts.started:
        parts.start(error)
    loaded, loads = 0, 0
    poison: list[tuple[int, str]] = []

    def split(rows: pa.Table, offset: int, known: str | None) -> None:
        """``rows`` (from position ``offset`` of the batch) in halves while refused;
        ``known``: the whole batch, refused already (split at once)."""

        def attempt(first: int, end: int, refused: str | None) -> tuple[str | None, None]:
            nonlocal loaded, loads
            if refused is not None:
                return refused, None
            check()
            part = rows.slice(first, end - first)
            at = offset + first
            request = replace(whole, batch_id=f"{whole.batch_id}:rows={at}+{part.num_rows}",
                              files=(parts.file(part, at),))  # fmt: skip
            loads += 1
            try:
                result = destination.load(request)
            except TerminalError as exc:
                return exc.message, None
            loaded += result.rows
            ids = part.column(ROW).to_pylist()
            poison.extend((ids[position], why) for position, why in result.rejected)
            return None, None

        def failed_alone(position: int, why: str) -> None:
            poison.append((rows.column(ROW)[position].as_py(), why))
            if len(poison) > max_poison_events:
                raise PoisonLimitError(
                    f"{table}: more than {max_poison_events} events of one batch "
                    f"refused, the last: {why}",
                    fix="repair the destination (or raise max_poison_events); the batch "
                    "goes on where it stopped",
                    table=table,
                )

        halve(0, rows.num_rows, attempt, known, failed_alone)

    total = sum(pq.ParquetFile(f).metadata.num_rows for f in whole.files)
    first = 0
    for file in whole.files:
        for batch in pq.ParquetFile(file).iter_batches(batch_size=PART_ROWS):
            rows = pa.Table.from_batches([batch])
            # A batch that is one part is known refused: split it at once.
            split(rows, first, error if rows.num_rows == total else None)
            first += rows.num_rows
    return Split(loaded, loads, poison)


def _row_ids(files: Sequence[Path]) -> list[int]:
    """The row id of each row of ``files``, in order (their ``__row`` column)."""
    import pyarrow.parquet as pq

    ids: list[int] = []
    for file in files:
        ids += pq.read_table(file, columns=[ROW]).column(ROW).to_pylist()
    return ids
