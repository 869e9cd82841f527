"""The durable log: group commit, sealing by size/age/command, recovery, one process
per writer id."""

from __future__ import annotations

import asyncio
import errno
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from eventpipe.errors import DataDirLockedError
from eventpipe.log import segments
from eventpipe.log.recovery import rotate_now
from eventpipe.log.segments import LogHooks, LogWriteError, SegmentLog, SyncedRound
from eventpipe.log.settings import LogSettings
from eventpipe.paths import DataLayout, SegmentName
from tests.process import wait_until_dead

W = "w-0"
"""The writer id of these tests' logs."""


def _line(n: int) -> bytes:
    return orjson.dumps({"n": n}) + b"\n"


@pytest.fixture
def layout(tmp_path: Path) -> DataLayout:
    return DataLayout(tmp_path / "data")


def _numbers(paths: list[Path]) -> list[int]:
    return [orjson.loads(line)["n"] for p in paths for line in p.read_bytes().splitlines()]


class _Recorder:
    def __init__(self) -> None:
        self.fsyncs = 0
        self.appends = 0
        self.sealed: list[tuple[str, int, str]] = []

    def hooks(self) -> LogHooks:
        return LogHooks(on_round=self._round, on_sealed=self._sealed)

    def _round(self, synced: SyncedRound) -> None:
        assert synced.wait_seconds >= synced.sync_seconds >= 0
        self.fsyncs += 1
        self.appends += synced.appends

    def _sealed(self, path: Path, size: int, reason: str) -> None:
        self.sealed.append((path.name, size, reason))


@pytest.fixture
def opened(layout: DataLayout) -> Iterator[tuple[SegmentLog, _Recorder]]:
    recorder = _Recorder()
    log = SegmentLog(layout, LogSettings(rotate_seconds=3600), writer=W, hooks=recorder.hooks())
    log.open()
    yield log, recorder
    if log._lock_fd is not None:
        log.close_sync()


def test_concurrent_appends_share_fsyncs_and_lose_nothing(
    opened: tuple[SegmentLog, _Recorder], layout: DataLayout
) -> None:
    log, recorder = opened

    async def scenario() -> list[Path]:
        await log.start()
        await asyncio.gather(*(log.append("web", _line(i)) for i in range(500)))
        return await log.close()

    sealed = asyncio.run(scenario())
    assert sorted(_numbers(sealed)) == list(range(500))
    assert 1 <= recorder.fsyncs < 500  # grouped: far fewer fsyncs than appends
    assert recorder.appends == 500  # each append counted in the round that made it durable
    assert layout.active_segments() == []


def test_append_returns_after_the_bytes_are_on_disk(
    opened: tuple[SegmentLog, _Recorder], layout: DataLayout
) -> None:
    log, _ = opened

    async def scenario() -> bytes:
        await log.start()
        await log.append("web", _line(1), rejected=b'{"error":"x"}\n')
        content = layout.active_segment("web", W).read_bytes()
        assert layout.failed_receiving("web", W).read_bytes() == b'{"error":"x"}\n'
        await log.close()
        return content

    assert asyncio.run(scenario()) == _line(1)


def test_sealing_by_size(layout: DataLayout) -> None:
    recorder = _Recorder()
    log = SegmentLog(layout, LogSettings(max_segment_bytes=1024), writer=W, hooks=recorder.hooks())
    log.open()

    async def scenario() -> None:
        await log.start()
        for i in range(200):
            await log.append("web", _line(i))
        await log.close()

    asyncio.run(scenario())
    sealed = layout.sealed_segments()
    assert len(sealed) > 1
    assert _numbers(sealed) == list(range(200))  # seal order is append order
    assert all(p.stat().st_size >= 1024 for p in sealed[:-1])
    assert {reason for _, _, reason in recorder.sealed[:-1]} == {"size"}


def test_sealing_by_age(layout: DataLayout) -> None:
    recorder = _Recorder()
    log = SegmentLog(layout, LogSettings(rotate_seconds=0.2), writer=W, hooks=recorder.hooks())
    log.open()

    async def scenario() -> None:
        await log.start()
        await log.append("web", _line(1))
        await asyncio.sleep(0.6)
        assert len(layout.sealed_segments()) == 1
        assert layout.active_segments() == []
        await log.close()

    asyncio.run(scenario())
    assert recorder.sealed[0][2] == "age"


def test_rotation_on_command_seals_every_key_and_only_non_empty(
    opened: tuple[SegmentLog, _Recorder], layout: DataLayout
) -> None:
    log, _ = opened

    async def scenario() -> list[Path]:
        await log.start()
        assert await log.rotate() == []
        await log.append("web", _line(1))
        await log.append("app", _line(2))
        sealed = await log.rotate()
        await log.close()
        return sealed

    sealed = asyncio.run(scenario())
    assert sorted(SegmentName.parse(p.name).key_id for p in sealed) == ["app", "web"]  # type: ignore[union-attr]
    assert layout.active_segments() == []


def test_sealed_names_sort_in_seal_order_even_within_one_millisecond(layout: DataLayout) -> None:
    from datetime import UTC, datetime

    frozen = datetime(2026, 11, 21, 10, 0, 0, tzinfo=UTC)
    log = SegmentLog(layout, LogSettings(), writer=W, clock=lambda: frozen)
    log.open()

    async def scenario() -> None:
        await log.start()
        for i in range(3):
            await log.append("web", _line(i))
            await log.rotate()
        await log.close()

    asyncio.run(scenario())
    names = [p.name for p in layout.sealed_segments()]
    assert names == [
        "incoming.tok=web|w=w-0-2026-11-21T10-00-00.000.log",
        "incoming.tok=web|w=w-0-2026-11-21T10-00-00.001.log",
        "incoming.tok=web|w=w-0-2026-11-21T10-00-00.002.log",
    ]
    assert _numbers(layout.sealed_segments()) == [0, 1, 2]


