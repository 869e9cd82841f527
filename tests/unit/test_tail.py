"""Reading the log as it is written (log/tail.py): segment identities that survive the
seal, complete lines only, progress, and what may leave incoming/."""

from __future__ import annotations

import os
from pathlib import Path

from eventpipe.log import tail
from eventpipe.paths import DataLayout
from eventpipe.processing.modes.stream import _line_boundary


def _layout(tmp_path: Path) -> DataLayout:
    layout = DataLayout(tmp_path / "data")
    layout.incoming.mkdir(parents=True)
    return layout


def test_a_segment_keeps_its_identity_when_sealed_and_only_complete_lines_count(
    tmp_path: Path,
) -> None:
    layout = _layout(tmp_path)
    active = layout.active_segment("web", "w-0")
    active.write_bytes(b'{"a": 1')
    assert tail.identity(active) is None  # no complete line yet
    assert tail.segments(layout) == []
    active.write_bytes(b'{"a": 1}\n{"b": 2}\n{"c"')
    ident = tail.identity(active)
    [segment] = tail.segments(layout)
    assert (segment.identity, segment.end) == (ident, 18)  # the torn third line is left
    sealed = layout.sealed_segment("web", "w-0", "2026-11-22T10-00-00.000")
    os.replace(active, sealed)
    assert tail.identity(sealed) == ident
    assert tail.locate(layout, ident, active) == sealed  # followed under its new name
    assert tail.locate(layout, ident, layout.incoming) == sealed  # no hint (a restart)
    assert list(tail.read_lines(sealed, 9, 18)) == [b'{"b": 2}']


def test_a_new_file_in_a_reused_inode_is_a_new_segment(tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    active = layout.active_segment("web", "w-0")
    active.write_bytes(b'{"id": "first"}\n')
    before = tail.identity(active)
    with active.open("r+b") as f:  # same inode, other content: as after a delete and reuse
        f.truncate(0)
        f.write(b'{"id": "second"}\n')
    assert tail.identity(active) != before
    assert tail.locate(layout, str(before), active) is None
    assert tail.locate(layout, str(tail.identity(active)), layout.incoming) == active


def test_complete_end_finds_the_last_newline_far_back(tmp_path: Path) -> None:
    path = tmp_path / "segment.log"
    path.write_bytes(b"x\n" + b"y" * 200_000)  # a long unfinished line after one line
    assert tail.complete_end(path) == 2
    path.write_bytes(b"no newline at all")
    assert tail.complete_end(path) == 0


def test_a_micro_batch_budget_ends_on_a_line_and_takes_at_least_one(tmp_path: Path) -> None:
    path = tmp_path / "segment.log"
    path.write_bytes(b"aaaa\nbbbb\n" + b"c" * 100 + b"\n")
    assert _line_boundary(path, 0, 7) == 5  # cut back to the end of the first line
    assert _line_boundary(path, 10, 20) == 111  # a line longer than the budget, whole


def test_progress_says_what_may_be_archived_and_the_lag(tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    sealed = layout.sealed_segment("web", "w-0", "2026-11-22T10-00-00.000")
    sealed.write_bytes(b'{"a": 1}\n{"a": 2}\n{"a": 3}\n')
    ident = str(tail.identity(sealed))
    assert tail.consumed(layout, [], sealed)  # no stream destination: nothing to wait for
    assert not tail.consumed(layout, ["pg"], sealed)
    assert tail.lag(layout, "pg").events == 3
    tail.write_progress(layout, "pg", {ident: 18})
    assert not tail.consumed(layout, ["pg"], sealed)
    behind = tail.lag(layout, "pg", now=tail.read_progress(layout, "pg").committed_at + 5)  # type: ignore[operator]
    assert (behind.events, round(behind.seconds)) == (1, 5)
    tail.write_progress(layout, "pg", {ident: 27})
    assert tail.consumed(layout, ["pg"], sealed)
    assert tail.lag(layout, "pg") == tail.Lag(0, 0.0)
    assert not tail.consumed(layout, ["pg", "other"], sealed)  # every stream destination


def test_a_micro_batch_reads_segments_oldest_first_within_its_budget(tmp_path: Path) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes

    from eventpipe.processing.modes.stream import _LogReader

    layout = _layout(tmp_path)
    old = layout.sealed_segment("web", "w-0", "2026-11-22T10-00-00.000")
    old.write_bytes(b'{"a": 1}\n{"a": 2}\n')  # 18 bytes
    new = layout.active_segment("web", "w-0")
    new.write_bytes(b'{"b": 1}\n')
    reader = _LogReader(layout, "d")
    first = reader.latestOffset({}, ReadMaxBytes(12))
    assert first == {tail.identity(old): 9, tail.identity(new): 0}  # one line, then no budget
    rest = reader.latestOffset(first, ReadAllAvailable())
    assert rest == {tail.identity(old): 18, tail.identity(new): 9}
    [a, b] = reader.partitions(first, rest)
    assert list(reader.read(a)) == [('{"a": 2}',)]
    assert list(reader.read(b)) == [('{"b": 1}',)]
