"""Backpressure: refuse new events (503 + Retry-After) while there is no room for them.

Two limits: bytes of unprocessed segments and of failed/ records
(``incoming.max_backlog_bytes``: bad input must not fill the disk either) and free disk
under the data directory (``incoming.min_free_disk_bytes``). Both are re-read every
``interval_seconds``, so the collector recovers by itself once the pipeline catches up or
space returns. A write that fails for lack of space turns backpressure on at once, before
the next reading, and it stays on while less than FULL_DISK_MARGIN is free (with
``min_free_disk_bytes: 0``, a reading of a disk that is still full would otherwise turn
it off again, and the next write fail).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
from dataclasses import dataclass

from eventpipe.collector.metrics import CollectorMetrics
from eventpipe.log.segments import SegmentLog
from eventpipe.paths import DataLayout, SegmentName

log = logging.getLogger("eventpipe.collector")

_NO_SPACE = {errno.ENOSPC, errno.EDQUOT}
FULL_DISK_MARGIN = 1 << 20
"""Free bytes there must be again, after a write failed for lack of space, before events
are accepted (a quota that is full while the disk is not: the next reading lifts it)."""
_FULL = "the disk is full: the last write failed"


@dataclass(frozen=True)
class Limits:
    max_backlog_bytes: int
    min_free_disk_bytes: int


class Backpressure:
    def __init__(
        self,
        layout: DataLayout,
        segment_log: SegmentLog,
        limits: Limits,
        metrics: CollectorMetrics,
        *,
        interval_seconds: float = 1.0,
    ) -> None:
        self.layout = layout
        self.segment_log = segment_log
        self.limits = limits
        self.metrics = metrics
        self.interval_seconds = interval_seconds
        self.reason: str | None = None
        self._full = False  # a write failed for lack of space, and space has not returned
        # A sealed segment never changes size: each is stat'ed once, then remembered while it
        # stays in incoming/ (with 10,000 segments a full stat each second took 80 ms of the
        # event loop).
        self._sealed_sizes: dict[str, int] = {}

    def sealed_bytes(self) -> int:
        """Bytes of the sealed segments in incoming/ (names are listed, not parsed again)."""
        try:
            names = os.listdir(self.layout.incoming)
        except FileNotFoundError:
            names = []
        sizes: dict[str, int] = {}
        for name in names:
            size = self._sealed_sizes.get(name)
            if size is None:
                parsed = SegmentName.parse(name)
                if parsed is None or parsed.sealed is None:
                    continue  # the active segments are counted by the log; other files not
                try:
                    size = os.stat(self.layout.incoming / name).st_size
                except FileNotFoundError:
                    continue  # processed and moved while we looked
            sizes[name] = size
        self._sealed_sizes = sizes
        return sum(sizes.values())

    def failed_bytes(self) -> int:
        """Bytes of the EventErrors in failed/ (a few files, each stat'ed)."""
        total = 0
        for directory in (self.layout.failed, self.layout.failed / "replay"):
            try:
                entries = list(os.scandir(directory))
            except FileNotFoundError:
                continue
            for entry in entries:
                with contextlib.suppress(FileNotFoundError):
                    if entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
        return total

    def refresh(self) -> None:
        backlog = self.sealed_bytes() + self.segment_log.active_bytes() + self.failed_bytes()
        stats = os.statvfs(self.layout.root)
        free = stats.f_bavail * stats.f_frsize
        self.metrics.backlog_bytes.set(backlog)
        self.metrics.free_disk_bytes.set(free)
        reason = None
        if self._full and free < FULL_DISK_MARGIN:
            reason = _FULL
        elif free < self.limits.min_free_disk_bytes:
            reason = (
                f"free disk {free} bytes is under min_free_disk_bytes "
                f"({self.limits.min_free_disk_bytes})"
            )
        elif backlog > self.limits.max_backlog_bytes:
            reason = (
                f"backlog {backlog} bytes is over max_backlog_bytes "
                f"({self.limits.max_backlog_bytes})"
            )
        self._full = reason == _FULL
        self._set(reason)

    def note_write_error(self, error_number: int | None) -> None:
        """A failed append: with no space left, refuse at once rather than at the next reading
        (which decides again from what it measures)."""
        if error_number in _NO_SPACE:
            self._full = True
            self._set(_FULL)

    def _set(self, reason: str | None) -> None:
        if reason != self.reason:
            if reason is None:
                log.info("backpressure off: accepting events again")
            elif self.reason is None:
                log.warning("backpressure on: answering 503 because %s", reason)
        self.reason = reason
        self.metrics.backpressure.set(0 if reason is None else 1)

    async def run(self) -> None:
        while True:
            try:
                self.refresh()
            except OSError as exc:
                log.error("could not measure backlog or free disk: %s", exc)
            await asyncio.sleep(self.interval_seconds)
