"""The ClickHouse destination against Debian's server (tests/clickhouse.py): what the
conformance suite does not ask of every destination. A load killed at each of its steps
and run again, days replaced by whole months, what the old server's types cannot hold,
and ``eventpipe query`` kept to reading the destination's tables. The loads, days and
changes also on a cluster of two replicas (``cluster:``), read back on both."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eventpipe.destinations.base import DaySwap, LoadRequest
from eventpipe.destinations.clickhouse import ClickHouseDestination
from eventpipe.destinations.clickhouse.client import ClickHouseClient
from eventpipe.destinations.clickhouse.query import check_query
from eventpipe.errors import QueryError, TerminalError
from eventpipe.locks import FileLocks
from eventpipe.schema.dialects import CLICKHOUSE
from eventpipe.schema.diff import Table, diff
from eventpipe.schema.types import DataType
from tests.conftest import CLICKHOUSE_ENGINES

S, N, H, T = DataType.STRING, DataType.INT64, DataType.INT128, DataType.TIMESTAMP
COLUMNS = {"id": S, "n": N, "_timestamp": T}


@pytest.fixture(params=list(CLICKHOUSE_ENGINES))
def server(request: pytest.FixtureRequest) -> Any:
    """Debian's 18.16 server, or today's engine (chDB) behind the HTTP interface."""
    return request.getfixturevalue(CLICKHOUSE_ENGINES[request.param])


@pytest.fixture
def dest(server: Any, clickhouse_database: str, tmp_path: Path) -> ClickHouseDestination:
    return _opened(server, clickhouse_database, tmp_path)


ANYWHERE = [*CLICKHOUSE_ENGINES, "cluster"]


@pytest.fixture(params=ANYWHERE)
def anywhere(request: pytest.FixtureRequest) -> Any:
    """Either engine, or the two replicas of a cluster (Debian's servers)."""
    fixture = CLICKHOUSE_ENGINES.get(request.param, "clickhouse_cluster")
    return request.getfixturevalue(fixture)


def _and_the_cluster(cases: list[str], on_the_cluster: list[str]) -> list[Any]:
    """``cases`` on both engines, those ``on_the_cluster`` on the cluster too (each
    case there takes seconds; these are the ones whose statements differ there)."""
    return [pytest.param(where, case, id=f"{where}-{case}")
            for where in ANYWHERE for case in cases
            if where != "cluster" or case in on_the_cluster]  # fmt: skip


@pytest.fixture
def dest_anywhere(anywhere: Any, clickhouse_database: str, tmp_path: Path) -> Any:
    """A destination on ``anywhere``; on the cluster, every table it made is checked
    afterwards to hold the same rows on the other replica."""
    dest = _opened(anywhere, clickhouse_database, tmp_path)
    yield dest
    if anywhere.cluster:
        _same_on_both_replicas(anywhere, dest)


def _opened(server: Any, database: str, tmp: Path, **settings: Any) -> ClickHouseDestination:
    settings = {"user": server.user, "cluster": server.cluster, **settings}
    return ClickHouseDestination("ch", server.url, FileLocks(tmp / "locks"), database=database,
                                 password=server.password, **settings)  # fmt: skip


def _same_on_both_replicas(cluster: Any, dest: ClickHouseDestination) -> None:
    """Each of ``dest``'s tables replicated, with the same rows on the second replica as
    on the first; no stage or rebuild table left on either."""
    replicas = [ClickHouseClient(r.url, user=cluster.user, password=cluster.password)
                for r in cluster.replicas]  # fmt: skip
    tables = dest.tables()
    for table in tables:
        replicas[1].execute(f"SYSTEM SYNC REPLICA {CLICKHOUSE.name_of(table, dest.database)}")
    for table in tables:
        sql = f"SELECT * FROM {CLICKHOUSE.name_of(table, dest.database)}"
        first, second = (sorted(map(repr, r.query(sql)[1])) for r in replicas)
        assert first == second, table
    for replica in replicas:
        _, made = replica.query(f"SELECT name, engine FROM system.tables "
                                f"WHERE database = '{dest.database}'")  # fmt: skip
        assert all(engine.startswith("Replicated") for _, engine in made), made
        assert {name for name, _ in made} == set(tables)
        replica.close()


def _ensure(dest: ClickHouseDestination, table: Table) -> None:
    dest.patch(diff(dest.describe(table.name), table))


def _rows(dest: ClickHouseDestination, sql: str) -> list[tuple[Any, ...]]:
    return dest.query(sql)[1]


def _events(path: Path, rows: int, months: int = 1) -> Path:
    """``rows`` events spread over ``months`` months (a partition each)."""
    times = [datetime(2026, 11 - i % months, 20, 12, 0, i % 60) for i in range(rows)]
    pq.write_table(pa.table({"id": [f"e{i}" for i in range(rows)], "n": list(range(rows)),
                             "_timestamp": times}), path)  # fmt: skip
    return path


_CHILD = """
import json, sys, time
from pathlib import Path
from eventpipe.destinations.clickhouse import client, ClickHouseDestination
from eventpipe.destinations.base import LoadRequest
from eventpipe.locks import FileLocks
from eventpipe.schema.types import DataType
url, user, password, cluster, database, locks, file, step = sys.argv[1:9]
original = client.ClickHouseClient.execute
seen = []
def execute(self, sql, **kwargs):
    if step in sql and (step != "ATTACH PARTITION" or seen):
        print("killed at " + step, flush=True)
        time.sleep(60)
    if step in sql:
        seen.append(sql)
    return original(self, sql, **kwargs)
client.ClickHouseClient.execute = execute
dest = ClickHouseDestination("ch", url, FileLocks(Path(locks)), database=database,
                             user=user, password=password, cluster=cluster or None)
columns = {"id": DataType.STRING, "n": DataType.INT64, "_timestamp": DataType.TIMESTAMP}
dest.load(LoadRequest("events", "batch-1", (Path(file),), columns))
"""

STEPS = {
    "staged": "'attaching'",  # the stage filled, nothing recorded
    "one month attached": "ATTACH PARTITION",  # the first month in, the second not
    "attached": "'done'",  # every month in, not recorded done
}


@pytest.mark.parametrize(
    ("anywhere", "step"), _and_the_cluster(list(STEPS), ["one month attached"]),
    indirect=["anywhere"],
)  # fmt: skip
def test_a_load_killed_at_each_step_then_run_again_equals_a_clean_load(
    dest_anywhere: ClickHouseDestination, anywhere: Any, tmp_path: Path, step: str
) -> None:
    dest, server = dest_anywhere, anywhere
    _ensure(dest, Table("events", COLUMNS))
    rows = 20_000
    big = _events(tmp_path / "big.parquet", rows, months=2)
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, server.url, server.user, server.password,
         server.cluster or "", dest.database, str(dest.locks.directory), str(big), STEPS[step]],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stdout is not None
    assert child.stdout.readline().strip() == f"killed at {STEPS[step]}"
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    child.stdout.close()
    [(visible,)] = _rows(dest, "SELECT count() FROM events")
    assert visible == {"staged": 0, "one month attached": rows // 2, "attached": rows}[step]
    result = dest.load(LoadRequest("events", "batch-1", (big,), COLUMNS))
    assert (result.rows, result.already_loaded) == (rows, False)
    assert _rows(dest, "SELECT count(), uniqExact(id), sum(n) FROM events") == [
        (rows, rows, rows * (rows - 1) // 2)
    ]
    assert dest.load(LoadRequest("events", "batch-1", (big,), COLUMNS)).already_loaded
    assert [t for t in dest.tables() if t != "_eventpipe_loads"] == ["events"]  # no stage left


def test_days_are_replaced_by_their_months_and_a_rerun_changes_nothing(
    dest_anywhere: ClickHouseDestination, tmp_path: Path
) -> None:
    dest = dest_anywhere
    _ensure(dest, Table("events", COLUMNS))
    old = [{"id": f"{day}-{i}", "n": 1, "_timestamp": datetime(2026, 11, day, 9)}
           for day in (19, 20, 21) for i in range(3)]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(old), tmp_path / "old.parquet")
    dest.load(LoadRequest("events", "b1", (tmp_path / "old.parquet",), COLUMNS))
    shadow = "_eventpipe_rp_x_events"
    _ensure(dest, Table(shadow, COLUMNS))
    rebuilt = [{"id": f"20-new-{i}", "n": 2, "_timestamp": datetime(2026, 11, 20, 10)}
               for i in range(5)]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rebuilt), tmp_path / "new.parquet")
    dest.load(LoadRequest(shadow, "rp", (tmp_path / "new.parquet",), COLUMNS))
    swap = DaySwap("swap-1", ("2026-11-20",), ("events",), {"events": shadow})
    assert dest.replace_days(swap) == {"events": 5}
    expected = [(19, 1, 3), (20, 2, 5), (21, 1, 3)]
    sql = "SELECT toDayOfMonth(_timestamp) d, max(n), count() FROM events GROUP BY d ORDER BY d"
    assert _rows(dest, sql) == expected
    assert dest.replace_days(swap) == {"events": 5}  # recorded: done once
    assert _rows(dest, sql) == expected
    assert shadow not in dest.tables()


