"""From an HTTP post to rows in Snowflake's stand-in (fakesnow's server through the
official connector, tests/snowflake.py): two batches through the job, keyed, with a
value a column cannot take failing alone; a stream; a day reprocessed."""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import Any

import orjson
import pytest

from eventpipe.errors import QueryError
from eventpipe.processing.batch.job import process_once, process_pending
from eventpipe.processing.modes import reprocess as rp
from eventpipe.processing.modes import stream
from tests.conftest import make_config
from tests.e2e.test_batch_pipeline import _post, _seal
from tests.e2e.test_reprocess import MOVE_N, _three_days


def test_batches_into_snowflake_keyed_and_a_value_its_column_cannot_take_fails_alone(
    start_collector: Any, spark: Any, snowflake_server: Any, snowflake_schema: str
) -> None:
    c = start_collector(destinations={"sf": {
        **snowflake_server.settings(snowflake_schema),
        "table_name_template": "{{ event_type }}", "primary_key": ["user_id"],
    }})  # fmt: skip
    _post(c, [
        {"event_type": "signup", "user": {"id": 1}, "plan": "pro", "seats": 3,
         "_timestamp": "2026-11-21T10:00:00Z"},
        {"event_type": "signup", "user": {"id": 1}, "plan": "team", "seats": 5,
         "_timestamp": "2026-11-21T11:00:00Z"},  # newer: wins
        {"event_type": "signup", "user": {"id": 2}, "plan": "free", "seats": 1,
         "_timestamp": "2026-11-21T09:00:00Z"},
    ], server=True)  # fmt: skip
    _seal(c)
    report = process_once(c.config, spark)
    assert report is not None
    assert report.loaded == {("sf", "signup"): 2}
    _post(c, [
        {"event_type": "signup", "user": {"id": 2}, "plan": "pro", "seats": "many",
         "_timestamp": "2026-11-22T09:00:00Z"},  # seats is a number column
        {"event_type": "signup", "user": {"id": 3}, "plan": "free", "seats": 2,
         "_timestamp": "2026-11-22T09:00:00Z"},
    ], server=True)  # fmt: skip
    _seal(c)
    report = process_once(c.config, spark)
    assert report is not None
    assert report.failed == {"sf": 1}
    assert _query(c.config, 'SELECT "user_id", "plan", "seats" FROM "signup" ORDER BY 1') == [
        (1, "team", 5),
        (2, "free", 1),
        (3, "free", 2),
    ]
    [line] = c.layout.failed_destination("sf").read_text().splitlines()
    failed = orjson.loads(line)
    assert failed["event"]["seats"] == "many"
    assert "column seats (INT64) cannot take many" in failed["error"]
    with pytest.raises(QueryError, match="only reads"):
        _query(c.config, 'DELETE FROM "signup"')


def test_events_stream_into_snowflake_in_micro_batches(
    start_collector: Any, spark: Any, snowflake_server: Any, snowflake_schema: str
) -> None:
    c = start_collector(destinations={"sf": {
        **snowflake_server.settings(snowflake_schema), "mode": "stream"}})  # fmt: skip
    _post(c, [{"n": 1}, {"n": 2}], server=True)
    stream.run_once(spark, c.config)
    _post(c, [{"n": 3, "color": "red"}], server=True)
    stream.run_once(spark, c.config)
    assert _query(c.config, 'SELECT "n", "color" FROM "events" ORDER BY 1') == [
        (1, None),
        (2, None),
        (3, "red"),
    ]
    assert not c.layout.sealed_segments()


def test_reprocess_replaces_a_days_rows_in_snowflake(
    tmp_path: Path, spark: Any, snowflake_server: Any, snowflake_schema: str
) -> None:
    data = tmp_path / "data"
    _three_days(data)
    sf = {**snowflake_server.settings(snowflake_schema), "table_name_template": "{{ event_type }}"}
    process_pending(make_config(data, destinations={"sf": sf}), spark)
    after = make_config(data, destinations={"sf": {**sf, "mappings": MOVE_N}})
    day = date(2026, 11, 20)
    _, results = rp.reprocess(spark, after, "sf", day, day)
    assert results[0].rows == {"page": 2, "click": 2}
    rows = _query(after, 'SELECT "eventn_ctx_event_id", "number", "n" FROM "page" ORDER BY 1')
    assert rows == [("e1", 1, None), ("e2", 2, None), ("e4", None, 4), ("e6", None, 6),
                    ("e7", None, 7)]  # fmt: skip
    assert rp.reprocess(spark, after, "sf", day, day)[1] == []


def _query(config: Any, sql: str) -> list[tuple[Any, ...]]:
    """``eventpipe query --destination sf``'s rows."""
    from eventpipe.processing.runtime.pipeline import Runtime

    return Runtime(config).open_destination("sf").query(sql)[1]  # type: ignore[union-attr]
