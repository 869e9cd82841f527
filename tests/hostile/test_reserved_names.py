"""Events that name eventpipe's own columns and tables: each is a row (under the escaped
name of eventpipe.reserved) and the destination goes on loading. Each case failed a run,
dropped a key or took over the load records before the reserved namespace."""

from __future__ import annotations

from typing import Any

import orjson
import psycopg

from eventpipe.processing.batch.job import process_once
from tests.e2e.test_batch_pipeline import _post, _query, _seal


def _columns(c: Any, table: str) -> set[str]:
    sql = f"SELECT column_name FROM information_schema.columns WHERE table_name = '{table}'"
    rows = _query(c, sql)
    return {name for (name,) in rows}


KEYS = {
    "__TABLE": "__table",
    "__row": "__row",
    "__error": "__error",
    "__file": "__file",
    "__segment": "__segment",
    "__lookup_ip": "__lookup_ip",
    "_corrupt_record": "_corrupt_record",
    "_metadata": "_metadata",
    "_eventpipe_row": "__eventpipe_row",
    "_EVENTPIPE_TABLE": "__eventpipe_table",
    "_eventpipe_corrupt": "__eventpipe_corrupt",
    "__eventpipe_error": "___eventpipe_error",
    "_unmapped_data": "__unmapped_data",
}
"""Keys named like eventpipe's columns, each in an event of its own, and the column it
loads into."""


def test_keys_named_like_internal_columns_are_columns_of_their_own(
    start_collector: Any, spark: Any
) -> None:
    c = start_collector(destinations={"warehouse": {
        "type": "duckdb", "table_name_template": "{{ event_type }}",
    }})  # fmt: skip
    events = [{"event_type": "x", key: n, "event_id": key} for n, key in enumerate(KEYS)]
    _post(c, [*events, {"event_type": "x", "n": 1, "event_id": "good"}])
    _seal(c)
    report = process_once(c.config, spark)
    assert report is not None
    assert report.loaded == {("warehouse", "x"): len(KEYS) + 1}
    assert report.failed == {"warehouse": 0}
    columns = _columns(c, "x")
    for n, (key, column) in enumerate(KEYS.items()):
        assert column in columns, key
        where = f"eventn_ctx_event_id = 'js:web:{key}'"  # a browser key's namespace
        rows = _query(c, f'SELECT "{column}" FROM x WHERE {where}')
        assert rows == [(n,)], key
    # The next batch loads as well: nothing about the destination was broken.
    _post(c, [{"event_type": "x", "n": 2, "event_id": "next"}])
    _seal(c)
    again = process_once(c.config, spark)
    assert again is not None
    assert again.loaded == {("warehouse", "x"): 1}


def test_a_nested_path_flattened_onto_an_internal_name_is_escaped(
    start_collector: Any, spark: Any
) -> None:
    c = start_collector(destinations={"warehouse": {"type": "duckdb"}})
    _post(c, [{"_eventpipe": {"row": 1, "table": "t"}, "_EventPipe_Row": 2, "event_id": "a"}])
    _seal(c)
    report = process_once(c.config, spark)
    assert report is not None
    assert report.loaded == {("warehouse", "events"): 1}
    # Two paths named alike: the shorter keeps the column, the other is kept in
    # _unmapped_data (schema/naming.py), never in an internal column.
    rows = _query(c, 'SELECT "__eventpipe_row", "__eventpipe_table", _unmapped_data FROM events')
    assert rows == [(2, "t", '{"/_eventpipe/row":1}')]


def test_a_table_named_like_the_load_records_is_a_table_of_its_own(
    start_collector: Any, spark: Any, postgres_dsn: str, postgres_schema: str
) -> None:
    c = start_collector(destinations={
        "warehouse": {"type": "duckdb", "table_name_template": "{{ event_type }}"},
        "pg": {"type": "postgres", "dsn": postgres_dsn, "schema": postgres_schema,
               "table_name_template": "{{ event_type }}"},
    })  # fmt: skip
    hostile = [
        {"event_type": "_eventpipe_loads", "batch_id": "x", "tbl": "y", "rows": "many"},
        {"event_type": "_EventPipe_RP_0_t", "n": 1},
        {"event_type": "_unmapped_data", "n": 2},
    ]
    _post(c, hostile)  # into a new warehouse: before the load records exist
    _seal(c)
    first = process_once(c.config, spark)
    assert first is not None
    escaped = {"__eventpipe_loads": 1, "__eventpipe_rp_0_t": 1, "__unmapped_data": 1}
    assert first.loaded == {(d, t): n for d in ("warehouse", "pg") for t, n in escaped.items()}
    # A batch whose id the hostile row named, and later batches, still load.
    _post(c, [{"event_type": "page", "n": 1}, {"event_type": "_eventpipe_loads", "n": 2}])
    _seal(c)
    second = process_once(c.config, spark)
    assert second is not None
    assert second.loaded == {
        (d, t): 1 for d in ("warehouse", "pg") for t in ("page", "__eventpipe_loads")
    }
    assert second.failed == {"warehouse": 0, "pg": 0}
    assert _query(c, "SELECT count(*) FROM __eventpipe_loads") == [(2,)]
    with psycopg.connect(postgres_dsn) as db:
        rows = db.execute(f'SELECT count(*) FROM "{postgres_schema}".__eventpipe_loads').fetchall()
    assert rows == [(2,)]


def test_a_numeric_corrupt_record_key_loads_and_a_bad_line_still_fails(
    start_collector: Any, spark: Any
) -> None:
    c = start_collector(destinations={"warehouse": {"type": "duckdb"}})
    _post(c, [{"event_type": "x", "_corrupt_record": 1, "event_id": "a"}])
    _seal(c)
    [segment] = c.layout.sealed_segments()
    with segment.open("ab") as log:  # a line that is not JSON, as a damaged disk leaves
        log.write(b'{"torn": \n')
    report = process_once(c.config, spark)
    assert report is not None
    assert report.loaded == {("warehouse", "events"): 1}
    assert report.corrupt == 1
    assert _query(c, "SELECT _corrupt_record FROM events") == [(1,)]
    [failed] = list(c.layout.failed.glob("failed.tok=*.log"))
    [record] = [orjson.loads(line) for line in failed.read_bytes().splitlines()]
    assert record["raw"] == '{"torn": '
    assert record["error"] == "line is not a JSON object"