def test_on_a_cluster_keyed_loads_and_new_columns_reach_the_other_replica(
    clickhouse_cluster: Any, clickhouse_database: str, tmp_path: Path
) -> None:
    """The table's name holds what a replica path must not take as it is: a ``/`` (a
    node of its own), a macro (``{replica}``: each replica a path of its own) and a
    quote."""
    dest = _opened(clickhouse_cluster, clickhouse_database, tmp_path)
    table = "users/{replica}'s"
    columns = {"id": S, "n": N, "_timestamp": T}
    batches = [
        [{"id": "u1", "n": 1, "_timestamp": datetime(2026, 10, 1)},
         {"id": "u2", "n": 2, "_timestamp": datetime(2026, 10, 1)}],
        [{"id": "u1", "n": 9, "_timestamp": datetime(2026, 11, 2)}],  # a month later
        [{"id": "u2", "n": 5, "plan": "pro", "_timestamp": datetime(2026, 11, 3)}],
    ]  # fmt: skip
    for number, rows in enumerate(batches):
        if number == 2:
            columns = {**columns, "plan": S}
        _ensure(dest, Table(table, columns, ("id",)))
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / f"{number}.parquet")
        request = LoadRequest(table, f"b{number}", (tmp_path / f"{number}.parquet",),
                              columns, primary_key=("id",))  # fmt: skip
        assert dest.load(request).rows == len(rows)
    second = clickhouse_cluster.replicas[1]
    name = CLICKHOUSE.name_of(table, clickhouse_database)
    with ClickHouseClient(second.url, user=clickhouse_cluster.user,
                          password=clickhouse_cluster.password) as other:  # fmt: skip
        other.execute(f"SYSTEM SYNC REPLICA {name}")
        _, rows = other.query(f"SELECT id, n, plan FROM {name} ORDER BY id")
        _, [(engine, made)] = other.query(
            "SELECT engine, create_table_query FROM system.tables WHERE database = "
            f"'{clickhouse_database}' AND name = {CLICKHOUSE.literal(table)}"
        )
    assert rows == [("u1", 9, None), ("u2", 5, "pro")]  # merged after each load, everywhere
    assert engine == "ReplicatedReplacingMergeTree"
    assert f"/{clickhouse_database}/users%2F%7Breplica%7D%27s'" in made
    _same_on_both_replicas(clickhouse_cluster, dest)


