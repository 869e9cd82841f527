"""Values that must arrive as they were sent: arrays of mixed values, large integers."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import orjson

from eventpipe.processing.batch.job import process_once
from tests.e2e.test_batch_pipeline import _post, _query, _seal


def test_arrays_are_stored_as_the_json_they_were_sent_as(start_collector: Any, spark: Any) -> None:
    c = start_collector(destinations={"warehouse": {"type": "duckdb"}})
    _post(c, [
        {"arr": [[1, [2]], {"a": None}], "mixed": [1, "a", True, 2.5], "n": {"x": [1, 2.5]},
         "objects": [{"a": None}, {"b": 1}], "event_id": "a", "count": 1},
        {"arr": [], "mixed": ["x"], "event_id": "b", "count": 2},
    ], server=True)  # fmt: skip
    _seal(c)
    report = process_once(c.config, spark)
    assert report is not None
    assert report.loaded == {("warehouse", "events"): 2}
    rows = _query(c, "SELECT eventn_ctx_event_id, arr, mixed, n_x, objects FROM events ORDER BY 1")
    assert rows == [
        ("a", '[[1,[2]],{"a":null}]', '[1,"a",true,2.5]', "[1,2.5]", '[{"a":null},{"b":1}]'),
        ("b", "[]", '["x"]', None, None),
    ]
    # An event that fails keeps its arrays as arrays in failed/ (a replay sends the same).
    _post(c, [{"arr": [1, "a", [None]], "n": {"x": [{"y": 1}]}, "count": "many"}], server=True)
    _seal(c)
    report = process_once(c.config, spark)
    assert report is not None
    assert report.failed == {"warehouse": 1}
    [line] = c.layout.failed_destination("warehouse").read_bytes().splitlines()
    event = orjson.loads(line)["event"]
    assert event["arr"] == [1, "a", [None]]
    assert event["n"] == {"x": [{"y": 1}]}


def _post_raw(c: Any, body: bytes) -> Any:
    """``body`` as it is (integers no JSON library here writes) to the server endpoint."""
    import httpx

    from tests.conftest import WEB_SERVER

    return httpx.post(c.url + "/api/v1/s2s/event", content=body,
                      headers={"X-Auth-Token": WEB_SERVER})  # fmt: skip


def test_integers_beyond_int64_keep_every_digit(
    start_collector: Any, spark: Any, postgres_dsn: str, postgres_schema: str
) -> None:
    import psycopg

    c = start_collector(destinations={
        "warehouse": {"type": "duckdb", "table_name_template": "{{ kind }}"},
        "pg": {"type": "postgres", "dsn": postgres_dsn, "schema": postgres_schema,
               "table_name_template": "{{ kind }}"},
    })  # fmt: skip
    body = (
        b'[{"kind": "big", "n": 18446744073709551617, "m": -99999999999999999999999999999999999999,'
        b' "small": 5, "event_id": "a"},'
        b' {"kind": "big", "n": 1, "event_id": "b"},'
        b' {"kind": "big", "n": 1234567890123456789012345678901234567890, "event_id": "c"}]'
    )
    # A BIGINT column first (a batch types a field once for all its tables).
    _post(c, [{"kind": "ints", "n": 7, "event_id": "d"}], server=True)
    _seal(c)
    assert process_once(c.config, spark) is not None
    response = _post_raw(c, body)
    # 39 digits: no destination stores it exactly, so the item is refused, alone.
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["accepted"] == 2
    [rejected] = answer["rejected"]
    assert rejected["index"] == 2
    assert "more than 38 digits" in rejected["error"]
    [line] = next(c.layout.failed.glob("failed.tok=*.log")).read_bytes().splitlines()
    assert orjson.loads(line)["event"]["n"] == "1234567890123456789012345678901234567890"
    _seal(c)
    report = process_once(c.config, spark)
    assert report is not None
    # INT128: DECIMAL(38,0) in DuckDB, NUMERIC(38,0) in PostgreSQL, every digit kept; an
    # INT64 value in the same column (event b) makes it INT128 too.
    expected = [("a", Decimal("18446744073709551617"), Decimal("-" + "9" * 38)),
                ("b", Decimal(1), None)]  # fmt: skip
    assert _query(c, "SELECT eventn_ctx_event_id, n, m FROM big ORDER BY 1") == expected
    assert _query(c, "SELECT column_name, data_type FROM information_schema.columns "
                     "WHERE table_name = 'big' AND column_name IN ('n', 'm') ORDER BY 1") == [
        ("m", "DECIMAL(38,0)"), ("n", "DECIMAL(38,0)")]  # fmt: skip
    with psycopg.connect(postgres_dsn) as db:
        rows = db.execute(
            f'SELECT eventn_ctx_event_id, n, m FROM "{postgres_schema}".big ORDER BY 1'
        ).fetchall()
        pg_types = db.execute(
            "SELECT column_name, data_type, numeric_precision, numeric_scale "
            "FROM information_schema.columns WHERE table_schema = %s AND table_name = 'big' "
            "AND column_name IN ('n', 'm') ORDER BY 1", [postgres_schema]
        ).fetchall()  # fmt: skip
    assert rows == expected
    assert pg_types == [("m", "numeric", 38, 0), ("n", "numeric", 38, 0)]
    # A text column takes the digits; the next batch sees the NUMERIC column as INT128.
    body = (b'[{"kind": "big", "n": 5, "text": "x", "event_id": "g"},'
            b' {"kind": "big", "n": 99999999999999999999999999999999999999, "event_id": "h"},'
            b' {"kind": "words", "text": 18446744073709551618, "event_id": "i"}]')  # fmt: skip
    _post(c, [{"kind": "words", "text": "hello", "event_id": "w"}], server=True)
    _seal(c)
    assert process_once(c.config, spark) is not None
    response = _post_raw(c, body)
    assert response.json() == {"status": "ok", "accepted": 3}
    _seal(c)
    report = process_once(c.config, spark)
    assert report is not None
    assert report.failed == {"warehouse": 0, "pg": 0}
    assert _query(c, "SELECT n FROM big WHERE eventn_ctx_event_id IN ('g', 'h') ORDER BY 1") == [
        (Decimal(5),), (Decimal(10**38 - 1),)]  # fmt: skip
    assert _query(c, "SELECT text FROM words ORDER BY 1") == [("18446744073709551618",),
                                                           ("hello",)]  # fmt: skip
    # Into a BIGINT column that exists: loaded where exact, else failed/ naming it.
    body = (b'[{"kind": "ints", "n": 18446744073709551617, "event_id": "e"},'
            b' {"kind": "ints", "n": 9223372036854775807, "event_id": "f"}]')  # fmt: skip
    response = _post_raw(c, body)
    assert response.json() == {"status": "ok", "accepted": 2}
    _seal(c)
    report = process_once(c.config, spark)
    assert report is not None
    assert report.failed == {"warehouse": 1, "pg": 1}
    assert _query(c, "SELECT n FROM ints ORDER BY 1") == [(7,), (9223372036854775807,)]
    [line] = c.layout.failed_destination("warehouse").read_bytes().splitlines()
    record = orjson.loads(line)
    assert "column n (INT64) cannot take 18446744073709551617" in record["error"]
    assert b'"n":18446744073709551617' in line  # the event as sent: a replay loads the same


def test_values_a_column_cannot_hold_exactly_are_refused_never_changed(
    start_collector: Any, spark: Any, postgres_dsn: str, postgres_schema: str
) -> None:
    """Underflow to zero, overflow to infinity, times no client reads back: each event
    goes to failed/ with the reason (or is refused at the collector), never stored
    changed; the clean events beside them load."""
    c = start_collector(destinations={
        "warehouse": {"type": "duckdb", "table_name_template": "{{ kind }}"},
        "pg": {"type": "postgres", "dsn": postgres_dsn, "schema": postgres_schema,
               "table_name_template": "{{ kind }}"},
    })  # fmt: skip
    # Typed columns first: FLOAT64 (numeric(38,18) in PostgreSQL) and TIMESTAMP.
    _post(c, [{"kind": "v", "x": 1.5, "at": "2026-01-01T00:00:00Z", "event_id": "typed"}],
          server=True)  # fmt: skip
    _seal(c)
    assert process_once(c.config, spark) is not None
    # orjson reads 1e-400 as 0.0 without a word: the collector refuses the item instead.
    refused = _post_raw(c, b'[{"kind": "v", "x": 1e-400, "event_id": "under"}, {"kind": "v"}]')
    assert refused.json()["rejected"][0]["error"].startswith("holds a number too small")
    _post(c, [
        {"kind": "v", "x": 1.5e-19, "event_id": "tiny"},  # PostgreSQL's numeric(38,18): 0
        {"kind": "v", "x": 5e-324, "event_id": "denormal"},
        {"kind": "v", "x": "1e400", "event_id": "huge-text"},  # DOUBLE: inf
        {"kind": "v", "x": "Infinity", "event_id": "inf-text"},
        {"kind": "v", "at": "10000-01-01T00:00:00Z", "event_id": "far"},
        {"kind": "v", "_timestamp": "10000-01-01T00:00:00Z", "event_id": "far-ts"},
        {"kind": "v", "x": 0.001, "at": "2999-12-31T23:59:59Z", "event_id": "clean"},
    ], server=True)  # fmt: skip
    _seal(c)
    report = process_once(c.config, spark)
    assert report is not None
    duck = {r[0]: r[1:] for r in _query(c, "SELECT eventn_ctx_event_id, x FROM v")}
    assert duck["clean"] == (0.001,)
    assert duck["tiny"] == (1.5e-19,)  # DuckDB's DOUBLE holds it
    assert duck["denormal"] == (5e-324,)
    assert {"huge-text", "inf-text", "far", "far-ts"}.isdisjoint(duck)
    import psycopg

    with psycopg.connect(postgres_dsn) as db:
        rows = db.execute(
            f'SELECT eventn_ctx_event_id, x, at, "_timestamp" FROM "{postgres_schema}".v'
        )
        pg = {r[0]: r[1:] for r in rows.fetchall()}  # every timestamp reads back in Python
    assert "clean" in pg
    assert {"tiny", "denormal", "huge-text", "inf-text", "far", "far-ts"}.isdisjoint(pg)
    failed = {
        orjson.loads(line)["event"]["eventn_ctx"]["event_id"]: orjson.loads(line)["error"]
        for dest in ("warehouse", "pg")
        for line in c.layout.failed_destination(dest).read_bytes().splitlines()
    }
    assert "cannot hold 1.5e-19 exactly" in failed["tiny"]
    assert "cannot hold 5e-324 exactly" in failed["denormal"]
    assert "1e400" in failed["huge-text"]
    assert "10000-01-01" in failed["far"]
    assert "10000-01-01" in failed["far-ts"]
