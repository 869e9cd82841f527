"""Spark reads the archive frame by frame, in parallel, and gets every event back."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import orjson

from eventpipe.archive.files import day_dirs, segments_of_day
from eventpipe.archive.spark import read_archive
from eventpipe.archive.write import archive_segment
from eventpipe.config import ArchiveConfig
from eventpipe.paths import DataLayout


def test_every_event_comes_back_with_its_segment_and_line(tmp_path: Path, spark: Any) -> None:
    layout = DataLayout(tmp_path / "data")
    layout.incoming.mkdir(parents=True)
    originals: dict[str, list[bytes]] = {}
    for hour, count in ((10, 950), (11, 7)):
        name = f"incoming.tok=web-2026-11-20T{hour}-00-00.000.log"
        lines = [orjson.dumps({"n": n, "eventn_ctx": {"event_id": f"{hour}-{n}"}})
                 for n in range(count)]  # fmt: skip
        lines[3] = b'{"raw":"a\rb"}'  # a damaged line: one line still
        originals[name] = lines
        (layout.incoming / name).write_bytes(b"".join(line + b"\n" for line in lines))
        archive_segment(layout, name, ArchiveConfig(frame_events=100))
    legacy = "incoming.tok=web-2026-11-20T09-00-00.000.log"  # archived before LZ4
    originals[legacy] = [b'{"old":1}', b'{"old":2}']
    (layout.archive / "2026-11-20" / f"{legacy}.gz").write_bytes(
        gzip.compress(b'{"old":1}\n{"old":2}\n')
    )
    segments = [s for day in day_dirs(layout) for s in segments_of_day(day)]
    frame = read_archive(spark, segments)
    assert frame.rdd.getNumPartitions() > 1
    rows = frame.collect()
    got = sorted((r["segment"], r["line"], bytes(r["value"])) for r in rows)
    expected = sorted(
        (name, line, value) for name, lines in originals.items() for line, value in enumerate(lines)
    )
    assert got == expected
