"""Lookup enrichment, mapping rules and max_columns, from HTTP post to DuckDB rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eventpipe.processing.batch.job import process_once
from tests.e2e.test_batch_pipeline import _post, _query, _seal
from tests.unit.processing.test_lookup import CHROME

LONDON = "81.2.69.160"


def test_browser_events_get_location_and_parsed_user_agent(
    start_collector: Any, spark: Any, geo_database: Path
) -> None:
    c = start_collector(enrichment={"ip_database": str(geo_database)})
    # The collector takes source_ip from the peer (127.0.0.1) for browser events; a trusted
    # proxy's X-Forwarded-For would do too. The server API may send its own source_ip.
    _post(c, [{"event_id": "b", "eventn_ctx": {"user_agent": CHROME}}])
    _post(c, [{"event_id": "s", "source_ip": LONDON, "eventn_ctx": {"user_agent": CHROME}}],
          server=True)  # fmt: skip
    _seal(c)
    process_once(c.config, spark)
    rows = _query(c, "SELECT eventn_ctx_event_id, eventn_ctx_parsed_ua_ua_family, "
                     "eventn_ctx_parsed_ua_os_family FROM events ORDER BY 1")  # fmt: skip
    # Implicit rules apply to browser events only (whose ids live in their key's namespace).
    assert rows == [("js:web:b", "Chrome", "Windows"), ("s", None, None)]


def test_configured_rules_and_the_browser_location(
    start_collector: Any, spark: Any, geo_database: Path
) -> None:
    c = start_collector(
        enrichment={"ip_database": str(geo_database)},
        destinations={"warehouse": {"type": "duckdb", "enrichment": [
            {"name": "ip_lookup", "from": "/properties/client_ip", "to": "/client_geo"},
        ]}},
    )  # fmt: skip
    _post(c, [{"event_id": "s", "properties": {"client_ip": LONDON}}], server=True)
    _post(c, [{"event_id": "t", "properties": {"client_ip": "2001:db8::7"}}], server=True)
    _seal(c)
    process_once(c.config, spark)
    rows = _query(c, "SELECT eventn_ctx_event_id, client_geo_city, client_geo_country, "
                     "client_geo_latitude FROM events ORDER BY 1")  # fmt: skip
    assert rows == [("s", "London", "GB", 51.5142), ("t", "Berlin", "DE", None)]


def test_mapping_rules(start_collector: Any, spark: Any) -> None:
    c = start_collector(destinations={"warehouse": {"type": "duckdb", "mappings": {"fields": [
        {"action": "move", "src": "/properties/plan", "dst": "/plan"},
        {"action": "remove", "src": "/properties/secret"},
        {"action": "cast", "src": "/properties/order_id", "type": "STRING"},
        {"action": "cast", "src": "/properties/amount", "type": "numeric(38,18)"},
        {"action": "constant", "dst": "/source", "value": "web"},
        {"action": "move", "src": "/user", "dst": "/customer"},
    ]}}})  # fmt: skip
    _post(c, [{"event_id": "a", "user": {"id": 7, "name": {"first": "Ada"}},
               "properties": {"plan": "pro", "secret": "pw", "order_id": 42, "amount": 3}}],
          server=True)  # fmt: skip
    _seal(c)
    process_once(c.config, spark)
    types = dict(_query(c, "SELECT column_name, data_type FROM information_schema.columns "
                           "WHERE table_name = 'events'"))  # fmt: skip
    assert "properties_secret" not in types
    assert "properties_plan" not in types
    assert "user_id" not in types
    assert types["properties_order_id"] == "VARCHAR"  # the cast wins over BIGINT
    assert types["properties_amount"] == "DOUBLE"
    rows = _query(c, "SELECT plan, source, properties_order_id, customer_id, "
                     "customer_name_first FROM events")  # fmt: skip
    assert rows == [("pro", "web", "42", 7, "Ada")]


def test_keep_unmapped_false_keeps_only_mapped_fields(start_collector: Any, spark: Any) -> None:
    c = start_collector(destinations={"warehouse": {"type": "duckdb", "mappings": {
        "keep_unmapped": False,
        "fields": [{"action": "move", "src": "/properties/plan", "dst": "plan"},
                   {"action": "cast", "src": "/n", "type": "FLOAT64"}],
    }}})  # fmt: skip
    _post(c, [{"event_id": "a", "n": 1, "other": 1, "properties": {"plan": "pro"}}],
          server=True)  # fmt: skip
    _seal(c)
    process_once(c.config, spark)
    columns = {r[0] for r in _query(c, "SELECT column_name FROM information_schema.columns "
                                       "WHERE table_name = 'events'")}  # fmt: skip
    assert columns == {"plan", "n", "_timestamp"}
    assert _query(c, "SELECT plan, n FROM events") == [("pro", 1.0)]


def test_columns_beyond_max_columns_go_to_unmapped_data(start_collector: Any, spark: Any) -> None:
    c = start_collector(destinations={"warehouse": {"type": "duckdb", "max_columns": 8}})
    # 16 columns: eventpipe's own (_timestamp, api_key, source_ip, src, eventn_ctx_event_id),
    # event_id, a, f00..f09. Room for 7 and _unmapped_data.
    event = {"event_id": "a", **{f"f{i:02d}": i for i in range(10)}, "A": 1, "a": 2}
    _post(c, [event], server=True)
    _seal(c)
    process_once(c.config, spark)
    columns = {r[0] for r in _query(c, "SELECT column_name FROM information_schema.columns "
                                       "WHERE table_name = 'events'")}  # fmt: skip
    assert len(columns) == 8
    assert {"_timestamp", "_unmapped_data", "f00"} <= columns
    [(unmapped,)] = _query(c, "SELECT _unmapped_data FROM events")
    data = json.loads(unmapped)
    assert data["/a"] == 2  # the case-collision loser, kept with the overflow
    # New columns are kept in name order, explicitly typed first: _timestamp, a, api_key,
    # event_id, eventn_ctx_event_id, f00, f01.
    assert {"f00", "f01"} <= columns
    assert "f02" not in columns
    assert {k: v for k, v in data.items() if k.startswith("/f")} == {
        f"/f{i:02d}": i for i in range(2, 10)
    }


def test_an_existing_columns_type_wins_over_a_cast(start_collector: Any, spark: Any) -> None:
    import duckdb

    c = start_collector(destinations={"warehouse": {"type": "duckdb", "mappings": {"fields": [
        {"action": "cast", "src": "/when", "type": "timestamp"},
        {"action": "cast", "src": "/n", "type": "bigint"},
    ]}}})  # fmt: skip
    # Tables made by hand, with other types than the casts say.
    db = duckdb.connect(str(c.layout.warehouse))
    db.execute("CREATE TABLE events (eventn_ctx_event_id VARCHAR, _timestamp VARCHAR, "
               "\"when\" BIGINT, n VARCHAR)")  # fmt: skip
    db.close()
    _post(c, [
        {"event_id": "a", "_timestamp": "2026-11-21T10:00:00Z", "n": "7"},
        {"event_id": "b", "when": "2026-11-21T10:00:00Z"},  # a timestamp is not a number
        {"event_id": "c", "n": "seven"},  # the cast itself fails
    ], server=True)  # fmt: skip
    _seal(c)
    report = process_once(c.config, spark)
    assert report is not None
    assert report.failed == {"warehouse": 2}
    assert _query(c, "SELECT eventn_ctx_event_id, _timestamp, n FROM events") == [
        ("a", "2026-11-21T10:00:00.000000Z", "7")
    ]  # fmt: skip
    errors = {
        e["event"]["event_id"]: e["error"]
        for e in map(json.loads, c.layout.failed_destination("warehouse").read_text().splitlines())
    }
    assert errors["b"] == "column when (INT64) cannot take 2026-11-21 10:00:00"
    assert errors["c"] == "column n (INT64) cannot take seven"