@pytest.mark.parametrize(("cluster", "refusal"), [
    ("nope", "cluster 'nope' is not in the server's remote_servers (it has: events, two_shards)"),
    ("two_shards", "cluster 'two_shards' has 2 shards: eventpipe loads a cluster of one shard"),
])  # fmt: skip
def test_a_cluster_the_server_lacks_or_of_several_shards_is_refused_before_any_table(
    clickhouse_cluster: Any,
    clickhouse_database: str,
    tmp_path: Path,
    cluster: str,
    refusal: str,
) -> None:
    from eventpipe.errors import ConfigError

    dest = _opened(clickhouse_cluster, clickhouse_database, tmp_path, cluster=cluster)
    with pytest.raises(ConfigError) as refused:
        _ensure(dest, Table("events", COLUMNS))
    assert str(refused.value).startswith(refusal)
    assert _opened(clickhouse_cluster, "default", tmp_path).describe("events") is None


def test_values_the_old_servers_types_cannot_hold_are_left_out_with_the_reason(
    clickhouse_server: Any, clickhouse_database: str, tmp_path: Path
) -> None:
    """Debian's 18.16 has no DateTime64: times keep whole seconds, from 1970 to 2106."""
    dest = _opened(clickhouse_server, clickhouse_database, tmp_path)
    assert not dest.features.datetime64
    _ensure(dest, Table("events", {"id": S, "big": H, "_timestamp": T}))
    rows = [
        {"id": "ok", "big": Decimal(2**64), "_timestamp": datetime(2026, 11, 20, 9, 0, 1, 500)},
        {"id": "early", "big": None, "_timestamp": datetime(1969, 12, 31, 23)},
        {"id": "late", "big": None, "_timestamp": datetime(2107, 1, 1)},
        {"id": "no time", "big": None, "_timestamp": None},  # the sorting key takes no null
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "a.parquet")
    result = dest.load(LoadRequest("events", "b1", (tmp_path / "a.parquet",),
                                   {"id": S, "big": H, "_timestamp": T}))  # fmt: skip
    assert result.rows == 1
    assert [p for p, _ in result.rejected] == [1, 2, 3]
    assert "before 1970 or after 2106" in result.rejected[0][1]
    assert "null" in result.rejected[2][1]
    assert all("_timestamp" in why for _, why in result.rejected)
    assert _rows(dest, "SELECT id, big, toString(_timestamp) FROM events") == [
        ("ok", Decimal(2**64), "2026-11-20 09:00:01")
    ]


