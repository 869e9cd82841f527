"""Stepping through one destination's progress through the log (``eventpipe log``).

* ``step``: process the destination's next pending event alone, through the whole
  pipeline, as a run of one line (``<segment>@<line>+1``, state.store.Part). The
  destination's cursor in the segment then moves past it; the next run takes the rest
  of the segment.
* ``acknowledge``: mark the events up to a position handled without loading them (whole
  segments, and the first lines of the last one).

Both refuse a destination with an unfinished run of its own in the way: that run holds
a batch id and may have loaded part of its tables, so its events are completed by
``eventpipe process`` or skipped whole by ``log ack``, never taken apart.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from eventpipe.errors import ConfigError, EventpipeError
from eventpipe.log.inspect import Position, segment_file, segment_id
from eventpipe.paths import count_lines
from eventpipe.processing.batch.archiving import archive_segments
from eventpipe.processing.batch.job import close_run, execute_run
from eventpipe.processing.batch.run import (
    DestinationsFailingError,
    RunReport,
    batch_destinations,
)
from eventpipe.processing.batch.version import code_version
from eventpipe.processing.runtime.pipeline import Runtime
from eventpipe.state.store import ALL_TABLES, Part, Run, StateStore

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from eventpipe.config import Config


class UnfinishedRunError(EventpipeError):
    """The destination has an unfinished run over the events asked for."""

    name = "unfinished_run"


@dataclass(frozen=True)
class Step:
    position: Position
    line: bytes
    report: RunReport


def _batch_destination(config: Config, dest_id: str) -> list[str]:
    batch = list(batch_destinations(config))
    config.destination(dest_id)
    if dest_id not in batch:
        raise ConfigError(
            f"{dest_id} is in stream mode: its progress is its stream's checkpoint",
            fix="log step and log ack work on batch destinations",
        )
    return batch


def _open_runs(state: StateStore, dest_id: str, batch: list[str]) -> list[tuple[Run, list[str]]]:
    """The unfinished runs ``dest_id`` has not finished, with its entries in each."""
    found = []
    for run in state.unfinished_runs():
        entries = list(run.segments_of(dest_id, batch))
        if entries and not state.table_ok(entries, dest_id, ALL_TABLES):
            found.append((run, entries))
    return found


def step(config: Config, spark: SparkSession, dest_id: str) -> Step | None:
    """Process ``dest_id``'s next pending event alone; None: nothing is pending."""
    layout = config.layout
    batch = _batch_destination(config, dest_id)
    runtime = Runtime(config, spark)
    with runtime.pipeline_lock():
        state = runtime.state
        if runs := _open_runs(state, dest_id, batch):
            run, entries = runs[0]
            raise UnfinishedRunError(
                f"{dest_id} has not finished run {run.run_id} ({len(entries)} segment(s), "
                f"{Part.parse(entries[0]).segment} first)",
                fix="`eventpipe process --once` completes it; `eventpipe log ack "
                f"--destination {dest_id} --to <its last segment>` skips it",
            )
        sealed = [p.name for p in layout.sealed_segments()]
        done = state.done_by(dest_id, sealed)
        cursors = state.cursors(dest_id)
        for name in (s for s in sealed if s not in done):
            start = cursors.get(name, 0)
            with (layout.incoming / name).open("rb") as lines:
                line = next(itertools.islice(lines, start, None), None)
            if line is None:  # every line handled (or an empty segment)
                state.advance(dest_id, name, start, done=True, run_id="step")
                continue
            entry = str(Part(name, start, 1))
            plan: dict[str, tuple[str, ...]] = {dest_id: (entry,)}
            failing: dict[str, str] = {}
            run = state.begin_run([entry], "step", plan, {dest_id: code_version(config, dest_id)})
            report = execute_run(runtime, run, plan, failing)
            close_run(layout, state, run, plan, failing)
            if failing:
                raise DestinationsFailingError(f"{dest_id}: {failing[dest_id]}", reports=[report])
            report.archived = archive_segments(config, state.segments_done([name], batch))
            return Step(Position(segment_id(name), start), line.rstrip(b"\n"), report)
        return None


def acknowledge(config: Config, dest_id: str, to: Position) -> list[str]:
    """Mark ``dest_id``'s events up to ``to`` (included) handled without loading them;
    the segments (or ``segment:line`` for the last one, when partly) marked."""
    layout = config.layout
    batch = _batch_destination(config, dest_id)
    runtime = Runtime(config)
    with runtime.pipeline_lock():
        state = runtime.state
        target = segment_file(to.segment)
        sealed = [p.name for p in layout.sealed_segments()]
        if target not in sealed:
            raise ConfigError(
                f"no segment {to.segment} waiting in incoming/ (archived segments are "
                "handled by every destination)",
                fix="eventpipe log segments lists them",
            )
        covered = sealed[: sealed.index(target) + 1]
        total = count_lines(layout.incoming / target)
        whole = to.line + 1 >= total
        done = state.done_by(dest_id, covered)
        for run, entries in _open_runs(state, dest_id, batch):
            inside = [Part.parse(e).segment in covered for e in entries]
            partly = Part.parse(entries[-1]).segment == target and not whole
            if any(inside) and (not all(inside) or partly):
                raise UnfinishedRunError(
                    f"{dest_id}'s unfinished run {run.run_id} holds segments "
                    f"{Part.parse(entries[0]).segment} to {Part.parse(entries[-1]).segment}: "
                    "its events are acknowledged all together or not at all",
                    fix="--to its last segment, or a position before its first",
                )
            if all(inside):  # the whole run, for this destination
                state.record(entries, dest_id, ALL_TABLES, ok=True, run_id="ack")
                close_run(layout, state, run, run.plan_for(batch), {})
        marked = [s for s in (covered if whole else covered[:-1]) if s not in done]
        state.acknowledge(dest_id, marked)
        result = [segment_id(s) for s in marked]
        if not whole and target not in done and state.cursors(dest_id).get(target, 0) <= to.line:
            state.advance(dest_id, target, to.line + 1, done=False, run_id="ack")
            result.append(str(to))
        archive_segments(config, state.segments_done(covered, batch))
        return result
