"""The archive's files: names, the index and the manifest, and event ids.

Formats (version 1; a reader refuses a version it does not know):

* index: ``{"format": 1, "segment": ..., "events": N, "frames": [[offset, size,
  raw_size, events, first, crc32, raw_crc32], ...]}``: a frame's byte offset and size in
  the ``.lz4`` file, its uncompressed size, its event count, the line number of its first
  event (0-based, as in log positions ``<segment>:<line>``), and the crc32 of its
  compressed and of its uncompressed bytes, so that verify names the damaged frame.
* ids: one little-endian uint32 per event, in line order: the crc32 of its
  ``eventn_ctx.event_id`` (0 for a line without one). 4 bytes an event, against ~60 for
  the event itself compressed; a crc32 match is confirmed on the event, so a collision
  costs one more frame read, never a wrong answer.
* manifest: the sizes, sha1 and crc32 of the compressed file and of the uncompressed
  data, the sizes and sha1 of the index and ids files, and how the file was written;
  ``days``: the UTC days of its events' ``_timestamp`` (a superset, for reprocessing to
  find a day's events without reading every file; null when some event's day cannot be
  told from its text: the file is then read for every day).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import orjson

from eventpipe.events import stored_event_id
from eventpipe.paths import DataLayout, SegmentName

FORMAT = 1
SUFFIX = ".lz4"
LEGACY_SUFFIX = ".gz"
_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_EVENT_ID = b'"event_id":"'


class ArchiveFormatError(ValueError):
    """An index or manifest that cannot be read: damaged, or of an unknown format."""


@dataclass(frozen=True)
class ArchivedSegment:
    """One archived segment's files."""

    data: Path
    """``archive/<day>/<segment file>.lz4`` (or ``.gz`` for the legacy format)."""

    @classmethod
    def of(cls, layout: DataLayout, segment_file: str) -> ArchivedSegment:
        """Where the sealed segment named ``segment_file`` is archived."""
        parsed = SegmentName.parse(segment_file)
        if parsed is None or parsed.sealed is None:
            raise ValueError(f"{segment_file!r} is not a sealed segment name")
        return cls(layout.archive / parsed.sealed[:10] / f"{segment_file}{SUFFIX}")

    @property
    def legacy(self) -> bool:
        return self.data.name.endswith(LEGACY_SUFFIX)

    @property
    def segment_file(self) -> str:
        """The segment's name in ``incoming/``."""
        return self.data.name.removesuffix(SUFFIX).removesuffix(LEGACY_SUFFIX)

    @property
    def index(self) -> Path:
        return self.data.with_name(self.data.name + ".index.json")

    @property
    def ids(self) -> Path:
        return self.data.with_name(self.data.name + ".ids")

    @property
    def manifest(self) -> Path:
        return self.data.with_name(self.data.name + ".manifest.json")

    @property
    def sidecars(self) -> tuple[Path, Path, Path]:
        return self.index, self.ids, self.manifest


@dataclass(frozen=True)
class Frame:
    offset: int
    size: int
    raw_size: int
    events: int
    first: int
    """Line number of the frame's first event in its segment."""
    crc32: int
    raw_crc32: int

    @property
    def last(self) -> int:
        return self.first + self.events - 1

    def describe(self, number: int) -> str:
        return f"frame {number} (bytes {self.offset}+{self.size}, lines {self.first}-{self.last})"


@dataclass(frozen=True)
class Index:
    segment: str
    events: int
    frames: tuple[Frame, ...]

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "format": FORMAT,
                "segment": self.segment,
                "events": self.events,
                "fields": ["offset", "size", "raw_size", "events", "first", "crc32", "raw_crc32"],
                "frames": [
                    [f.offset, f.size, f.raw_size, f.events, f.first, f.crc32, f.raw_crc32]
                    for f in self.frames
                ],
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> Index:
        raw = _load(data, "index")
        try:
            frames = tuple(Frame(*map(int, row)) for row in raw["frames"])
            return cls(str(raw["segment"]), int(raw["events"]), frames)
        except (KeyError, TypeError, ValueError) as exc:
            raise ArchiveFormatError(f"index: {exc}") from exc

    @classmethod
    def read(cls, path: Path) -> Index:
        return cls.from_json(path.read_bytes())

    def frame_of(self, line: int) -> int:
        """The number of the frame that holds ``line`` (the last frame for a line past
        the end)."""
        low, high = 0, len(self.frames) - 1
        while low < high:
            middle = (low + high + 1) // 2
            if self.frames[middle].first <= line:
                low = middle
            else:
                high = middle - 1
        return low