def test_todays_servers_keep_microseconds_and_times_before_1970(
    chdb_server: Any, clickhouse_database: str, tmp_path: Path
) -> None:
    dest = _opened(chdb_server, clickhouse_database, tmp_path)
    assert dest.features.datetime64
    columns = {"id": S, "big": H, "_timestamp": T}
    _ensure(dest, Table("events", columns))
    rows = [
        {"id": "ok", "big": Decimal(2**64), "_timestamp": datetime(2026, 11, 20, 9, 0, 1, 500)},
        {"id": "early", "big": None, "_timestamp": datetime(1969, 7, 20, 20, 17)},
        {"id": "late", "big": None, "_timestamp": datetime(2107, 1, 1)},
        {"id": "no time", "big": None, "_timestamp": None},  # the sorting key takes no null
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "a.parquet")
    result = dest.load(LoadRequest("events", "b1", (tmp_path / "a.parquet",), columns))
    assert result.rows == 3
    assert [p for p, _ in result.rejected] == [3]
    assert _rows(dest, "SELECT id, big, toString(_timestamp), toTypeName(_timestamp) "
                 "FROM events ORDER BY _timestamp") == [
        ("early", None, "1969-07-20 20:17:00.000000", "DateTime64(6, 'UTC')"),
        ("ok", Decimal(2**64), "2026-11-20 09:00:01.000500", "DateTime64(6, 'UTC')"),
        ("late", None, "2107-01-01 00:00:00.000000", "DateTime64(6, 'UTC')"),
    ]  # fmt: skip


def test_a_key_cannot_be_added_to_a_table_made_without_one(dest: ClickHouseDestination) -> None:
    _ensure(dest, Table("users", {"id": S, "_timestamp": T}))
    with pytest.raises(TerminalError, match="fixes a table's key when the table is made"):
        _ensure(dest, Table("users", {"id": S, "_timestamp": T}, primary_key=("id",)))


