"""A run that fails twice for a reason in its events isolates them: the events that fail
alone go to failed/ with the error, the rest load, and the destination goes on."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from eventpipe.processing.batch import shape
from eventpipe.processing.batch.job import process_once
from eventpipe.processing.batch.run import DestinationsFailingError
from tests.conftest import SHOP_JS
from tests.e2e.test_batch_pipeline import _post, _query, _seal


def _breaks_on_poison(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step that fails for the whole batch when one of its events has a field named
    "poison": what a field that Spark's analysis cannot take does."""
    flatten = shape.flatten_mapped

    def failing(frame: Any, **kwargs: Any) -> Any:
        if "poison" in frame.columns:
            raise ValueError("[AMBIGUOUS_REFERENCE] Reference `poison` is ambiguous")
        return flatten(frame, **kwargs)

    monkeypatch.setattr(shape, "flatten_mapped", failing)


def test_a_batch_that_fails_twice_is_isolated_event_by_event(
    start_collector: Any, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import httpx

    c = start_collector(destinations={
        "warehouse": {"type": "duckdb", "table_name_template": "{{ kind }}"},
        "lake": {"type": "parquet", "only_keys": ["shop"]},
    })  # fmt: skip
    events = [{"kind": "a" if n % 2 else "b", "n": n, "event_id": f"e{n}"} for n in range(30)]
    events[7]["poison"] = 1
    events[22]["poison"] = {"x": 2}
    _post(c, events)
    response = httpx.post(c.url + "/api/v1/event", json={"kind": "shop", "event_id": "s1"},
                          params={"token": SHOP_JS},
                          headers={"Origin": "https://shop.example.com"})  # fmt: skip
    assert response.status_code == 200
    _seal(c)
    _breaks_on_poison(monkeypatch)
    # First failure: recorded, the destinations wait (it may have been passing). The
    # field is in the batch's schema, so both fail, the lake though it takes no poison.
    with pytest.raises(DestinationsFailingError, match="failed on its events' data"):
        process_once(c.config, spark)
    assert not c.layout.warehouse.exists() or _query(c, "SHOW TABLES") == []
    lake = c.layout.root / "parquet" / "events"
    assert not list(lake.rglob("*.parquet"))
    # Second failure of the same run: its events are isolated.
    report = process_once(c.config, spark)
    assert report is not None
    assert report.failed == {"warehouse": 2, "lake": 0}
    assert report.loaded[("lake", "events")] == 1  # only its own key's event
    assert len(list(lake.rglob("*.parquet"))) == 1
    assert sum(n for (d, _), n in report.loaded.items() if d == "warehouse") == 29
    sql = "SELECT eventn_ctx_event_id FROM a UNION ALL SELECT eventn_ctx_event_id FROM b"
    ids = sorted(r[0] for r in _query(c, sql))  # each once: no part loaded twice
    assert ids == sorted(f"js:web:e{n}" for n in range(30) if n not in (7, 22))
    assert _query(c, "SELECT eventn_ctx_event_id FROM shop") == [("js:shop:s1",)]
    records = [orjson.loads(line) for line in
               c.layout.failed_destination("warehouse").read_bytes().splitlines()]  # fmt: skip
    assert sorted(r["event"]["event_id"] for r in records) == ["e22", "e7"]
    assert all(r["error"].startswith("processing failed for this event alone: ValueError: "
                                     "[AMBIGUOUS_REFERENCE]") for r in records)  # fmt: skip
    # The run is done; later batches load as usual.
    _post(c, [{"kind": "a", "n": 99, "event_id": "later"}])
    _seal(c)
    later = process_once(c.config, spark)
    assert later is not None
    assert later.loaded[("warehouse", "a")] == 1


def test_a_stream_micro_batch_that_fails_twice_is_isolated_and_a_replay_too(
    start_collector: Any, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyspark.errors import StreamingQueryException

    from eventpipe.processing.modes import stream
    from eventpipe.processing.modes.replay import replay_failed

    c = start_collector(destinations={"warehouse": {"type": "duckdb", "mode": "stream"}})
    events = [{"n": n, "event_id": f"e{n}"} for n in range(6)]
    events[4]["poison"] = 1
    _post(c, events, server=True)
    _breaks_on_poison(monkeypatch)
    # First failure: the query stops (the service's supervisor starts it again from its
    # checkpoint: the same micro-batch).
    with pytest.raises(StreamingQueryException, match="AMBIGUOUS_REFERENCE"):
        stream.run_once(spark, c.config)
    assert not c.layout.warehouse.exists() or _query(c, "SHOW TABLES") == []
    # Second: the micro-batch's events are isolated; the stream goes on.
    stream.run_once(spark, c.config)
    assert _query(c, "SELECT n FROM events ORDER BY n") == [(0,), (1,), (2,), (3,), (5,)]
    [record] = [orjson.loads(line) for line in
                c.layout.failed_destination("warehouse").read_bytes().splitlines()]  # fmt: skip
    assert record["event"]["event_id"] == "e4"
    assert "processing failed for this event alone" in record["error"]
    _post(c, [{"n": 6, "event_id": "e6"}], server=True)
    stream.run_once(spark, c.config)
    assert _query(c, "SELECT max(n) FROM events") == [(6,)]
    # A replay of the event that still fails: the same two steps, and it is back in
    # failed/ with its error, never lost.
    with pytest.raises(ValueError, match="AMBIGUOUS_REFERENCE"):
        replay_failed(c.config, spark, "warehouse")
    report = replay_failed(c.config, spark, "warehouse")
    assert report is not None
    assert report.failed == {"warehouse": 1}
    [record] = [orjson.loads(line) for line in
                c.layout.failed_destination("warehouse").read_bytes().splitlines()]  # fmt: skip
    assert record["event"]["event_id"] == "e4"
    assert _query(c, "SELECT count(*) FROM events") == [(6,)]


def test_a_damaged_duckdb_file_is_the_destination_failing_not_its_events(
    start_collector: Any, spark: Any
) -> None:
    """A DuckDB file truncated between runs: every good event went to failed/ "for this
    event alone" and the run exited 0. It is the destination's failure: it waits with its
    backlog (exit 75), nothing goes to failed/, and the other destination loads."""
    c = start_collector(destinations={
        "warehouse": {"type": "duckdb"},
        "lake": {"type": "parquet"},
    })  # fmt: skip
    _post(c, [{"n": n, "pad": "x" * 200} for n in range(2000)], server=True)
    _seal(c)
    assert process_once(c.config, spark) is not None
    size = c.layout.warehouse.stat().st_size
    with c.layout.warehouse.open("r+b") as damaged:
        damaged.truncate(size // 2)
    _post(c, [{"n": 1, "event_id": "after"}], server=True)
    _seal(c)
    for _ in range(2):  # twice: a second failure of a run is when events were isolated
        with pytest.raises(DestinationsFailingError, match="cannot be read or written") as info:
            process_once(c.config, spark)
        assert info.value.exit_code == 75
    assert not c.layout.failed_destination("warehouse").exists()
    lake = c.layout.root / "parquet" / "events"
    assert len(list(lake.rglob("*.parquet"))) == 2  # both batches in the lake
    assert c.layout.sealed_segments()  # the warehouse's backlog is kept


def test_a_table_the_database_refuses_fails_alone(
    start_collector: Any, spark: Any, postgres_dsn: str, postgres_schema: str
) -> None:
    """A table PostgreSQL will not widen (1,600 columns already): the run failed with
    exit 65 on every rerun and nothing else loaded. Now that table's events go to failed/
    with the reason and the table is marked failing; its other tables, the other
    destination and the next batches load."""
    import psycopg

    from eventpipe.state.store import open_state

    with psycopg.connect(postgres_dsn, autocommit=True) as db:
        db.execute(f'CREATE SCHEMA "{postgres_schema}"')
        columns = ", ".join(f"c{n} int" for n in range(1600))
        db.execute(f'CREATE TABLE "{postgres_schema}".wide ({columns})')
    c = start_collector(destinations={
        "pg": {"type": "postgres", "dsn": postgres_dsn, "schema": postgres_schema,
               "table_name_template": "{{ kind }}"},
        "warehouse": {"type": "duckdb", "table_name_template": "{{ kind }}"},
    })  # fmt: skip
    _post(c, [{"kind": "wide", "event_id": "w1"}, {"kind": "fine", "event_id": "f1"}],
          server=True)  # fmt: skip
    _seal(c)
    report = process_once(c.config, spark)  # no error: the refusal is the table's alone
    assert report is not None
    assert report.failed["pg"] == 1
    [line] = c.layout.failed_destination("pg").read_bytes().splitlines()
    record = orjson.loads(line)
    assert record["event"]["event_id"] == "w1"
    assert "refused to create or change table wide" in record["error"]
    assert "1600 columns" in record["error"]
    [(table, error)] = open_state(c.config).failing_tables("pg")
    assert table == "wide"
    assert "1600 columns" in error
    assert open_state(c.config).failing_tables("warehouse") == []
    from tests.process import run, write_config

    destinations = c.config.model_dump(mode="json")["destinations"]
    config_file = write_config(c.layout.root.parent / "status.yaml", c.layout.root, 1,
                               destinations=destinations)  # fmt: skip
    shown = run("status", "-c", str(config_file))
    assert shown.returncode == 0, shown.stderr
    assert "pg: table wide failing, its events go to failed/: " in shown.stdout
    _post(c, [{"kind": "fine", "event_id": "f2"}], server=True)
    _seal(c)
    assert process_once(c.config, spark) is not None
    with psycopg.connect(postgres_dsn) as db:
        rows = db.execute(f'SELECT event_id FROM "{postgres_schema}".fine ORDER BY 1')
        assert [r[0] for r in rows.fetchall()] == ["f1", "f2"]
    assert sorted(_query(c, "SELECT event_id FROM wide UNION ALL SELECT event_id FROM fine")) == [
        ("f1",), ("f2",), ("w1",)]  # fmt: skip
    assert not c.layout.sealed_segments()  # every destination done: archived
