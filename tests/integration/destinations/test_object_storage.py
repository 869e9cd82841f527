"""The lakes on S3 (moto's server, tests/s3.py), through eventpipe's own S3 clients: the
objects land in the bucket and nothing stays behind locally; a Parquet load cut before
its record runs again to the clean result; Iceberg and Delta replace a day in one commit,
compact and expire there; a store that cannot be reached is a transient error. (The
conformance suite runs the three on S3 too: test_conformance.py.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from eventpipe.destinations.base import DaySwap, LoadRequest
from eventpipe.destinations.delta import DeltaDestination
from eventpipe.destinations.iceberg import IcebergDestination
from eventpipe.destinations.parquet_s3 import S3ParquetDestination
from eventpipe.objectstore import Location, S3Settings
from eventpipe.schema.diff import Table, diff
from tests.integration.destinations.test_lakehouse import COLUMNS, _rows_file
from tests.s3 import open_lake

Lake = S3ParquetDestination | IcebergDestination | DeltaDestination


def _open(kind: str, uri: str, settings: S3Settings, tmp_path: Path) -> Lake:
    return open_lake(kind, Location.of(uri, settings), tmp_path)


@pytest.fixture
def on_s3(s3_server: Any, s3_bucket: str, tmp_path: Path) -> Any:
    def lake(kind: str) -> Lake:
        return _open(kind, f"s3://{s3_bucket}/lakes/{kind}", S3Settings(**s3_server.settings()),
                     tmp_path)  # fmt: skip

    return lake


def _created(dest: Lake, table: str = "events") -> None:
    dest.patch(diff(dest.describe(table), Table(table, COLUMNS)))


def _count(dest: Lake) -> tuple[int, int, int]:
    [(rows, ids, total)] = dest.query("SELECT count(*), count(DISTINCT id), sum(n) FROM events")[1]
    return rows, ids, total


@pytest.mark.parametrize("kind", ["parquet", "iceberg", "delta"])
def test_a_lake_on_s3_keeps_its_tables_in_the_bucket_and_nothing_locally(
    kind: str, on_s3: Any, s3_server: Any, s3_bucket: str, tmp_path: Path
) -> None:
    dest = on_s3(kind)
    _created(dest)
    for n in range(2):
        rows = _rows_file(tmp_path / f"{n}.parquet", 300, first=300 * n)
        assert dest.load(LoadRequest("events", f"b{n}", (rows,), COLUMNS)).rows == 300
    keys = s3_server.keys(s3_bucket, f"lakes/{kind}/events/")
    assert sum(k.endswith(".parquet") for k in keys) == 6  # a file per batch and day
    assert not list((tmp_path / "work").rglob("*.parquet"))  # staged files gone
    other = on_s3(kind)  # another process: reads the bucket, not this one's memory
    assert other.describe("events") == Table("events", COLUMNS)
    assert _count(other) == (600, 600, 600 * 599 // 2)
    assert other.query("SELECT count(*) FROM _eventpipe_loads")[1] == [(2,)]
    assert other.tables() == ["events"]
    other.drop(["events"])
    assert s3_server.keys(s3_bucket, f"lakes/{kind}/events/") == []


def test_a_parquet_load_on_s3_cut_before_its_record_then_run_again_equals_a_clean_load(
    on_s3: Any, s3_server: Any, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from eventpipe.destinations.storage import ObjectStorage

    dest = on_s3("parquet")
    _created(dest)
    request = LoadRequest("events", "b1", (_rows_file(tmp_path / "1.parquet", 3000),), COLUMNS)
    original = ObjectStorage.create_text

    def no_record(self: ObjectStorage, path: str, text: str) -> None:
        if "/loads/" in path:
            raise OSError("cut before the record")
        original(self, path, text)

    monkeypatch.setattr(ObjectStorage, "create_text", no_record)
    with pytest.raises(Exception, match="cut before the record"):
        dest.load(request)

    def data() -> list[str]:
        keys = s3_server.keys(s3_bucket, "lakes/parquet/events/")
        return [k for k in keys if k.endswith(".parquet")]

    uploaded = data()
    assert len(uploaded) == 3  # every object uploaded, the batch not recorded
    monkeypatch.undo()
    assert dest.load(request).rows == 3000
    assert _count(dest) == (3000, 3000, 3000 * 2999 // 2)
    assert data() == uploaded  # the same names: replaced, nothing added
    again = dest.load(request)
    assert (again.rows, again.already_loaded) == (3000, True)


@pytest.mark.parametrize("kind", ["iceberg", "delta"])
def test_a_reprocess_replaces_a_day_on_s3_in_one_commit(
    kind: str, on_s3: Any, tmp_path: Path
) -> None:
    dest = on_s3(kind)
    _created(dest)
    dest.load(LoadRequest("events", "b1", (_rows_file(tmp_path / "1.parquet", 3000),), COLUMNS))
    shadow = "_eventpipe_rp_0"
    _created(dest, shadow)
    rebuilt = _rows_file(tmp_path / "r.parquet", 1000, 10_000, ("2026-11-21",))
    dest.load(LoadRequest(shadow, "r0", (rebuilt,), COLUMNS))
    swap = DaySwap("swap-0", ("2026-11-21",), ("events",), {"events": shadow})
    assert dest.replace_days(swap) == {"events": 1000}
    assert on_s3(kind).replace_days(swap) == {"events": 1000}  # done once
    [(day, other)] = dest.query(
        "SELECT count(*) FILTER (WHERE n >= 10000), count(*) FILTER (WHERE n < 10000) FROM events"
    )[1]
    assert (day, other) == (1000, 2000)
    assert dest.tables() == ["events"]


@pytest.mark.parametrize("kind", ["iceberg", "delta"])
def test_compact_then_expire_on_s3_deletes_the_objects_no_version_names(
    kind: str, on_s3: Any, s3_server: Any, s3_bucket: str, tmp_path: Path
) -> None:
    dest = on_s3(kind)
    _created(dest)
    for n in range(3):
        rows = _rows_file(tmp_path / f"{n}.parquet", 300, first=300 * n)
        dest.load(LoadRequest("events", f"b{n}", (rows,), COLUMNS))
    expected = _count(dest)

    def data_objects() -> int:
        keys = s3_server.keys(s3_bucket, f"lakes/{kind}/events/")
        return sum(k.endswith(".parquet") for k in keys)

    assert dest.compact("events") == (9, 3)
    assert data_objects() == 12
    versions, deleted = dest.expire("events", datetime.now(UTC) + timedelta(seconds=1))
    assert versions >= 3
    assert deleted >= 9
    assert data_objects() == 3
    assert _count(on_s3(kind)) == expected


@pytest.mark.parametrize("kind", ["parquet", "iceberg", "delta"])
def test_a_store_that_cannot_be_reached_is_a_transient_error(kind: str, tmp_path: Path) -> None:
    """Not the events' fault: the destination waits and retries with backoff instead of
    isolating its events one by one."""
    from eventpipe.errors import TransientError
    from tests.process import free_port

    closed = S3Settings(endpoint=f"http://127.0.0.1:{free_port()}", region="us-east-1",
                        access_key_id="key", secret_access_key="secret")  # fmt: skip
    dest = _open(kind, "s3://nowhere/lake", closed, tmp_path)
    with pytest.raises(TransientError) as raised:
        _created(dest)
    assert "secret" not in str(raised.value)


def test_a_parquet_lake_on_s3_refuses_to_replace_days(on_s3: Any) -> None:
    from eventpipe.errors import TerminalError

    swap = DaySwap("swap-0", ("2026-11-21",), ("events",), {"events": "_eventpipe_rp_0"})
    with pytest.raises(TerminalError, match="object store"):
        on_s3("parquet").replace_days(swap)
