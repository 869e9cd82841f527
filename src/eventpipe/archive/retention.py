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
) -> list[Path]:
    """Delete the archive's days older than ``retention_days`` before ``today`` (UTC),
    then the oldest days while the archive is larger than ``max_bytes`` (the newest day
    is kept whatever its size). Returns the days deleted, oldest first."""
    days = day_dirs(layout)
    deleted: list[Path] = []
    if retention_days is not None:
        cutoff = ((today or utc_now().date()) - timedelta(days=retention_days)).isoformat()
        deleted = [d for d in days if d.name < cutoff]
        for day in deleted:
            shutil.rmtree(day)
            log.info("archive: %s deleted (retention_days %d)", day.name, retention_days)
        days = days[len(deleted) :]
    if max_bytes is not None and days:
        sizes = [disk_bytes(d) for d in days]
        total = sum(sizes)
        for day, size in zip(days[:-1], sizes[:-1], strict=True):
            if total <= max_bytes:
                break
            shutil.rmtree(day)
            total -= size
            deleted.append(day)
            log.warning(
                "archive: %s deleted (%.1f MB; the archive is over max_bytes %d)",
                day.name, size / 1e6, max_bytes,
            )  # fmt: skip
    if deleted:
        newest = max(d.name for d in deleted)
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
