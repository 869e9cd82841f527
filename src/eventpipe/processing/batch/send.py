"""Send: a destination without tables (a sink: destinations/base.py ``Sink``; the HTTP
sink is one) gets its staged rows on Spark, a task per group of sessions; the driver
waits out an API that is down. Which sink it is, this module never asks."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F

from eventpipe.events import Stage
from eventpipe.processing.batch.failures import fail_once
from eventpipe.processing.batch.run import RunContext, Target, ref, step
from eventpipe.processing.batch.shape import Flattened
from eventpipe.processing.runtime import shutdown
from eventpipe.reserved import (
    ERROR,
    ROW,
)
from eventpipe.retry import Backoff
from eventpipe.schema.naming import column_name
from eventpipe.sessions import parallelism
from eventpipe.state.store import (
    SENT_TABLE,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from eventpipe.destinations.base import SinkSettings

log = logging.getLogger("eventpipe.processing")


def send(
    staged: DataFrame,
    flattened: Flattened,
    counts: dict[str, Any],
    where: Path,
    run: RunContext,
    target: Target,
) -> None:
    """Deliver the destination's staged rows through its sink, on Spark: rows partitioned
    by session key, so that a task owns each session (one request in flight per session,
    in order, on a cluster too). Events that could not be delivered go to failed/ with
    the API's answer. Progress records go to ``where``/sent (the destination's directory
    of the run)."""
    dest_id, sink = target.id, target.sink
    retries = sink.retries
    columns = flattened.columns
    if run.state.table_ok(target.segments, dest_id, SENT_TABLE):
        return  # sent by an earlier try of this run
    present = set(columns)
    group = [c for c in (_group_column(g) for g in sink.sessions) if c in present]
    attrs = [c for c in columns if c not in group]
    spark = staged.sparkSession
    tasks = parallelism(spark)
    ts = (
        F.unix_micros(F.col("_timestamp").cast("timestamp")) * F.lit(1000)
        if "_timestamp" in present
        else F.lit(None).cast("long")
    )
    info = F.to_json(F.struct(*(ref(c) for c in group))) if group else F.lit("{}")
    key = F.concat_ws("\x1f", *(F.coalesce(ref(c).cast("string"), F.lit("")) for c in group))
    rows = (
        staged.select(
            F.col(ROW).alias("row"),
            key.alias("key"),
            info.alias("info"),
            ts.alias("ts"),
            F.to_json(F.struct(*(ref(c) for c in attrs))).alias("attrs"),
        )
        .repartition(tasks, "key")
        # Log order: a task's sessions fill side by side, their requests overlap.
        .sortWithinPartitions("row")
    )
    progress = where / "sent"
    settings: SinkSettings = sink.settings(
        progress=str(progress), run=run.run_id, tasks=tasks, hold_seconds=HOLD_SECONDS
    )
    hold = settings.hold_seconds or HOLD_SECONDS
    backoff: Backoff | None = None
    stats: dict[str, float] = {}
    with step(f"{dest_id}: send"):
        while True:
            shutdown.check(f"sending to {dest_id}")
            attempt = _send_attempt(rows, settings)
            _add_stats(stats, attempt)
            if not attempt["unsent"]:
                break
            # The API keeps failing: wait here, where no Spark slot is held, then send
            # what is left (progress records skip what was delivered).
            if backoff is None:  # the deadline counts from the failing request's first try
                give_up_at = time.time() - hold + retries.max_elapsed_seconds
                settings = settings.until(give_up_at)
                backoff = Backoff(retries.initial_seconds, retries.max_seconds,
                                  deadline=give_up_at)  # fmt: skip
            # Past the deadline: one last attempt at it, where the tasks give up.
            wait = backoff.wait(attempt["retry_after"])
            if wait is None:
                wait = max(0.0, give_up_at - time.time())
            log.warning("%s: %d event(s) wait for the API; sending again in %.1f s", dest_id,
                        attempt["unsent"], wait)  # fmt: skip
            run.pause(wait)
    # What was delivered and what failed, by this attempt and any earlier one of the run.
    totals = sink.outcome(str(progress))
    if totals.failed:
        frame = spark.createDataFrame([(f.row, f.error) for f in totals.failed],
                                      f"{ROW} long, {ERROR} string")  # fmt: skip
        fail_once(frame, run, dest_id, "sent", table=None, stage=Stage.SENDING)
    run.report.loaded[(dest_id, SENT_TABLE)] = totals.delivered
    log.info(
        "%s: %d event(s) in %d request(s) (mean payload %.0f bytes), %d failed, %d possible "
        "duplicate(s); by this process: %d trimmed, %d retries, %d skipped as sent before, "
        "at most %d event bytes held by a task", dest_id, totals.delivered, totals.requests,
        totals.payload_bytes / max(totals.requests, 1), len(totals.failed),
        totals.possible_duplicates, stats.get("trimmed", 0), stats.get("retries", 0),
        stats.get("already_sent", 0), stats.get("peak_buffered_bytes", 0),
    )  # fmt: skip
    run.state.record(target.segments, dest_id, SENT_TABLE, ok=True, rows=totals.delivered,
                     run_id=run.run_id)  # fmt: skip


HOLD_SECONDS = 5.0
"""How long a Spark task retries a failing request before it hands the session back to
the driver, which waits without holding a slot (others' jobs need the cores)."""


_PEAKS = frozenset({"peak_buffered_bytes", "retry_after"})
"""Stats whose total over tasks and attempts is the largest, not the sum."""


def _send_attempt(rows: DataFrame, settings: SinkSettings) -> dict[str, float]:
    """One Spark job delivering ``rows``; the stats of its tasks, added up."""
    import orjson

    outputs = rows.mapInArrow(settings.deliver, "stats string").collect()
    total: dict[str, float] = {}
    for output in outputs:
        _add_stats(total, orjson.loads(output["stats"]))
    return total


def _add_stats(total: dict[str, float], more: dict[str, float]) -> None:
    for name, value in more.items():
        before = total.get(name, 0)
        total[name] = max(before, value) if name in _PEAKS else before + value


def _group_column(field: str) -> str:
    """A ``group_by`` entry as its flattened column: ``a.b`` -> ``a_b``."""
    return column_name(tuple(field.split(".")))
