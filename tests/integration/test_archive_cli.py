"""`eventpipe archive verify` and `archive cat`, as a user runs them."""

from __future__ import annotations

from pathlib import Path

import orjson

from eventpipe.archive.files import Index
from eventpipe.archive.write import archive_segment
from eventpipe.config import ArchiveConfig
from eventpipe.paths import DataLayout
from tests.process import run, write_config

SEGMENTS = (
    "incoming.tok=web-2026-11-20T10-00-00.000.log",
    "incoming.tok=web-2026-11-20T11-00-00.000.log",
)


def _archived(tmp_path: Path) -> tuple[Path, DataLayout, list[bytes]]:
    layout = DataLayout(tmp_path / "data")
    layout.incoming.mkdir(parents=True)
    events = [
        orjson.dumps({"n": n, "eventn_ctx": {"event_id": f"ev-{n}"}}) + b"\n" for n in range(500)
    ]
    for part, name in enumerate(SEGMENTS):
        (layout.incoming / name).write_bytes(b"".join(events[part * 250 : (part + 1) * 250]))
        archive_segment(layout, name, ArchiveConfig(frame_events=100))
    return write_config(tmp_path / "eventpipe.yaml", layout.root, 0), layout, events


def test_cat_prints_a_day_in_log_order_and_one_event_by_id(tmp_path: Path) -> None:
    config, _, events = _archived(tmp_path)
    day = run("archive", "cat", "--day", "2026-11-20", "-c", str(config))
    assert day.returncode == 0, day.stderr
    assert day.stdout.encode() == b"".join(events)
    one = run("archive", "cat", "--day", "2026-11-20", "--event-id", "ev-321", "-c", str(config))
    assert one.returncode == 0, one.stderr
    assert one.stdout.encode() == events[321]
    assert "web-2026-11-20T11-00-00.000:71" in one.stderr  # its log position


def test_cat_says_what_is_not_there(tmp_path: Path) -> None:
    config, _, _ = _archived(tmp_path)
    missing = run("archive", "cat", "--day", "2026-11-20", "--event-id", "nope", "-c", str(config))
    assert missing.returncode == 1
    assert "no event 'nope' in archive/2026-11-20" in missing.stderr
    no_day = run("archive", "cat", "--day", "2026-10-01", "-c", str(config))
    assert no_day.returncode == 1
    assert "the archive has no day 2026-10-01" in no_day.stderr
    bad = run("archive", "cat", "--day", "yesterday", "-c", str(config))
    assert bad.returncode == 2
    assert "'yesterday' does not match the format '%Y-%m-%d'" in bad.stderr


def test_verify_says_ok_then_names_a_flipped_byte(tmp_path: Path) -> None:
    config, layout, _ = _archived(tmp_path)
    ok = run("archive", "verify", "-c", str(config))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == "ok: 1 day(s), 2 file(s), 6 frame(s), 500 event(s), 0.0 MB"
    data = layout.archive / "2026-11-20" / f"{SEGMENTS[1]}.lz4"
    frame = Index.read(data.with_name(data.name + ".index.json")).frames[1]
    damaged = bytearray(data.read_bytes())
    damaged[frame.offset + 40] ^= 0x10
    data.write_bytes(bytes(damaged))
    bad = run("archive", "verify", "--from", "2026-11-20", "--to", "2026-11-20", "-c", str(config))
    assert bad.returncode == 65  # a data error: a retry will not fix it
    assert f"MISMATCH 2026-11-20/{SEGMENTS[1]}.lz4: frame 1 (bytes {frame.offset}+" in bad.stdout
    assert "problem(s) in 1 day(s), 2 file(s)" in bad.stderr
    other_days = run("archive", "verify", "--from", "2026-11-21", "-c", str(config))
    assert other_days.returncode == 0
    assert other_days.stdout.strip() == "ok: 0 day(s), 0 file(s), 0 frame(s), 0 event(s), 0.0 MB"
