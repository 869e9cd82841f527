"""Failed events: the EventError records of a run's steps, written once per run to
``failed/``."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pyspark.sql import functions as F

from eventpipe.events import Stage, event_error_line, utc_now
from eventpipe.files import append_file, write_file
from eventpipe.log.writers import PIPELINE_WRITER
from eventpipe.paths import DataLayout
from eventpipe.processing.batch.run import COUNTS, RunContext
from eventpipe.reserved import (
    CORRUPT,
    DAY,
    ERROR,
    FILE,
    RAW,
    ROW,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger("eventpipe.processing")


def fail_once(
    frame: DataFrame, run: RunContext, dest_id: str, what: str, *, table: str | None, stage: Stage
) -> None:
    """Write the failed events of ``frame`` (with their ERROR) to the destination's
    failed/ file once per run (``what`` names the write), and count them."""
    marker = run.layout.tmp / run.run_id / f"dst={dest_id}" / f"failed.{what}.done"
    count = once(marker, lambda: _write_failed(frame, run, dest_id, table=table, stage=stage))
    with COUNTS:
        run.report.failed[dest_id] += count


def once(marker: Path, write: Callable[[], int]) -> int:
    """``write()`` (which appends failed events and returns how many) once per run: a
    resumed run finds ``marker`` and does not append the same EventErrors again. (A crash
    between the append and the marker still repeats them: a window of one file write.)"""
    if marker.exists():
        return int(marker.read_text())
    count = write()
    write_file(marker, str(count))
    return count


BROADCAST_FAILED = 50_000
"""Failed rows of one write up to which their (row id, error) pairs are broadcast to the
join that finds their events (about 100 bytes each)."""


def _write_failed(
    frame: DataFrame, run: RunContext, dest_id: str, *, table: str | None, stage: Stage
) -> int:
    """Append each row's original event as an EventError line to the destination's
    failed/ file (a reprocess: to its own, :func:`reprocess_failures`); returns the count."""
    import orjson

    when = utc_now()
    failing = frame.select(ROW, ERROR)
    # Usually none, or a few: found first, they are the side of the join Spark broadcasts.
    # Left to its estimates, Spark broadcast the originals (all the batch's events as
    # JSON) whenever their Parquet was small on disk, and ran out of memory at 1M events.
    found = failing.limit(BROADCAST_FAILED + 1).collect()
    if not found:
        return 0
    originals = run.originals
    if len(found) <= BROADCAST_FAILED:
        failing = F.broadcast(frame.sparkSession.createDataFrame(found, failing.schema))
    else:  # a mass failure: a sort-merge join, nothing broadcast
        originals = originals.hint("merge")
    with_originals = failing.join(originals, ROW).select(RAW, ERROR, DAY)
    lines = []
    for row in with_originals.toLocalIterator():
        key = orjson.loads(row[0]).get("api_key")
        # The event's JSON as Spark wrote it, not parsed again: orjson would read an
        # integer beyond 64 bits as a float, and a replay would load it rounded.
        lines.append(event_error_line(
            event=orjson.Fragment(row[0]), error=row[1], stage=stage, when=when,
            destination=dest_id, table=table, api_key=key if isinstance(key, str) else None,
            day=row[2],
        ))  # fmt: skip
    if lines:
        failed = (
            reprocess_failures(run.layout, run.run_id, dest_id)
            if run.reprocessing
            else run.layout.failed_destination(dest_id)
        )
        append_failed(failed, b"".join(lines))
    return len(lines)


def reprocess_failures(layout: DataLayout, run_id: str, dest_id: str) -> Path:
    """Where a reprocess run writes its failed events: they replace the failed/ records
    of its days when its rows are swapped in, not before."""
    return layout.tmp / run_id / f"failed.dst={dest_id}.log"


def fail_corrupt(raw: DataFrame, layout: DataLayout) -> int:
    """Lines Spark could not parse: EventErrors in failed/failed.tok=<key>|w=pipeline.log,
    raw kept."""
    from pyspark.sql import functions as F

    from eventpipe.paths import SegmentName

    rows = raw.filter(F.col(CORRUPT).isNotNull()).select(CORRUPT, FILE)
    by_key: dict[str, list[bytes]] = {}
    when = utc_now()
    for row in rows.toLocalIterator():
        parsed = SegmentName.parse(os.path.basename(row[FILE]))
        key = parsed.key_id if parsed else "unknown"
        by_key.setdefault(key, []).append(
            event_error_line(
                event=None, error="line is not a JSON object", stage=Stage.PROCESSING,
                when=when, api_key=key, raw=row[CORRUPT],
            )
        )  # fmt: skip
    for key, lines in by_key.items():
        append_failed(layout.failed_receiving(key, PIPELINE_WRITER), b"".join(lines))
    return sum(len(lines) for lines in by_key.values())


def append_failed(path: Path, data: bytes) -> None:
    with COUNTS:  # one append at a time from the run's threads
        append_file(path, data)
