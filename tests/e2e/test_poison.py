"""A load the database refuses: the events that cause it are found (the batch loaded in
parts) and go to failed/, the rest loads; a destination that refuses everything stops
alone, and the others go on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import orjson
import psycopg
import pytest

from eventpipe.processing.batch import load
from eventpipe.processing.batch.job import process_once, process_pending
from eventpipe.processing.batch.run import DestinationsFailingError
from tests.e2e.test_batch_pipeline import _post, _query, _seal


def _events(count: int, negative: set[int]) -> list[dict[str, Any]]:
    return [
        {"event_id": f"e{i}", "amount": -i if i in negative else i, "user": {"id": i % 7}}
        for i in range(count)
    ]


def _failed(c: Any, dest_id: str) -> list[dict[str, Any]]:
    path = c.layout.failed_destination(dest_id)
    return [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def test_events_a_duckdb_check_refuses_go_to_failed_and_the_rest_loads(
    start_collector: Any, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = start_collector(destinations={"warehouse": {"type": "duckdb"}})
    # The table's owner made it with a constraint eventpipe does not know about.
    c.layout.warehouse.parent.mkdir(parents=True, exist_ok=True)
    with duckdb.connect(str(c.layout.warehouse)) as db:
        db.execute("CREATE TABLE events (event_id VARCHAR, amount BIGINT CHECK (amount >= 0))")
    monkeypatch.setattr(load, "PART_ROWS", 64)  # several parts, some of them refused
    negative = {5, 77, 150}
    _post(c, _events(200, negative), server=True)
    _seal(c)
    report = process_once(c.config, spark)
    assert report is not None
    assert report.loaded == {("warehouse", "events"): 197}
    assert report.failed == {"warehouse": 3}
    loaded = _query(c, "SELECT event_id FROM events ORDER BY event_id")
    assert sorted(r[0] for r in loaded) == sorted(f"e{i}" for i in range(200) if i not in negative)
    failed = _failed(c, "warehouse")
    assert sorted(f["event"]["event_id"] for f in failed) == ["e150", "e5", "e77"]
    assert all("CHECK constraint" in f["error"] for f in failed), failed[0]["error"]
    assert {(f["stage"], f["table"]) for f in failed} == {("loading", "events")}
    assert report.archived  # the segment is done
    assert process_once(c.config, spark) is None  # nothing loops
    assert _query(c, "SELECT count(*) FROM events") == [(197,)]


def test_a_resumed_load_in_parts_loads_nothing_twice(
    start_collector: Any, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pipeline dies in the middle of a load in parts: the next run goes on from the
    parts already loaded (never the whole batch again), and no row is doubled."""
    c = start_collector(destinations={"warehouse": {"type": "duckdb"}})
    c.layout.warehouse.parent.mkdir(parents=True, exist_ok=True)
    with duckdb.connect(str(c.layout.warehouse)) as db:
        db.execute("CREATE TABLE events (event_id VARCHAR, amount BIGINT CHECK (amount >= 0))")
    monkeypatch.setattr(load, "PART_ROWS", 32)
    _post(c, _events(100, {3, 90}), server=True)
    _seal(c)

    from eventpipe.destinations.duckdb import DuckDBDestination

    real_load = DuckDBDestination.load
    loaded: list[str] = []

    def dying_load(self: Any, request: Any) -> Any:
        if len(loaded) == 2:  # two parts in
            raise KeyboardInterrupt("killed")
        result = real_load(self, request)
        loaded.append(request.batch_id)
        return result

    monkeypatch.setattr(DuckDBDestination, "load", dying_load)
    with pytest.raises(KeyboardInterrupt):
        process_once(c.config, spark)
    monkeypatch.setattr(DuckDBDestination, "load", real_load)
    loaded_before = _query(c, "SELECT count(*) FROM events")[0][0]
    assert loaded_before > 0
    report = process_once(c.config, spark)
    assert report is not None
    assert report.resumed
    rows = _query(c, "SELECT event_id, count(*) FROM events GROUP BY 1 HAVING count(*) > 1")
    assert rows == []
    assert _query(c, "SELECT count(*) FROM events") == [(98,)]
    assert sorted(f["event"]["event_id"] for f in _failed(c, "warehouse")) == ["e3", "e90"]


