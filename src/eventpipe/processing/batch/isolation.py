"""Isolation: a destination's part of a run that fails twice for a reason its events may
cause is run again in halving parts, down to the events that fail alone."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from eventpipe.errors import EventpipeError, first_line
from eventpipe.events import Stage, event_error_line, utc_now
from eventpipe.files import json_lines, write_file
from eventpipe.processing.batch.failures import append_failed, once
from eventpipe.processing.batch.halving import halve
from eventpipe.processing.batch.load import PoisonLimitError
from eventpipe.processing.batch.run import COUNTS, Job, RunReport, step
from eventpipe.processing.runtime import shutdown
from eventpipe.processing.runtime.pipeline import Runtime
from eventpipe.state.store import ALL_TABLES, StateStore

if TYPE_CHECKING:
    from eventpipe.config import Config

log = logging.getLogger("eventpipe.processing")

RunPart = Callable[[Runtime, Job], None]
"""job.run_job: what a part of an isolated run is run with."""


def caused_by_data(exc: Exception) -> bool:
    """Whether a failure of a destination's part of a run may come from the events it
    processes (Spark's analysis or a task failing, a Python error in a step), and so may
    be isolated event by event. Not: eventpipe's own classified errors (a destination
    that is down, a bad config), the disk, memory, or Spark itself gone."""
    from py4j.protocol import Py4JNetworkError

    not_data = (EventpipeError, OSError, MemoryError, Py4JNetworkError)
    return not isinstance(exc, not_data)


@dataclass(frozen=True)
class Isolation:
    """A destination's part of a run that failed for a reason its events may cause.

    The first such failure is recorded (``data-failed`` in the run's directory of the
    destination) and the destination waits, like one that is down: it may have been
    passing (an executor lost). When the same run fails so a second time, its events are
    isolated instead of failing again: the destination's lines are processed in parts,
    each a run of its own with its own schema (a part's schema has only its events'
    fields, so a field that breaks the batch breaks only its part), a failing part is
    halved down to single events, and each event that fails alone goes to failed/ with
    the error. The rest loads. Parts are runs with fixed ids (the run's and the lines'),
    so a crash during isolation repeats nothing that loaded. More failing events than
    ``max_poison_events``: the destination stops (PoisonLimitError), taken as broken.
    Stream micro-batches and replays take the same two steps (their first failure is
    raised: the query starts again from its checkpoint, the replay resumes).
    """

    runtime: Runtime
    run_id: str
    dest_id: str
    report: RunReport
    run_part: RunPart
    """How a part runs: job.run_job (given by the job, which runs its isolation)."""

    @property
    def config(self) -> Config:
        return self.runtime.config

    @property
    def state(self) -> StateStore:
        return self.runtime.state

    @property
    def root(self) -> Path:
        return self.config.layout.tmp / self.run_id / f"dst={self.dest_id}" / "isolation"

    def after(self, exc: Exception, entries: Sequence[str], files: Sequence[Path]) -> str | None:
        """Handle ``exc``, the destination's failure in this run of the plan's ``entries``,
        whose lines are in ``files`` (see the class). A first failure is recorded and
        described (the destination stops for now); None: the events were isolated."""
        error = f"{type(exc).__name__}: {first_line(exc)}"
        first_failure = self.root.parent / "data-failed"  # kept until the run is done
        if not first_failure.exists():
            write_file(first_failure, error)
            log.error("%s failed in %s (%s); tried again next time, then event by event",
                      self.dest_id, self.run_id, error)  # fmt: skip
            self.state.record(entries, self.dest_id, ALL_TABLES, ok=False, error=error[:2000],
                              run_id=self.run_id)  # fmt: skip
            return f"failed on its events' data: {error}"
        log.warning("%s failed again in %s (%s): isolating its events", self.dest_id,
                    self.run_id, error)  # fmt: skip
        with step(f"{self.dest_id}: isolate the events of {self.run_id}"):
            self._isolate(files)
        self.state.record(entries, self.dest_id, ALL_TABLES, ok=True, run_id=self.run_id)
        return None

    def _lines(self, files: Sequence[Path]) -> list[bytes]:
        """The destination's events of the run (of its keys), in order (lines that are
        not JSON objects were recorded by the run's read already)."""
        keys = self.config.destinations[self.dest_id].only_keys
        return [
            line
            for path in files
            for line, event in json_lines(path)
            if isinstance(event, dict) and (keys is None or event.get("api_key") in keys)
        ]

    def _isolate(self, files: Sequence[Path]) -> None:
        lines = self._lines(files)
        limit = self.config.destinations[self.dest_id].max_poison_events
        poisoned: list[tuple[bytes, str]] = []
        entries: list[str] = []

        def attempt(
            first: int, end: int, loaded: frozenset[str]
        ) -> tuple[str | None, frozenset[str]]:
            """``loaded``: tables the part this one was halved from loaded whole before it
            failed (they hold all its events of them: loaded again, rows would double)."""
            shutdown.check(f"isolating {self.dest_id}'s events")
            entry = f"{self.run_id}:lines={first}+{end - first}"
            entries.append(entry)
            try:
                self._run_part(lines, entry, first, end, loaded)
            except Exception as exc:
                if not caused_by_data(exc):
                    raise
                loaded |= frozenset(self.state.loaded_tables(entry, self.dest_id))
                return f"{type(exc).__name__}: {first_line(exc)}", loaded
            return None, loaded

        def failed_alone(position: int, why: str) -> None:
            poisoned.append((lines[position], why))
            if len(poisoned) > limit:
                raise PoisonLimitError(
                    f"more than {limit} events of {self.run_id} failed alone in "
                    f"{self.dest_id}, the last: {why}",
                    fix="the destination's processing fails for most events: see the "
                    "error, fix the config (or raise max_poison_events)",
                )

        none: frozenset[str] = frozenset()
        halve(0, len(lines), attempt, none, failed_alone)
        failed = once(self.root / "failed.done", lambda: self._fail(poisoned))
        self.state.forget(entries, self.dest_id)  # parts are not segments of the log
        with COUNTS:
            self.report.failed[self.dest_id] = self.report.failed.get(self.dest_id, 0) + failed
        went_on = len(lines) - len(poisoned)
        log.warning("%s: %d event(s) of %s failed alone -> failed/; the other %d went on",
                    self.dest_id, len(poisoned), self.run_id, went_on)  # fmt: skip

    def _run_part(
        self,
        lines: list[bytes],
        entry: str,
        first: int,
        end: int,
        loaded: frozenset[str],
    ) -> None:
        """Lines ``first`` to ``end`` through every step for the destination, as a run of
        their own (``entry``: its loads' batch ids are its own), but for the tables of
        ``loaded``."""
        name = entry.rsplit(":", 1)[1]
        path = self.root / f"{name}.log"
        if not path.exists():
            write_file(path, b"".join(lines[first:end]))
        for table in loaded:  # load_tables skips a table recorded ok for the entry
            self.state.record([entry], self.dest_id, table, ok=True)
        part_id = f"{self.run_id}.{name}"
        report = RunReport(part_id, (name,), resumed=False)
        self.run_part(self.runtime, Job(part_id, {self.dest_id: (entry,)}, [str(path)], report))
        shutil.rmtree(self.config.layout.tmp / part_id, ignore_errors=True)
        with COUNTS:
            for key, rows in report.loaded.items():
                self.report.loaded[key] = self.report.loaded.get(key, 0) + rows
            for found, part in ((self.report.held, report.held),
                                (self.report.broken, report.broken)):  # fmt: skip
                for what, n in part.items():
                    found[what] = found.get(what, 0) + n
            for counts, more in ((self.report.skipped, report.skipped),
                                 (self.report.filtered, report.filtered),
                                 (self.report.failed, report.failed)):  # fmt: skip
                for dest, n in more.items():
                    counts[dest] = counts.get(dest, 0) + n

    def _fail(self, poisoned: list[tuple[bytes, str]]) -> int:
        import orjson

        when = utc_now()
        lines = []
        for line, error in poisoned:
            key = orjson.loads(line).get("api_key")
            # The line as the log holds it: parsed again, an integer beyond 64 bits
            # would be rounded in the record (and in a replay).
            lines.append(event_error_line(
                event=orjson.Fragment(line.rstrip(b"\n")),
                error=f"processing failed for this event alone: {error}",
                stage=Stage.PROCESSING, when=when, destination=self.dest_id,
                api_key=key if isinstance(key, str) else None,
            ))  # fmt: skip
        if lines:
            append_failed(self.config.layout.failed_destination(self.dest_id), b"".join(lines))
        return len(lines)