@dataclass(frozen=True)
class Checksums:
    size: int
    sha1: str
    crc32: str
    """8 hex digits."""


@dataclass(frozen=True)
class Manifest:
    segment: str
    events: int
    frames: int
    compressed: Checksums
    """Of the ``.lz4`` file."""
    uncompressed: Checksums
    """Of the segment's bytes (what ``lz4 -d`` gives back)."""
    index: Checksums
    ids: Checksums
    frame_events: int
    compression_level: int
    archived_at: str
    days: tuple[str, ...] | None = None
    """The days its events may belong to (see :func:`event_days`); None: any day."""

    def to_json(self) -> bytes:
        def sums(c: Checksums) -> dict[str, Any]:
            return {"size": c.size, "sha1": c.sha1, "crc32": c.crc32}

        return orjson.dumps(
            {
                "format": FORMAT,
                "segment": self.segment,
                "events": self.events,
                "frames": self.frames,
                "compressed": sums(self.compressed),
                "uncompressed": sums(self.uncompressed),
                "index": sums(self.index),
                "ids": sums(self.ids),
                "frame_events": self.frame_events,
                "compression_level": self.compression_level,
                "archived_at": self.archived_at,
                "days": None if self.days is None else list(self.days),
            },
            option=orjson.OPT_INDENT_2,
        )

    @classmethod
    def read(cls, path: Path) -> Manifest:
        raw = _load(path.read_bytes(), "manifest")
        try:
            return cls(
                segment=str(raw["segment"]),
                events=int(raw["events"]),
                frames=int(raw["frames"]),
                compressed=Checksums(**raw["compressed"]),
                uncompressed=Checksums(**raw["uncompressed"]),
                index=Checksums(**raw["index"]),
                ids=Checksums(**raw["ids"]),
                frame_events=int(raw["frame_events"]),
                compression_level=int(raw["compression_level"]),
                archived_at=str(raw["archived_at"]),
                days=None if raw.get("days") is None else tuple(map(str, raw["days"])),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ArchiveFormatError(f"manifest: {exc}") from exc


def _load(data: bytes, what: str) -> dict[str, Any]:
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ArchiveFormatError(f"{what} is not JSON: {exc}") from exc
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        found = raw.get("format") if isinstance(raw, dict) else None
        raise ArchiveFormatError(f"{what} format {found!r}; this eventpipe reads {FORMAT}")
    return raw


# A line as the log counts them: up to and with "\n" only (bytes.splitlines would also
# cut at "\r" and others, and a damaged line's positions would shift).
_LINE = re.compile(rb"[^\n]*\n|[^\n]+\Z")


def split_lines(data: bytes) -> list[bytes]:
    """``data``'s lines, each with its newline (the last may have none)."""
    return _LINE.findall(data)


def without_newline(line: bytes) -> bytes:
    return line[:-1] if line.endswith(b"\n") else line


def events_of(data: bytes) -> list[bytes]:
    """``data``'s lines without their newlines (what :func:`split_lines` finds)."""
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return lines


def crc32_hex(value: int) -> str:
    return f"{value:08x}"


def event_id(line: bytes) -> str | None:
    """The ``eventn_ctx.event_id`` of a log line, None when it has none (or is no event).

    The collector writes it compactly (``"event_id":"..."``); when that text occurs once
    and holds no escape it is the id, read without parsing the line (2x faster than
    orjson on the benchmark's events). Otherwise the line is parsed."""
    at = line.find(_EVENT_ID)
    if at >= 0 and line.find(_EVENT_ID, at + 1) < 0:
        start = at + len(_EVENT_ID)
        end = line.find(b'"', start)
        if end > 0 and b"\\" not in line[start:end]:
            return line[start:end].decode("utf-8", "replace")
    if at < 0:
        return None
    try:
        return stored_event_id(orjson.loads(line))
    except orjson.JSONDecodeError:
        return None


def id_hash(event: str | None) -> int:
    """What the ids file holds for an event id."""
    return 0 if event is None else zlib.crc32(event.encode("utf-8", "surrogatepass"))


# The first compact, escape-free event id of a line, and the rest of that line: one match
# per line at most.
_FIRST_ID = re.compile(rb'"event_id":"([^"\\\n]*)"[^\n]*(?:\n|\Z)')


def id_hashes(data: bytes, lines: list[bytes]) -> list[int]:
    """:func:`id_hash` of each line of ``data`` (the bytes of ``lines``). When every line
    holds the id text exactly once, one regex pass over the bytes finds them (3x faster
    than line by line, measured on the benchmark's events); else line by line."""
    found = _FIRST_ID.findall(data)
    if len(found) == len(lines) and data.count(_EVENT_ID) == len(lines):
        return list(map(zlib.crc32, found))
    return [id_hash(event_id(line)) for line in lines]


# The collector's own stamp (RFC 3339, UTC): the day is its first ten characters.
_TIMESTAMP = b'"_timestamp":'
_UTC_DAY = re.compile(rb'"_timestamp":"(\d{4}-\d{2}-\d{2})T\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?Z"')
_UTC_TEXT = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?Z")
_DAY_PREFIX = re.compile(r"^(\d{4})-(\d{2})-(\d{2})")


def event_days(data: bytes, lines: list[bytes]) -> set[str] | None:
    """The UTC days (``YYYY-MM-DD``) the events of ``lines`` (``data``: their bytes) may
    belong to by their ``_timestamp``: a superset, None when some event's day cannot be
    told from its text (then the file is read for every day).

    When each line holds one ``_timestamp`` in the collector's UTC form, one regex pass
    gives the exact days. Otherwise each line is parsed: a text timestamp in another form
    (with an offset, a local time) counts for its date and the days on either side; one
    that does not start with a date makes the answer None. Non-text timestamps never load
    (schema/casts.py), so they add no day."""
    found = _UTC_DAY.findall(data)
    if len(found) == len(lines) and data.count(_TIMESTAMP) == len(lines):
        return {day.decode() for day in set(found)}
    days: set[str] = set()
    for line in lines:
        try:
            event = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue  # a damaged line: it fails in the pipeline, it belongs to no day
        value = event.get("_timestamp") if isinstance(event, dict) else None
        if not isinstance(value, str):
            continue
        if _UTC_TEXT.fullmatch(value):
            days.add(value[:10])
            continue
        prefix = _DAY_PREFIX.match(value)
        if prefix is None:
            return None
        try:
            day = date(int(prefix[1]), int(prefix[2]), int(prefix[3]))
        except ValueError:
            return None
        days.update((day + timedelta(days=k)).isoformat() for k in (-1, 0, 1))
    return days


def day_dirs(layout: DataLayout, first: date | None = None, last: date | None = None) -> list[Path]:
    """The archive's day directories, oldest first, within ``first``..``last`` (both
    included; None: unbounded)."""
    if not layout.archive.is_dir():
        return []
    low = first.isoformat() if first else ""
    high = last.isoformat() if last else "9999-99-99"
    return sorted(
        d for d in layout.archive.iterdir()
        if d.is_dir() and _DAY.match(d.name) and low <= d.name <= high
    )  # fmt: skip


def segments_of_day(day: Path) -> Iterator[ArchivedSegment]:
    """The archived segments of one day directory, in seal order (legacy ``.gz`` ones
    included)."""
    found = []
    for path in day.iterdir():
        name = path.name
        if not name.startswith("incoming.tok="):
            continue
        if name.endswith(".log" + SUFFIX) or name.endswith(".log" + LEGACY_SUFFIX):
            segment = ArchivedSegment(path)
            parsed = SegmentName.parse(segment.segment_file)
            if parsed is not None and parsed.sealed is not None:
                found.append(((parsed.sealed, parsed.key_id), segment))
    yield from (segment for _, segment in sorted(found, key=lambda pair: pair[0]))
