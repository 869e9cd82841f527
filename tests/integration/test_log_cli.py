"""`eventpipe log`: segments, events by position (incoming/ and archive/), progress per
destination x table, as a user runs it."""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson

from eventpipe.archive.write import archive_segment
from eventpipe.config import ArchiveConfig
from eventpipe.paths import DataLayout
from eventpipe.state.store import ALL_TABLES, StateStore
from tests.process import run, write_config

LEGACY = "web-2026-11-19T09-00-00.000"
OLD = "web-2026-11-20T09-00-00.000"
NEW = "web-2026-11-21T10-00-00.000"


def _log(tmp_path: Path) -> Path:
    """Three sealed segments of 3 events: the oldest archived in the legacy format
    (gzip), the next archived (LZ4 frames), the newest waiting."""
    data = tmp_path / "data"
    lines = {seg: [orjson.dumps({"seg": seg[4:14], "n": n}) + b"\n" for n in range(3)]
             for seg in (LEGACY, OLD, NEW)}  # fmt: skip
    (data / "archive/2026-11-19").mkdir(parents=True)
    (data / "archive/2026-11-19" / f"incoming.tok={LEGACY}.log.gz").write_bytes(
        gzip.compress(b"".join(lines[LEGACY]))
    )
    (data / "incoming").mkdir()
    for name in (OLD, NEW):
        (data / "incoming" / f"incoming.tok={name}.log").write_bytes(b"".join(lines[name]))
    archive_segment(DataLayout(data), f"incoming.tok={OLD}.log", ArchiveConfig(frame_events=2))
    return write_config(tmp_path / "eventpipe.yaml", data, 0, destinations={
        "warehouse": {"type": "duckdb"}, "api": {"type": "http", "url": "http://127.0.0.1:9/x"},
    })  # fmt: skip


def test_segments_are_listed_in_log_order_wherever_they_are(tmp_path: Path) -> None:
    config = _log(tmp_path)
    result = run("log", "segments", "-c", str(config))
    assert result.returncode == 0, result.stderr
    rows = [line.split("|") for line in result.stdout.splitlines()[2:-1]]
    assert [(r[0].strip(), r[1].strip()) for r in rows] == [
        (LEGACY, "archive"), (OLD, "archive"), (NEW, "incoming"),
    ]  # fmt: skip


def test_show_prints_a_range_across_segments_with_positions(tmp_path: Path) -> None:
    config = _log(tmp_path)
    result = run("log", "show", "--from", f"{OLD}:1", "--to", f"{NEW}:0", "-c", str(config))
    assert result.returncode == 0, result.stderr
    shown = [line.split("\t") for line in result.stdout.splitlines()]
    assert [p for p, _ in shown] == [f"{OLD}:1", f"{OLD}:2", f"{NEW}:0"]
    assert orjson.loads(shown[1][1]) == {"seg": "2026-11-20", "n": 2}  # from its second frame
    assert orjson.loads(shown[2][1]) == {"seg": "2026-11-21", "n": 0}
    # From the legacy gzip archive on.
    result = run("log", "show", "--from", f"{LEGACY}:2", "--to", f"{OLD}:0", "-c", str(config))
    assert [line.split("\t")[0] for line in result.stdout.splitlines()] == [
        f"{LEGACY}:2", f"{OLD}:0",
    ]  # fmt: skip
    # From a segment alone: its first line, to the end of the log.
    result = run("log", "show", "--from", NEW, "--limit", "2", "-c", str(config))
    assert [line.split("\t")[0] for line in result.stdout.splitlines()] == [
        f"{NEW}:0", f"{NEW}:1",
    ]  # fmt: skip


def test_show_takes_stored_events_on_standard_input(tmp_path: Path) -> None:
    config = _log(tmp_path)
    given = '{"n": 1}\n\n{"n": 2, "s": "tab\\there"}\n'
    result = run("log", "show", "--stdin", "-c", str(config), input=given)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        'stdin:0\t{"n": 1}',
        'stdin:1\t{"n": 2, "s": "tab\\there"}',
    ]
    for both_or_neither in (["--stdin", "--from", NEW], []):
        refused = run("log", "show", *both_or_neither, "-c", str(config), input=given)
        assert refused.returncode == 2
        assert "give --from (a position of the log) or --stdin, not both" in refused.stderr


def test_a_bad_position_says_how_to_write_one(tmp_path: Path) -> None:
    config = _log(tmp_path)
    result = run("log", "show", "--from", "yesterday", "-c", str(config))
    assert result.returncode == 2
    assert "'yesterday' is not a log position" in result.stderr
    assert "<segment>:<line>" in result.stderr
    result = run("log", "show", "--from", "web-2026-01-01T00-00-00.000:0", "-c", str(config))
    assert "no segment web-2026-01-01T00-00-00.000 in the log" in result.stderr


def test_status_shows_each_destination_x_table_and_what_is_pending(tmp_path: Path) -> None:
    config = _log(tmp_path)
    store = StateStore(tmp_path / "data" / "state.sqlite")
    store.record([f"incoming.tok={OLD}.log"], "warehouse", "events", ok=True, rows=3)
    store.record([f"incoming.tok={OLD}.log"], "warehouse", ALL_TABLES, ok=True)
    store.record([f"incoming.tok={OLD}.log"], "api", "*sent*", ok=True, rows=2)
    (tmp_path / "data" / "failed").mkdir()
    (tmp_path / "data" / "failed" / "failed.dst=api.log").write_bytes(b"{}\n")
    result = run("log", "status", "-c", str(config))
    assert result.returncode == 0, result.stderr
    rows = [[c.strip() for c in line.split("|")] for line in result.stdout.splitlines()[2:-1]]
    by = {(r[0], r[1]): r for r in rows}  # destinations in the config's order (sorted here)
    assert by["warehouse", "events"][2:4] == ["1", "3"]
    assert by["warehouse", "(pending)"][-1] == "1 segment(s), 0.0 MB"  # as `status` says
    assert by["warehouse", "(failed/)"][-1] == "0 event(s) in failed.dst=warehouse.log"
    assert by["api", "(sent)"][2:4] == ["1", "2"]
    assert by["api", "(failed/)"][-1] == "1 event(s) in failed.dst=api.log"


def test_a_writers_position_without_its_pipe_and_a_range_past_the_end(tmp_path: Path) -> None:
    """A writer's segment id has a `|`, which a shell cuts unquoted: `@` stands for it;
    and a position past the end said nothing at all."""
    config = _log(tmp_path)
    writer = "web|w=host-0-2026-11-22T10-00-00.000"
    incoming = tmp_path / "data/incoming"
    (incoming / f"incoming.tok={writer}.log").write_bytes(b'{"n": 7}\n')
    result = run("log", "show", "--from", writer.replace("|", "@") + ":0", "-c", str(config))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\t")[0] == f"{writer}:0"
    past = run("log", "show", "--from", f"{NEW}:9", "--to", f"{NEW}:12", "-c", str(config))
    assert past.returncode == 0
    assert past.stdout == ""
    assert f"no events from {NEW}:9 to {NEW}:12" in past.stderr
    bad = run("log", "show", "--from", "web", "-c", str(config))
    assert "in single quotes" in bad.stderr
    assert "with @ for |" in bad.stderr
