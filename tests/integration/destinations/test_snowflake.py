"""The Snowflake destination against a stand-in that speaks Snowflake's protocol
(fakesnow's server, tests/snowflake.py) through the official connector: what the
conformance suite does not ask of every destination. A load killed before its commit and
run again, ``eventpipe query`` kept to reads, and no
server (a source's changes applied by key: the conformance suite)."""

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
from eventpipe.destinations.snowflake import SnowflakeDestination
from eventpipe.destinations.snowflake.query import check_query
from eventpipe.errors import QueryError, TransientError
from eventpipe.locks import FileLocks
from eventpipe.schema.diff import Table, diff
from eventpipe.schema.types import DataType

S, N, T = DataType.STRING, DataType.INT64, DataType.TIMESTAMP
COLUMNS = {"id": S, "n": N, "_timestamp": T}


@pytest.fixture
def dest(snowflake_server: Any, snowflake_schema: str, tmp_path: Path) -> SnowflakeDestination:
    return _opened(snowflake_server, snowflake_schema, tmp_path)


def _opened(server: Any, schema: str, tmp: Path) -> SnowflakeDestination:
    settings = server.settings(schema)
    del settings["type"]
    return SnowflakeDestination("sf", FileLocks(tmp / "locks"), **settings)


def _ensure(dest: SnowflakeDestination, table: Table) -> None:
    dest.patch(diff(dest.describe(table.name), table))


def _rows(dest: SnowflakeDestination, sql: str) -> list[tuple[Any, ...]]:
    return dest.query(sql)[1]


def _file(path: Path, rows: list[dict[str, Any]]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


_CHILD = """
import sys
from pathlib import Path
from eventpipe.destinations.snowflake import SnowflakeDestination
from eventpipe.destinations.base import LoadRequest
from eventpipe.locks import FileLocks
from eventpipe.schema.types import DataType
port, schema, locks, file, step = sys.argv[1:6]
dest = SnowflakeDestination("sf", FileLocks(Path(locks)), account="a", user="loader",
                            password="p", database="EVENTPIPE", schema=schema,
                            host="127.0.0.1", port=int(port), protocol="http")
def killed(*args, **kwargs):
    import os, signal
    os.kill(os.getpid(), signal.SIGKILL)
original = getattr(dest, step)
def then_killed(db, *args):
    original(db, *args)
    killed()  # inside the transaction: the rows in the table, not committed
setattr(dest, step, then_killed)
columns = {"id": DataType.STRING, "n": DataType.INT64, "_timestamp": DataType.TIMESTAMP}
key = ("id",) if step == "_move" else ()
dest.load(LoadRequest("events", "batch-1", (Path(file),), columns, key))
"""


@pytest.mark.parametrize("step", ["_copy", "_move"])  # without a key; with one
def test_a_load_killed_inside_its_transaction_leaves_nothing_and_a_rerun_loads_once(
    dest: SnowflakeDestination,
    snowflake_server: Any,
    snowflake_schema: str,
    tmp_path: Path,
    step: str,
) -> None:
    key = ("id",) if step == "_move" else ()
    _ensure(dest, Table("events", COLUMNS, key))
    rows = [{"id": f"e{i}", "n": i, "_timestamp": datetime(2026, 11, 20, 9)} for i in range(500)]
    batch = _file(tmp_path / "batch.parquet", rows)
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(snowflake_server.port), snowflake_schema,
         str(dest.locks.directory), str(batch), step], capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert child.returncode == -9, child.stderr  # killed after its rows went in, before COMMIT
    assert _rows(dest, "SELECT count(*) FROM events") == [(0,)]
    assert _rows(dest, "SELECT count(*) FROM _eventpipe_loads") == [(0,)]
    result = dest.load(LoadRequest("events", "batch-1", (batch,), COLUMNS, key))
    assert (result.rows, result.already_loaded) == (500, False)
    assert _rows(dest, "SELECT count(*), count(DISTINCT id), sum(n) FROM events") == [
        (500, 500, sum(range(500)))
    ]
    assert dest.tables() == ["_eventpipe_loads", "events"]  # no stage table left


