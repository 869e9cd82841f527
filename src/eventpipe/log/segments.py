"""The durable log of incoming events: one active segment per key id, sealed by rename.

Guarantees (what the collector's 200 means):

* ``await log.append(...)`` returns only after the bytes are written *and* fsynced. Appends
  that arrive while an fsync runs wait together for the next one (group commit), so the
  number of fsyncs per second stays bounded however many requests arrive.
* A segment is sealed by an atomic rename of ``incoming.tok=K|w=W.log`` to
  ``incoming.tok=K|w=W-<UTC seal time>.log`` followed by an fsync of the directory.
  Readers only look at sealed names, so they never see a partial segment.
* A write that fails (disk full) is cut back to the last fsynced size, so nothing already
  acknowledged is damaged and no half line is left behind.
* If the process dies in the middle of a write, the active segment may end with a torn
  line. :meth:`SegmentLog.open` finds it, moves it aside as an EventError in ``failed/``,
  and seals what precedes it.
* Many processes write one data directory's log, each as a writer with an id of its
  own (log/writers.py) in the name of every file it writes: no two write one file. A
  writer holds an exclusive ``flock`` on ``incoming/writer.w=<id>.lock`` (its pid and
  host inside) and touches it as a heartbeat; a second process with the same id on the
  same host is refused. At start a writer seals what its id left (and what a data
  directory from before writer ids left).

One writer task runs rounds in order, never overlapping: page-cache writes on the event
loop thread, then the fsync in the syncer process (log/syncer.py: the loop waits for it
as for a socket, and shares its GIL with no thread), then any sealing on one dedicated
I/O thread. Sealing, torn tails and the recovery of writers that are gone:
log/recovery.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from eventpipe import locks
from eventpipe.errors import DataDirLockedError, TransientError
from eventpipe.files import fsync_directory
from eventpipe.log import writers
from eventpipe.log.recovery import RecoveryReport, Sealer, now, recover_legacy
from eventpipe.log.settings import LogSettings
from eventpipe.log.syncer import Syncer
from eventpipe.paths import DataLayout, SegmentName

log = logging.getLogger("eventpipe.log")


class LogWriteError(TransientError):
    """Appending to the log failed (typically: disk full); nothing of the group was kept."""

    name = "log_write_failed"


class LogClosedError(TransientError):
    """The log is shutting down and takes no more appends."""

    name = "log_closed"


@dataclass(frozen=True)
class SyncedRound:
    """What one group commit took, as ``LogHooks.on_round`` reports it."""

    appends: int
    """The appends (requests) the round made durable together."""
    sync_seconds: float
    """The syncs themselves, as the syncer process timed them."""
    wait_seconds: float
    """From handing the round to the syncer to its answer: the syncs, plus the hand-off
    (the two messages, the syncer's waking, the loop's noticing the answer)."""


@dataclass(frozen=True)
class LogHooks:
    """Callbacks for metrics, so they must be quick: ``on_round`` is called on the event
    loop after each durable round (with fsync on), ``on_sealed`` on the log's I/O
    thread."""

    on_round: Callable[[SyncedRound], None] = lambda synced: None
    on_sealed: Callable[[Path, int, str], None] = lambda path, size, reason: None


@dataclass
class _Active:
    """An open append target and how much of it is known to be on disk."""

    path: Path
    fd: int
    size: int
    opened_at: float  # monotonic seconds
    is_segment: bool


@dataclass
class _Round:
    """One group commit: the files written to and how much, awaiting one fsync round."""

    segment_keys: dict[Path, str]
    touched: list[tuple[_Active, int]] = field(default_factory=list)
    new_files_in: set[Path] = field(default_factory=set)


@dataclass
class _Pending:
    key_id: str
    events: bytes
    rejected: bytes
    future: asyncio.Future[None] = field(repr=False)


class SegmentLog:
    """One writer's part of the append-only log under ``data/incoming`` (see the
    module's docstring)."""

    def __init__(
        self,
        layout: DataLayout,
        settings: LogSettings,
        *,
        writer: str | None = None,
        hooks: LogHooks | None = None,
        clock: Callable[[], datetime] = now,
    ) -> None:
        self.layout = layout
        self.settings = settings
        self.writer = writer or writers.host_writer(0)
        """This writer's id, in the names of its files."""
        self.hooks = hooks or LogHooks()
        self._clock = clock
        self._lock_fd: int | None = None
        self._files: dict[Path, _Active] = {}
        self._segment_paths: dict[str, Path] = {}
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="eventpipe-log")
        self._syncer = Syncer()
        self._pending: list[_Pending] = []
        self._wake = asyncio.Event()
        self._rotate_reasons: list[str] = []
        self._rotate_waiters: list[asyncio.Future[list[Path]]] = []
        self._age_check = False
        self._closing = False
        self._flusher: asyncio.Task[None] | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._sealer = Sealer(layout, self.writer, clock)
        self._rotation_seen = _mtime(layout.rotate_request)
        self._heartbeat_at = 0.0
        self._abandoned = False
        self.started = False

    # ----------------------------------------------------------------- start and stop

    def open(self, wait_seconds: float = 0.0) -> RecoveryReport:
        """Take the writer's lock, repair torn tails, seal what an earlier process with
        this writer's id left (and a data directory's from before writer ids).

        Synchronous: call before serving. Raises DataDirLockedError if another process
        holds the writer's id for longer than ``wait_seconds`` (a restarted worker waits
        for the one it replaces to finish stopping).
        """
        self.layout.incoming.mkdir(parents=True, exist_ok=True)
        self.layout.failed.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + wait_seconds
        while True:
            try:
                self._take_lock()
                break
            except DataDirLockedError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.1)
        report = self._sealer.recover()
        legacy = recover_legacy(self.layout, self._clock)
        return RecoveryReport(
            report.sealed + legacy.sealed, report.torn + legacy.torn,
            report.removed_empty + legacy.removed_empty,
        )  # fmt: skip

    async def start(self) -> None:
        """Start the group-commit writer and the rotation timer on the running loop."""
        self._wake = asyncio.Event()
        self.started = True
        self._flusher = asyncio.create_task(self._flush_loop(), name="eventpipe-log-flush")
        self._ticker = asyncio.create_task(self._tick_loop(), name="eventpipe-log-tick")

    async def close(self) -> list[Path]:
        """Write what is queued, seal every active segment, release the lock."""
        self._closing = True
        self._wake.set()
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        if self._flusher is not None:
            await self._flusher
        loop = asyncio.get_running_loop()
        sealed = await loop.run_in_executor(self._io, self._seal_all_sync, "shutdown")
        self.close_sync()
        return sealed

    def close_sync(self) -> None:
        """Close files and release the lock without sealing (after open() only, or at exit)."""
        for active in self._files.values():
            os.close(active.fd)
        self._files.clear()
        self._io.shutdown(wait=True)
        self._syncer.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # ----------------------------------------------------------------- appending

    async def append(self, key_id: str, events: bytes, rejected: bytes = b"") -> None:
        """Durably append JSON lines for one key. Returns after fsync; raises LogWriteError.

        ``events`` go to the key's active segment, ``rejected`` (EventError lines) to
        ``failed/failed.tok=<key>.log``; both are made durable by the same fsync round.
        """
        if self._closing:
            raise LogClosedError("the collector is shutting down")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(key_id, events, rejected, future))
        self._wake.set()
        await future

    async def rotate(self, reason: str = "command") -> list[Path]:
        """Seal every non-empty active segment now; returns the sealed paths."""
        future: asyncio.Future[list[Path]] = asyncio.get_running_loop().create_future()
        self._rotate_reasons.append(reason)
        self._rotate_waiters.append(future)
        self._wake.set()
        return await future

    def request_rotation(self, reason: str) -> None:
        """Like rotate() without waiting: safe to call from a signal handler."""
        self._rotate_reasons.append(reason)
        self._wake.set()

    def active_bytes(self) -> int:
        # list() copies atomically under the GIL; the I/O thread may seal (pop) meanwhile.
        return sum(a.size for a in list(self._files.values()) if a.is_segment)

    # ----------------------------------------------------------------- the writer task

    async def _flush_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._age_check:
                self._age_check = False
                await loop.run_in_executor(self._io, self._seal_due_sync)
            if self._rotate_reasons:
                reasons, self._rotate_reasons = self._rotate_reasons, []
                waiters, self._rotate_waiters = self._rotate_waiters, []
                try:
                    sealed = await loop.run_in_executor(
                        self._io, self._seal_all_sync, ",".join(sorted(set(reasons)))
                    )
                except OSError as exc:
                    log.error("rotation failed: %s", exc)
                    for waiter in waiters:
                        waiter.set_exception(LogWriteError(f"rotation failed: {exc}"))
                else:
                    for waiter in waiters:
                        waiter.set_result(sealed)
            batch, self._pending = self._pending, []
            if batch:
                try:
                    await self._sync_round(self._write_round(batch), len(batch))
                except OSError as exc:
                    error = LogWriteError(
                        f"could not append to the log: {exc.strerror or exc}",
                        errno=exc.errno,
                    )
                    for item in batch:
                        if not item.future.done():
                            item.future.set_exception(error)
                else:
                    for item in batch:
                        if not item.future.done():
                            item.future.set_result(None)
            if self._closing and not self._pending and not self._rotate_reasons:
                return

    async def _tick_loop(self) -> None:
        """Wake the writer when an active segment is due for time-based rotation or
        ``eventpipe rotate`` asked (rotate.request touched); touch the heartbeat."""
        interval = min(1.0, self.settings.rotate_seconds / 4)
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            if now - self._heartbeat_at >= writers.heartbeat_seconds(self.settings):
                self._heartbeat_at = now
                await loop.run_in_executor(self._io, self._heartbeat)
            requested = _mtime(self.layout.rotate_request)
            if requested != self._rotation_seen:
                self._rotation_seen = requested
                self.request_rotation("command")
            if any(
                a.is_segment and a.size > 0 and now - a.opened_at >= self.settings.rotate_seconds
                for a in list(self._files.values())
            ):
                self._age_check = True
                self._wake.set()

    # ----------------------------------------------------------------- I/O thread

    def _write_round(self, batch: list[_Pending]) -> _Round:
        """Write a round's bytes to the page cache (on the loop thread: it is a memcpy).

        Only the fsync leaves the loop, and not for a thread: a thread coming back from
        a blocking call must take the GIL from the busy loop (log/syncer.py).
        """
        by_path: dict[Path, list[bytes]] = {}
        segment_keys: dict[Path, str] = {}
        for item in batch:
            if item.events:
                path = self._segment_path(item.key_id)
                by_path.setdefault(path, []).append(item.events)
                segment_keys[path] = item.key_id
            if item.rejected:
                failed = self.layout.failed_receiving(item.key_id, self.writer)
                by_path.setdefault(failed, []).append(item.rejected)
        written = _Round(segment_keys=segment_keys)
        try:
            for path, chunks in by_path.items():
                active = self._files.get(path)
                if active is None:
                    active = self._open_target(path, is_segment=path in segment_keys)
                    if active.size == 0:
                        written.new_files_in.add(path.parent)
                data = b"".join(chunks)
                written.touched.append((active, len(data)))
                _write_all(active.fd, data)
        except OSError:
            self._cut_back([active for active, _ in written.touched])
            raise
        return written

    async def _sync_round(self, written: _Round, appends: int) -> None:
        """Make a written round durable (the syncer process), then seal segments that
        are full (the I/O thread)."""
        touched = [active for active, _ in written.touched]
        if self.settings.fsync:
            directories: list[int] = []
            try:
                for directory in written.new_files_in:
                    directories.append(os.open(directory, os.O_RDONLY | os.O_DIRECTORY))
                handed = time.perf_counter()
                synced = await self._syncer.sync([active.fd for active in touched], directories)
                waited = time.perf_counter() - handed
                self.hooks.on_round(SyncedRound(appends, synced, waited))
            except OSError:
                self._cut_back(touched)
                raise
            finally:
                for fd in directories:
                    os.close(fd)
        for active, size in written.touched:
            active.size += size
        full = [(path, key_id) for path, key_id in written.segment_keys.items()
                if self._files[path].size >= self.settings.max_segment_bytes]  # fmt: skip
        if full:
            await asyncio.get_running_loop().run_in_executor(self._io, self._seal_full, full)

    def _seal_full(self, full: list[tuple[Path, str]]) -> None:
        for path, key_id in full:
            self._seal_sync(path, key_id, reason="size")

    def _segment_path(self, key_id: str) -> Path:
        path = self._segment_paths.get(key_id)
        if path is None:
            path = self._segment_paths[key_id] = self.layout.active_segment(key_id, self.writer)
        return path

    def _heartbeat(self) -> None:
        """Touch the lock file (I/O thread). A writer whose id was taken over (by the
        pipeline, after ``writer_timeout_seconds`` without a heartbeat) stops taking
        events and leaves its files as they are: they were sealed by the one that took
        it over, and what it appended now could go to a segment already read."""
        try:
            writers.heartbeat(self.layout, self.writer)
        except writers.TakenOverError as exc:
            log.critical("%s; this collector takes no more events (restart it)", exc)
            self._abandoned = True
            self._closing = True
            self._wake.set()
        except OSError as exc:
            log.error("could not touch %s: %s", self.layout.writer_lock(self.writer), exc)

    def _cut_back(self, touched: list[_Active]) -> None:
        """Undo a failed group: truncate each file to its last durable size."""
        for active in touched:
            try:
                os.ftruncate(active.fd, active.size)
                os.lseek(active.fd, active.size, os.SEEK_SET)
                if self.settings.fsync:
                    os.fsync(active.fd)
            except OSError as exc:  # the disk may refuse even this; the tail check repairs it
                log.error("could not cut %s back after a failed write: %s", active.path, exc)

    def _open_target(self, path: Path, *, is_segment: bool) -> _Active:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        size = os.fstat(fd).st_size
        if not is_segment and size > 0 and os.pread(fd, 1, size - 1) != b"\n":
            # A failed/ file left torn by a crash mid-write (segments are cut at open):
            # the next record starts on a line of its own, and the torn tail stays
            # behind as the one damaged line it is, instead of swallowing that record.
            _write_all(fd, b"\n")
            size += 1
            log.warning("%s ended inside a line (a crash mid-write); appending after it", path.name)
        active = _Active(path, fd, size, time.monotonic(), is_segment)
        self._files[path] = active
        return active

    def _seal_all_sync(self, reason: str) -> list[Path]:
        if self._abandoned:  # another process sealed them when it took this writer over
            return []
        sealed = []
        for path, active in list(self._files.items()):
            if active.is_segment and active.size > 0:
                key_id = SegmentName.parse(path.name).key_id  # type: ignore[union-attr]
                sealed.append(self._seal_sync(path, key_id, reason=reason))
        return sealed

    def _seal_due_sync(self) -> None:
        now = time.monotonic()
        for path, active in list(self._files.items()):
            if (
                active.is_segment
                and active.size > 0
                and now - active.opened_at >= self.settings.rotate_seconds
            ):
                key_id = SegmentName.parse(path.name).key_id  # type: ignore[union-attr]
                try:
                    self._seal_sync(path, key_id, reason="age")
                except OSError as exc:
                    log.error("could not seal %s: %s", path.name, exc)

    def _seal_sync(self, path: Path, key_id: str, *, reason: str) -> Path:
        active = self._files.pop(path)
        os.close(active.fd)
        sealed = self._sealer.rename(path, key_id, reason=reason)
        fsync_directory(self.layout.incoming)
        self.hooks.on_sealed(sealed, active.size, reason)
        log.info("sealed %s (%d bytes, %s)", sealed.name, active.size, reason)
        return sealed

    def _take_lock(self) -> None:
        try:
            self._lock_fd = locks.acquire(
                self.layout.writer_lock(self.writer), writers.lock_details()
            )
        except locks.LockHeldError as held:
            raise DataDirLockedError(
                f"another eventpipe process (pid {held.pid}) writes {self.layout.incoming} "
                f"as writer {self.writer}",
                fix="stop it, or give this one another server.writer_id",
                pid=held.pid,
            ) from None


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
