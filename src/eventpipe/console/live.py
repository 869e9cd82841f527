"""The live view's tail of the log: the events written since it started, as they were
stored (enriched), read from the segments' files (log/tail.py's identities survive a
seal). The collector is never asked for anything: the console reads what it wrote.

At high rates only a sample is read: from each segment at most :data:`READ_BYTES` a
poll (the newest lines), and of those at most the configured events per second shown,
spread evenly; only the lines shown (and those a filter turned down) are parsed, and
what was passed over is counted (the lines not read, estimated from the length of those
read). A sealed segment read to its end is not opened again.

Beside each event as stored, the live view shows it as its client sent it where the
collector kept it so (:class:`Received`, collector/received.py: a sample, while a live
view is open); the events of that sample are shown first when the view samples."""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from eventpipe.archive.files import event_id
from eventpipe.events import stored_event_id
from eventpipe.log.tail import complete_end
from eventpipe.paths import DataLayout

READ_BYTES = 256 * 1024
"""Bytes read from one segment in one poll at most (the newest whole lines of them)."""
RECEIVED_KEPT = 5_000
"""Events as received a live view keeps at most (the newest): a few minutes of the
collector's sample, which it looks up only for the events it shows as they arrive."""


@dataclass(frozen=True)
class Filters:
    """What the live view shows: events of a key, of a type, of a source, whose stored
    text contains a string (each: absent, any)."""

    key: str | None = None
    event_type: str | None = None
    source: str | None = None
    text: str | None = None

    def keep(self, line: bytes, event: dict[str, Any]) -> bool:
        if self.key and event.get("api_key") != self.key:
            return False
        if self.event_type and event.get("event_type") != self.event_type:
            return False
        if self.source and event.get("src") != self.source:
            return False
        return not self.text or self.text.encode() in line


@dataclass(frozen=True)
class Polled:
    events: list[dict[str, Any]]
    passed_over: int
    """Lines written since the last poll that are not shown (the sample, or filtered)."""


class LiveTail:
    """The log's new lines, poll by poll, from where it stood when made.

    A segment is known by its inode, which its seal (a rename) keeps; only a segment that
    grew since the last poll is read (one stat each), so that a log of many sealed
    segments costs the console nothing while they do not change. A segment smaller than
    where it was read to is a new file on a reused inode: read from its start."""

    def __init__(self, layout: DataLayout) -> None:
        self.layout = layout
        self.offsets: dict[int, int] = {}
        self.read_whole: set[Path] = set()
        """Sealed segments read to their end: they never grow again."""
        for path in [*layout.sealed_segments(), *layout.active_segments()]:
            with contextlib.suppress(FileNotFoundError):
                self.offsets[path.stat().st_ino] = complete_end(path)

    def poll(self, most: int, filters: Filters, preferred: Collection[str] = ()) -> Polled:
        """The events written since the last poll: at most ``most`` of those ``filters``
        keeps, those whose id is ``preferred`` first, then spread over the rest."""
        lines: list[bytes] = []
        passed = 0
        sealed = self.layout.sealed_segments()
        sealed_set = set(sealed)
        self.read_whole.intersection_update(sealed_set)  # archived ones: forgotten
        for path in [*sealed, *self.layout.active_segments()]:
            if path in self.read_whole:
                continue
            try:
                found = self._new_lines(path, sealed=path in sealed_set)
            except FileNotFoundError:  # sealed or archived meanwhile: next poll
                continue
            if found is not None:
                lines.extend(found[0])
                passed += found[1]
        shown: list[tuple[int, dict[str, Any]]] = []
        first = (
            [i for i, line in enumerate(lines) if event_id(line) in preferred] if preferred else []
        )
        picked = set(first)
        rest = (i for i in _spread(len(lines), most) if i not in picked)
        for index in itertools.chain(first, rest):
            if len(shown) == most:
                break
            try:
                event = orjson.loads(lines[index])
            except orjson.JSONDecodeError:
                continue
            if isinstance(event, dict) and filters.keep(lines[index], event):
                shown.append((index, event))
        passed += len(lines) - len(shown)
        return Polled([event for _, event in sorted(shown, key=lambda each: each[0])], passed)

    def _new_lines(self, path: Path, *, sealed: bool) -> tuple[list[bytes], int] | None:
        """The whole lines ``path`` got since the last poll (at most READ_BYTES of the
        newest), and about how many lines before them were passed over."""
        with path.open("rb") as f:
            grown = _read_on(f, self.offsets, READ_BYTES)
        if grown is None:
            if sealed:
                self.read_whole.add(path)
            return None
        start, first, chunk = grown
        if not chunk:
            return None  # no whole line yet
        lines = [line for line in chunk.split(b"\n") if line.strip()]
        passed = 0
        if first > start:  # a sample: the first line read is a part of one
            lines = lines[1:]
            average = len(chunk) / max(len(lines), 1)
            passed = round((first - start) / average) + 1
        return lines, passed