def test_a_destination_that_refuses_everything_stops_alone(
    start_collector: Any, spark: Any, tmp_path: Path
) -> None:
    strict = tmp_path / "strict.duckdb"
    c = start_collector(destinations={
        "warehouse": {"type": "duckdb"},
        "strict": {"type": "duckdb", "path": str(strict), "max_poison_events": 5},
    })  # fmt: skip
    with duckdb.connect(str(strict)) as db:  # no event can pass
        db.execute("CREATE TABLE events (event_id VARCHAR, amount BIGINT CHECK (amount > 1e9))")
    _post(c, _events(50, set()), server=True)
    _seal(c)
    with pytest.raises(DestinationsFailingError) as stopped:
        process_pending(c.config, spark)
    assert "strict" in stopped.value.message
    assert "more than 5 events" in stopped.value.message
    assert _query(c, "SELECT count(*) FROM events") == [(50,)]  # the other one loaded
    assert _failed(c, "strict") == []  # the events are not blamed
    assert c.layout.sealed_segments()  # kept for the one that stopped

    # The warehouse goes on with new events while "strict" is stopped.
    _post(c, _events(10, set()), server=True)
    _seal(c)
    with pytest.raises(DestinationsFailingError):
        process_pending(c.config, spark)
    assert _query(c, "SELECT count(*) FROM events") == [(60,)]

    # Repaired: it catches up with both segments, each event once.
    with duckdb.connect(str(strict)) as db:
        db.execute("DROP TABLE events")
        db.execute("CREATE TABLE events (event_id VARCHAR, amount BIGINT)")
    reports = process_pending(c.config, spark)
    # Its unfinished run first (the first segment), then a new run of the second one.
    assert [(r.resumed, r.loaded) for r in reports] == [
        (True, {("strict", "events"): 50}),
        (False, {("strict", "events"): 10}),
    ]
    with duckdb.connect(str(strict), read_only=True) as db:
        assert db.execute("SELECT count(*), count(DISTINCT event_id) FROM events").fetchall() == [
            (60, 50)  # e0..e9 were posted twice
        ]
    assert _query(c, "SELECT count(*) FROM events") == [(60,)]
    assert not c.layout.sealed_segments()  # archived once both have them
    assert process_pending(c.config, spark) == []


def test_postgres_upsert_refused_by_a_check_loads_the_rest(
    start_collector: Any, spark: Any, postgres_dsn: str, postgres_schema: str
) -> None:
    c = start_collector(destinations={"pg": {
        "type": "postgres", "dsn": postgres_dsn, "schema": postgres_schema,
        "primary_key": ["event_id"],
    }})  # fmt: skip
    with psycopg.connect(postgres_dsn, autocommit=True) as db:
        db.execute(f'CREATE SCHEMA "{postgres_schema}"')
        db.execute(
            f'CREATE TABLE "{postgres_schema}".events (event_id text PRIMARY KEY, '
            "amount bigint CHECK (amount >= 0))"
        )
    _post(c, _events(40, {7, 31}), server=True)
    _seal(c)
    report = process_once(c.config, spark)
    assert report is not None
    assert report.loaded == {("pg", "events"): 38}
    with psycopg.connect(postgres_dsn) as db:
        (count,) = db.execute(f'SELECT count(*) FROM "{postgres_schema}".events').fetchone() or (0,)
    assert count == 38
    failed = _failed(c, "pg")
    assert sorted(f["event"]["event_id"] for f in failed) == ["e31", "e7"]
    assert all("check constraint" in f["error"] for f in failed), failed[0]["error"]
