"""Reading the archive back: a segment's lines from any line on, or an event by its id,
each decompressing only the frames it needs."""

from __future__ import annotations

import gzip
import logging
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

import lz4.frame

from eventpipe.archive.files import (
    ArchivedSegment,
    ArchiveFormatError,
    Frame,
    Index,
    event_id,
    events_of,
    id_hash,
    segments_of_day,
    split_lines,
    without_newline,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Found:
    segment: ArchivedSegment
    line: int
    event: bytes
    """The line, without its newline."""


def read_frame(data: IO[bytes], frame: Frame) -> bytes:
    """One frame's events, decompressed."""
    data.seek(frame.offset)
    return cast("bytes", lz4.frame.decompress(data.read(frame.size)))


def lines(segment: ArchivedSegment, start: int = 0) -> Iterator[tuple[int, bytes]]:
    """The segment's lines from line ``start`` on, with their numbers (newlines kept).
    With an index, the frames before ``start`` are not read; without one (a legacy
    ``.gz`` file, or an index that is missing or damaged) the file is read from its
    beginning."""
    index = None if segment.legacy else _index_or_none(segment)
    if index is None:
        opened = gzip.open if segment.legacy else lz4.frame.open
        with opened(segment.data, "rb") as stream:
            for number, line in enumerate(cast("IO[bytes]", stream)):
                if number >= start:
                    yield number, line
        return
    if not index.frames:
        return
    with segment.data.open("rb") as data:
        for frame in index.frames[index.frame_of(start) :]:
            events = split_lines(read_frame(data, frame))
            for number, line in enumerate(events, start=frame.first):
                if number >= start:
                    yield number, line


def find(day: Path, wanted: str) -> Iterator[Found]:
    """Every event of the archive day ``day`` whose ``eventn_ctx.event_id`` is
    ``wanted`` (a client that sent one id twice has two), in log order. Reads each
    segment's ids file and, for a match, the one frame that holds it."""
    for segment in segments_of_day(day):
        index = None if segment.legacy else _index_or_none(segment)
        if index is None or not segment.ids.exists():
            log.warning("%s has no readable index: searched line by line", segment.data.name)
            for number, line in lines(segment):
                if event_id(line) == wanted:
                    yield Found(segment, number, without_newline(line))
            continue
        candidates = _matching_lines(segment.ids.read_bytes(), id_hash(wanted))
        if not candidates:
            continue
        with segment.data.open("rb") as data:
            frame_lines: dict[int, list[bytes]] = {}
            for number in candidates:
                at = index.frame_of(number)
                if at not in frame_lines:
                    frame_lines[at] = events_of(read_frame(data, index.frames[at]))
                frame = index.frames[at]
                events = frame_lines[at]
                if number - frame.first < len(events):
                    line = events[number - frame.first]
                    if event_id(line) == wanted:  # not a crc32 collision
                        yield Found(segment, number, line)


def _matching_lines(ids: bytes, wanted: int) -> list[int]:
    """Line numbers whose id hash is ``wanted``: a byte search, kept where aligned."""
    pattern = struct.pack("<I", wanted)
    found = []
    at = ids.find(pattern)
    while at >= 0:
        if at % 4 == 0:
            found.append(at // 4)
            at = ids.find(pattern, at + 4)
        else:
            at = ids.find(pattern, at + 1)
    return found


def _index_or_none(segment: ArchivedSegment) -> Index | None:
    try:
        return Index.read(segment.index)
    except FileNotFoundError:
        return None
    except ArchiveFormatError as exc:
        log.warning("%s: %s; read without it (eventpipe archive verify)", segment.index.name, exc)
        return None