def _read_on(
    f: BinaryIO, read_to: dict[int, int], most: int | None = None
) -> tuple[int, int, bytes] | None:
    """What the open file ``f`` got since it was read to (``read_to``, by inode; a file
    smaller than that is a new one on a reused inode, read from its start), up to its
    last whole line and at most its newest ``most`` bytes: where it had been read to,
    where this read began, and the bytes (empty: no whole line yet); None: it did not
    grow. ``read_to`` moves on to the end of the bytes."""
    stat = os.fstat(f.fileno())
    start = read_to.get(stat.st_ino, 0)
    if stat.st_size < start:
        start = 0
    if stat.st_size == start:
        return None
    first = start if most is None else max(start, stat.st_size - most)
    f.seek(first)
    chunk = f.read(stat.st_size - first)
    end = chunk.rfind(b"\n") + 1
    if end:
        read_to[stat.st_ino] = first + end
    return start, first, chunk[:end]


def _spread(count: int, most: int) -> Iterator[int]:
    """Every index below ``count``, in an order whose first ``most`` are spread evenly
    over them (then those between, and so on): a sample read first, and more of it only
    as far as a filter turns lines down."""
    step = max(1, count // max(most, 1))
    for offset in range(step):
        yield from range(offset, count, step)


class Received:
    """The collector's sample of events as received (collector/received.py), by event
    id: each file read on from where it was read to (a file moved aside keeps its inode,
    a new one is read from its start), the newest :data:`RECEIVED_KEPT` ids kept. Marks
    the live view open as it reads."""

    def __init__(self, layout: DataLayout) -> None:
        self.layout = layout
        self._read_to: dict[int, int] = {}
        """Per file (inode): the bytes read, up to its last whole line."""
        self._by_id: dict[str, Any] = {}

    def refresh(self, *, watch: bool = True) -> None:
        """Mark a live view open (``watch``), and read what the sample's files got."""
        mark = self.layout.received_watching
        if watch:
            with contextlib.suppress(OSError):
                mark.parent.mkdir(parents=True, exist_ok=True)
                mark.touch()
        inodes = set()
        for path in self.layout.received_files():  # the older of each worker first
            with contextlib.suppress(OSError), path.open("rb") as f:
                inodes.add(os.fstat(f.fileno()).st_ino)
                grown = _read_on(f, self._read_to)
                if grown is not None:
                    self._add(grown[2])
        self._read_to = {ino: at for ino, at in self._read_to.items() if ino in inodes}

    def _add(self, lines: bytes) -> None:
        for line in lines.splitlines():
            with contextlib.suppress(orjson.JSONDecodeError):
                record = orjson.loads(line)
                if isinstance(record, dict) and isinstance(record.get("event_id"), str):
                    self._by_id.pop(record["event_id"], None)  # the newest last
                    self._by_id[record["event_id"]] = record.get("received")
        for oldest in list(itertools.islice(self._by_id, max(0, len(self._by_id) - RECEIVED_KEPT))):
            del self._by_id[oldest]

    def ids(self) -> Collection[str]:
        return self._by_id.keys()

    def of(self, event: dict[str, Any]) -> tuple[str, Any] | None:
        """The event's id and its form as received, if the sample holds it."""
        found = stored_event_id(event)
        if found is not None and found in self._by_id:
            return found, self._by_id[found]
        return None
