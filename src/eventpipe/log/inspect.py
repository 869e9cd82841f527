"""Looking into the log (``eventpipe log``): event positions, events by range.

A position is ``<segment>:<line>``: the sealed segment's id (its key and seal stamp, as
in ``incoming.tok=<key>-<stamp>.log``) and the 0-based line in it, for example
``web-2026-11-21T10-00-00.000:15``. It is stable from the seal on, wherever the segment
is (``incoming/``, or under ``archive/``). Events of an active segment have no
stable position yet: it is renamed when sealed (``eventpipe rotate`` seals it now).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from eventpipe.archive.files import ArchivedSegment, day_dirs, segments_of_day
from eventpipe.archive.read import lines
from eventpipe.errors import ConfigError
from eventpipe.paths import DataLayout, SegmentName

_PREFIX = "incoming.tok="


@dataclass(frozen=True)
class Position:
    segment: str
    """The sealed segment's id: ``<key>-<stamp>``."""
    line: int

    def __str__(self) -> str:
        return f"{self.segment}:{self.line}"

    @classmethod
    def parse(cls, text: str) -> Position:
        """``<segment>:<line>``, or ``<segment>`` alone (its first line). A writer's
        segment has a ``|`` in its id (``web|w=host-0-...``), which a shell cuts unless
        quoted: ``@`` may stand for it."""
        text = text.replace("@w=", "|w=")
        segment, _, line = text.rpartition(":") if ":" in text else (text, "", "0")
        parsed = SegmentName.parse(f"{_PREFIX}{segment}.log")
        if parsed is None or parsed.sealed is None or not line.isdigit():
            raise ConfigError(
                f"{text!r} is not a log position",
                fix="write <segment>:<line> in single quotes, e.g. "
                "'web|w=host-0-2026-11-21T10-00-00.000:15', or with @ for | "
                "(web@w=host-0-2026-11-21T10-00-00.000:15); segments: eventpipe log segments",
            )
        return cls(segment, int(line))


@dataclass(frozen=True)
class Segment:
    id: str
    path: Path
    archived: bool

    @property
    def order(self) -> tuple[str, str, str]:
        return _order(self.id)

    def lines(self, start: int = 0) -> Iterator[tuple[int, bytes]]:
        """The segment's lines from ``start`` on, with their numbers (an archived
        segment's earlier frames are not read)."""
        if self.archived:
            yield from lines(ArchivedSegment(self.path), start)
            return
        with self.path.open("rb") as stream:
            for number, line in enumerate(stream):
                if number >= start:
                    yield number, line


def _order(segment: str) -> tuple[str, str, str]:
    """A segment id's place in the log: by seal stamp, then key, then writer."""
    parsed = SegmentName.parse(f"{_PREFIX}{segment}.log")
    if parsed is None or parsed.sealed is None:
        raise ValueError(f"{segment!r} is not a sealed segment's id")
    return parsed.sealed, parsed.key_id, parsed.writer or ""


def file_order(name: str) -> tuple[str, str, str]:
    """A sealed segment's place in the log, from its file name (``incoming.tok=...log``)."""
    return _order(segment_id(name))


def segment_id(name: str) -> str:
    """A segment's file name, ``incoming.tok=<id>.log``, -> ``<id>``."""
    return name.removeprefix(_PREFIX).removesuffix(".log")


def segment_file(segment: str) -> str:
    """A segment's id -> its file name in ``incoming/``."""
    return f"{_PREFIX}{segment}.log"


def segments(layout: DataLayout) -> list[Segment]:
    """Every sealed segment still on disk, in seal order: waiting in ``incoming/`` or
    archived (a segment being archived, in both places, is listed once)."""
    found: dict[str, Segment] = {}
    for day in day_dirs(layout):
        for archived in segments_of_day(day):
            name = segment_id(archived.segment_file)
            found[name] = Segment(name, archived.data, archived=True)
    for path in layout.sealed_segments():
        found[segment_id(path.name)] = Segment(segment_id(path.name), path, archived=False)
    return sorted(found.values(), key=lambda s: s.order)


def read(
    layout: DataLayout, start: Position, end: Position | None = None
) -> Iterator[tuple[Position, bytes]]:
    """The log's lines from ``start`` to ``end`` (both included; None: to the end of the
    log), with their positions, in log order."""
    all_segments = segments(layout)
    if start.segment not in {s.id for s in all_segments}:
        raise ConfigError(
            f"no segment {start.segment} in the log (incoming/ or archive/)",
            fix="eventpipe log segments lists them",
        )
    first = _order(start.segment)
    last = _order(end.segment) if end else None
    for segment in all_segments:
        if segment.order < first or (last is not None and segment.order > last):
            continue
        for index, line in segment.lines(start.line if segment.id == start.segment else 0):
            if end is not None and segment.id == end.segment and index > end.line:
                break
            yield Position(segment.id, index), line.rstrip(b"\n")