def test_query_reads_as_the_read_only_user_and_cannot_write(
    server: Any, clickhouse_database: str, tmp_path: Path
) -> None:
    dest = _opened(server, clickhouse_database, tmp_path, query_user="reader",
                   query_password=server.password)  # fmt: skip
    _ensure(dest, Table("events", COLUMNS))
    assert dest.query("SELECT count() FROM events") == (["count()"], [(0,)])
    with pytest.raises(QueryError, match="Code: 164"):  # READONLY
        dest.query("INSERT INTO events (id) VALUES ('x')")
    same_user = _opened(server, clickhouse_database, tmp_path)
    with pytest.raises(QueryError, match="Code: 164"):  # readonly=1 for the loading user
        same_user.query("DROP TABLE events")
    with pytest.raises(QueryError, match="Code: 164"):  # nor can it lift readonly
        same_user.query("SELECT 1 SETTINGS readonly = 0")


@pytest.mark.parametrize(
    ("sql", "refused"),
    [
        ("SELECT * FROM url('http://169.254.169.254/latest/meta-data', CSV, 'a String')", "url"),
        ("SELECT * FROM file('/etc/passwd', TSV, 'line String')", "file"),
        ("SELECT * FROM remote('other:9000', system.one)", "remote"),
        ("SELECT 1 WHERE 1 IN (SELECT * FROM\n  mysql('h', 'd', 't', 'u', 'p'))", "mysql"),
        ("SELECT query FROM system.processes", "system.processes"),
        ("SELECT query FROM system . query_log", "system.query_log"),
    ],
)
def test_query_refuses_what_reaches_past_the_destinations_tables(sql: str, refused: str) -> None:
    with pytest.raises(QueryError, match=refused):
        check_query(sql)


def test_query_reads_text_that_only_names_a_table_function() -> None:
    check_query("SELECT 'file(x)' AS s, url_path FROM events -- remote(")


def test_column_names_clickhouse_reads_differently_land_where_they_say(
    dest: ClickHouseDestination, tmp_path: Path
) -> None:
    """Backquoted identifiers take backslash escapes in ClickHouse: a backslash, a
    backtick or a newline in a name is escaped, not doubled."""
    names = ["select", "new col", "a`b", "ü", "a\\b", "x'y", "a.b", 'a"b', "a\nb", "`", "\\"]
    columns = dict.fromkeys(names, S)
    _ensure(dest, Table("events", columns))
    described = dest.describe("events")
    assert described is not None
    assert described.columns == columns
    pq.write_table(pa.table({n: [f"v{i}"] for i, n in enumerate(names)}), tmp_path / "a.parquet")
    assert dest.load(LoadRequest("events", "b1", (tmp_path / "a.parquet",), columns)).rows == 1
    found, [row] = dest.query("SELECT * FROM events")
    assert dict(zip(found, row, strict=True)) == {
        **{n: f"v{i}" for i, n in enumerate(names)},
        "_eventpipe_load": "b1",
    }


def test_a_mappings_clickhouse_type_is_the_columns_and_its_rows_load(
    server: Any, clickhouse_database: str, tmp_path: Path
) -> None:
    """Seed 1's own example, ``type: Lowcardinality(String)``, as it spells it; on 18.16
    LowCardinality is experimental (a setting of the DDL, and rows through plain types)."""
    from eventpipe.config import MappingConfig
    from eventpipe.destinations.clickhouse.types import mapped_types

    mapping = MappingConfig.model_validate({"fields": [
        {"action": "cast", "src": "/plan", "type": "Lowcardinality(String)"},
        {"action": "move", "src": "/user/id", "dst": "/user_id", "type": "UInt32"},
    ]})  # fmt: skip
    assert mapped_types(mapping) == {"plan": "LowCardinality(String)", "user_id": "UInt32"}
    dest = _opened(server, clickhouse_database, tmp_path, column_types=mapped_types(mapping))
    columns = {"plan": S, "user_id": N, "_timestamp": T}
    _ensure(dest, Table("events", columns))
    _ensure(dest, Table("events", {**columns, "late": S}))  # added beside them: plain
    where = f"database = '{clickhouse_database}' AND table = 'events'"
    types = dict(_rows(dest, f"SELECT name, type FROM system.columns WHERE {where}"))
    assert types["plan"] == "LowCardinality(Nullable(String))"
    assert types["user_id"] == "Nullable(UInt32)"
    assert types["late"] == "Nullable(String)"
    assert dest.describe("events") == Table("events", {**columns, "late": S})
    rows = [{"plan": p, "user_id": i, "_timestamp": datetime(2026, 11, 20)}
            for i, p in enumerate(["pro", None, "pro", "free"])]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "a.parquet")
    assert dest.load(LoadRequest("events", "b1", (tmp_path / "a.parquet",), columns)).rows == 4
    assert _rows(dest, "SELECT plan, user_id FROM events ORDER BY user_id") == [
        ("pro", 0), (None, 1), ("pro", 2), ("free", 3)
    ]  # fmt: skip
    assert [t for t in dest.tables() if t != "_eventpipe_loads"] == ["events"]


