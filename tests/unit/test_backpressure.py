"""The backlog measure: the bytes of sealed segments in incoming/, each stat'ed once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from eventpipe.collector.backpressure import Backpressure, Limits
from eventpipe.collector.metrics import CollectorMetrics
from eventpipe.paths import DataLayout, seal_stamp


class _NoActive:
    def active_bytes(self) -> int:
        return 0


def _seal(layout: DataLayout, n: int, size: int) -> Path:
    stamp = seal_stamp(datetime(2026, 11, 21, tzinfo=UTC) + timedelta(seconds=n))
    path = layout.sealed_segment("web", "w-0", stamp)
    path.write_bytes(b"x" * size)
    return path


def test_sealed_bytes_follow_segments_in_and_out(tmp_path: Path) -> None:
    layout = DataLayout(tmp_path)
    layout.incoming.mkdir()
    backpressure = Backpressure(
        layout,
        _NoActive(),
        Limits(10**9, 0),
        CollectorMetrics(),  # type: ignore[arg-type]
    )
    first = _seal(layout, 1, 100)
    _seal(layout, 2, 50)
    layout.active_segment("web", "w-0").write_bytes(b"y" * 1000)  # counted by the log, not here
    (layout.incoming / "collector.lock").write_bytes(b"1")
    assert backpressure.sealed_bytes() == 150
    first.unlink()  # processed and archived
    _seal(layout, 3, 7)
    assert backpressure.sealed_bytes() == 57
    assert backpressure.sealed_bytes() == 57
