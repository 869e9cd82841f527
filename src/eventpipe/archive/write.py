"""Archiving a sealed segment: LZ4 frames, their index, the event ids and the manifest.

The four files are written under ``.partial`` names and fsynced, then renamed: the
sidecars first, the ``.lz4`` last, so that an ``.lz4`` file always has its sidecars. The
segment leaves ``incoming/`` only after that (the caller removes it); a crash anywhere
before means archiving it again from the start, which writes the same files.
"""

from __future__ import annotations

import hashlib
import os
import sys
import zlib
from array import array
from collections.abc import Iterator
from pathlib import Path

import lz4.frame

from eventpipe.archive.files import (
    ArchivedSegment,
    Checksums,
    Frame,
    Index,
    Manifest,
    crc32_hex,
    event_days,
    id_hashes,
    split_lines,
)
from eventpipe.config import ArchiveConfig
from eventpipe.events import utc_now
from eventpipe.files import fsync_directory, replacing, write_file
from eventpipe.paths import DataLayout


class Digest:
    """Size, sha1 and crc32 of bytes written in pieces."""

    def __init__(self) -> None:
        self.size = 0
        self.sha1 = hashlib.sha1(usedforsecurity=False)
        self.crc32 = 0

    def update(self, data: bytes) -> None:
        self.size += len(data)
        self.sha1.update(data)
        self.crc32 = zlib.crc32(data, self.crc32)

    def sums(self) -> Checksums:
        return Checksums(self.size, self.sha1.hexdigest(), crc32_hex(self.crc32))


def digest(data: bytes) -> Checksums:
    whole = Digest()
    whole.update(data)
    return whole.sums()


def archive_segment(layout: DataLayout, name: str, settings: ArchiveConfig) -> Path:
    """Archive the sealed segment ``incoming/<name>``, then remove it from incoming/;
    the ``.lz4`` file. A segment already gone was archived by an earlier attempt. Files
    prepare_segment wrote ahead are moved into place; without them (or when they are not
    of the segment as it is) the segment is compressed here."""
    source = layout.incoming / name
    target = ArchivedSegment.of(layout, name)
    if source.exists():
        if not _move_ahead(ahead_of(layout, name), target, source):
            write_segment(source, target, settings)
        source.unlink()
    return target.data


def ahead_of(layout: DataLayout, name: str) -> ArchivedSegment:
    """Where prepare_segment writes the archive files of segment ``name``."""
    archived = ArchivedSegment.of(layout, name)
    return ArchivedSegment(layout.tmp / "archive-ahead" / archived.data.name)


def prepare_segment(layout: DataLayout, name: str, settings: ArchiveConfig) -> None:
    """Write the archive files of the sealed segment ``incoming/<name>`` ahead, under
    ``tmp/archive-ahead/``, while the run that processes it works: archive_segment then
    only moves them. Nothing is in ``archive/`` until the segment is done."""
    source = layout.incoming / name
    ahead = ahead_of(layout, name)
    if source.exists() and not ahead.data.exists():
        write_segment(source, ahead, settings)


def _move_ahead(ahead: ArchivedSegment, target: ArchivedSegment, source: Path) -> bool:
    """Move the files prepare_segment wrote into ``archive/`` (sidecars first, the .lz4
    last); False when there are none, or they are not of ``source`` as it is now."""
    try:
        if Manifest.read(ahead.manifest).uncompressed.size != source.stat().st_size:
            return False
        target.data.parent.mkdir(parents=True, exist_ok=True)
        for moved, into in zip((*ahead.sidecars, ahead.data), (*target.sidecars, target.data),
                               strict=True):  # fmt: skip
            os.replace(moved, into)
    except (OSError, ValueError, KeyError, TypeError):  # none, half moved, other filesystem
        return False
    fsync_directory(target.data.parent)
    return True


def write_segment(source: Path, target: ArchivedSegment, settings: ArchiveConfig) -> Manifest:
    """Archive the segment file ``source`` as ``target`` (``source`` is left in place)."""
    compressed, raw = Digest(), Digest()
    frames: list[Frame] = []
    ids = array("I")
    days: set[str] | None = set()
    # The data file takes its name last, after its sidecars: a crash in between leaves
    # sidecars without data, which the next attempt writes again.
    with replacing(target.data) as out:
        for lines in _frames(source, settings):
            data = b"".join(lines)
            # The frame's own xxhash32 of its content: `lz4 -d` checks it too.
            frame = lz4.frame.compress(
                data,
                compression_level=settings.compression_level,
                content_checksum=True,
                store_size=True,
            )
            frames.append(
                Frame(
                    offset=compressed.size,
                    size=len(frame),
                    raw_size=len(data),
                    events=len(lines),
                    first=len(ids),
                    crc32=zlib.crc32(frame),
                    raw_crc32=zlib.crc32(data),
                )
            )
            out.write(frame)
            compressed.update(frame)
            raw.update(data)
            ids.extend(id_hashes(data, lines))
            if days is not None:
                in_frame = event_days(data, lines)
                days = None if in_frame is None else days | in_frame
        if sys.byteorder == "big":
            ids.byteswap()  # the file is little-endian
        index = Index(target.segment_file, len(ids), tuple(frames)).to_json()
        id_bytes = ids.tobytes()
        manifest = Manifest(
            segment=target.segment_file,
            events=len(ids),
            frames=len(frames),
            compressed=compressed.sums(),
            uncompressed=raw.sums(),
            index=digest(index),
            ids=digest(id_bytes),
            frame_events=settings.frame_events,
            compression_level=settings.compression_level,
            archived_at=utc_now().isoformat(),
            days=None if days is None else tuple(sorted(days)),
        )
        for path, data in ((target.index, index), (target.ids, id_bytes)):
            write_file(path, data)
        write_file(target.manifest, manifest.to_json())
    return manifest


_READ_BYTES = 8 << 20


def _frames(source: Path, settings: ArchiveConfig) -> Iterator[list[bytes]]:
    """The lines of ``source`` (newlines kept), cut into frames. Read in large blocks
    and cut by list slices: a loop over lines in Python cost more than compressing."""
    pending: list[bytes] = []
    with source.open("rb") as stream:
        carry = b""
        while block := stream.read(_READ_BYTES):
            block_lines = split_lines(carry + block)
            carry = block_lines.pop() if not block_lines[-1].endswith(b"\n") else b""
            pending.extend(block_lines)
            while len(pending) >= settings.frame_events:
                take = _frame_length(pending, settings)
                yield pending[:take]
                del pending[:take]
        if carry:
            pending.append(carry)  # a last line without its newline
    while pending:
        take = _frame_length(pending, settings)
        yield pending[:take]
        del pending[:take]


def _frame_length(lines: list[bytes], settings: ArchiveConfig) -> int:
    """How many of ``lines`` the next frame takes: ``frame_events``, fewer if they would
    exceed ``frame_max_bytes`` (one at least)."""
    count = min(len(lines), settings.frame_events)
    if sum(map(len, lines[:count])) <= settings.frame_max_bytes:
        return count
    size = 0
    for taken, line in enumerate(lines[:count]):
        size += len(line)
        if size > settings.frame_max_bytes:
            return max(taken, 1)
    return count