def test_a_torn_last_line_is_moved_aside_at_startup(layout: DataLayout) -> None:
    layout.incoming.mkdir(parents=True)
    active = layout.active_segment("web", W)
    active.write_bytes(_line(1) + _line(2) + b'{"n": 3, "half')
    log = SegmentLog(layout, LogSettings(), writer=W)
    report = log.open()
    log.close_sync()
    assert len(report.torn) == 1
    assert report.torn[0].size == len(b'{"n": 3, "half')
    assert _numbers(list(report.sealed)) == [1, 2]
    [record] = [
        orjson.loads(x) for x in layout.failed_receiving("web", W).read_bytes().splitlines()
    ]
    assert record["raw"] == '{"n": 3, "half'
    assert record["stage"] == "receiving"
    assert "torn line" in record["error"]


def test_a_segment_that_is_all_torn_is_emptied_and_removed(layout: DataLayout) -> None:
    layout.incoming.mkdir(parents=True)
    layout.active_segment("web", W).write_bytes(b"x" * 100_000)  # no newline at all, > one probe
    log = SegmentLog(layout, LogSettings(), writer=W)
    report = log.open()
    log.close_sync()
    assert report.torn[0].size == 100_000
    assert report.sealed == ()
    assert report.removed_empty == ("incoming.tok=web|w=w-0.log",)
    assert layout.active_segments() == []


def test_startup_seals_what_a_previous_run_left(layout: DataLayout) -> None:
    layout.incoming.mkdir(parents=True)
    layout.active_segment("web", W).write_bytes(_line(1))
    log = SegmentLog(layout, LogSettings(), writer=W)
    report = log.open()
    log.close_sync()
    assert report.torn == ()
    assert [p.name for p in report.sealed] == [p.name for p in layout.sealed_segments()]


def test_one_process_per_writer_id(layout: DataLayout) -> None:
    first = SegmentLog(layout, LogSettings(), writer=W)
    first.open()
    second = SegmentLog(layout, LogSettings(), writer=W)
    with pytest.raises(DataDirLockedError, match=f"pid {os.getpid()}"):
        second.open()
    first.close_sync()
    second.open()  # free again once the first is closed
    second.close_sync()


def test_a_failed_write_is_cut_back_and_reported(
    opened: tuple[SegmentLog, _Recorder], layout: DataLayout, monkeypatch: pytest.MonkeyPatch
) -> None:
    log, _ = opened
    real_write = os.write

    def half_then_enospc(fd: int, data: bytes | memoryview) -> int:
        if len(data) > 10:
            real_write(fd, bytes(data[:10]))  # part of it lands, as on a real full disk
        raise OSError(errno.ENOSPC, "No space left on device")

    async def scenario() -> None:
        await log.start()
        await log.append("web", _line(1))
        monkeypatch.setattr(segments.os, "write", half_then_enospc)
        with pytest.raises(LogWriteError) as info:
            await log.append("web", _line(2) * 5)
        assert info.value.fields["errno"] == errno.ENOSPC
        assert layout.active_segment("web", W).read_bytes() == _line(1)  # nothing torn left
        monkeypatch.setattr(segments.os, "write", real_write)
        await log.append("web", _line(3))  # recovers once space returns
        await log.close()

    asyncio.run(scenario())
    assert _numbers(layout.sealed_segments()) == [1, 3]


def test_a_round_whose_syncer_died_fails_is_cut_back_and_the_next_round_starts_another(
    opened: tuple[SegmentLog, _Recorder], layout: DataLayout
) -> None:
    log, recorder = opened

    async def scenario() -> None:
        await log.start()
        await log.append("web", _line(1))
        first = log._syncer.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        wait_until_dead(first)
        with pytest.raises(LogWriteError, match="fsync process"):
            await log.append("web", _line(2))
        assert layout.active_segment("web", W).read_bytes() == _line(1)  # not kept
        await log.append("web", _line(3))
        assert log._syncer.pid not in (None, first)
        await log.close()

    asyncio.run(scenario())
    assert _numbers(layout.sealed_segments()) == [1, 3]
    assert recorder.fsyncs >= 2


def test_rotate_now_without_a_collector_seals_itself(layout: DataLayout) -> None:
    layout.incoming.mkdir(parents=True)
    layout.active_segment("web", W).write_bytes(_line(1))
    sealed = rotate_now(layout, LogSettings())
    assert [p.name for p in sealed] == [p.name for p in layout.sealed_segments()]
    assert _numbers(sealed) == [1]
    assert rotate_now(layout, LogSettings()) == []


def test_a_record_after_a_torn_failed_line_starts_a_line_of_its_own(layout: DataLayout) -> None:
    """A crash mid-write left failed/ ending inside a record: the next record after the
    restart is whole, on its own line; the torn one stays, counted as damaged."""
    layout.failed.mkdir(parents=True)
    failed = layout.failed_receiving("web", W)
    failed.write_bytes(b'{"error":"first"}\n{"error":"to')
    log = SegmentLog(layout, LogSettings(), writer=W)
    log.open()

    async def scenario() -> None:
        await log.start()
        await log.append("web", _line(1), rejected=b'{"error":"after"}\n')
        await log.close()

    asyncio.run(scenario())
    assert failed.read_bytes().splitlines() == [
        b'{"error":"first"}',
        b'{"error":"to',
        b'{"error":"after"}',
    ]
    from eventpipe.figures import failed_records

    assert failed_records([failed]) == (2, 1)  # two records and the torn line, told apart
