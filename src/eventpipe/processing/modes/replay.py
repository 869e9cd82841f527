"""``eventpipe replay failed``: failed/ events of one destination through the pipeline
again."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eventpipe.config import Config
from eventpipe.events import failed_event_id, utc_now
from eventpipe.files import json_lines, move, replacing
from eventpipe.processing.batch.archiving import compress
from eventpipe.processing.batch.isolation import Isolation, caused_by_data
from eventpipe.processing.batch.job import run_job
from eventpipe.processing.batch.run import Job, RunReport
from eventpipe.processing.runtime.pipeline import Runtime
from eventpipe.reserved import CHECKED

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("eventpipe.processing")

SELECTED = "-selected"
"""Ends the stamp of a replay of a selection (its file holds the chosen records only)."""


@dataclass(frozen=True)
class Selection:
    """Which failed records a replay takes: those of ``reason`` (the record's error, as
    the console groups them) and of ``event_ids`` (their ``eventn_ctx.event_id``); a
    criterion not given takes every record."""

    reason: str | None = None
    event_ids: Collection[str] = ()

    def __bool__(self) -> bool:
        return self.reason is not None or bool(self.event_ids)

    def takes(self, record: Any) -> bool:
        if not isinstance(record, dict):
            return False
        if self.reason is not None and str(record.get("error") or "") != self.reason:
            return False
        if self.event_ids:
            return failed_event_id(record) in self.event_ids
        return True


def replay_failed(
    config: Config, spark: SparkSession, dest_id: str, selection: Selection | None = None
) -> RunReport | None:
    """Send the failed events of one destination through the pipeline again.

    ``failed/failed.dst=<id>.log`` is first renamed to ``failed/replay/`` (new failures
    then go to a fresh file), its events go through every step for this destination only,
    what fails again is written to ``failed.dst=<id>.log`` with its new error, and the
    replayed file is archived as ``archive/YYYY-MM-DD/replayed.dst=<id>.<stamp>.log.lz4``.
    An interrupted replay resumes with the same file and run id, and loads nothing twice
    (loads are idempotent per run, destination and table). None: nothing to replay.

    ``selection``: only the records it takes (:class:`Selection`) are replayed; the rest
    stay in ``failed.dst=<id>.log``. The chosen records are written to the replay's file
    first, then taken out of the failed file (again on every resume, so a crash between
    the two never leaves a record in both once the replay has run).
    """
    config.destination(dest_id)  # else a ConfigError naming the configured ones
    runtime = Runtime(config, spark).only([dest_id])
    with runtime.pipeline_lock():
        return _replay(runtime, dest_id, selection or Selection())


def _replay(runtime: Runtime, dest_id: str, selection: Selection) -> RunReport | None:
    layout = runtime.config.layout
    replay_dir = layout.failed / "replay"
    source = layout.failed_destination(dest_id)
    pending = sorted(replay_dir.glob(f"replaying.dst={dest_id}.*.log"))
    if not pending:
        if not source.exists() or source.stat().st_size == 0:
            return None
        stamp = utc_now().strftime("%Y-%m-%dT%H-%M-%S.%f")
        if selection:
            pending = [replay_dir / f"replaying.dst={dest_id}.{stamp}{SELECTED}.log"]
            if not _select(source, pending[0], selection):
                return None
        else:
            pending = [replay_dir / f"replaying.dst={dest_id}.{stamp}.log"]
            move(source, pending[0])
    replaying = pending[0]
    if replaying.name.endswith(f"{SELECTED}.log"):
        _take_out(source, replaying)
    stamp = replaying.name.removeprefix(f"replaying.dst={dest_id}.").removesuffix(".log")
    run_id = f"replay-{dest_id}-{stamp}"
    report = RunReport(run_id, (replaying.name,), resumed=(layout.tmp / run_id).exists())
    events_file = layout.tmp / run_id / "events.log"
    if not events_file.exists():
        _extract_events(replaying, events_file)
    try:
        run_job(runtime, Job(run_id, {dest_id: (replaying.name,)}, [str(events_file)], report))
    except Exception as exc:
        if not caused_by_data(exc):
            raise
        # Raised the first time (the replay resumes when run again); then isolated.
        isolation = Isolation(runtime, run_id, dest_id, report, run_job)
        if isolation.after(exc, (replaying.name,), [events_file]):
            raise
    archived = layout.archive / stamp[:10] / f"replayed.dst={dest_id}.{stamp}.log.lz4"
    compress([replaying], archived)
    report.archived = [archived]
    shutil.rmtree(layout.tmp / run_id, ignore_errors=True)
    return report


def _select(source: Path, out: Path, selection: Selection) -> bool:
    """The records of ``source`` that ``selection`` takes, written to ``out`` (whether
    there were any)."""
    chosen = [line for line, record in json_lines(source) if selection.takes(record)]
    if not chosen:
        return False
    with replacing(out) as sink:
        sink.writelines(chosen)
    return True


def _take_out(source: Path, replaying: Path) -> None:
    """``source`` without the records a replay of a selection took (``replaying``'s)."""
    taken = set(replaying.read_bytes().splitlines())
    if not source.exists():
        return
    kept = [line for line in source.read_bytes().splitlines(keepends=True)
            if line.rstrip(b"\n") not in taken]  # fmt: skip
    with replacing(source) as sink:
        sink.writelines(kept)


def _extract_events(failed_file: Path, out: Path) -> None:
    """The ``event`` of each EventError line, one JSON object per line. Lines without one
    (edited by hand) are counted in the log and stay in the archived failed file."""
    import orjson

    unusable = 0
    with failed_file.open("rb") as source, replacing(out) as sink:
        for line in source:
            try:
                event = orjson.loads(line).get("event")
            except (orjson.JSONDecodeError, AttributeError):
                event = None
            if isinstance(event, dict):
                event.pop(CHECKED, None)  # a mark stands for its line as it was: checked again
                sink.write(orjson.dumps(event, option=orjson.OPT_APPEND_NEWLINE))
            elif line.strip():
                unusable += 1
    if unusable:
        log.warning("%s: %d line(s) hold no event to replay; kept in the archived file",
                    failed_file.name, unusable)  # fmt: skip
