"""The live view's tail of the log: the events written since it started, as they were
stored (enriched), read from the segments' files (log/tail.py's identities survive a
seal). The collector is never asked for anything: the console reads what it wrote.

At high rates only a sample is read: from each segment at most :data:`READ_BYTES` a
poll (the newest lines), and of those at most the configured events per second shown,
spread evenly; what was passed over is counted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from eventpipe.log.tail import read_lines, segments
from eventpipe.paths import DataLayout

READ_BYTES = 256 * 1024
"""Bytes read from one segment in one poll at most (the newest whole lines of them)."""


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
    """The log's new lines, poll by poll, from where it stood when made."""

    def __init__(self, layout: DataLayout) -> None:
        self.layout = layout
        self.offsets = {s.identity: s.end for s in segments(layout)}

    def poll(self, most: int, filters: Filters) -> Polled:
        """The events written since the last poll: at most ``most`` of those ``filters``
        keeps, spread over them."""
        lines: list[bytes] = []
        passed = 0
        for segment in segments(self.layout):
            start = self.offsets.get(segment.identity, 0)  # a new segment: from its start
            self.offsets[segment.identity] = segment.end
            if segment.end <= start:
                continue
            if segment.end - start > READ_BYTES:  # a sample: the newest lines only
                skipped_from, start = start, _line_start(segment.path, segment.end - READ_BYTES)
                passed += _count(segment.path, skipped_from, start)
            try:
                lines.extend(read_lines(segment.path, start, segment.end))
            except FileNotFoundError:  # archived meanwhile
                continue
        kept: list[tuple[bytes, dict[str, Any]]] = []
        for line in lines:
            try:
                event = orjson.loads(line)
            except orjson.JSONDecodeError:
                passed += 1
                continue
            if isinstance(event, dict) and filters.keep(line, event):
                kept.append((line, event))
            else:
                passed += 1
        if len(kept) > most:
            step = len(kept) / most
            chosen = [kept[int(i * step)] for i in range(most)]
            passed += len(kept) - most
            kept = chosen
        return Polled([event for _, event in kept], passed)


def _line_start(path: Any, offset: int) -> int:
    """The start of the first whole line at or after ``offset``."""
    with open(path, "rb") as f:
        f.seek(max(0, offset - 1))
        f.readline()  # the rest of the line ``offset`` is in (none if it starts one)
        return f.tell()


def _count(path: Any, start: int, end: int) -> int:
    from eventpipe.log.tail import count_lines

    try:
        return count_lines(path, start, end)
    except FileNotFoundError:
        return 0
