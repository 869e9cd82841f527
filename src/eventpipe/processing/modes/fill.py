"""Filling a destination from the archive (``eventpipe log fill``): a destination added
later gets what was archived before it existed, then goes on with the log as usual.

The archived segments of the keys it takes (``only_keys``; all of them without), those
it has not handled, are run through the job for it alone, in log order, in runs of
``SEGMENTS_PER_RUN``. A run's id comes from its segments, so a fill cut short resumes
with the same batch ids and loads nothing twice; each segment is recorded handled by
the destination, as a normal run records it. After a source's compaction
(log/compaction.py) this is the source's current state, then what followed.

A destination that has already handled a segment newer than the first one to fill is
refused: changes applied out of their order would leave older rows (docs/cdc.md). Fill
a new destination before the pipeline runs it.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
from collections.abc import Callable
from typing import TYPE_CHECKING

from eventpipe.archive.files import ArchivedSegment, day_dirs, segments_of_day
from eventpipe.config import Config
from eventpipe.errors import ConfigError
from eventpipe.log.inspect import file_order
from eventpipe.paths import SegmentName
from eventpipe.processing.batch.job import run_job
from eventpipe.processing.batch.run import Job, RunReport
from eventpipe.processing.modes.reprocess import Source, spark_inputs
from eventpipe.processing.runtime import shutdown
from eventpipe.processing.runtime.pipeline import Runtime

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("eventpipe.processing")

SEGMENTS_PER_RUN = 100


def archived_for(config: Config, destination_id: str) -> list[ArchivedSegment]:
    """The archived segments of the keys ``destination_id`` takes, in log order."""
    keys = config.destination(destination_id).only_keys
    found = []
    for day in day_dirs(config.layout):
        for segment in segments_of_day(day):
            name = SegmentName.parse(segment.segment_file)
            if name is not None and (keys is None or name.key_id in keys):
                found.append(segment)
    return sorted(found, key=lambda s: file_order(s.segment_file))


def fill(
    spark: SparkSession,
    config: Config,
    destination_id: str,
    progress: Callable[[str], None] = log.info,
) -> list[RunReport]:
    """Run ``destination_id`` over the archived segments it has not handled (the
    module's docstring); the reports of the runs."""
    dest = config.destination(destination_id)
    if dest.mode != "batch":
        raise ConfigError(f"destination {destination_id!r} is in mode stream: fill a batch "
                          "destination", fix="fill it in mode batch, then switch")  # fmt: skip
    runtime = Runtime(config, spark).only([destination_id])
    with runtime.pipeline_lock():
        state = runtime.state
        archived = archived_for(config, destination_id)
        done = state.done_by(destination_id, [s.segment_file for s in archived])
        todo = [s for s in archived if s.segment_file not in done]
        if not todo:
            return []
        first = file_order(todo[0].segment_file)
        sealed = [p.name for p in config.layout.sealed_segments()]
        newer = sorted(
            name for name in state.done_by(destination_id, sealed) | done
            if file_order(name) > first
        )  # fmt: skip
        if newer:
            raise ConfigError(
                f"destination {destination_id!r} has handled {newer[-1]}, newer than the "
                f"archived {todo[0].segment_file} it has not: filling it now would apply "
                "older events after newer ones",
                fix="fill a new destination before the pipeline runs it (or use a new one)",
            )
        reports = []
        for start in range(0, len(todo), SEGMENTS_PER_RUN):
            shutdown.check(f"the fill of {destination_id}")
            chunk = todo[start : start + SEGMENTS_PER_RUN]
            names = tuple(s.segment_file for s in chunk)
            digest = hashlib.sha1("\n".join(names).encode()).hexdigest()[:16]
            run_id = f"fill-{destination_id}-{digest}"
            sources = [Source(s.segment_file, s.data, "") for s in chunk]
            paths = [str(p) for p in spark_inputs(config, run_id, sources)]
            report = RunReport(run_id, names, (config.layout.tmp / run_id).exists())
            run_job(runtime, Job(run_id, {destination_id: names}, paths, report))
            shutil.rmtree(config.layout.tmp / run_id, ignore_errors=True)
            reports.append(report)
            progress(f"{destination_id}: {start + len(chunk)} of {len(todo)} archived "
                     f"segment(s), {sum(report.loaded.values()):,} row(s) in this run")  # fmt: skip
        return reports
