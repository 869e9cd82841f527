"""The HTTP sink's progress records: each request's outcome, appended and fsynced the
moment it is known, so that a task that starts again (a resumed run, a Spark task retry)
skips what an earlier attempt handled (delivery.py sends; processing/batch/send.py
adds the records of every attempt up)."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson


@dataclass(frozen=True)
class Failed:
    """An event the API refused (or whose retries ran out), by its row id."""

    row: int
    error: str


class _Sent(Protocol):
    """An event of a request, as the records know it: by its row id."""

    @property
    def row(self) -> int: ...


@dataclass
class Totals:
    """What a run's progress records add up to, over every attempt."""

    delivered: int = 0
    requests: int = 0
    payload_bytes: int = 0
    possible_duplicates: int = 0
    failed: list[Failed] = field(default_factory=list)


class Progress:
    """The outcome of each request of a run, one JSON line per request (or per piece of
    a split one), appended and fsynced the moment it is known: the session key, the last
    row it covered, and what was delivered or failed (with the answer). Each task attempt
    writes a file of its own in a directory the run's tasks share (under the run's tmp/,
    where its staged rows are too).

    A session's requests cover its rows in order, one at a time, so the last row of its
    records is how far it got. Before each request a ``sending`` line is written: a
    crash leaves at most one request per session without an outcome, and those events,
    sent again by the next attempt, are counted as possible duplicates (the API may have
    stored them before the crash)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self._file: Any = None
        self._lock = threading.Lock()

    def sending(self, key: str, events: Sequence[_Sent]) -> None:
        """A request is about to be sent: if no outcome follows (a crash), the API may
        have stored its events, and they are counted as possible duplicates."""
        self._append({"key": key, "sending": len(events)})

    def record(self, key: str, events: Sequence[_Sent], *, delivered: bool, error: str = "",
               payload_bytes: int = 0, duplicates: int = 0) -> None:  # fmt: skip
        """The outcome of a request: its events delivered, or failed with ``error``;
        ``duplicates``: events the API may have stored by an earlier try that timed out."""
        entry: dict[str, Any] = {"key": key, "last": events[-1].row, "duplicates": duplicates}
        if delivered:
            entry.update(delivered=len(events), bytes=payload_bytes)
        else:
            entry.update(failed=[e.row for e in events], error=error)
        self._append(entry)

    def waiting(self, key: str, events: Sequence[_Sent], *, duplicates: int = 0) -> None:
        """A request handed back: answered (not stored, unless a try timed out), but not
        done; its events are sent again by the next attempt."""
        self._append({"key": key, "waiting": len(events), "duplicates": duplicates})

    def _append(self, entry: dict[str, Any]) -> None:
        line = orjson.dumps(entry, option=orjson.OPT_APPEND_NEWLINE)
        with self._lock:
            if self._file is None:
                self.directory.mkdir(parents=True, exist_ok=True)
                self._file = (self.directory / f"{uuid.uuid4().hex}.jsonl").open("ab")
            self._file.write(line)
            self._file.flush()
            os.fsync(self._file.fileno())

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def _files(self) -> Iterator[list[dict[str, Any]]]:
        """The records of each attempt's file."""
        if not self.directory.is_dir():
            return
        for path in sorted(self.directory.glob("*.jsonl")):
            records = []
            with path.open("rb") as lines:
                for line in lines:
                    try:
                        records.append(orjson.loads(line))
                    except orjson.JSONDecodeError:
                        break  # torn by a crash: the last line, its request is sent again
            yield records

    def done(self) -> dict[str, int]:
        """The last row handled per session key."""
        last: dict[str, int] = {}
        for records in self._files():
            for record in records:
                if "last" in record:
                    last[record["key"]] = max(last.get(record["key"], -1), record["last"])
        return last

    def totals(self) -> Totals:
        totals = Totals()
        for records in self._files():
            unanswered: dict[str, int] = {}  # per session: events of a request in flight
            for record in records:
                if "sending" in record:
                    unanswered[record["key"]] = record["sending"]
                    continue
                unanswered.pop(record["key"], None)
                totals.possible_duplicates += record["duplicates"]
                if "failed" in record:
                    totals.failed += [Failed(row, record["error"]) for row in record["failed"]]
                elif "delivered" in record:
                    totals.delivered += record["delivered"]
                    totals.requests += 1
                    totals.payload_bytes += record["bytes"]
            # The attempt ended with these in flight; a later one sent them again.
            totals.possible_duplicates += sum(unanswered.values())
        return totals
