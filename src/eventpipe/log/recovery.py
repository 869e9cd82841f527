"""Recovery of the log: what a writer that stopped left is sealed, and ``rotate`` seals
what every writer has open.

* :class:`Sealer` seals one writer's active segments, after cutting a torn last line
  (a process that died inside a write) off into ``failed/`` as an EventError.
* A writer recovers its own id's segments when it starts (log/segments.py); the
  pipeline, before each run, and ``eventpipe rotate`` recover every writer that is not
  alive (:func:`recover_dead`): on this host at once, on another after
  ``incoming.writer_timeout_seconds`` without a heartbeat (log/writers.py).
* Data directories from before writer ids: :func:`recover_legacy`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from eventpipe import locks
from eventpipe.errors import TransientError
from eventpipe.events import Stage, event_error_line
from eventpipe.files import fsync_directory
from eventpipe.log import writers
from eventpipe.paths import DataLayout, SegmentName, seal_stamp

if TYPE_CHECKING:
    from eventpipe.log.settings import LogSettings

log = logging.getLogger("eventpipe.log")

_TAIL_PROBE_BYTES = 1 << 16


def now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class TornTail:
    segment: str
    offset: int
    size: int


@dataclass(frozen=True)
class RecoveryReport:
    sealed: tuple[Path, ...]
    torn: tuple[TornTail, ...]
    removed_empty: tuple[str, ...]


class Sealer:
    """Seals one writer's segments (``writer`` None: the names from before writer
    ids), each under a name that is new and sorts after every earlier seal of its key."""

    def __init__(
        self, layout: DataLayout, writer: str | None, clock: Callable[[], datetime]
    ) -> None:
        self.layout = layout
        self.writer = writer
        self.clock = clock
        self._last_stamp: dict[str, str] = {}

    def recover(self) -> RecoveryReport:
        """Cut torn tails off the writer's active segments and seal them (the caller
        holds the writer's lock)."""
        torn: list[TornTail] = []
        sealed: list[Path] = []
        removed: list[str] = []
        for path in self.layout.writer_segments(self.writer):
            key_id = SegmentName.parse(path.name).key_id  # type: ignore[union-attr]
            tail = self._cut_torn_tail(path, key_id)
            if tail is not None:
                torn.append(tail)
            if path.stat().st_size == 0:
                path.unlink()
                removed.append(path.name)
                continue
            sealed.append(self.rename(path, key_id, reason="startup"))
        if sealed or torn or removed:
            fsync_directory(self.layout.incoming)
        return RecoveryReport(tuple(sealed), tuple(torn), tuple(removed))

    def rename(self, path: Path, key_id: str, *, reason: str) -> Path:
        """Rename to a sealed name that is new and sorts after every earlier seal of the key."""
        when = self.clock()
        stamp = seal_stamp(when)
        previous = self._last_stamp.get(key_id)
        while (previous is not None and stamp <= previous) or self.layout.sealed_segment(
            key_id, self.writer, stamp
        ).exists():
            when += timedelta(milliseconds=1)
            stamp = seal_stamp(when)
        target = self.layout.sealed_segment(key_id, self.writer, stamp)
        os.rename(path, target)
        self._last_stamp[key_id] = stamp
        if reason == "startup":
            log.info("sealed %s left by an earlier process", target.name)
        return target

    def _cut_torn_tail(self, path: Path, key_id: str) -> TornTail | None:
        """If ``path`` ends inside a line, move that partial line to failed/ and cut it off."""
        size = path.stat().st_size
        if size == 0:
            return None
        with path.open("r+b") as fh:
            probe = min(size, _TAIL_PROBE_BYTES)
            fh.seek(size - probe)
            chunk = fh.read(probe)
            if chunk.endswith(b"\n"):
                return None
            start = size - probe
            while (cut := chunk.rfind(b"\n")) < 0 and start > 0:
                probe = min(start, _TAIL_PROBE_BYTES)
                start -= probe
                fh.seek(start)
                chunk = fh.read(probe) + chunk
            keep = start + cut + 1 if cut >= 0 else 0
            fh.seek(keep)
            tail = fh.read()
            record = event_error_line(
                event=None,
                error=(
                    f"torn line: {len(tail)} bytes at offset {keep} of {path.name} were "
                    "written by a process that stopped before finishing them; they were "
                    "never acknowledged"
                ),
                stage=Stage.RECEIVING,
                when=self.clock(),
                api_key=key_id,
                raw=tail.decode("utf-8", errors="backslashreplace"),
            )
            failed = self.layout.failed_receiving(key_id, self.writer)
            with failed.open("ab") as out:
                out.write(record)
                out.flush()
                os.fsync(out.fileno())
            fh.truncate(keep)
            fh.flush()
            os.fsync(fh.fileno())
        log.warning("moved a torn line (%d bytes) from %s to %s", len(tail), path.name, failed.name)
        return TornTail(path.name, keep, len(tail))


