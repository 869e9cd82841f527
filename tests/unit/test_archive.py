"""The raw archive: LZ4 frames readable by the standard `lz4` tool, an index that reads
one frame for one event, and a verify that names each damaged file and frame."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path

import orjson
import pytest

from eventpipe.archive import read
from eventpipe.archive.files import (
    ArchivedSegment,
    Index,
    Manifest,
    event_id,
    id_hash,
    id_hashes,
    segments_of_day,
)
from eventpipe.archive.verify import verify
from eventpipe.archive.write import ahead_of, archive_segment, prepare_segment
from eventpipe.config import ArchiveConfig, Config, parse_config
from eventpipe.paths import DataLayout
from eventpipe.processing.batch.archiving import prepare_sealed, wait_preparing_sealed
from eventpipe.processing.runtime import shutdown
from eventpipe.processing.runtime.pipeline import pipeline_lock

SEGMENT = "incoming.tok=web-2026-11-20T10-00-00.000.log"
SMALL_FRAMES = ArchiveConfig(frame_events=100)


def _events(count: int, start: int = 0) -> bytes:
    return b"".join(
        orjson.dumps({"event_type": "page", "n": n, "eventn_ctx": {"event_id": f"id-{n}"}}) + b"\n"
        for n in range(start, start + count)
    )


def _archive(
    tmp_path: Path, data: bytes, settings: ArchiveConfig = SMALL_FRAMES, name: str = SEGMENT
) -> tuple[DataLayout, ArchivedSegment]:
    layout = DataLayout(tmp_path / "data")
    layout.incoming.mkdir(parents=True, exist_ok=True)
    (layout.incoming / name).write_bytes(data)
    path = archive_segment(layout, name, settings)
    assert not (layout.incoming / name).exists()  # moved, not copied
    return layout, ArchivedSegment(path)


def test_the_standard_lz4_tool_gives_back_the_segment_byte_for_byte(tmp_path: Path) -> None:
    data = _events(1050)
    _, segment = _archive(tmp_path, data)
    assert segment.data.parent.name == "2026-11-20"  # the day it was sealed
    assert segment.data.name == f"{SEGMENT}.lz4"
    out = subprocess.run(["lz4", "-dc", str(segment.data)], capture_output=True, check=True)
    assert out.stdout == data


def test_frames_are_bounded_and_the_index_and_manifest_describe_them(tmp_path: Path) -> None:
    data = _events(1050)
    _, segment = _archive(tmp_path, data)
    index = Index.read(segment.index)
    assert [f.events for f in index.frames] == [100] * 10 + [50]
    assert [f.first for f in index.frames] == list(range(0, 1050, 100))
    assert index.frames[0].offset == 0
    for before, after in zip(index.frames, index.frames[1:], strict=False):
        assert after.offset == before.offset + before.size  # contiguous, independent frames
    manifest = Manifest.read(segment.manifest)
    assert (manifest.events, manifest.frames) == (1050, 11)
    assert manifest.uncompressed.size == len(data)
    assert manifest.compressed.size == segment.data.stat().st_size
    ids = segment.ids.read_bytes()
    assert len(ids) == 4 * 1050
    assert int.from_bytes(ids[4 * 7 : 4 * 8], "little") == id_hash("id-7")


def test_a_frame_closes_at_frame_max_bytes_and_holds_a_huge_event_alone(tmp_path: Path) -> None:
    big = orjson.dumps({"blob": "x" * 5000, "eventn_ctx": {"event_id": "big"}}) + b"\n"
    data = _events(30) + big + _events(30, start=30)
    settings = ArchiveConfig(frame_events=1000, frame_max_bytes=2048)
    _, segment = _archive(tmp_path, data, settings)
    index = Index.read(segment.index)
    assert all(f.raw_size <= 2048 or f.events == 1 for f in index.frames)
    assert sum(f.events for f in index.frames) == 61
    assert b"".join(line for _, line in read.lines(segment)) == data


def test_reading_from_a_line_starts_at_its_frame(tmp_path: Path) -> None:
    data = _events(1050)
    _, segment = _archive(tmp_path, data)
    got = list(read.lines(segment, start=777))
    assert got[0] == (777, data.splitlines(keepends=True)[777])
    assert len(got) == 1050 - 777
    # Frames before line 777 are never read: damage there does not matter.
    _flip_byte(segment.data, Index.read(segment.index).frames[2].offset + 20)
    assert list(read.lines(segment, start=777)) == got


def test_an_event_is_found_by_id_reading_only_its_frame(tmp_path: Path) -> None:
    data = _events(1050)
    _, segment = _archive(tmp_path, data)
    index = Index.read(segment.index)
    # Every frame but the one that holds line 512 damaged: the event is still read.
    for number, frame in enumerate(index.frames):
        if number != 5:
            _flip_byte(segment.data, frame.offset + frame.size // 2)
    [found] = read.find(segment.data.parent, "id-512")
    assert (found.line, found.event) == (512, data.splitlines()[512])
    assert list(read.find(segment.data.parent, "no-such-id")) == []


def test_an_id_sent_twice_is_found_twice_across_segments(tmp_path: Path) -> None:
    layout, _ = _archive(tmp_path, _events(300))
    later = "incoming.tok=web-2026-11-20T11-00-00.000.log"
    _archive(tmp_path, _events(10, start=295), name=later)
    found = list(read.find(layout.archive / "2026-11-20", "id-299"))
    assert [(f.segment.segment_file, f.line) for f in found] == [(SEGMENT, 299), (later, 4)]


def test_event_ids_are_read_from_any_line_the_log_may_hold() -> None:
    assert event_id(b'{"eventn_ctx":{"event_id":"a1"}}') == "a1"
    # Written twice (a property of the same name): the line is parsed.
    line = b'{"properties":{"event_id":"other"},"eventn_ctx":{"event_id":"a2"}}'
    assert event_id(line) == "a2"
    assert event_id(b'{"eventn_ctx":{"event_id":"quo\\"te"}}') == 'quo"te'
    assert event_id(b'{"eventn_ctx":{"event_id":"\xc3\xa9t\xc3\xa9"}}') == "\u00e9t\u00e9"
    assert event_id(b"not json at all") is None
    assert event_id(b'{"eventn_ctx":{"event_id":"x') is None  # torn line
    lines = [
        b'{"eventn_ctx":{"event_id":"a1"}}\n',
        line + b"\n",
        b"garbage\n",
        b'{"eventn_ctx":{"event_id":"last"}}',
    ]
    expected = [id_hash("a1"), id_hash("a2"), 0, id_hash("last")]
    assert id_hashes(b"".join(lines), lines) == expected
    clean = [lines[0], lines[3]]  # the one-regex path
    assert id_hashes(b"".join(clean), clean) == [expected[0], expected[3]]


def test_a_segment_without_a_last_newline_and_an_empty_one(tmp_path: Path) -> None:
    data = _events(5) + b'{"eventn_ctx":{"event_id":"torn"}}'
    _, segment = _archive(tmp_path, data)
    assert b"".join(line for _, line in read.lines(segment)) == data
    [found] = read.find(segment.data.parent, "torn")
    assert found.line == 5
    other = "incoming.tok=web-2026-11-20T12-00-00.000.log"
    layout, empty = _archive(tmp_path, b"", name=other)
    assert list(read.lines(empty)) == []
    report = verify(layout)
    assert report.ok, report.problems
    assert (report.files, report.events) == (2, 6)


def test_lines_are_cut_at_newlines_only_as_the_log_counts_them(tmp_path: Path) -> None:
    # A damaged line with a raw carriage return (and others bytes.splitlines cuts at).
    data = _events(3) + b'{"eventn_ctx":{"event_id":"cr"},"x":"a\rb\x0bc\x1cd"}\n' + _events(3, 3)
    layout, segment = _archive(tmp_path, data)
    assert Index.read(segment.index).events == 7
    got = list(read.lines(segment))
    assert [n for n, _ in got] == list(range(7))
    assert b"".join(line for _, line in got) == data
    [found] = read.find(segment.data.parent, "cr")
    assert found.line == 3
    assert found.event == data.split(b"\n")[3]
    assert verify(layout).ok


def test_verify_passes_a_sound_archive(tmp_path: Path) -> None:
    layout, _ = _archive(tmp_path, _events(1050))
    report = verify(layout)
    assert report.ok, report.problems
    assert (report.days, report.files, report.frames, report.events) == (1, 1, 11, 1050)


def test_verify_names_the_frame_of_a_flipped_byte(tmp_path: Path) -> None:
    layout, segment = _archive(tmp_path, _events(1050))
    frame = Index.read(segment.index).frames[4]
    _flip_byte(segment.data, frame.offset + frame.size // 2)
    problems = [str(p) for p in verify(layout).problems]
    where = f"2026-11-20/{SEGMENT}.lz4"
    assert f"{where}: sha1 is " in "\n".join(problems)  # the whole file's checksums
    frame_problems = [p for p in problems if "frame" in p]
    assert frame_problems
    assert all(p.startswith(f"{where}: frame 4 (bytes {frame.offset}+") for p in frame_problems)
    assert "lines 400-499" in frame_problems[0]


def test_verify_finds_a_truncated_file(tmp_path: Path) -> None:
    layout, segment = _archive(tmp_path, _events(1050))
    data = segment.data.read_bytes()
    segment.data.write_bytes(data[: len(data) - 100])
    problems = "\n".join(str(p) for p in verify(layout).problems)
    assert "size is" in problems
    assert "frame 10 " in problems
    assert "(truncated)" in problems


@pytest.mark.parametrize("sidecar", ["index", "ids", "manifest"])
def test_verify_finds_a_missing_sidecar(tmp_path: Path, sidecar: str) -> None:
    layout, segment = _archive(tmp_path, _events(300))
    path = getattr(segment, sidecar)
    path.unlink()
    problems = [str(p) for p in verify(layout).problems]
    assert f"2026-11-20/{path.name}: missing" in problems
    # Without its index, the file still reads from its beginning (and by id, line by line).
    assert len(list(read.lines(segment))) == 300
    assert [f.line for f in read.find(segment.data.parent, "id-250")] == [250]


def test_verify_finds_a_damaged_ids_file_and_a_sidecar_without_its_data(tmp_path: Path) -> None:
    layout, segment = _archive(tmp_path, _events(300))
    _flip_byte(segment.ids, 4 * 120)
    problems = "\n".join(str(p) for p in verify(layout).problems)
    assert f"{segment.ids.name}: sha1 is" in problems
    assert f"{segment.ids.name}: does not match the events from line 120 on" in problems
    shutil.copy(segment.manifest, segment.data.parent / "incoming.tok=web-x.log.lz4.manifest.json")
    problems = "\n".join(str(p) for p in verify(layout).problems)
    assert "incoming.tok=web-x.log.lz4.manifest.json: incoming.tok=web-x.log.lz4 is missing" in (
        problems
    )


def test_verify_reads_legacy_gzip_files_and_finds_their_damage(tmp_path: Path) -> None:
    import gzip

    layout = DataLayout(tmp_path / "data")
    day = layout.archive / "2026-11-01"
    day.mkdir(parents=True)
    legacy = day / "incoming.tok=web-2026-11-01T00-00-00.000.log.gz"
    legacy.write_bytes(gzip.compress(_events(20)))
    [segment] = segments_of_day(day)
    assert segment.legacy
    assert len(list(read.lines(segment))) == 20
    assert verify(layout).ok
    legacy.write_bytes(legacy.read_bytes()[:-9])
    assert "gzip" in str(verify(layout).problems[0])


def test_verify_limits_itself_to_the_days_asked(tmp_path: Path) -> None:
    from datetime import date

    layout, segment = _archive(tmp_path, _events(10))
    _flip_byte(segment.data, 30)
    assert not verify(layout, date(2026, 11, 20), date(2026, 11, 20)).ok
    assert verify(layout, date(2026, 11, 21)).files == 0
    assert verify(layout, None, date(2026, 11, 19)).ok


def _flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_files_archived_ahead_are_moved_in_and_equal_archiving_at_once(tmp_path: Path) -> None:
    data = _events(1050)
    _, direct = _archive(tmp_path / "direct", data)
    layout = DataLayout(tmp_path / "data")
    layout.incoming.mkdir(parents=True)
    (layout.incoming / SEGMENT).write_bytes(data)
    prepare_segment(layout, SEGMENT, SMALL_FRAMES)
    ahead = ahead_of(layout, SEGMENT)
    assert ahead.data.exists()
    assert not layout.archive.exists()  # nothing in archive/ before the segment is done
    segment = ArchivedSegment(archive_segment(layout, SEGMENT, SMALL_FRAMES))
    assert not ahead.data.exists()  # moved, not compressed again
    assert not any(p.exists() for p in ahead.sidecars)
    for mine, theirs in zip((segment.data, segment.index, segment.ids),
                            (direct.data, direct.index, direct.ids), strict=True):  # fmt: skip
        assert mine.read_bytes() == theirs.read_bytes()
    assert verify(layout).problems == []


@pytest.mark.parametrize("spoilt", ["appended", "half moved"])
def test_files_archived_ahead_that_do_not_fit_are_not_used(tmp_path: Path, spoilt: str) -> None:
    """Files ahead of a segment that has changed since (a size of its own), or that a
    crash left half moved (a sidecar gone), are not used: the segment is compressed."""
    layout = DataLayout(tmp_path / "data")
    layout.incoming.mkdir(parents=True)
    source = layout.incoming / SEGMENT
    source.write_bytes(_events(500))
    prepare_segment(layout, SEGMENT, SMALL_FRAMES)
    if spoilt == "appended":
        source.write_bytes(_events(600))
    else:
        ahead_of(layout, SEGMENT).index.unlink()
    segment = ArchivedSegment(archive_segment(layout, SEGMENT, SMALL_FRAMES))
    assert Manifest.read(segment.manifest).events == (600 if spoilt == "appended" else 500)
    assert verify(layout).problems == []


def _service_config(tmp_path: Path) -> Config:
    return parse_config({"data_dir": str(tmp_path / "data"), "archive": {"frame_events": 100}},
                        source="test")  # fmt: skip


def test_the_services_wait_compresses_the_segments_sealed_meanwhile(tmp_path: Path) -> None:
    """Between two runs, `eventpipe process` compresses ahead what has sealed, each
    segment once; the run then moves those files in, as it moves its own."""
    config = _service_config(tmp_path)
    layout = config.layout
    layout.incoming.mkdir(parents=True)
    (layout.incoming / SEGMENT).write_bytes(_events(300))
    later = "incoming.tok=web-2026-11-20T10-00-05.000.log"

    def seal_later() -> None:
        time.sleep(0.2)
        (layout.incoming / later).write_bytes(_events(200, start=300))

    sealing = threading.Thread(target=seal_later)
    sealing.start()
    assert wait_preparing_sealed(config, 1.0, poll=0.05) is False
    sealing.join()
    for name, events in ((SEGMENT, 300), (later, 200)):
        ahead = ahead_of(layout, name)
        assert Manifest.read(ahead.manifest).events == events
        assert (layout.incoming / name).exists()  # still the run's to process
    assert not layout.archive.exists()
    assert prepare_sealed(config) == []  # each once
    segment = ArchivedSegment(archive_segment(layout, later, config.archive))
    assert not ahead_of(layout, later).data.exists()  # moved in
    assert Manifest.read(segment.manifest).events == 200
    assert verify(layout).problems == []


def test_the_services_wait_leaves_segments_to_a_run_that_holds_the_lock(tmp_path: Path) -> None:
    """A run (of this process or another) holds the pipeline lock: the wait compresses
    nothing beside it, since the run's own archiving writes the same files."""
    config = _service_config(tmp_path)
    layout = config.layout
    layout.incoming.mkdir(parents=True)
    (layout.incoming / SEGMENT).write_bytes(_events(300))
    with pipeline_lock(config):
        assert prepare_sealed(config) == []
    assert not ahead_of(layout, SEGMENT).data.exists()
    assert prepare_sealed(config) == [SEGMENT]


def test_the_services_wait_ends_at_once_when_the_process_stops(tmp_path: Path) -> None:
    config = _service_config(tmp_path)
    config.layout.incoming.mkdir(parents=True)
    (config.layout.incoming / SEGMENT).write_bytes(_events(300))
    shutdown.request(grace=86_400)  # the grace's timer never ends this test's process
    try:
        started = time.monotonic()
        assert wait_preparing_sealed(config, 30.0) is True
        assert time.monotonic() - started < 10  # not the 30 s asked for
        assert not ahead_of(config.layout, SEGMENT).data.exists()  # nothing begun
    finally:
        shutdown.reset()