def test_a_keys_newest_row_wins_across_months_and_its_days_are_replaced(
    dest: ClickHouseDestination, tmp_path: Path
) -> None:
    """ClickHouse replaces rows within a partition only: a keyed table has none, so a
    key updated a month later keeps one row; its days are replaced table-wide."""
    columns = {"id": S, "name": S, "_timestamp": T}
    _ensure(dest, Table("users", columns, primary_key=("id",)))
    october, november = datetime(2026, 10, 20), datetime(2026, 11, 20)
    batches = [[{"id": "u1", "name": "october", "_timestamp": october},
                {"id": "u2", "name": "kept", "_timestamp": october}],
               [{"id": "u1", "name": "november", "_timestamp": november}]]  # fmt: skip
    for i, rows in enumerate(batches):
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / f"{i}.parquet")
        dest.load(LoadRequest("users", f"b{i}", (tmp_path / f"{i}.parquet",), columns, ("id",)))
    assert _rows(dest, "SELECT id, name FROM users ORDER BY id") == [
        ("u1", "november"), ("u2", "kept")
    ]  # fmt: skip
    shadow = "_eventpipe_rp_y_users"
    _ensure(dest, Table(shadow, columns, primary_key=("id",)))
    rebuilt = [{"id": "u1", "name": "rebuilt", "_timestamp": datetime(2026, 11, 20, 1)}]
    pq.write_table(pa.Table.from_pylist(rebuilt), tmp_path / "r.parquet")
    dest.load(LoadRequest(shadow, "rp", (tmp_path / "r.parquet",), columns, ("id",)))
    swap = DaySwap("swap-1", ("2026-11-20",), ("users",), {"users": shadow}, ("id",))
    assert dest.replace_days(swap) == {"users": 1}
    assert _rows(dest, "SELECT id, name FROM users ORDER BY id") == [
        ("u1", "rebuilt"), ("u2", "kept")
    ]  # fmt: skip


CHANGE_COLUMNS = {"_op": S, "_key": S, "_old_key": S, "_lsn": N, "_seq": N, "v": S}
CHANGES = {  # the table's changes before, the batch, the table after (tests/unit's cases)
    "last change decides": (
        [("read", "[1]", None, 9, 1, "a"), ("read", "[2]", None, 9, 2, "b")],
        [("update", "[1]", None, 30, 1, "a3"), ("update", "[1]", None, 20, 1, "a2"),
         ("delete", "[2]", None, 25, 1, None), ("insert", "[3]", None, 26, 1, "c"),
         ("insert", "[3]", None, 26, 1, "c")],
        [("[1]", "a3"), ("[3]", "c")],
    ),
    "moved key": (
        [("read", "[1]", None, 9, 1, "a")],
        [("update", "[10]", "[1]", 20, 1, "moved"), ("insert", "[1]", None, 21, 1, "new one"),
         ("update", "[11]", "[10]", 22, 1, "moved again")],
        [("[11]", "moved again"), ("[1]", "new one")],
    ),
    "truncate": (
        [("read", "[1]", None, 9, 1, "a"), (None, None, None, None, None, "an event")],
        [("insert", "[2]", None, 10, 1, "gone"), ("truncate", None, None, 11, 1, None),
         ("insert", "[3]", None, 11, 2, "after"),
         ("insert", "[4]", None, 9, 5, "older than the truncate"),
         (None, None, None, 12, 1, "a row without a key")],
        [(None, "a row without a key"), ("[3]", "after")],
    ),
    "nothing left": (  # today's servers refuse to replace a partition with no rows
        [("read", "[1]", None, 9, 1, "a")],
        [("delete", "[1]", None, 20, 1, None)],
        [],
    ),
}  # fmt: skip