def recover_legacy(layout: DataLayout, clock: Callable[[], datetime] = now) -> RecoveryReport:
    """Seal the active segments of a data directory from before writer ids, unless an
    eventpipe of that time still writes them (it holds ``incoming/collector.lock``)."""
    if not layout.writer_segments(None):
        return RecoveryReport((), (), ())
    report = _recover_holding(layout, None, layout.incoming / "collector.lock", "", clock)
    return report or RecoveryReport((), (), ())


def _recover_holding(
    layout: DataLayout, writer: str | None, lock: Path, details: str,
    clock: Callable[[], datetime],
) -> RecoveryReport | None:  # fmt: skip
    """Seal ``writer``'s active segments holding ``lock``; None when another process
    holds it (it writes them)."""
    try:
        fd = locks.acquire(lock, details)
    except locks.LockHeldError:
        return None
    try:
        return Sealer(layout, writer, clock).recover()
    finally:
        os.close(fd)


def recover_dead(
    layout: DataLayout, settings: LogSettings, clock: Callable[[], datetime] = now
) -> list[Path]:
    """Seal the active segments of every writer that is not alive (log/writers.py):
    the pipeline's and ``eventpipe rotate``'s part of recovery. A writer is taken over
    by taking its lock, which then names this process."""
    sealed = list(recover_legacy(layout, clock).sealed)
    with_segments = {SegmentName.parse(p.name).writer for p in layout.active_segments()}  # type: ignore[union-attr]
    for writer in sorted(w for w in with_segments if w is not None):
        found = writers.state(layout, writer, settings.writer_timeout_seconds)
        if found.alive:
            continue
        lock = layout.writer_lock(writer)
        report = _recover_holding(layout, writer, lock, writers.lock_details(), clock)
        if report is None:
            continue  # it started again meanwhile
        if report.sealed:
            log.warning("writer %s (pid %s on %s) is gone: sealed %d segment(s) it left",
                        writer, found.pid, found.host or "?", len(report.sealed))  # fmt: skip
        sealed += report.sealed
    return sealed


def rotate_now(
    layout: DataLayout, settings: LogSettings, *, timeout_seconds: float = 30.0
) -> list[Path]:
    """Seal every active segment of ``layout``, whoever writes it (``eventpipe rotate``).

    Writers that are gone are recovered here; the others, on this host or any other,
    see ``incoming/rotate.request`` touched within a second and seal. This waits until
    every segment that was active has been renamed.
    """
    before = {p: p.stat().st_ino for p in layout.active_segments() if p.stat().st_size > 0}
    sealed_before = set(layout.sealed_segments())
    recover_dead(layout, settings)
    layout.incoming.mkdir(parents=True, exist_ok=True)
    layout.rotate_request.touch()  # a new mtime, whether it existed or not
    deadline = time.monotonic() + timeout_seconds
    while True:
        left = [p for p, ino in before.items() if p.exists() and p.stat().st_ino == ino]
        if not left:
            return sorted(set(layout.sealed_segments()) - sealed_before)
        if time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    names = sorted({str(SegmentName.parse(p.name).writer) for p in left})  # type: ignore[union-attr]
    raise TransientError(
        f"writer(s) {', '.join(names)} did not seal their segments within {timeout_seconds:.0f} s",
        fix="check their logs for errors (eventpipe status lists the writers)",
    )
