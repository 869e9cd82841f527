"""Reading the log as it is written, for stream destinations.

A stream reads every segment of ``incoming/``, the active ones too, up to their last
complete line. A position in the log is a map from each segment's identity to a byte
offset. The identity must survive the seal (a rename of ``incoming.tok=K.log`` to
``incoming.tok=K-<stamp>.log``) and must not be mistaken for another file: it is the
inode together with a hash of the segment's first line (an inode is reused once its file
is deleted; a first line holds the event's id and time).

Each stream destination keeps its progress, the position it has loaded up to, in
``incoming/queue.dst=<id>/progress.json``. A sealed segment may leave ``incoming/`` only
when every stream destination's progress has reached its end (:func:`consumed`).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from eventpipe.files import write_file
from eventpipe.paths import DataLayout, check_safe_id

_FIRST_LINE_BYTES = 1 << 16
_TAIL_BYTES = 1 << 16


@dataclass(frozen=True)
class SegmentEnd:
    """A segment as it is now: its identity, path and the end of its last complete line."""

    identity: str
    path: Path
    end: int


def identity(path: Path) -> str | None:
    """The segment's identity, or None while it has no complete line yet."""
    try:
        with path.open("rb") as f:
            inode = os.fstat(f.fileno()).st_ino
            head = f.read(_FIRST_LINE_BYTES)
    except (FileNotFoundError, IsADirectoryError):
        return None
    newline = head.find(b"\n")
    if newline < 0:
        return None  # no complete first line (a line longer than 64 KiB counts its head)
    return f"{inode}-{hashlib.sha1(head[:newline]).hexdigest()[:16]}"


def complete_end(path: Path, size: int | None = None) -> int:
    """The offset just after the last newline of the file (0 if none)."""
    with path.open("rb") as f:
        position = os.fstat(f.fileno()).st_size if size is None else size
        while position > 0:
            start = max(0, position - _TAIL_BYTES)
            f.seek(start)
            chunk = f.read(position - start)
            newline = chunk.rfind(b"\n")
            if newline >= 0:
                return start + newline + 1
            position = start
    return 0


def segments(layout: DataLayout) -> list[SegmentEnd]:
    """Every segment with a complete line: sealed ones in seal order, then active ones."""
    found = []
    for path in [*layout.sealed_segments(), *layout.active_segments()]:
        ident = identity(path)
        if ident is None:
            continue
        try:
            end = complete_end(path)
        except FileNotFoundError:  # sealed and archived meanwhile: listed again next time
            continue
        found.append(SegmentEnd(ident, path, end))
    return found


def locate(layout: DataLayout, ident: str, hint: Path) -> Path | None:
    """The segment with identity ``ident`` now: at ``hint`` if it is still there, else
    under another name (sealed since, or a hint from before a restart), else None (it
    left ``incoming/``)."""
    if identity(hint) == ident:
        return hint
    for path in [*layout.sealed_segments(), *layout.active_segments()]:
        if identity(path) == ident:
            return path
    return None


def read_lines(path: Path, start: int, end: int) -> Iterator[bytes]:
    """The lines between byte offsets ``start`` and ``end`` (line boundaries), without
    their newlines; blank lines skipped."""
    with path.open("rb") as f:
        f.seek(start)
        remaining = end - start
        while remaining > 0:
            line = f.readline(remaining)
            remaining -= len(line)
            line = line.rstrip(b"\n")
            if line.strip():
                yield line


def count_lines(path: Path, start: int, end: int) -> int:
    count = 0
    with path.open("rb") as f:
        f.seek(start)
        remaining = end - start
        while remaining > 0:
            chunk = f.read(min(remaining, 1 << 20))
            if not chunk:
                break
            count += chunk.count(b"\n")
            remaining -= len(chunk)
    return count


def queue_dir(layout: DataLayout, destination_id: str) -> Path:
    return layout.incoming / f"queue.dst={check_safe_id(destination_id, 'destination id')}"


@dataclass(frozen=True)
class Progress:
    """How far a stream destination has loaded: byte offset per segment identity."""

    offsets: Mapping[str, int]
    committed_at: float | None = None


def read_progress(layout: DataLayout, destination_id: str) -> Progress:
    path = queue_dir(layout, destination_id) / "progress.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return Progress({})
    return Progress({str(k): int(v) for k, v in data["offsets"].items()}, data["committed_at"])


def write_progress(layout: DataLayout, destination_id: str, offsets: Mapping[str, int]) -> None:
    """Record the position loaded up to (atomically: a rename)."""
    progress = {"offsets": dict(offsets), "committed_at": time.time()}
    write_file(queue_dir(layout, destination_id) / "progress.json", json.dumps(progress))


def consumed(layout: DataLayout, stream_ids: list[str], path: Path) -> bool:
    """Whether every stream destination has loaded all of the sealed segment ``path``."""
    if not stream_ids:
        return True
    ident = identity(path)
    if ident is None:
        return True  # no complete line: nothing to stream
    end = complete_end(path)
    return all(read_progress(layout, d).offsets.get(ident, 0) >= end for d in stream_ids)


@dataclass(frozen=True)
class Lag:
    events: int
    seconds: float


def lag(layout: DataLayout, destination_id: str, now: float | None = None) -> Lag:
    """Events in the log that the destination has not loaded yet, and for how long the
    oldest of them has waited (0 when it is caught up)."""
    progress = read_progress(layout, destination_id)
    now = time.time() if now is None else now
    events, oldest = 0, None
    for segment in segments(layout):
        start = progress.offsets.get(segment.identity, 0)
        if segment.end > start:
            events += count_lines(segment.path, start, segment.end)
            written = segment.path.stat().st_mtime
            oldest = min(oldest or written, written)
    if not events:
        return Lag(0, 0.0)
    waited_since = progress.committed_at if progress.committed_at is not None else oldest
    return Lag(events, max(0.0, now - (waited_since or now)))
