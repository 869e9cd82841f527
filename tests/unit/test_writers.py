"""Many writers, one log: each writer's files carry its id, a dead writer's segments are
sealed by whoever finds it dead, a writer taken for dead stops, ``rotate`` reaches every
writer through the data directory, and data directories from before writer ids are read
and recovered."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import orjson
import pytest

from eventpipe import locks
from eventpipe.log import writers
from eventpipe.log.recovery import recover_dead, rotate_now
from eventpipe.log.segments import SegmentLog
from eventpipe.log.settings import LogSettings
from eventpipe.paths import DataLayout, SegmentName


def _line(n: int) -> bytes:
    return orjson.dumps({"n": n}) + b"\n"


def _numbers(paths: list[Path]) -> list[int]:
    return [orjson.loads(line)["n"] for p in paths for line in p.read_bytes().splitlines()]


@pytest.fixture
def layout(tmp_path: Path) -> DataLayout:
    layout = DataLayout(tmp_path / "data")
    layout.incoming.mkdir(parents=True)
    return layout


def test_names_carry_the_writer_and_parse_back_with_old_names_too() -> None:
    sealed = "incoming.tok=web|w=host-a-1-2026-11-24T10-00-00.000.log"
    assert SegmentName.parse(sealed) == SegmentName("web", "host-a-1", "2026-11-24T10-00-00.000")
    assert SegmentName.parse("incoming.tok=web|w=host-a-1.log") == SegmentName(
        "web", "host-a-1", None
    )
    old = SegmentName.parse("incoming.tok=web-2026-11-24T10-00-00.000.log")
    assert old == SegmentName("web", None, "2026-11-24T10-00-00.000")
    for name in (sealed, "incoming.tok=web.log"):
        parsed = SegmentName.parse(name)
        assert parsed is not None
        assert parsed.file_name == name
    assert SegmentName.parse("incoming.tok=web|w=a/b.log") is None
    assert SegmentName.parse("incoming.tok=web|w=.log") is None


def test_two_writers_write_their_own_files_and_the_log_reads_both(layout: DataLayout) -> None:
    async def scenario() -> None:
        first = SegmentLog(layout, LogSettings(), writer="a-0")
        second = SegmentLog(layout, LogSettings(), writer="b-0")
        for log in (first, second):
            log.open()
            await log.start()
        await first.append("web", _line(1), b'{"error":"a"}\n')
        await second.append("web", _line(2), b'{"error":"b"}\n')
        assert {p.name for p in layout.active_segments()} == {
            "incoming.tok=web|w=a-0.log", "incoming.tok=web|w=b-0.log",
        }  # fmt: skip
        await first.close()
        await second.close()

    asyncio.run(scenario())
    assert sorted(_numbers(layout.sealed_segments())) == [1, 2]
    assert [p.name for p in layout.failed_received("web")] == [
        "failed.tok=web|w=a-0.log", "failed.tok=web|w=b-0.log",
    ]  # fmt: skip
    assert layout.writers() == ["a-0", "b-0"]


def test_a_directory_from_before_writer_ids_is_recovered_by_the_first_writer(
    layout: DataLayout,
) -> None:
    layout.active_segment("web", None).write_bytes(_line(1) + b'{"torn')
    layout.sealed_segment("web", None, "2026-11-20T10-00-00.000").write_bytes(_line(0))
    log = SegmentLog(layout, LogSettings(), writer="a-0")
    report = log.open()
    log.close_sync()
    assert [p.name for p in report.sealed] == [
        p.name for p in layout.sealed_segments() if "2026-11-20" not in p.name
    ]
    assert _numbers(layout.sealed_segments()) == [0, 1]  # the old sealed one first
    assert len(report.torn) == 1
    assert layout.active_segments() == []


def test_a_dead_writer_of_this_host_is_recovered_at_once(layout: DataLayout) -> None:
    """Its lock is free (the kernel dropped it with the process): dead, whatever its age."""
    log = SegmentLog(layout, LogSettings(), writer="a-0")
    log.open()
    layout.active_segment("web", "a-0").write_bytes(_line(1))
    assert recover_dead(layout, LogSettings()) == []  # alive: it holds its lock
    log.close_sync()  # as if killed: the lock goes, the segment stays
    [sealed] = recover_dead(layout, LogSettings())
    assert SegmentName.parse(sealed.name) == SegmentName("web", "a-0", sealed.name[-27:-4])
    assert _numbers([sealed]) == [1]


def test_a_writer_on_another_host_is_dead_only_after_the_timeout(layout: DataLayout) -> None:
    lock = layout.writer_lock("far-0")
    lock.write_text("4242\nfar-away-host\n")  # nobody here holds it: flock says nothing
    layout.active_segment("web", "far-0").write_bytes(_line(1))
    settings = LogSettings(writer_timeout_seconds=60)
    assert writers.state(layout, "far-0", 60).alive
    assert recover_dead(layout, settings) == []
    old = time.time() - 61
    os.utime(lock, (old, old))
    found = writers.state(layout, "far-0", 60)
    assert (found.alive, found.pid, found.host) == (False, 4242, "far-away-host")
    [sealed] = recover_dead(layout, settings)
    assert _numbers([sealed]) == [1]
    assert locks.read(lock) == (os.getpid(), writers.HOST)  # taken over: it names us now


def test_a_writer_taken_for_dead_stops_taking_events(layout: DataLayout) -> None:
    async def scenario() -> None:
        log = SegmentLog(layout, LogSettings(writer_timeout_seconds=10), writer="a-0")
        log.open()
        await log.start()
        await log.append("web", _line(1))
        layout.writer_lock("a-0").write_text("1\nsome-other-host\n")  # taken over meanwhile
        log._heartbeat()
        with pytest.raises(Exception, match="shutting down"):
            await log.append("web", _line(2))
        await log.close()

    asyncio.run(scenario())
    # Left as it was: the process that took it over sealed (or will seal) it, not this one.
    assert layout.sealed_segments() == []
    assert _numbers(layout.writer_segments("a-0")) == [1]


def test_rotate_reaches_a_running_writer_through_the_data_directory(layout: DataLayout) -> None:
    async def scenario() -> list[Path]:
        log = SegmentLog(layout, LogSettings(), writer="a-0")
        log.open()
        await log.start()
        await log.append("web", _line(1))
        sealed = await asyncio.get_running_loop().run_in_executor(
            None, lambda: rotate_now(layout, LogSettings(), timeout_seconds=10)
        )
        await log.close()
        return sealed

    sealed = asyncio.run(scenario())
    assert _numbers(sealed) == [1]
