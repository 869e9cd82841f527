"""The archive's copy on an S3-compatible store (``archive.remote: s3://bucket/prefix``).

The archive is written on this disk as always (archive/write.py); after each run, the
segments it archived are uploaded under the same names::

    <prefix>/YYYY-MM-DD/<segment>.log.lz4 (+ .index.json, .ids, .manifest.json)

Each object is one PUT (it appears whole); a segment's sidecars go first and its
``.lz4`` last, as on disk, so a segment whose ``.lz4`` is there is there whole. A day
whose upload failed (the store unreachable) is noted in ``archive/remote-pending`` and
tried again after the next run; ``max_bytes`` never deletes such a day from the disk.

What is deleted from the copy: days past ``retention_days`` (as on disk), and a source's
segments that compaction replaced. ``max_bytes`` bounds the disk only: the copy keeps
those days, and ``eventpipe archive restore`` (or a reprocess, which restores the days
the disk lacks first) brings them back, each segment checked against its manifest
before it takes its place.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

from eventpipe.archive.files import (
    LEGACY_SUFFIX,
    SUFFIX,
    ArchivedSegment,
    ArchiveFormatError,
    Manifest,
    day_dirs,
    segments_of_day,
)
from eventpipe.archive.write import digest
from eventpipe.config import ArchiveConfig, S3Config
from eventpipe.errors import TransientError
from eventpipe.files import fsync_directory, write_file
from eventpipe.objectstore import Location
from eventpipe.paths import DataLayout

log = logging.getLogger(__name__)

PENDING = "remote-pending"
"""``archive/remote-pending``: the days whose upload is not done (a JSON list)."""
_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_SIDECARS = (".index.json", ".ids", ".manifest.json")


@dataclass
class Synced:
    """What one upload after a run did."""

    uploaded: int = 0
    pending: list[str] = field(default_factory=list)
    """Days still to upload (the store failed): tried again after the next run."""


class RemoteArchive:
    """The archive's copy under an S3 prefix, through pyarrow's S3 filesystem."""

    def __init__(self, location: Location) -> None:
        self.location = location
        self._fs: Any = location.filesystem()
        self._base = location.fs_path(location.uri).rstrip("/")

    def _key(self, *parts: str) -> str:
        return "/".join((self._base, *parts))

    def days(self, first: date | None = None, last: date | None = None) -> list[str]:
        """The copy's days, oldest first, within ``first``..``last`` (None: unbounded)."""
        import pyarrow.fs as pafs

        low = first.isoformat() if first else ""
        high = last.isoformat() if last else "9999-99-99"
        entries = self._fs.get_file_info(pafs.FileSelector(self._base, allow_not_found=True))
        return sorted(
            e.base_name for e in entries
            if e.type == pafs.FileType.Directory and _DAY.match(e.base_name)
            and low <= e.base_name <= high
        )  # fmt: skip

    def objects(self, day: str) -> dict[str, int]:
        """The names and sizes of a day's objects."""
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(self._key(day), allow_not_found=True)
        return {
            e.base_name: e.size
            for e in self._fs.get_file_info(selector)
            if e.type == pafs.FileType.File
        }

    # Uploading ---------------------------------------------------------------------

    def upload_day(self, day: Path) -> int:
        """Upload the segments of the disk's ``day`` the copy lacks (or holds at another
        size); how many."""
        there = self.objects(day.name)
        uploaded = 0
        for segment in segments_of_day(day):
            files = [p for p in (*segment.sidecars, segment.data) if p.exists()]
            if all(there.get(p.name) == p.stat().st_size for p in files):
                continue
            for path in files:  # the sidecars, then the data: the data marks it whole
                self._upload(path, self._key(day.name, path.name))
            uploaded += 1
        return uploaded

    def _upload(self, local: Path, key: str) -> None:
        import pyarrow.fs as pafs

        pafs.copy_files(str(local), key, destination_filesystem=self._fs)

    def sync(self, layout: DataLayout, days: Iterable[str]) -> Synced:
        """Upload ``days`` of the disk and the days an earlier upload left pending."""
        result = Synced()
        wanted = sorted({*days, *pending(layout)})
        for n, name in enumerate(wanted):
            day = layout.archive / name
            if not day.is_dir():
                continue  # deleted since (retention): nothing to upload
            try:
                result.uploaded += self.upload_day(day)
            except OSError as exc:  # the store fails: the rest waits too, untried
                result.pending = [d for d in wanted[n:] if (layout.archive / d).is_dir()]
                log.warning("archive: %s not uploaded to %s (tried again after the next "
                            "run): %s", ", ".join(result.pending), self.location, exc)  # fmt: skip
                break
        _write_pending(layout, result.pending)
        return result

    # Deleting ----------------------------------------------------------------------

    def delete_days_before(self, cutoff: str) -> list[str]:
        """Delete the copy's days older than ``cutoff`` (``YYYY-MM-DD``)."""
        gone = [d for d in self.days() if d < cutoff]
        for name in gone:
            self._fs.delete_dir(self._key(name))
        return gone

    def forget(self, segments: Sequence[ArchivedSegment]) -> None:
        """Delete the copy's objects of ``segments`` (the data first: sidecars alone
        are no segment)."""
        for segment in segments:
            day = segment.data.parent.name
            for path in (segment.data, *segment.sidecars):
                with contextlib.suppress(FileNotFoundError):
                    self._fs.delete_file(self._key(day, path.name))

    # Restoring ---------------------------------------------------------------------

    def restore(
        self, layout: DataLayout, first: date | None = None, last: date | None = None
    ) -> list[str]:
        """Bring back the copy's segments of ``first``..``last`` that the disk lacks, each
        checked against its manifest first (a damaged one raises ArchiveFormatError,
        naming it, and takes no place); the segments restored."""
        restored: list[str] = []
        for day in self.days(first, last):
            target = layout.archive / day
            present = {s.data.name for s in segments_of_day(target)} if target.is_dir() else set()
            there = self.objects(day)
            missing = [n for n in there if _is_data(n) and n not in present]
            if not missing:
                continue
            staging = Path(tempfile.mkdtemp(prefix="archive-restore-", dir=_tmp(layout)))
            try:
                for name in sorted(missing):
                    files = [n for n in (*(name + s for s in _SIDECARS), name) if n in there]
                    for file in files:
                        self._download(self._key(day, file), staging / file)
                    _check(ArchivedSegment(staging / name))
                    target.mkdir(parents=True, exist_ok=True)
                    for file in files:  # sidecars first, the data last, as when written
                        (staging / file).replace(target / file)
                    fsync_directory(target)
                    restored.append(f"{day}/{name}")
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        return restored

    def _download(self, key: str, local: Path) -> None:
        import pyarrow.fs as pafs

        pafs.copy_files(key, str(local), source_filesystem=self._fs)

    def download_day(self, day: str, into: Path) -> None:
        """Every object of the copy's ``day`` into the directory ``into/<day>/``."""
        (into / day).mkdir(parents=True, exist_ok=True)
        for name in self.objects(day):
            self._download(self._key(day, name), into / day / name)


