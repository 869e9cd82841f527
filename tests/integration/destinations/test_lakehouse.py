"""Iceberg and Delta tables around their commits: a load that dies after writing data
files and before the commit, or after the commit and before eventpipe's record, or at
any moment (SIGKILL), then runs again, gives the same table, nothing twice, no file
missing; a reader during a reprocess of a day never sees that day empty; the Iceberg
catalog on PostgreSQL. (The conformance suite runs on both too: test_conformance.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eventpipe.destinations.base import DaySwap, LoadRequest
from eventpipe.destinations.delta import DeltaDestination
from eventpipe.destinations.iceberg import IcebergDestination
from eventpipe.destinations.lakehouse import LakehouseDestination
from eventpipe.locks import FileLocks
from eventpipe.schema.diff import Table, diff
from eventpipe.schema.types import DataType

COLUMNS = {"id": DataType.STRING, "n": DataType.INT64, "_timestamp": DataType.TIMESTAMP}
DAYS = ("2026-11-20", "2026-11-21", "2026-11-22")


def _open(kind: str, tmp_path: Path, catalog: str | None = None) -> LakehouseDestination:
    locks = FileLocks(tmp_path / "locks")
    if kind == "iceberg":
        uri = catalog or f"sqlite:///{tmp_path / 'catalog.db'}"
        return IcebergDestination("lake", tmp_path / "iceberg", locks,
                                  {"type": "sql", "uri": uri}, "lake")  # fmt: skip
    return DeltaDestination("lake", tmp_path / "delta", locks)


def _rows_file(path: Path, rows: int, first: int = 0, days: tuple[str, ...] = DAYS) -> Path:
    starts = [datetime.fromisoformat(d).replace(hour=12, tzinfo=UTC) for d in days]
    pq.write_table(pa.table({
        "id": [f"e{first + i}" for i in range(rows)],
        "n": list(range(first, first + rows)),
        "_timestamp": pa.array([starts[i % len(days)] + timedelta(seconds=i) for i in range(rows)],
                               pa.timestamp("us")),
    }), path)  # fmt: skip
    return path


def _created(dest: LakehouseDestination, table: str = "events") -> None:
    dest.patch(diff(dest.describe(table), Table(table, COLUMNS)))


def _count(dest: LakehouseDestination) -> tuple[int, int, int]:
    [(rows, ids, total)] = dest.query("SELECT count(*), count(DISTINCT id), sum(n) FROM events")[1]
    return rows, ids, total


def _files_referenced(kind: str, tmp_path: Path) -> list[Path]:
    """Every data file the table's current version names."""
    if kind == "delta":
        from deltalake import DeltaTable

        return [Path(u.removeprefix("file://")) for u in
                DeltaTable(str(tmp_path / "delta" / "events")).file_uris()]  # fmt: skip
    dest = _open(kind, tmp_path)
    assert isinstance(dest, IcebergDestination)
    table = dest.catalog.load_table(("lake", "events"))
    return [Path(t.file.file_path.removeprefix("file://")) for t in table.scan().plan_files()]


def _data_files(kind: str, tmp_path: Path) -> set[Path]:
    return set((tmp_path / kind / "events").rglob("*.parquet"))


