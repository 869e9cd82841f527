"""The Redshift destination against a stand-in (tests/redshift.py: the run's PostgreSQL
behind a front that runs Redshift's ``COPY`` from moto's S3): what the conformance suite
does not ask of every destination. A load killed inside its transaction and run again,
text made storable, the COPY it sends, ``eventpipe
query`` kept to reads, and no cluster or no bucket."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eventpipe.destinations.base import LoadRequest
from eventpipe.destinations.redshift import TRUNCATED, RedshiftDestination
from eventpipe.errors import QueryError, TransientError
from eventpipe.locks import FileLocks
from eventpipe.objectstore import Location, S3Settings
from eventpipe.schema.diff import Table, diff
from eventpipe.schema.types import DataType

S, N, T = DataType.STRING, DataType.INT64, DataType.TIMESTAMP
COLUMNS = {"id": S, "n": N, "_timestamp": T}


@pytest.fixture
def settings(redshift_server: Any, s3_bucket: str) -> dict[str, Any]:
    found = redshift_server.settings(s3_bucket)
    del found["type"]
    return dict(found)


@pytest.fixture
def dest(settings: dict[str, Any], tmp_path: Path) -> RedshiftDestination:
    return _opened(settings, tmp_path / "locks")


def _opened(settings: dict[str, Any], locks: Path) -> RedshiftDestination:
    given = dict(settings)
    staging = Location.of(given.pop("staging"), S3Settings(**given.pop("s3")))
    return RedshiftDestination("rs", FileLocks(locks), staging=staging, **given)


def _ensure(dest: RedshiftDestination, table: Table) -> None:
    dest.patch(diff(dest.describe(table.name), table))


def _rows(dest: RedshiftDestination, sql: str) -> list[tuple[Any, ...]]:
    return dest.query(sql)[1]


def _file(path: Path, rows: list[dict[str, Any]]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


_CHILD = """
import json, sys
from pathlib import Path
from eventpipe.destinations.redshift import RedshiftDestination
from eventpipe.destinations.base import LoadRequest
from eventpipe.locks import FileLocks
from eventpipe.objectstore import Location, S3Settings
from eventpipe.schema.types import DataType
settings, locks, file, step = json.loads(sys.argv[1]), *sys.argv[2:5]
staging = Location.of(settings.pop("staging"), S3Settings(**settings.pop("s3")))
dest = RedshiftDestination("rs", FileLocks(Path(locks)), staging=staging, **settings)
original = getattr(dest, step)
def then_killed(db, *args):
    original(db, *args)
    import os, signal
    os.kill(os.getpid(), signal.SIGKILL)  # inside the transaction: rows in, no COMMIT
