"""PostgreSQL stopped, then started: the other destination keeps loading while it is down,
and it catches up afterwards, every event once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from eventpipe.processing.batch.job import process_pending
from eventpipe.processing.batch.run import DestinationsFailingError
from eventpipe.state.store import StateStore
from tests.e2e.test_batch_pipeline import _post, _query, _seal
from tests.postgres import PostgresServer


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A server of this test's own: it is stopped and started again."""
    server = PostgresServer()
    server.start()
    try:
        yield server
    finally:
        server.remove()


def _batch(first: int, count: int) -> list[dict[str, Any]]:
    return [{"event_id": f"e{i}", "n": i} for i in range(first, first + count)]


def test_postgres_down_then_up(
    start_collector: Any, spark: Any, own_postgres: PostgresServer
) -> None:
    c = start_collector(destinations={
        "warehouse": {"type": "duckdb"},
        "pg": {"type": "postgres", "dsn": own_postgres.dsn},
    })  # fmt: skip
    _post(c, _batch(0, 30), server=True)
    _seal(c)
    assert len(process_pending(c.config, spark)) == 1  # both up: one run

    own_postgres.stop()
    for first in (30, 60):  # two batch periods while it is down
        _post(c, _batch(first, 30), server=True)
        _seal(c)
        with pytest.raises(DestinationsFailingError) as down:
            process_pending(c.config, spark)
        assert down.value.message.startswith("destination(s) stopped: pg: postgres")
        assert _query(c, "SELECT count(*) FROM events") == [(first + 30,)]
    assert len(c.layout.sealed_segments()) == 2  # kept until pg has them
    store = StateStore(c.layout.state)
    assert store.done_by("pg", [p.name for p in c.layout.sealed_segments()]) == set()

    own_postgres.start()
    reports = process_pending(c.config, spark)
    assert sum(r.loaded.get(("pg", "events"), 0) for r in reports) == 60
    assert all(("warehouse", "events") not in r.loaded for r in reports)
    with psycopg.connect(own_postgres.dsn) as db:
        rows = db.execute("SELECT event_id, count(*) FROM events GROUP BY 1").fetchall()
    assert sorted(rows) == sorted((f"e{i}", 1) for i in range(90))
    assert _query(c, "SELECT count(*), count(DISTINCT event_id) FROM events") == [(90, 90)]
    assert not c.layout.sealed_segments()  # archived: both destinations have them
    assert process_pending(c.config, spark) == []