@pytest.mark.parametrize(
    ("anywhere", "case"), _and_the_cluster(list(CHANGES), ["last change decides", "nothing left"]),
    indirect=["anywhere"],
)  # fmt: skip
def test_a_sources_changes_are_applied_by_key_and_a_crash_before_the_record_changes_nothing(
    dest_anywhere: ClickHouseDestination,
    tmp_path: Path,
    case: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dest = dest_anywhere
    before, batch, after = CHANGES[case]
    _ensure(dest, Table("t", CHANGE_COLUMNS))
    names = list(CHANGE_COLUMNS)
    original = ClickHouseDestination._write_record

    def no_done(self: Any, ch: Any, batch_id: str, table: str, state: str, *args: Any) -> None:
        if state == "done":
            raise OSError("killed before the record")
        original(self, ch, batch_id, table, state, *args)

    for i, rows in enumerate((before, batch)):
        path = tmp_path / f"{i}.parquet"
        pq.write_table(pa.Table.from_pylist([dict(zip(names, r, strict=True)) for r in rows],
                                            schema=_change_schema()), path)  # fmt: skip
        request = LoadRequest("t", f"b{i}", (path,), CHANGE_COLUMNS, apply_changes=True)
        if i == 1:  # the first attempt dies after its swap, before its record
            monkeypatch.setattr(ClickHouseDestination, "_write_record", no_done)
            with pytest.raises(OSError, match="killed"):
                dest.load(request)
            monkeypatch.setattr(ClickHouseDestination, "_write_record", original)
        assert dest.load(request).rows == len(rows)
    found = _rows(dest, "SELECT _key, v FROM t ORDER BY _key NULLS FIRST, v")
    assert found == after
    assert [t for t in dest.tables() if t != "_eventpipe_loads"] == ["t"]


def _change_schema() -> pa.Schema:
    return pa.schema([("_op", pa.string()), ("_key", pa.string()), ("_old_key", pa.string()),
                      ("_lsn", pa.int64()), ("_seq", pa.int64()), ("v", pa.string())])  # fmt: skip


def test_no_server_is_transient_and_a_wrong_password_stops_without_showing_it(
    server: Any, clickhouse_database: str, tmp_path: Path
) -> None:
    from eventpipe.errors import ConfigError, TransientError
    from tests.process import free_port

    gone = ClickHouseDestination("ch", f"http://127.0.0.1:{free_port()}",
                                 FileLocks(tmp_path / "locks"), password="s3cret")  # fmt: skip
    with pytest.raises(TransientError) as down:
        gone.describe("events")
    assert "s3cret" not in str(down.value)
    wrong = ClickHouseDestination("ch", server.url, FileLocks(tmp_path / "locks"),
                                  database=clickhouse_database, password="s3cret")  # fmt: skip
    with pytest.raises(ConfigError, match="refused user 'default'") as refused:
        wrong.patch(diff(None, Table("events", COLUMNS)))
    assert "s3cret" not in str(refused.value)
    assert "s3cret" not in repr(wrong)


def test_a_query_before_the_first_load_says_nothing_was_loaded(server: Any, tmp_path: Path) -> None:
    fresh = _opened(server, "never_loaded", tmp_path)
    with pytest.raises(QueryError, match="database never_loaded does not exist yet"):
        fresh.query("SELECT count() FROM events")