def remote_of(settings: ArchiveConfig) -> RemoteArchive | None:
    """The archive's copy ``settings`` names, if it names one."""
    if settings.remote is None:
        return None
    return RemoteArchive(Location.of(settings.remote, (settings.s3 or S3Config()).settings()))


def restore_missing(settings: ArchiveConfig, layout: DataLayout) -> None:
    """The segments that only the archive's copy holds (the disk bounded by
    ``max_bytes``, or lost) restored to the disk, when there is a copy: a reprocess does
    this first, since late events of the days it rebuilds may be in any later day."""
    remote = remote_of(settings)
    if remote is None:
        return
    try:
        restored = remote.restore(layout)
    except OSError as exc:
        raise TransientError(
            f"the archive's copy on {settings.remote} cannot be read: {exc}",
            fix="reprocess again once the store answers",
        ) from exc
    if restored:
        log.info("archive: %d segment(s) restored from %s", len(restored), settings.remote)


def _is_data(name: str) -> bool:
    return name.endswith(".log" + SUFFIX) or name.endswith(".log" + LEGACY_SUFFIX)


def _check(segment: ArchivedSegment) -> None:
    """Raise ArchiveFormatError unless the segment's files are what its manifest says
    (legacy ``.gz`` files have none: taken as they are)."""
    if segment.legacy:
        return
    manifest = Manifest.read(segment.manifest)
    found = digest(segment.data.read_bytes())
    if found != manifest.compressed:
        raise ArchiveFormatError(
            f"{segment.data.name} on the remote does not match its manifest "
            f"({found.size:,} bytes, sha1 {found.sha1}; recorded {manifest.compressed.size:,} "
            f"bytes, sha1 {manifest.compressed.sha1}): not restored"
        )
    for path, recorded in ((segment.index, manifest.index), (segment.ids, manifest.ids)):
        if digest(path.read_bytes()) != recorded:
            raise ArchiveFormatError(f"{path.name} on the remote does not match its manifest")


def _tmp(layout: DataLayout) -> Path:
    layout.tmp.mkdir(parents=True, exist_ok=True)
    return layout.tmp


def pending(layout: DataLayout) -> list[str]:
    """The days whose upload an earlier run left undone."""
    try:
        return [str(d) for d in json.loads((layout.archive / PENDING).read_text())]
    except FileNotFoundError:
        return []
    except ValueError:  # damaged: every day on disk is looked at again
        return [d.name for d in day_dirs(layout)]


def _write_pending(layout: DataLayout, days: list[str]) -> None:
    path = layout.archive / PENDING
    if days:
        write_file(path, json.dumps(sorted(days)).encode())
    else:
        path.unlink(missing_ok=True)
