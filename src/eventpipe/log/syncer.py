"""The log's fsyncs in a small process of its own, so the collector's event loop never
shares its GIL with the thread that waits on the disk.

Why a process: the log's group commit made each round's fsync on a thread of the
collector. That thread takes the GIL twice a round (when it wakes, and when the fsync
returns), and each time the busy event loop stops until it has it back. Measured with
single-event requests (docs/collector.md, "Single-event requests"), the loop thread was
idle 19% of the time, and with fsync off a request handed to the thread took 1.4x as
long as one whose round stayed on the loop. A process
has its own interpreter: the loop sends it the round's file descriptors over a Unix
socket (``SCM_RIGHTS``, so it syncs the very files the loop wrote, whatever their names
become) and reads one answer, as it reads from a client.

The protocol is one request at a time, on a ``SOCK_SEQPACKET`` socket pair:

* request: up to :data:`MAX_FDS` descriptors attached, and a byte for each saying what
  it is: ``f`` a file, made durable with ``fdatasync``, ``d`` a directory, with
  ``fsync``;
* answer: the errno of the first sync that failed (0: all durable) and the seconds the
  syncs took, packed as :data:`ANSWER`.

``fdatasync`` keeps the guarantee for the log's appends: it writes the file's data and
the metadata needed to read it back (its size, its blocks), and leaves out only what a
reader does not need (times). Measured on a 16-core machine with ext4 (bench/fsync.py,
45,000-byte appends), it made 5-12% more rounds per second than ``fsync`` and a lower
p99 with 8 writers (docs/collector.md).

The syncer exits when the socket closes, so a collector killed with SIGKILL leaves none
behind. If the syncer dies, the round it was given fails like a failed fsync (the log
cuts the files back), and the next round starts a new one.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import struct
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Sequence

# asyncio and subprocess are imported where the log's side uses them: the syncer process
# runs this module and needs neither (it is 9 MB smaller without them).

ANSWER = struct.Struct("<id")
MAX_FDS = 200
"""Descriptors per request; the kernel takes at most 253 in one message."""


class Syncer:
    """The log's side: a syncer process started on first use, asked to fsync file
    descriptors, restarted after it dies."""

    def __init__(self) -> None:
        self._socket: socket.socket | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._retired: list[subprocess.Popen[bytes]] = []
        """Syncers let go while they may still be in an fsync: reaped when they exit."""

    async def sync(self, files: Sequence[int], directories: Sequence[int] = ()) -> float:
        """Make ``files`` (fdatasync) and ``directories`` (fsync) durable, through the
        syncer's copies of the descriptors (the caller's stay open). Returns the seconds
        the syncs took; raises OSError like os.fsync, or with EIO if the syncer died."""
        import asyncio

        loop = asyncio.get_running_loop()
        fds = [*files, *directories]
        kinds = b"f" * len(files) + b"d" * len(directories)
        seconds = 0.0
        for start in range(0, len(fds), MAX_FDS):
            sock = self._socket or self._start()
            try:
                socket.send_fds(
                    sock, [kinds[start : start + MAX_FDS]], fds[start : start + MAX_FDS]
                )
                answer = await loop.sock_recv(sock, ANSWER.size)
            except OSError as exc:
                self._stop()
                raise OSError(errno.EIO, f"the fsync process is gone: {exc}") from exc
            except asyncio.CancelledError:
                # Its answer would be read as the next request's. It may be in a long
                # fsync: let it go without waiting (it exits when it sees the socket
                # closed), and start another for the next round.
                self._stop(wait=False)
                raise
            if len(answer) != ANSWER.size:
                self._stop()
                raise OSError(errno.EIO, "the fsync process exited")
            failed, took = ANSWER.unpack(answer)
            if failed:
                raise OSError(failed, os.strerror(failed))
            seconds += took
        return seconds

    def close(self) -> None:
        self._stop()
        for process in self._retired:
            _reap(process)
        self._retired.clear()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def _start(self) -> socket.socket:
        import subprocess

        self._retired = [each for each in self._retired if each.poll() is None]
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            self._process = subprocess.Popen(
                [sys.executable, "-m", __name__, str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
            )
        ours.setblocking(False)
        self._socket = ours
        return ours

    def _stop(self, wait: bool = True) -> None:
        if self._socket is not None:
            self._socket.close()  # the syncer reads the end of its socket and exits
            self._socket = None
        if self._process is not None:
            if wait:
                _reap(self._process)
            elif self._process.poll() is None:
                self._retired.append(self._process)
            self._process = None


def _reap(process: subprocess.Popen[bytes]) -> None:
    import subprocess

    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def serve(sock: socket.socket) -> None:
    """The syncer's loop: sync what each request carries, answer, until the socket
    closes."""
    while True:
        try:
            kinds, fds, _, _ = socket.recv_fds(sock, MAX_FDS, MAX_FDS)
        except ConnectionResetError:
            return
        if not kinds:
            return
        failed = 0 if len(kinds) == len(fds) else errno.EINVAL
        started = time.perf_counter()
        for kind, fd in zip(kinds, fds, strict=False):
            if not failed:
                try:
                    os.fdatasync(fd) if kind == ord("f") else os.fsync(fd)
                except OSError as exc:
                    failed = exc.errno or errno.EIO
        for fd in fds:
            os.close(fd)
        try:
            sock.send(ANSWER.pack(failed, time.perf_counter() - started))
        except (BrokenPipeError, ConnectionResetError):
            return  # the log stopped waiting for this answer


if __name__ == "__main__":
    # It stops when the collector closes the socket, after the collector's last round:
    # Ctrl-C and a service manager's SIGTERM go to the collector, which drains first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    serve(socket.socket(fileno=int(sys.argv[1])))
