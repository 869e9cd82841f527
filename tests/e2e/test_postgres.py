"""From an HTTP post to rows in PostgreSQL (a real server, tests/postgres.py), next to DuckDB."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import psycopg

from eventpipe.errors import TransientError
from eventpipe.processing.batch.job import process_once
from tests.e2e.test_batch_pipeline import _post, _query, _seal


def test_one_batch_into_postgres_and_duckdb(
    start_collector: Any, spark: Any, postgres_dsn: str, postgres_schema: str
) -> None:
    c = start_collector(destinations={
        "warehouse": {"type": "duckdb"},
        "pg": {"type": "postgres", "dsn": postgres_dsn, "schema": postgres_schema,
               "table_name_template": "{{ event_type }}", "primary_key": ["user_id"]},
    })  # fmt: skip
    _post(c, [
        {"event_type": "signup", "user": {"id": 1}, "plan": "pro", "price": 9.5,
         "note": "nul \u0000 inside", "_timestamp": "2026-11-21T10:00:00Z"},
        {"event_type": "signup", "user": {"id": 1}, "plan": "team", "price": 20,
         "_timestamp": "2026-11-21T11:00:00Z"},  # newer: wins the upsert
        {"event_type": "signup", "user": {"id": 2}, "plan": "free", "price": 0,
         "_timestamp": "2026-11-21T09:00:00Z"},
    ], server=True)  # fmt: skip
    _seal(c)
    report = process_once(c.config, spark)
    assert report is not None
    assert report.loaded == {("warehouse", "events"): 3, ("pg", "signup"): 2}
    with psycopg.connect(postgres_dsn) as db:
        rows = db.execute(
            f'SELECT user_id, plan, price, note, _timestamp FROM "{postgres_schema}".signup '
            "ORDER BY user_id"
        ).fetchall()
        types = dict(db.execute(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = %s AND table_name = 'signup'", [postgres_schema],
        ).fetchall())  # fmt: skip
        tables = db.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s "
            "ORDER BY 1", [postgres_schema],
        ).fetchall()  # fmt: skip
    assert [(r[0], r[1], r[2]) for r in rows] == [(1, "team", Decimal(20)), (2, "free", 0)]
    assert str(rows[0][4]) == "2026-11-21 11:00:00"
    assert types["user_id"] == "bigint"
    assert types["price"] == "numeric"
    assert types["_timestamp"] == "timestamp without time zone"
    assert tables == [("_eventpipe_loads",), ("signup",)]
    assert _query(c, "SELECT count(*) FROM events") == [(3,)]
    # Reprocessing nothing new changes nothing.
    assert process_once(c.config, spark) is None


def test_nul_in_text_is_stored_as_the_replacement_character(
    start_collector: Any, spark: Any, postgres_dsn: str, postgres_schema: str
) -> None:
    c = start_collector(destinations={"pg": {
        "type": "postgres", "dsn": postgres_dsn, "schema": postgres_schema}})  # fmt: skip
    _post(c, [{"note": "a\u0000b", "event_id": "n"}], server=True)
    _seal(c)
    process_once(c.config, spark)
    with psycopg.connect(postgres_dsn) as db:
        [(note,)] = db.execute(f'SELECT note FROM "{postgres_schema}".events').fetchall()
    assert note == "a\ufffdb"


def test_an_unreachable_server_is_transient_and_the_password_is_not_shown(
    tmp_path: Any,
) -> None:
    import socket

    import pytest

    from eventpipe.destinations.postgres import PostgresDestination

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    dest = PostgresDestination("pg", f"postgresql://u:s3cret@127.0.0.1:{port}/db")
    with pytest.raises(TransientError) as raised:
        dest.describe("events")
    assert f"127.0.0.1:{port}/db" in str(raised.value)
    assert "s3cret" not in str(raised.value)


def test_a_poison_row_goes_to_failed_and_the_rest_loads(
    start_collector: Any, spark: Any, postgres_dsn: str, postgres_schema: str
) -> None:
    import json

    c = start_collector(destinations={"pg": {
        "type": "postgres", "dsn": postgres_dsn, "schema": postgres_schema}})  # fmt: skip
    _post(c, [{"event_id": "ok", "price": 1.5}, {"event_id": "huge", "price": 1e25}],
          server=True)  # fmt: skip
    _seal(c)
    report = process_once(c.config, spark)
    assert report is not None
    assert report.loaded == {("pg", "events"): 1}
    assert report.failed == {"pg": 1}
    [line] = c.layout.failed_destination("pg").read_text().splitlines()
    failed = json.loads(line)
    assert failed["event"]["eventn_ctx"]["event_id"] == "huge"
    assert "numeric field overflow" in failed["error"]
    assert failed["table"] == "events"
    assert failed["api_key"] == "web"


def test_tables_load_in_parallel_and_their_failures_add_up(
    start_collector: Any, spark: Any, postgres_dsn: str, postgres_schema: str
) -> None:
    import json

    c = start_collector(destinations={"pg": {
        "type": "postgres", "dsn": postgres_dsn, "schema": postgres_schema,
        "table_name_template": "{{ kind }}"}})  # fmt: skip
    events = [{"kind": k, "price": 1.5, "event_id": f"{k}{i}"} for k in "abcd" for i in range(3)]
    events += [{"kind": k, "price": 1e25, "event_id": f"{k}-huge"} for k in "bd"]
    _post(c, events, server=True)
    _seal(c)
    report = process_once(c.config, spark)
    assert report is not None
    assert report.loaded == {("pg", k): 3 for k in "abcd"}
    assert report.failed == {"pg": 2}
    lines = [json.loads(x) for x in c.layout.failed_destination("pg").read_text().splitlines()]
    assert sorted(x["event"]["eventn_ctx"]["event_id"] for x in lines) == ["b-huge", "d-huge"]
