"""The fsync process of the durable log: it syncs the descriptors it is sent, reports
the errno of an fsync that fails, is replaced after it dies, and does not outlive the
process that started it."""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventpipe.log.syncer import MAX_FDS, Syncer
from tests.process import gone, wait_until_dead


@pytest.fixture
def syncer() -> Iterator[Syncer]:
    syncer = Syncer()
    yield syncer
    syncer.close()


@pytest.fixture
def fd(tmp_path: Path) -> Iterator[int]:
    """A file opened for writing, as the log opens its segments."""
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    yield fd
    os.close(fd)


def test_it_fsyncs_files_and_directories(tmp_path: Path, syncer: Syncer) -> None:
    # More descriptors than one request carries, so they go in several.
    paths = [tmp_path / f"f{n}" for n in range(MAX_FDS + 5)]
    fds = [os.open(p, os.O_WRONLY | os.O_CREAT) for p in paths]
    fds.append(os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY))
    try:
        seconds = asyncio.run(syncer.sync(fds[:-1], fds[-1:]))
        assert seconds >= 0
        for each in fds:  # the caller's descriptors stay open
            os.fstat(each)
    finally:
        for each in fds:
            os.close(each)


def test_an_fsync_that_fails_raises_its_errno(syncer: Syncer, fd: int) -> None:
    read_end, write_end = os.pipe()  # a pipe cannot be fsynced: EINVAL
    try:
        with pytest.raises(OSError, match="Invalid argument") as info:
            asyncio.run(syncer.sync([fd, read_end]))
        assert info.value.errno == errno.EINVAL
        assert asyncio.run(syncer.sync([fd])) >= 0  # the same process goes on
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_syncer_that_died_fails_the_request_and_the_next_one_starts_another(
    syncer: Syncer, fd: int
) -> None:
    asyncio.run(syncer.sync([fd]))
    first = syncer.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    wait_until_dead(first)
    with pytest.raises(OSError, match="the fsync process") as info:
        asyncio.run(syncer.sync([fd]))
    assert info.value.errno == errno.EIO
    asyncio.run(syncer.sync([fd]))
    assert syncer.pid not in (None, first)


def test_a_request_cancelled_while_it_waits_leaves_no_answer_behind(
    syncer: Syncer, fd: int, capfd: pytest.CaptureFixture[str]
) -> None:
    async def scenario() -> None:
        await syncer.sync([fd])
        first = syncer.pid
        assert first is not None
        os.kill(first, signal.SIGSTOP)  # as if in a long fsync: it cannot answer yet
        try:
            waiting = asyncio.create_task(syncer.sync([fd]))
            await asyncio.sleep(0.05)
            assert not waiting.done()  # sent, and waiting for the answer
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting  # at once: the loop does not wait for the stopped syncer
            assert syncer.pid is None  # let go: its late answer cannot be another's
            assert not gone(first)  # neither waited for nor killed
        finally:
            os.kill(first, signal.SIGCONT)
        wait_until_dead(first)  # it answered into a closed socket, and exited
        assert await syncer.sync([fd]) >= 0
        assert syncer.pid not in (None, first)

    asyncio.run(scenario())
    assert "Traceback" not in capfd.readouterr().err


def test_close_stops_it(syncer: Syncer, fd: int) -> None:
    assert syncer.pid is None  # started by the first request
    asyncio.run(syncer.sync([fd]))
    pid = syncer.pid
    assert pid is not None
    syncer.close()
    assert syncer.pid is None
    assert gone(pid)


def test_it_exits_when_the_process_that_started_it_is_killed(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import asyncio, os, sys, time
        from eventpipe.log.syncer import Syncer
        syncer = Syncer()
        fd = os.open({str(tmp_path / "f")!r}, os.O_WRONLY | os.O_CREAT)
        asyncio.run(syncer.sync([fd]))
        print(syncer.pid, flush=True)
        time.sleep(60)
        """
    )
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                          text=True) as parent:  # fmt: skip
        try:
            assert parent.stdout is not None
            pid = int(parent.stdout.readline())
            assert not gone(pid)
        finally:
            parent.kill()  # SIGKILL: no chance to close anything
    wait_until_dead(pid)