setattr(dest, step, then_killed)
columns = {"id": DataType.STRING, "n": DataType.INT64, "_timestamp": DataType.TIMESTAMP}
key = ("id",) if step == "_move" else ()
dest.load(LoadRequest("events", "batch-1", (Path(file),), columns, key))
"""


@pytest.mark.parametrize("step", ["_copy", "_move"])  # without a key; with one
def test_a_load_killed_inside_its_transaction_leaves_nothing_and_a_rerun_loads_once(
    dest: RedshiftDestination,
    settings: dict[str, Any],
    s3_server: Any,
    s3_bucket: str,
    tmp_path: Path,
    step: str,
) -> None:
    import json

    key = ("id",) if step == "_move" else ()
    _ensure(dest, Table("events", COLUMNS, key))
    rows = [{"id": f"e{i}", "n": i, "_timestamp": datetime(2026, 11, 20, 9)} for i in range(500)]
    batch = _file(tmp_path / "batch.parquet", rows)
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(settings), str(dest.locks.directory),
         str(batch), step], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert child.returncode == -9, child.stderr  # killed after its rows went in, before COMMIT
    assert _rows(dest, "SELECT count(*) FROM events") == [(0,)]
    assert _rows(dest, "SELECT count(*) FROM _eventpipe_loads") == [(0,)]
    assert s3_server.keys(s3_bucket, "staging/rs/events/")  # its file left staged
    result = dest.load(LoadRequest("events", "batch-1", (batch,), COLUMNS, key))
    assert (result.rows, result.already_loaded) == (500, False)
    assert _rows(dest, "SELECT count(*), count(DISTINCT id), sum(n) FROM events") == [
        (500, 500, sum(range(500)))
    ]
    # The staged file deleted once in (pyarrow leaves its folder's empty marker).
    assert [k for k in s3_server.keys(s3_bucket, "staging/") if not k.endswith("/")] == []
    again = dest.load(LoadRequest("events", "batch-1", (batch,), COLUMNS, key))
    assert (again.rows, again.already_loaded) == (500, True)
    assert dest.tables() == ["_eventpipe_loads", "events"]


def test_the_copy_names_the_role_and_parquet_and_the_row_goes_in_by_position(
    dest: RedshiftDestination, redshift_server: Any, s3_bucket: str, tmp_path: Path
) -> None:
    columns = {"id": S, "price": DataType.FLOAT64, "n": N, "ok": DataType.BOOL, "_timestamp": T}
    _ensure(dest, Table("orders", columns))
    # The batch has fewer columns than the table, in another order.
    batch = _file(tmp_path / "b.parquet", [{"n": 7, "price": 2.5, "id": "a"}])
    result = dest.load(LoadRequest("orders", "b1", (batch,), {"n": N, "price": DataType.FLOAT64,
                                                              "id": S}))  # fmt: skip
    assert result.rows == 1
    sent = redshift_server.copies[-1]
    assert f"FROM 's3://{s3_bucket}/staging/rs/orders/" in sent
    assert "IAM_ROLE 'arn:aws:iam::123456789012:role/eventpipe-copy' FORMAT AS PARQUET" in sent
    assert _rows(dest, "SELECT id, price, n, ok, _timestamp FROM orders") == [
        ("a", pytest.approx(2.5), 7, None, None)
    ]


def test_long_text_is_cut_to_the_columns_bytes_with_a_marker_and_nul_replaced(
    dest: RedshiftDestination, tmp_path: Path
) -> None:
    columns = {"id": S, "body": S}
    _ensure(dest, Table("pages", columns))
    long = "é" * 40_000  # 80,000 bytes: over varchar(65535)'s bytes, under its characters
    batch = _file(tmp_path / "b.parquet", [{"id": "long", "body": long},
                                           {"id": "nul", "body": "a\0b"},
                                           {"id": "fine", "body": "ok"}])  # fmt: skip
    result = dest.load(LoadRequest("pages", "b1", (batch,), columns))
    assert (result.rows, result.rejected) == (3, ())
    stored = dict(_rows(dest, "SELECT id, body FROM pages"))
    assert stored["fine"] == "ok"
    assert stored["nul"] == "a\ufffdb"
    assert stored["long"].endswith(TRUNCATED)
    assert stored["long"].startswith("é" * 30_000)
    assert len(stored["long"].encode()) <= 65_535


def test_query_reads_refuses_writes_and_says_the_servers_error(
    dest: RedshiftDestination,
) -> None:
    _ensure(dest, Table("events", COLUMNS))
    assert dest.query("SELECT count(*) AS n FROM events") == (["n"], [(0,)])
    with pytest.raises(QueryError, match="read-only"):
        dest.query("DELETE FROM events")
    with pytest.raises(QueryError, match="one statement"):
        dest.query("SELECT 1; DROP TABLE events")
    with pytest.raises(QueryError, match='relation "nope" does not exist'):
        dest.query("SELECT * FROM nope")


def test_no_cluster_or_bucket_is_transient_and_says_no_secret(
    dest: RedshiftDestination, settings: dict[str, Any], tmp_path: Path
) -> None:
    from tests.process import free_port

    gone = _opened({**settings, "dsn": f"postgresql://loader:s3cret@127.0.0.1:{free_port()}/dev"},
                   tmp_path / "l")  # fmt: skip
    with pytest.raises(TransientError) as down:
        gone.describe("events")
    assert "s3cret" not in str(down.value)
    _ensure(dest, Table("events", COLUMNS))
    nowhere = _opened({**settings, "staging": "s3://no-such-bucket/staging"}, tmp_path / "l")
    batch = _file(tmp_path / "b.parquet", [{"id": "a", "n": 1}])
    with pytest.raises(TransientError, match="staging on s3://no-such-bucket"):
        nowhere.load(LoadRequest("events", "b1", (batch,), {"id": S, "n": N}))


def test_text_cut_to_a_short_columns_bytes_keeps_whole_characters(tmp_path: Path) -> None:
    from eventpipe.destinations.redshift import fit_text

    path = _file(tmp_path / "t.parquet", [{"short": "ééééé", "long": "ab" * 100, "n": 1}])
    assert fit_text(path, {"short": 5, "long": 150}) == 2
    row = pq.read_table(path).to_pylist()[0]
    assert row["short"] == "éé"  # 4 bytes: a third é would be cut in half
    assert row["long"].endswith(TRUNCATED)
    assert len(row["long"].encode()) <= 150
    assert row["n"] == 1
