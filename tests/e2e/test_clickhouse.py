"""From an HTTP post to rows in ClickHouse (Debian's server, tests/clickhouse.py): a batch
beside DuckDB, a stream, and a day reprocessed."""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import Any

import orjson

from eventpipe.destinations.clickhouse.client import ClickHouseClient
from eventpipe.processing.batch.job import process_once, process_pending
from eventpipe.processing.modes import reprocess as rp
from eventpipe.processing.modes import stream
from tests.conftest import make_config
from tests.e2e.test_batch_pipeline import _post, _query, _seal
from tests.e2e.test_reprocess import MOVE_N, _three_days


def _clickhouse(server: Any, database: str, **settings: Any) -> dict[str, Any]:
    return {"type": "clickhouse", "url": server.url, "database": database,
            "password": server.password, **settings}  # fmt: skip


def _read(server: Any, sql: str) -> list[tuple[Any, ...]]:
    with ClickHouseClient(server.url, password=server.password) as client:
        return client.query(sql)[1]


def test_one_batch_into_clickhouse_and_duckdb_and_a_time_before_1970_fails_alone(
    start_collector: Any, spark: Any, clickhouse_server: Any, clickhouse_database: str
) -> None:
    db = clickhouse_database
    c = start_collector(destinations={
        "warehouse": {"type": "duckdb"},
        "ch": _clickhouse(clickhouse_server, db, table_name_template="{{ event_type }}",
                          primary_key=["user_id"]),
    })  # fmt: skip
    _post(c, [
        {"event_type": "signup", "user": {"id": 1}, "plan": "pro", "price": 9.5,
         "_timestamp": "2026-11-21T10:00:00Z"},
        {"event_type": "signup", "user": {"id": 1}, "plan": "team", "price": 20,
         "_timestamp": "2026-11-21T11:00:00Z"},  # newer: wins
        {"event_type": "signup", "user": {"id": 2}, "plan": "free", "price": 0,
         "_timestamp": "2026-11-21T09:00:00Z"},
        {"event_type": "signup", "user": {"id": 3}, "plan": "old",
         "_timestamp": "1969-07-20T20:17:00Z"},  # before DateTime's 1970
    ], server=True)  # fmt: skip
    _seal(c)
    report = process_once(c.config, spark)
    assert report is not None
    assert report.loaded == {("warehouse", "events"): 4, ("ch", "signup"): 2}
    assert report.failed == {"warehouse": 0, "ch": 1}
    assert _read(clickhouse_server, f"SELECT user_id, plan, price, toString(_timestamp) "
                 f"FROM `{db}`.signup ORDER BY user_id") == [
        (1, "team", 20.0, "2026-11-21 11:00:00"), (2, "free", 0.0, "2026-11-21 09:00:00"),
    ]  # fmt: skip
    types = dict(_read(clickhouse_server, "SELECT name, type FROM system.columns "
                       f"WHERE database = '{db}' AND table = 'signup'"))  # fmt: skip
    assert types["user_id"] == "Int64"  # the key: not Nullable
    assert types["price"] == "Nullable(Float64)"
    assert types["_timestamp"] == "DateTime('UTC')"  # 18.16 has no DateTime64
    [line] = c.layout.failed_destination("ch").read_text().splitlines()
    failed = orjson.loads(line)
    assert failed["event"]["plan"] == "old"
    assert "before 1970" in failed["error"]
    assert _query(c, "SELECT count(*) FROM events") == [(4,)]
    assert process_once(c.config, spark) is None


def test_events_stream_into_clickhouse(
    start_collector: Any, spark: Any, clickhouse_server: Any, clickhouse_database: str
) -> None:
    c = start_collector(destinations={"ch": _clickhouse(
        clickhouse_server, clickhouse_database, mode="stream")})  # fmt: skip
    _post(c, [{"n": 1}, {"n": 2}], server=True)
    stream.run_once(spark, c.config)
    _post(c, [{"n": 3, "color": "red"}], server=True)
    stream.run_once(spark, c.config)
    assert _read(clickhouse_server, f"SELECT n, color FROM `{clickhouse_database}`.events "
                 "ORDER BY n") == [(1, None), (2, None), (3, "red")]  # fmt: skip
    assert not c.layout.sealed_segments()


def test_reprocess_replaces_a_days_rows_in_clickhouse(
    tmp_path: Path, spark: Any, clickhouse_server: Any, clickhouse_database: str
) -> None:
    data = tmp_path / "data"
    _three_days(data)
    ch = _clickhouse(clickhouse_server, clickhouse_database,
                     table_name_template="{{ event_type }}")  # fmt: skip
    process_pending(make_config(data, destinations={"ch": ch}), spark)
    after = make_config(data, destinations={"ch": {**ch, "mappings": MOVE_N}})
    day = date(2026, 11, 20)
    _, results = rp.reprocess(spark, after, "ch", day, day)
    assert results[0].rows == {"page": 2, "click": 2}
    rows = _read(clickhouse_server, "SELECT eventn_ctx_event_id, number, n FROM "
                 f"`{clickhouse_database}`.page ORDER BY eventn_ctx_event_id")  # fmt: skip
    assert rows == [("e1", 1, None), ("e2", 2, None), ("e4", None, 4), ("e6", None, 6),
                    ("e7", None, 7)]  # fmt: skip
    tables = _read(clickhouse_server, "SELECT name FROM system.tables "
                   f"WHERE database = '{clickhouse_database}' ORDER BY name")  # fmt: skip
    assert tables == [("_eventpipe_loads",), ("click",), ("page",)]
    assert rp.reprocess(spark, after, "ch", day, day)[1] == []