@pytest.mark.parametrize("kind", ["iceberg", "delta"])
def test_a_commit_that_failed_after_its_files_leaves_them_unreferenced_and_the_retry_loads_once(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = _open(kind, tmp_path)
    _created(dest)
    first = LoadRequest("events", "b0", (_rows_file(tmp_path / "0.parquet", 300),), COLUMNS)
    dest.load(first)
    second = _rows_file(tmp_path / "1.parquet", 3000, first=300)
    request = LoadRequest("events", "b1", (second,), COLUMNS)
    before = _data_files(kind, tmp_path)
    if kind == "delta":  # the next version's file is taken: the commit fails, files written
        blocker = tmp_path / "delta" / "events" / "_delta_log" / f"{2:020d}.json"
        blocker.mkdir()
    else:
        from pyiceberg.catalog.sql import SqlCatalog

        def refuse(*args: Any, **kwargs: Any) -> None:
            raise OSError("the catalog refused the commit")

        monkeypatch.setattr(SqlCatalog, "commit_table", refuse)
    with pytest.raises(Exception):  # noqa: B017, PT011 - the format's own commit error
        dest.load(request)
    orphans = _data_files(kind, tmp_path) - before
    assert orphans, "the data files were not written before the commit"
    assert _count(dest) == (300, 300, 300 * 299 // 2)  # the table as before
    if kind == "delta":
        blocker.rmdir()
    else:
        monkeypatch.undo()
    assert dest.load(request).rows == 3000
    assert _count(dest) == (3300, 3300, 3300 * 3299 // 2)
    referenced = _files_referenced(kind, tmp_path)
    assert all(f.exists() for f in referenced)
    assert not orphans & set(referenced)


@pytest.mark.parametrize("kind", ["iceberg", "delta"])
def test_a_batch_committed_but_not_recorded_is_not_loaded_again(kind: str, tmp_path: Path) -> None:
    """The process died after the commit, before the state store's record: the next run
    loads the batch again, and the commit's own record says it is there."""
    dest = _open(kind, tmp_path)
    _created(dest)
    request = LoadRequest("events", "b1", (_rows_file(tmp_path / "1.parquet", 500),), COLUMNS)
    assert dest.load(request).rows == 500
    again = _open(kind, tmp_path).load(request)  # a new process: nothing kept in memory
    assert (again.rows, again.already_loaded) == (500, True)
    assert _count(dest) == (500, 500, 500 * 499 // 2)


_CHILD = """
import sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from tests.integration.destinations.test_lakehouse import COLUMNS, _open
from eventpipe.destinations.base import LoadRequest
kind, where, file = sys.argv[1:4]
dest = _open(kind, Path(where))
print("loading", flush=True)
dest.load(LoadRequest("events", "big", (Path(file),), COLUMNS))
print("loaded", flush=True)
"""


@pytest.mark.parametrize("kind", ["iceberg", "delta"])
def test_a_load_killed_at_any_moment_then_run_again_gives_the_clean_table(
    kind: str, tmp_path: Path
) -> None:
    dest = _open(kind, tmp_path)
    _created(dest)
    rows = 200_000
    big = _rows_file(tmp_path / "big.parquet", rows)
    child = _CHILD.format(tests=str(Path(__file__).resolve().parents[3]))
    outcomes = []
    for delay in (0.05, 0.3, 0.8, 1.5):  # into the read, the conversion, the write, the commit
        process = subprocess.Popen([sys.executable, "-c", child, kind, str(tmp_path), str(big)],
                                   stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "loading"
        time.sleep(delay)
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        outcomes.append(process.stdout.read().strip())
        process.stdout.close()
        assert _count(dest)[0] in (0, rows)  # all of the batch or none of it
    result = dest.load(LoadRequest("events", "big", (big,), COLUMNS))
    assert result.rows == rows
    assert _count(dest) == (rows, rows, rows * (rows - 1) // 2)
    assert all(f.exists() for f in _files_referenced(kind, tmp_path))
    assert "" in outcomes, "no kill landed before the load finished"


@pytest.mark.parametrize("kind", ["iceberg", "delta"])
def test_a_reader_during_a_reprocess_never_sees_the_day_empty(kind: str, tmp_path: Path) -> None:
    dest = _open(kind, tmp_path)
    _created(dest)
    dest.load(LoadRequest("events", "b1", (_rows_file(tmp_path / "1.parquet", 3000),), COLUMNS))
    seen: list[int] = []
    stop = threading.Event()

    def read() -> None:
        reader = _open(kind, tmp_path)  # its own catalog connection, as another process's
        while not stop.is_set():
            [(n,)] = reader.query(
                "SELECT count(*) FROM events WHERE _timestamp >= TIMESTAMPTZ '2026-11-21 00:00:00Z'"
                " AND _timestamp < TIMESTAMPTZ '2026-11-22 00:00:00Z'"
            )[1]
            seen.append(n)

    thread = threading.Thread(target=read)
    thread.start()
    try:
        for attempt in range(4):
            shadow = f"_eventpipe_rp_{attempt}"
            _created(dest, shadow)
            first = 10_000 * (attempt + 1)
            rebuilt = _rows_file(tmp_path / f"r{attempt}.parquet", 1000, first, ("2026-11-21",))
            dest.load(LoadRequest(shadow, f"r{attempt}", (rebuilt,), COLUMNS))
            swap = DaySwap(f"swap-{attempt}", ("2026-11-21",), ("events",), {"events": shadow})
            assert dest.replace_days(swap) == {"events": 1000}
            assert dest.replace_days(swap) == {"events": 1000}  # done once
    finally:
        stop.set()
        thread.join()
    assert len(seen) >= 4
    assert set(seen) == {1000}, "a reader saw the day with other than its 1000 rows"
    assert dest.tables() == ["events"]
    assert _count(dest)[0] == 3000


def test_an_iceberg_catalog_on_postgresql(
    tmp_path: Path, postgres_dsn: str, postgres_schema: str
) -> None:
    from eventpipe.config import IcebergConfig
    from eventpipe.destinations.registry import iceberg_catalog
    from tests.conftest import make_config

    config = make_config(tmp_path / "data")
    settings = IcebergConfig(catalog={"uri": postgres_dsn, "namespace": postgres_schema})
    properties = iceberg_catalog(settings, config)
    assert properties["uri"].startswith("postgresql+psycopg://")  # eventpipe's driver
    dest = IcebergDestination("lake", tmp_path / "iceberg", FileLocks(tmp_path / "locks"),
                              properties, postgres_schema)  # fmt: skip
    dest.patch(diff(None, Table("events", COLUMNS)))
    dest.load(LoadRequest("events", "b1", (_rows_file(tmp_path / "1.parquet", 100),), COLUMNS))
    other = IcebergDestination("lake", tmp_path / "iceberg", FileLocks(tmp_path / "other"),
                               properties, postgres_schema)  # fmt: skip
    assert other.query("SELECT count(*) FROM events")[1] == [(100,)]
    assert other.tables() == ["events"]


@pytest.mark.parametrize("kind", ["iceberg", "delta"])
def test_a_table_directory_that_cannot_be_written_is_a_transient_error(
    kind: str, tmp_path: Path
) -> None:
    """The format's failure is not the events': the destination waits and retries,
    instead of isolating its events one by one."""
    from eventpipe.errors import TransientError

    (tmp_path / kind).write_text("a file where the tables' directory should be")
    dest = _open(kind, tmp_path)
    with pytest.raises(TransientError, match=r"lake\.events: "):
        _created(dest)


@pytest.mark.parametrize("kind", ["iceberg", "delta"])
def test_compact_then_expire_leaves_the_rows_in_fewer_files_and_deletes_the_rest(
    kind: str, tmp_path: Path
) -> None:
    dest = _open(kind, tmp_path)
    _created(dest)
    for n in range(5):  # a file per batch and day: 15
        rows = _rows_file(tmp_path / f"{n}.parquet", 300, first=300 * n)
        dest.load(LoadRequest("events", f"b{n}", (rows,), COLUMNS))
    expected = _count(dest)
    assert dest.compact("events") == (15, 3)  # one per day
    assert _count(dest) == expected
    assert dest.compact("events") == (3, 3)  # nothing more to do
    on_disk = len(_data_files(kind, tmp_path))
    versions, deleted = dest.expire("events", datetime.now(UTC) + timedelta(seconds=1))
    assert versions >= 5
    assert deleted >= 15  # the compacted files (and Iceberg's old manifests)
    assert len(_data_files(kind, tmp_path)) == on_disk - 15
    assert _count(dest) == expected
    assert all(f.exists() for f in _files_referenced(kind, tmp_path))


def _versions(kind: str, tmp_path: Path) -> int:
    """How many commits the table has had: Delta's versions; Iceberg's metadata files
    (each commit writes one; the table keeps the last 100)."""
    if kind == "delta":
        from deltalake import DeltaTable

        return DeltaTable(str(tmp_path / "delta" / "events")).version() + 1
    dest = _open(kind, tmp_path)
    assert isinstance(dest, IcebergDestination)
    found = dest.catalog.load_table(("lake", "events"))
    return len(found.metadata.metadata_log) + 1


@pytest.mark.parametrize("kind", ["iceberg", "delta"])
def test_new_columns_are_committed_with_the_rows_that_bring_them(kind: str, tmp_path: Path) -> None:
    dest = _open(kind, tmp_path)
    _created(dest)
    dest.load(LoadRequest("events", "b1", (_rows_file(tmp_path / "1.parquet", 10),), COLUMNS))
    wider = {**COLUMNS, "color": DataType.STRING}
    dest.patch(diff(dest.describe("events"), Table("events", wider)))
    assert dest.describe("events") == Table("events", wider)  # as the load will find it
    other = _open(kind, tmp_path)  # another process: nothing committed yet
    assert other.describe("events") == Table("events", COLUMNS)
    before = _versions(kind, tmp_path)
    colored = tmp_path / "2.parquet"
    pq.write_table(pa.table({"id": ["c1"], "n": [99], "color": ["red"],
                             "_timestamp": pa.array([datetime(2026, 11, 21, tzinfo=UTC)],
                                                    pa.timestamp("us"))}), colored)  # fmt: skip
    dest.load(LoadRequest("events", "b2", (colored,), wider))
    assert _versions(kind, tmp_path) == before + 1  # one commit: the column and its rows
    assert other.describe("events") == Table("events", wider)
    assert other.query("SELECT count(*), count(color) FROM events")[1] == [(11, 1)]
