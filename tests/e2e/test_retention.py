"""Retention: the archive keeps `archive.retention_days` of processed segments and at
most `archive.max_bytes`; a segment some destination has not handled is never deleted,
however old."""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from eventpipe.archive.retention import prune, pruned_through
from eventpipe.archive.write import archive_segment
from eventpipe.processing.batch.job import process_pending
from eventpipe.processing.batch.run import DestinationsFailingError
from tests.conftest import make_config
from tests.process import free_port, run, write_config

OLD = "incoming.tok=web-2026-01-02T10-00-00.000.log"
TODAY = datetime.now(UTC).date().isoformat()
RECENT = f"incoming.tok=web-{TODAY}T00-00-00.000.log"


def _segments(data: Path) -> None:
    (data / "incoming").mkdir(parents=True)
    for name in (OLD, RECENT):
        (data / "incoming" / name).write_bytes(orjson.dumps({"event_id": name}) + b"\n")


def test_prune_deletes_only_days_older_than_the_retention(tmp_path: Path) -> None:
    config = make_config(tmp_path / "data")
    for day in ("2026-11-01", "2026-11-10", "2026-11-11", "2026-11-20"):
        (config.layout.archive / day).mkdir(parents=True)
        (config.layout.archive / day / "x.log.gz").write_bytes(b"x")
    (config.layout.archive / "notes").mkdir()  # not a day: left alone
    pruned = prune(config.layout, 10, today=date(2026, 11, 21))
    assert [p.name for p in pruned] == ["2026-11-01", "2026-11-10"]
    assert sorted(p.name for p in config.layout.archive.iterdir()) == [
        "2026-11-11", "2026-11-20", "notes", "pruned-through",
    ]  # fmt: skip
    assert pruned_through(config.layout) == "2026-11-10"  # reprocess refuses days up to it
    prune(config.layout, 100, today=date(2026, 11, 21))  # nothing deleted: the mark stays
    assert pruned_through(config.layout) == "2026-11-10"


def test_max_bytes_deletes_the_oldest_days_but_never_the_newest(tmp_path: Path) -> None:
    config = make_config(tmp_path / "data")
    for day, size in (("2026-11-01", 300), ("2026-11-02", 300), ("2026-11-03", 900)):
        (config.layout.archive / day).mkdir(parents=True)
        (config.layout.archive / day / "x.log.lz4").write_bytes(b"x" * size)
    assert prune(config.layout, None, max_bytes=1300) == [config.layout.archive / "2026-11-01"]
    assert prune(config.layout, None, max_bytes=1300) == []  # 1,200 bytes now
    # Over the bound with the newest day alone: it stays.
    assert prune(config.layout, None, max_bytes=100) == [config.layout.archive / "2026-11-02"]
    assert [d.name for d in config.layout.archive.iterdir() if d.is_dir()] == ["2026-11-03"]


def test_an_old_segment_waits_for_every_destination_then_goes(tmp_path: Path, spark: Any) -> None:
    data = tmp_path / "data"
    _segments(data)
    down = f"postgresql://nobody@127.0.0.1:{free_port()}/none"  # nothing listens there
    both = {"warehouse": {"type": "duckdb"}, "pg": {"type": "postgres", "dsn": down}}
    config = make_config(data, destinations=both, archive={"retention_days": 30})
    with pytest.raises(DestinationsFailingError):
        process_pending(config, spark)
    # Loaded into DuckDB, 10 months old, but pg has not handled it: kept.
    assert (data / "incoming" / OLD).exists()
    assert not (data / "archive").exists()
    alone = make_config(data, destinations={"warehouse": both["warehouse"]},
                        archive={"retention_days": 30})  # fmt: skip
    process_pending(alone, spark)  # pg removed from the config: handled by all
    assert not (data / "incoming" / OLD).exists()
    assert not (data / "archive" / "2026-01-02").exists()  # archived, then past retention
    assert (data / "archive" / TODAY / f"{RECENT}.lz4").exists()


def test_status_shows_the_archive(tmp_path: Path) -> None:
    data = tmp_path / "data"
    config = make_config(data)
    (data / "incoming").mkdir(parents=True)
    segment = "incoming.tok=web-2026-11-20T10-00-00.000.log"
    events = b"".join(orjson.dumps({"n": n, "text": "x" * 100}) + b"\n" for n in range(20_000))
    (data / "incoming" / segment).write_bytes(events)
    archive_segment(config.layout, segment, config.archive)
    path = write_config(tmp_path / "eventpipe.yaml", data, 0,
                        archive={"retention_days": 7, "max_bytes": 50_000_000})  # fmt: skip
    result = run("status", "-c", str(path))
    assert result.returncode == 0, result.stderr
    line = next(x for x in result.stdout.splitlines() if x.startswith("archive:"))
    disk = sum(f.stat().st_size for f in (data / "archive" / "2026-11-20").iterdir())
    assert line == (
        f"archive: 1 day(s) (2026-11-20 to 2026-11-20), 1 file(s), 20,000 event(s), "
        f"{disk / 1e6:.1f} MB ({disk / len(events):.0%} of {len(events) / 1e6:.1f} MB); "
        "kept 7 day(s), at most 50.0 MB"
    )
