"""From an HTTP post to rows in the cloud warehouses' stand-ins, through each one's own
client: Snowflake (fakesnow's server, tests/snowflake.py), BigQuery (bqemulator,
tests/bigquery.py) and Redshift (PostgreSQL behind a front that copies from moto's S3,
tests/redshift.py). Two batches through the job, keyed, with a value a column cannot take
failing alone; a stream; a day reprocessed."""

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
from eventpipe.schema.dialects import DIALECTS
from tests.conftest import make_config
from tests.e2e.test_batch_pipeline import _post, _seal
from tests.e2e.test_reprocess import MOVE_N, _three_days


@pytest.fixture(params=["snowflake", "bigquery", "redshift"])
def warehouse(request: pytest.FixtureRequest) -> dict[str, Any]:
    """A warehouse destination's settings on its stand-in, in a schema or dataset of the
    test's own."""
    if request.param == "snowflake":
        server = request.getfixturevalue("snowflake_server")
        return dict(server.settings(request.getfixturevalue("snowflake_schema")))
    if request.param == "redshift":
        server = request.getfixturevalue("redshift_server")
        return dict(server.settings(request.getfixturevalue("s3_bucket")))
    server = request.getfixturevalue("bigquery_server")
    return dict(server.settings(request.getfixturevalue("bigquery_dataset")))


def _sql(warehouse: dict[str, Any], text: str) -> str:
    """``text`` with each ``{name}`` quoted as the warehouse quotes names."""
    quote = DIALECTS[warehouse["type"]].quote
    return text.format_map(_Quoted(quote))


class _Quoted(dict[str, str]):
    def __init__(self, quote: Any) -> None:
        super().__init__()
        self.quote = quote

    def __missing__(self, name: str) -> str:
        return str(self.quote(name))


def test_batches_keyed_and_a_value_its_column_cannot_take_fails_alone(
    start_collector: Any, spark: Any, warehouse: dict[str, Any]
) -> None:
    c = start_collector(destinations={"wh": {
        **warehouse, "table_name_template": "{{ event_type }}", "primary_key": ["user_id"],
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
    assert report.loaded == {("wh", "signup"): 2}
    _post(c, [
        {"event_type": "signup", "user": {"id": 2}, "plan": "pro", "seats": "many",
         "_timestamp": "2026-11-22T09:00:00Z"},  # seats is a number column
        {"event_type": "signup", "user": {"id": 3}, "plan": "free", "seats": 2,
         "_timestamp": "2026-11-22T09:00:00Z"},
    ], server=True)  # fmt: skip
    _seal(c)
    report = process_once(c.config, spark)
    assert report is not None
    assert report.failed == {"wh": 1}
    sql = _sql(warehouse, "SELECT {user_id}, {plan}, {seats} FROM {signup} ORDER BY 1")
    assert _query(c.config, sql) == [(1, "team", 5), (2, "free", 1), (3, "free", 2)]
    [line] = c.layout.failed_destination("wh").read_text().splitlines()
    failed = orjson.loads(line)
    assert failed["event"]["seats"] == "many"
    assert "column seats (INT64) cannot take many" in failed["error"]
    with pytest.raises(QueryError, match=r"only reads|read-only"):
        _query(c.config, _sql(warehouse, "DELETE FROM {signup} WHERE true"))


def test_events_stream_in_micro_batches(
    start_collector: Any, spark: Any, warehouse: dict[str, Any]
) -> None:
    c = start_collector(destinations={"wh": {**warehouse, "mode": "stream"}})
    _post(c, [{"n": 1}, {"n": 2}], server=True)
    stream.run_once(spark, c.config)
    _post(c, [{"n": 3, "color": "red"}], server=True)
    stream.run_once(spark, c.config)
    sql = _sql(warehouse, "SELECT {n}, {color} FROM {events} ORDER BY 1")
    assert _query(c.config, sql) == [(1, None), (2, None), (3, "red")]
    assert not c.layout.sealed_segments()
    if warehouse["type"] == "bigquery":  # appended through the Storage Write API
        streams = _sql(warehouse, "SELECT count(*), sum({rows}) FROM {_eventpipe_streams}")
        assert _query(c.config, streams) == [(2, 3)]


def test_reprocess_replaces_a_days_rows(
    tmp_path: Path, spark: Any, warehouse: dict[str, Any]
) -> None:
    data = tmp_path / "data"
    _three_days(data)
    wh = {**warehouse, "table_name_template": "{{ event_type }}"}
    process_pending(make_config(data, destinations={"wh": wh}), spark)
    after = make_config(data, destinations={"wh": {**wh, "mappings": MOVE_N}})
    day = date(2026, 11, 20)
    _, results = rp.reprocess(spark, after, "wh", day, day)
    assert results[0].rows == {"page": 2, "click": 2}
    sql = _sql(warehouse, "SELECT {eventn_ctx_event_id}, {number}, {n} FROM {page} ORDER BY 1")
    assert _query(after, sql) == [("e1", 1, None), ("e2", 2, None), ("e4", None, 4),
                                  ("e6", None, 6), ("e7", None, 7)]  # fmt: skip
    assert rp.reprocess(spark, after, "wh", day, day)[1] == []


def _query(config: Any, sql: str) -> list[tuple[Any, ...]]:
    """``eventpipe query --destination wh``'s rows."""
    from eventpipe.processing.runtime.pipeline import Runtime

    return Runtime(config).open_destination("wh").query(sql)[1]  # type: ignore[union-attr]
