"""The collector's sample of events as received, for the console's live view: kept only
while a live view is open, at most its share a second, scrubbed, in a ring of two files."""

from __future__ import annotations

import os
import time
from pathlib import Path

import orjson
import pytest

from eventpipe.collector import received
from eventpipe.collector.received import ReceivedSample, as_parsed
from eventpipe.collector.secrets import Scrubber
from eventpipe.console.live import Received
from eventpipe.paths import DataLayout


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def layout(tmp_path: Path) -> DataLayout:
    return DataLayout(tmp_path / "data")


def _sample(layout: DataLayout, clock: Clock, per_second: int = 3) -> ReceivedSample:
    return ReceivedSample(layout, "host-0", Scrubber(["s3cr3t-key"]), per_second=per_second,
                          clock=clock)  # fmt: skip


def _watch(layout: DataLayout, age: float = 0.0) -> None:
    layout.received.mkdir(parents=True, exist_ok=True)
    layout.received_watching.touch()
    then = time.time() - age
    os.utime(layout.received_watching, (then, then))


def test_nothing_is_kept_while_no_live_view_is_open(layout: DataLayout) -> None:
    clock = Clock()
    sample = _sample(layout, clock)
    assert sample.choose(10) == []
    _watch(layout, age=received.WATCH_SECONDS + 1)  # a view closed a while ago
    clock.now += 1
    assert sample.choose(10) == []
    assert not layout.received_file("host-0").exists()


def test_a_seconds_share_is_spread_over_the_items_and_renewed_each_second(
    layout: DataLayout,
) -> None:
    clock = Clock()
    _watch(layout)
    sample = _sample(layout, clock, per_second=3)
    assert sample.choose(9) == [0, 3, 6]
    assert sample.choose(5) == []  # this second's share is taken
    clock.now += 1
    assert sample.choose(2) == [0, 1]
    assert sample.choose(5) == [0]


def test_items_are_kept_as_parsed_with_their_ids_and_scrubbed(layout: DataLayout) -> None:
    clock = Clock()
    _watch(layout)
    sample = _sample(layout, clock)
    items: list[object] = [
        {"n": 1, "writeKey": "wk", "note": "s3cr3t-key"},
        7,  # not an object: it gets no id, and is left out
        {"n": 3},
    ]
    chosen = [(i, raw) for i in sample.choose(len(items)) if (raw := as_parsed(items[i]))]
    for n, item in enumerate(items):  # what enrichment does in place
        if isinstance(item, dict):
            item["eventn_ctx"] = {"event_id": f"id-{n}"}
            item["api_key"] = "web"
    sample.keep(chosen, items)
    lines = [orjson.loads(x) for x in layout.received_file("host-0").read_bytes().splitlines()]
    assert lines == [
        {"event_id": "id-0", "received": {"n": 1, "note": "[redacted]"}},
        {"event_id": "id-2", "received": {"n": 3}},
    ]


def test_a_full_file_is_moved_aside_and_the_console_reads_both(
    layout: DataLayout, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(received, "RING_BYTES", 200)
    clock = Clock()
    _watch(layout)
    sample = _sample(layout, clock, per_second=1000)
    for n in range(10):
        items: list[object] = [{"n": n, "pad": "x" * 40}]
        chosen = [(0, orjson.dumps(items[0]))]
        items[0]["eventn_ctx"] = {"event_id": f"id-{n}"}  # type: ignore[index]
        sample.keep(chosen, items)
    files = layout.received_files()
    assert [p.name for p in files] == ["received.w=host-0.old.jsonl", "received.w=host-0.jsonl"]
    assert sum(p.stat().st_size for p in files) < 2 * 200 + 100  # two files at most
    view = Received(layout)
    view.refresh()
    assert view.of({"eventn_ctx": {"event_id": "id-9"}}) == ("id-9", {"n": 9, "pad": "x" * 40})
    assert view.of({"eventn_ctx": {"event_id": "id-0"}}) is None  # dropped with the ring
    assert layout.received_watching.exists()  # reading marks the view open


def test_the_console_reads_on_where_it_stopped_and_keeps_the_newest(
    layout: DataLayout, monkeypatch: pytest.MonkeyPatch
) -> None:
    from eventpipe.console import live

    monkeypatch.setattr(live, "RECEIVED_KEPT", 3)
    path = layout.received_file("host-0")
    path.parent.mkdir(parents=True)
    view = Received(layout)

    def add(n: int, tail: bytes = b"\n") -> None:
        with path.open("ab") as f:
            f.write(orjson.dumps({"event_id": f"id-{n}", "received": {"n": n}}) + tail)

    add(0)
    add(1, tail=b"")  # a line not whole yet: read once it is
    view.refresh(watch=False)
    assert view.of({"eventn_ctx": {"event_id": "id-0"}}) == ("id-0", {"n": 0})
    assert view.of({"eventn_ctx": {"event_id": "id-1"}}) is None
    assert not layout.received_watching.exists()  # a trace's look: no sample asked for
    with path.open("ab") as f:
        f.write(b"\n")
    for n in range(2, 5):
        add(n)
    view.refresh(watch=False)
    assert [n for n in range(5) if view.of({"eventn_ctx": {"event_id": f"id-{n}"}})] == [2, 3, 4]


def test_an_ip_sent_is_kept_as_stored_where_addresses_are_anonymized(layout: DataLayout) -> None:
    _watch(layout)
    sample = ReceivedSample(layout, "host-0", Scrubber([]), anonymize_ip=True, clock=Clock())
    items: list[object] = [{"source_ip": "203.0.113.77", "n": 1}]
    chosen = [(i, raw) for i in sample.choose(1) if (raw := as_parsed(items[i]))]
    items[0] = {"source_ip": "203.0.113.0", "n": 1, "eventn_ctx": {"event_id": "id-0"}}
    sample.keep(chosen, items)
    [line] = layout.received_file("host-0").read_bytes().splitlines()
    assert orjson.loads(line)["received"] == {"source_ip": "203.0.113.0", "n": 1}
    assert b"203.0.113.77" not in layout.received_file("host-0").read_bytes()
