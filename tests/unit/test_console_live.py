"""The live view's tail of the log: new lines only, a sample at high rates parsed alone,
filters applied before the sample is cut, and sealed segments read once."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from eventpipe.console import live
from eventpipe.console.live import Filters, LiveTail
from eventpipe.paths import DataLayout


@pytest.fixture
def layout(tmp_path: Path) -> DataLayout:
    layout = DataLayout(tmp_path / "data")
    layout.incoming.mkdir(parents=True)
    return layout


def _append(path: Path, events: list[dict[str, object]]) -> None:
    with path.open("ab") as f:
        f.write(b"".join(orjson.dumps(e) + b"\n" for e in events))


def test_only_lines_written_since_it_started_are_shown(layout: DataLayout) -> None:
    active = layout.active_segment("web", "host-0")
    _append(active, [{"n": -1}])
    tail = LiveTail(layout)
    _append(active, [{"n": 0}, {"n": 1}])
    polled = tail.poll(10, Filters())
    assert [e["n"] for e in polled.events] == [0, 1]
    assert polled.passed_over == 0
    assert tail.poll(10, Filters()).events == []


def test_a_sample_is_spread_and_only_it_is_parsed(
    layout: DataLayout, monkeypatch: pytest.MonkeyPatch
) -> None:
    active = layout.active_segment("web", "host-0")
    tail = LiveTail(layout)
    _append(active, [{"n": n} for n in range(1000)])
    parsed: list[bytes] = []
    loads = orjson.loads

    def counting(line: bytes) -> object:
        parsed.append(line)
        return loads(line)

    monkeypatch.setattr(live.orjson, "loads", counting)
    polled = tail.poll(10, Filters())
    assert [e["n"] for e in polled.events] == list(range(0, 1000, 100))
    assert polled.passed_over == 990
    assert len(parsed) == 10


def test_a_filter_reads_on_until_the_sample_is_full(layout: DataLayout) -> None:
    active = layout.active_segment("web", "host-0")
    tail = LiveTail(layout)
    _append(active, [{"n": n, "event_type": "buy" if n % 50 == 7 else "view"}
                     for n in range(1000)])  # fmt: skip
    polled = tail.poll(5, Filters(event_type="buy"))
    shown = [e["n"] for e in polled.events]
    assert len(shown) == 5
    assert all(n % 50 == 7 for n in shown)
    assert shown == sorted(shown)
    assert polled.passed_over == 995


def test_a_sealed_segment_read_to_its_end_is_not_opened_again(
    layout: DataLayout, monkeypatch: pytest.MonkeyPatch
) -> None:
    active = layout.active_segment("web", "host-0")
    tail = LiveTail(layout)
    _append(active, [{"n": 1}])
    sealed = layout.sealed_segment("web", "host-0", "2026-11-28T07-00-00.000")
    os.rename(active, sealed)  # sealed: the same inode, read on from where it was
    _append(sealed, [])
    assert [e["n"] for e in tail.poll(10, Filters()).events] == [1]
    opened: list[Path] = []
    real = Path.open

    def counting(self: Path, *args: object, **kwargs: object) -> object:
        opened.append(self)
        return real(self, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(Path, "open", counting)
    assert tail.poll(10, Filters()).events == []  # found unchanged: read whole
    assert tail.poll(10, Filters()).events == []
    assert opened == [sealed]
    _append(active, [{"n": 2}])  # the writer's next active segment is read
    assert [e["n"] for e in tail.poll(10, Filters()).events] == [2]


def test_events_kept_as_received_are_shown_first(layout: DataLayout) -> None:
    active = layout.active_segment("web", "host-0")
    tail = LiveTail(layout)
    _append(active, [{"n": n, "eventn_ctx": {"event_id": f"e{n}"}} for n in range(1000)])
    polled = tail.poll(3, Filters(), preferred={"e5", "e777"})
    assert [e["n"] for e in polled.events] == [0, 5, 777]  # in the log's order
    assert polled.passed_over == 997