@pytest.mark.parametrize(
    ("sql", "refusal"),
    [
        ("DELETE FROM events", "only reads"),
        ("SELECT 1; DROP TABLE events", "one statement at a time"),
        ("CREATE TABLE x AS SELECT * FROM events", "only reads"),
        ("INSERT INTO events SELECT * FROM events", "only reads"),
        ("SELECT SYSTEM$CANCEL_ALL_QUERIES(1)", "SYSTEM$"),
        ("COPY INTO @stage FROM events", "only reads"),
        ("GRANT ALL ON SCHEMA s TO ROLE r", "only reads"),
    ],
)
def test_query_refuses_what_is_not_a_read_before_sending_it(sql: str, refusal: str) -> None:
    with pytest.raises(QueryError, match=refusal.replace("$", r"\$")):
        check_query(sql)


def test_query_reads_and_says_the_servers_error(dest: SnowflakeDestination) -> None:
    _ensure(dest, Table("events", COLUMNS))
    check_query("WITH x AS (SELECT 1 AS a) SELECT a FROM x")
    assert dest.query("SELECT count(*) AS n FROM events") == (["N"], [(0,)])
    with pytest.raises(QueryError, match=r"(?i)table with name nope does not exist"):
        dest.query("SELECT * FROM nope")


def test_no_server_is_transient_and_says_no_secret(
    dest: SnowflakeDestination, tmp_path: Path
) -> None:
    from tests.process import free_port

    gone = SnowflakeDestination("sf", FileLocks(tmp_path / "l"), account="a", user="loader",
                                password="s3cret", database="EVENTPIPE", host="127.0.0.1",
                                port=free_port(), protocol="http", timeout_seconds=2)  # fmt: skip
    with pytest.raises(TransientError) as down:
        gone.describe("events")
    assert "s3cret" not in str(down.value)


def test_a_staged_file_with_the_runs_row_ids_is_copied_as_it_is(
    dest: SnowflakeDestination, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from eventpipe.destinations.snowflake import destination as module
    from eventpipe.reserved import ROW

    columns = {"id": S, "n": DataType.INT64}
    _ensure(dest, Table("staged", columns))
    file = _file(tmp_path / "part-0.parquet", [{ROW: 5, "n": 1, "id": "a"},
                                               {ROW: 6, "n": 2, "id": "b"}])  # fmt: skip

    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a staged file that fits was converted")

    monkeypatch.setattr(module, "converted_rows", never)
    assert dest.load(LoadRequest("staged", "b1", (file,), columns)).rows == 2
    assert _rows(dest, "SELECT id, n FROM staged ORDER BY id") == [("a", 1), ("b", 2)]


def test_floats_numeric_38_18_cannot_hold_are_left_out_and_the_rest_copied_as_it_is(
    dest: SnowflakeDestination, tmp_path: Path
) -> None:
    from eventpipe.destinations.converted import fits

    columns = {"id": S, "price": DataType.FLOAT64}
    _ensure(dest, Table("prices", columns))
    fine = _file(tmp_path / "fine.parquet", [{"id": "a", "price": 1.5}])
    wild = _file(tmp_path / "wild.parquet", [{"id": "b", "price": 1e25},
                                             {"id": "c", "price": float("nan")},
                                             {"id": "d", "price": -2.25}])  # fmt: skip
    types = {"id": "VARCHAR", "price": "DECIMAL(38,18)"}
    assert fits([fine], types)
    assert not fits([fine, wild], types)
    result = dest.load(LoadRequest("prices", "b1", (fine, wild), columns))
    assert result.rows == 2
    assert [p for p, _ in result.rejected] == [1, 2]
    assert all("column price (DECIMAL(38,18)) cannot take" in why for _, why in result.rejected)
    assert [(i, float(p)) for i, p in _rows(dest, "SELECT id, price FROM prices ORDER BY id")] == [
        ("a", 1.5),
        ("d", -2.25),
    ]
