"""What the archive keeps: ``archive.retention_days`` and ``archive.max_bytes``.

Only handled data is in the archive (a segment is archived once every destination has
it), so deleting a day loses nothing a destination still needs; it does take away what
``eventpipe reprocess`` could rebuild those days from: the newest day deleted is written
to ``archive/pruned-through``, and reprocess refuses the days up to it (their events
were archived on that day or before, and some of them are gone).
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

from eventpipe.archive.files import ArchiveFormatError, Manifest, day_dirs, segments_of_day
from eventpipe.archive.remote import RemoteArchive, pending
from eventpipe.events import utc_now
from eventpipe.files import write_file
from eventpipe.paths import DataLayout

log = logging.getLogger(__name__)


def disk_bytes(directory: Path) -> int:
    """Bytes of the files under ``directory``."""
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


def prune(
    layout: DataLayout,
    retention_days: int | None,
    max_bytes: int | None = None,
    today: date | None = None,
    remote: RemoteArchive | None = None,
) -> list[Path]:
    """Delete the archive's days older than ``retention_days`` before ``today`` (UTC),
    from ``remote`` too, then the oldest days while the archive is larger than
    ``max_bytes`` (the newest day is kept whatever its size; with a remote copy, only
    days that are there, which keeps them). Returns the days deleted, oldest first."""
    days = day_dirs(layout)
    deleted: list[Path] = []
    gone: list[str] = []  # what no copy holds any more: reprocess refuses these days
    if retention_days is not None:
        cutoff = ((today or utc_now().date()) - timedelta(days=retention_days)).isoformat()
        deleted = [d for d in days if d.name < cutoff]
        for day in deleted:
            shutil.rmtree(day)
            log.info("archive: %s deleted (retention_days %d)", day.name, retention_days)
        gone = [d.name for d in deleted]
        if remote is not None:
            try:
                gone += remote.delete_days_before(cutoff)
            except OSError as exc:  # deleted after a later run
                log.warning("archive: days before %s not deleted from %s yet: %s",
                            cutoff, remote.location, exc)  # fmt: skip
        days = days[len(deleted) :]
    if max_bytes is not None and days:
        sizes = [disk_bytes(d) for d in days]
        total = sum(sizes)
        waiting = set(pending(layout)) if remote is not None else set()
        for day, size in zip(days[:-1], sizes[:-1], strict=True):
            if total <= max_bytes:
                break
            if day.name in waiting:
                continue  # not uploaded yet: its only copy
            shutil.rmtree(day)
            total -= size
            deleted.append(day)
            if remote is None:
                gone.append(day.name)
            log.warning(
                "archive: %s deleted from disk (%.1f MB; the archive is over max_bytes %d)%s",
                day.name, size / 1e6, max_bytes,
                f"; kept on {remote.location}" if remote is not None else "",
            )  # fmt: skip
    if gone:
        newest = max(gone)
        if newest > (pruned_through(layout) or ""):
            write_file(layout.archive / PRUNED_THROUGH, f"{newest}\n".encode())
    return deleted


PRUNED_THROUGH = "pruned-through"


def pruned_through(layout: DataLayout) -> str | None:
    """The newest archive day retention deleted (``YYYY-MM-DD``), None if none was."""
    try:
        return (layout.archive / PRUNED_THROUGH).read_text().strip() or None
    except FileNotFoundError:
        return None


@dataclass(frozen=True)
class Usage:
    """What the archive holds, for ``eventpipe status``."""

    days: tuple[str, ...]
    files: int
    events: int
    """Events of the files with a manifest (legacy ``.gz`` files have none)."""
    disk_bytes: int
    raw_bytes: int
    """The uncompressed size of the files with a manifest."""


def usage(layout: DataLayout) -> Usage:
    days = day_dirs(layout)
    files = events = raw = 0
    for day in days:
        for segment in segments_of_day(day):
            files += 1
            try:
                manifest = Manifest.read(segment.manifest)
            except (FileNotFoundError, ArchiveFormatError):
                continue  # legacy, or damaged: `archive verify` says which
            events += manifest.events
            raw += manifest.uncompressed.size
    return Usage(tuple(d.name for d in days), files, events, sum(map(disk_bytes, days)), raw)
