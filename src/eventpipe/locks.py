"""Process locks: an exclusive ``flock`` on a file, the one lock mechanism of eventpipe.

* :func:`acquire` / :func:`holding`: single-holder locks that do not wait and name their
  holder's pid: the collector's data directory (one log writer), the pipeline (one job
  per data directory), a stream destination (one query per checkpoint).
* :func:`waiting`: a lock taken in turn, waiting for the holder: patching a table of a
  destination without locks of its own (files, DuckDB; PostgreSQL uses advisory locks).

The kernel drops a lock when its holder dies, however it dies, so a stale pid in the file
never blocks anyone; the pid is only there to be reported.

The pipeline's locks (one pipeline, one stream query per destination, one patch per
table) are named, and taken through a :class:`Locks`: :class:`FileLocks` in the data
directory, or the state store's PostgreSQL advisory locks when hosts share the data
directory (eventpipe.state.locks), since ``flock`` on a network file system is not to
be trusted.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Protocol


class LockHeldError(Exception):
    """Another process holds the lock; ``pid`` is what its file says (None if unreadable)."""

    def __init__(self, path: Path, pid: int | None) -> None:
        super().__init__(f"{path} is held by pid {pid}")
        self.path = path
        self.pid = pid


Busy = Callable[[str], Exception]
"""Makes the error raised when a lock is held elsewhere, from who holds it (``pid 42``,
``pid 42 on host b``, or ``?``)."""


class Locks(Protocol):
    """Named locks of one data directory, held across the processes (and hosts) that
    share it. Names are file-name safe: ``pipeline``, ``stream.dst=web``."""

    def holding(self, name: str, busy: Busy) -> AbstractContextManager[None]:
        """The lock for the length of the block, without waiting: ``busy(holder)`` is
        raised when another process holds it."""
        ...

    def waiting(self, name: str) -> AbstractContextManager[None]:
        """The lock for the length of the block, waiting until the holder lets it go."""
        ...


class FileLocks:
    """:class:`Locks` as ``flock``s on ``<directory>/<name>.lock``: for one host, or a
    shared file system whose locks hold across hosts."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, name: str) -> Path:
        return self.directory / f"{name}.lock"

    @contextmanager
    def holding(self, name: str, busy: Busy) -> Iterator[None]:
        with holding(self.path(name), lambda pid: busy(f"pid {pid}" if pid else "?")):
            yield

    def waiting(self, name: str) -> AbstractContextManager[None]:
        return waiting(self.path(name))


def acquire(path: Path, details: str = "") -> int:
    """Take the lock without waiting and write our pid (and ``details``, a line after
    it); returns the fd to keep open.

    Closing the fd releases the lock. Raises LockHeldError when another process holds it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise LockHeldError(path, holder(path)) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n{details}".encode())
    return fd


def holder(path: Path) -> int | None:
    """The pid written in the lock file, if any."""
    return read(path)[0]


def read(path: Path) -> tuple[int | None, str]:
    """The pid written in the lock file (None if none) and the details after it."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None, ""
    first, _, details = text.partition("\n")
    first = first.strip()
    return (int(first) if first.isdigit() else None), details.strip()


def is_held(path: Path) -> bool:
    """Whether some process holds the lock now."""
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@contextmanager
def holding(path: Path, busy: Callable[[int | None], Exception] | None = None) -> Iterator[None]:
    """:func:`acquire` for the length of the block. When another process holds it:
    ``busy(its pid)`` is raised, or LockHeldError without ``busy``."""
    try:
        fd = acquire(path)
    except LockHeldError as held:
        if busy is None:
            raise
        raise busy(held.pid) from None
    try:
        yield
    finally:
        os.close(fd)


@contextmanager
def waiting(path: Path) -> Iterator[None]:
    """The lock for the length of the block, waiting until the holder lets it go."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
