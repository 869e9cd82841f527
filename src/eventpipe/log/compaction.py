"""Log compaction (seed 3): a source's archived segments rewritten so that each key's
newest message remains, and a destination added later can be filled with the current
state plus what followed (docs/cdc.md).

What is compacted: the archived segments of a source (their key id is the source's
id). A segment is archived only once every destination has handled it, so nothing a
destination has not handled, and no active or waiting segment, is ever touched. HTTP
events are not compacted: their key would be their namespace alone (seed 3), and the
archive is their history of record (``eventpipe reprocess`` rebuilds days from it).

What remains, in the order of the changes (``_lsn``, ``_seq``):

* per namespace, its newest ``truncate``; of the namespace, only what came after it;
* per key (namespace + ``_key``), its newest message, unless that is a delete (or an
  update that moved the key away, ``_old_key``): every segment of the source is
  compacted at once, the earlier compaction's included, so nothing older remains that a
  delete would have to remove;
* every message without a key (tables without a primary key: each change is a row);
* a line that is not a source's change, as it is (nothing is dropped unread).

The result is one archived segment, ``<source>|w=compacted-<stamp>``, at the seal stamp
of the newest segment it replaces (it sorts where they were). It is written whole (the
archive's four files, fsynced) before those are deleted: a crash in between leaves both,
which a fill applies alike (a change applied twice is harmless), and the next compaction
takes both again.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from eventpipe.archive.files import ArchivedSegment, day_dirs, segments_of_day
from eventpipe.archive.read import lines
from eventpipe.archive.remote import remote_of
from eventpipe.archive.write import write_segment
from eventpipe.config import Config
from eventpipe.files import fsync_directory
from eventpipe.log.inspect import file_order
from eventpipe.paths import SegmentName

log = logging.getLogger("eventpipe.log")

WRITER = "compacted"
"""The writer id of compacted segments."""


@dataclass(frozen=True)
class Compacted:
    source: str
    segments: int
    """Segments replaced."""
    events_in: int
    events_out: int
    bytes_in: int
    bytes_out: int
    segment: str
    """The compacted segment's file name."""


def source_segments(config: Config, source_id: str) -> list[ArchivedSegment]:
    """A source's archived segments, in log order (compacted ones included)."""
    found = []
    for day in day_dirs(config.layout):
        for segment in segments_of_day(day):
            name = SegmentName.parse(segment.segment_file)
            if name is not None and name.key_id == source_id and not segment.legacy:
                found.append(segment)
    return sorted(found, key=lambda s: file_order(s.segment_file))


def is_compacted(segment: ArchivedSegment) -> bool:
    name = SegmentName.parse(segment.segment_file)
    return name is not None and name.writer == WRITER


def due(config: Config, source_id: str) -> bool:
    """Whether a source's archived segments since its last compaction have reached its
    ``compaction_bytes``."""
    limit = config.source(source_id).compaction_bytes
    if limit is None:
        return False
    fresh = [s for s in source_segments(config, source_id) if not is_compacted(s)]
    return sum(s.data.stat().st_size for s in fresh) >= limit


def compact(config: Config, source_id: str) -> Compacted | None:
    """Compact a source's archived segments into one (see the module's docstring); None
    when there is nothing to compact (no segment, or only a compacted one)."""
    config.source(source_id)  # an unknown source is refused by name
    segments = source_segments(config, source_id)
    if not segments or (len(segments) == 1 and is_compacted(segments[0])):
        return None
    newest = SegmentName.parse(segments[-1].segment_file)
    assert newest is not None
    assert newest.sealed is not None
    name = SegmentName(source_id, WRITER, newest.sealed).file_name
    target = ArchivedSegment.of(config.layout, name)
    kept = Kept()
    bytes_in = 0
    for segment in segments:
        bytes_in += segment.data.stat().st_size
        for _, line in lines(segment):
            kept.add(line)
    staging = config.layout.tmp / f"compaction.{source_id}.log"
    staging.parent.mkdir(parents=True, exist_ok=True)
    with staging.open("wb") as out:
        for line in kept.lines():
            out.write(line if line.endswith(b"\n") else line + b"\n")
    if target.data.exists():  # this very compaction, cut short after it was written
        segments = [s for s in segments if s.data != target.data]
    write_segment(staging, target, config.archive)
    fsync_directory(target.data.parent)
    for segment in segments:  # the data file first: sidecars alone are no segment
        for path in (segment.data, *segment.sidecars):
            path.unlink(missing_ok=True)
        fsync_directory(segment.data.parent)
    staging.unlink()
    _forget_remotely(config, segments)
    result = Compacted(source_id, len(segments), kept.read, kept.written,
                       bytes_in, target.data.stat().st_size, name)  # fmt: skip
    log.info("source %s: %d segment(s) compacted into %s: %d of %d events kept",
             source_id, result.segments, name, result.events_out, result.events_in)  # fmt: skip
    return result


Position = tuple[int, int]


def _forget_remotely(config: Config, segments: list[ArchivedSegment]) -> None:
    """The replaced segments out of the archive's remote copy too. Left there (the store
    failed), a restore brings them back beside the compacted one, which a fill applies
    alike, as after a crash between the two steps here."""
    remote = remote_of(config.archive)
    if remote is None or not segments:
        return
    try:
        remote.forget(segments)
    except OSError as exc:
        log.warning("archive: the segments compaction replaced stay on %s: %s",
                    config.archive.remote, exc)  # fmt: skip


class Kept:
    """What compaction keeps of the messages it is given, in log order."""

    def __init__(self) -> None:
        self.read = 0
        self.written = 0
        self.newest: dict[tuple[str, str], tuple[Position, bytes | None]] = {}
        """(namespace, key) -> its newest message (None: deleted, or moved away)."""
        self.truncated: dict[str, tuple[Position, bytes]] = {}
        self.keyless: dict[tuple[str, Position], bytes] = {}
        self.other: list[bytes] = []

    def add(self, line: bytes) -> None:
        self.read += 1
        try:
            change: Any = json.loads(line)
            namespace, op = change["_namespace"], change["_op"]
            position = (int(change["_lsn"]), int(change["_seq"]))
        except (ValueError, TypeError, KeyError):
            self.other.append(line)
            return
        key, old = change.get("_key"), change.get("_old_key")
        if op == "truncate":
            if position >= self.truncated.get(namespace, ((-1, -1), b""))[0]:
                self.truncated[namespace] = (position, line)
        elif key is None:
            self.keyless[(namespace, position)] = line  # a change read twice: once
        else:
            self._newest((namespace, str(key)), position, None if op == "delete" else line)
            if op == "update" and old is not None and old != key:
                self._newest((namespace, str(old)), position, None)

    def _newest(self, key: tuple[str, str], position: Position, line: bytes | None) -> None:
        found = self.newest.get(key)
        if found is None or position >= found[0]:
            self.newest[key] = (position, line)

    def lines(self) -> list[bytes]:
        def after_truncate(namespace: str, position: Position) -> bool:
            cut = self.truncated.get(namespace)
            return cut is None or position > cut[0]

        ordered = [(position, line) for position, line in self.truncated.values()]
        ordered += [
            (position, line)
            for (namespace, _), (position, line) in self.newest.items()
            if line is not None and after_truncate(namespace, position)
        ]
        ordered += [
            (position, line)
            for (namespace, position), line in self.keyless.items()
            if after_truncate(namespace, position)
        ]
        ordered.sort(key=lambda kept: kept[0])
        result = self.other + [line for _, line in ordered]
        self.written = len(result)
        return result
