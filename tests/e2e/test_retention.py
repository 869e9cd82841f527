"""Retention: the archive keeps `processing.retention_days` of processed segments; a
segment some destination has not handled is never deleted, however old."""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from eventpipe.processing.job import DestinationsFailingError, process_pending, prune_archive
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
    pruned = prune_archive(config.layout, 10, today=date(2026, 11, 21))
    assert [p.name for p in pruned] == ["2026-11-01", "2026-11-10"]
    assert sorted(p.name for p in config.layout.archive.iterdir()) == [
        "2026-11-11", "2026-11-20", "notes",
    ]  # fmt: skip


def test_an_old_segment_waits_for_every_destination_then_goes(tmp_path: Path, spark: Any) -> None:
    data = tmp_path / "data"
    _segments(data)
    down = f"postgresql://nobody@127.0.0.1:{free_port()}/none"  # nothing listens there
    both = {"warehouse": {"type": "duckdb"}, "pg": {"type": "postgres", "dsn": down}}
    config = make_config(data, destinations=both, processing={"retention_days": 30})
    with pytest.raises(DestinationsFailingError):
        process_pending(config, spark)
    # Loaded into DuckDB, 10 months old, but pg has not handled it: kept.
    assert (data / "incoming" / OLD).exists()
    assert not (data / "archive").exists()
    alone = make_config(data, destinations={"warehouse": both["warehouse"]},
                        processing={"retention_days": 30})  # fmt: skip
    process_pending(alone, spark)  # pg removed from the config: handled by all
    assert not (data / "incoming" / OLD).exists()
    assert not (data / "archive" / "2026-01-02").exists()  # archived, then past retention
    assert (data / "archive" / TODAY / f"{RECENT}.gz").exists()


def test_status_shows_the_archive(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "archive" / "2026-11-20").mkdir(parents=True)
    (data / "archive" / "2026-11-20" / "a.log.gz").write_bytes(b"x" * 2_000_000)
    config = write_config(tmp_path / "eventpipe.yaml", data, 0,
                          processing={"retention_days": 7})  # fmt: skip
    result = run("status", "-c", str(config))
    assert result.returncode == 0, result.stderr
    assert "archive: 1 day(s) (2026-11-20 to 2026-11-20), 2.0 MB, kept 7 day(s)" in result.stdout
