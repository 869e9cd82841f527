"""Stream mode: from an HTTP post to a row in the destination without waiting for the log
to rotate, on Spark Structured Streaming (processing/modes/stream.py)."""

from __future__ import annotations

from typing import Any

import lz4.frame
import orjson

from eventpipe.console.ledger import streams
from eventpipe.errors import QueryError
from eventpipe.log import tail
from eventpipe.processing.batch.job import process_once
from eventpipe.processing.modes import stream
from eventpipe.state.store import open_state
from tests.conftest import read_lines
from tests.e2e.test_batch_pipeline import _post, _query, _seal


def test_events_stream_from_the_active_segment_and_new_fields_become_columns(
    start_collector: Any, spark: Any
) -> None:
    warehouse = {"type": "duckdb", "mode": "stream", "table_name_template": "{{ event_type }}"}
    c = start_collector(destinations={"warehouse": warehouse})
    _post(c, [{"event_type": "click", "n": 1}, {"event_type": "view", "url": "/a"}], server=True)
    assert c.layout.active_segments()
    assert not c.layout.sealed_segments()
    stream.run_once(spark, c.config)
    assert _query(c, "SELECT n FROM click") == [(1,)]
    assert _query(c, "SELECT url FROM view") == [("/a",)]
    # A new field mid-stream: a new column, in the same active segment.
    _post(c, [{"event_type": "click", "n": 2, "color": "red"}], server=True)
    stream.run_once(spark, c.config)
    assert _query(c, "SELECT n, color FROM click ORDER BY n") == [(1, None), (2, "red")]
    assert tail.lag(c.layout, "warehouse").events == 0
    archived = sorted(c.layout.archive.glob("*/streaming-archive.dst=warehouse-*.log.lz4"))
    assert len(archived) == 2
    with lz4.frame.open(archived[-1], "rb") as frames:  # the archive's one format
        assert orjson.loads(frames.read().splitlines()[-1])["color"] == "red"
    # Sealing renames the segment: the stream follows it and reads nothing twice, and the
    # batch side archives it (it has no batch destination) without loading it again.
    _seal(c)
    stream.run_once(spark, c.config)
    report = process_once(c.config, spark)
    assert report is None  # nothing for batch destinations
    assert not c.layout.sealed_segments()  # archived: every stream destination read it
    assert _query(c, "SELECT count(*) FROM click") == [(2,)]
    # The console's ledger: one line over all micro-batches (the first ones folded), the
    # events they read against the rows.
    [line] = streams(c.config, open_state(c.config))
    assert (line.destination, line.acknowledged, line.loaded, line.difference) == (
        "warehouse", 3, 3, 0,
    )  # fmt: skip


def test_a_streams_checkpoint_is_written_through_the_file_system_api(
    start_collector: Any, spark: Any
) -> None:
    """Spark's default writes the offset and commit logs through FileContext, whose
    renames start a ``readlink`` process per file status asked (pip's PySpark has no
    native Hadoop library): the query's logs use FileSystem's API instead."""
    c = start_collector(destinations={"warehouse": {"type": "duckdb", "mode": "stream"}})
    _post(c, [{"event_type": "click"}], server=True)
    with stream.stream_lock(c.config, "warehouse"):
        query = stream.start_stream(spark, c.config, "warehouse", available_now=True)
        query.awaitTermination()
    execution = query._jsq.streamingQuery()
    for log in (execution.offsetLog(), execution.commitLog()):
        manager = log.fileManager().getClass().getName()
        assert manager in stream.FILE_SYSTEM_MANAGERS
    assert _query(c, "SELECT count(*) FROM events") == [(1,)]
    assert (c.layout.incoming / "queue.dst=warehouse" / "checkpoint" / "commits" / "0").exists()


def test_a_key_reaches_a_stream_postgres_and_a_batch_duckdb_and_a_rejected_row_fails_alone(
    start_collector: Any, spark: Any, postgres_dsn: str, postgres_schema: str
) -> None:
    import orjson
    import psycopg

    c = start_collector(destinations={
        "warehouse": {"type": "duckdb", "table_name_template": "{{ event_type }}"},
        "pg": {"type": "postgres", "dsn": postgres_dsn, "schema": postgres_schema,
               "mode": "stream", "table_name_template": "{{ event_type }}"},
    })  # fmt: skip
    _post(c, [{"event_type": "buy", "price": 9.5}, {"event_type": "buy", "price": 1e25},
              {"event_type": "buy", "price": 2.0}], server=True)  # fmt: skip
    stream.run_once(spark, c.config)
    with psycopg.connect(postgres_dsn) as db:
        prices = db.execute(f'SELECT price FROM "{postgres_schema}".buy ORDER BY 1').fetchall()
    assert [float(p) for (p,) in prices] == [2.0, 9.5]  # 1e25 overflows numeric(38,18)
    [failed] = [
        orjson.loads(x) for x in c.layout.failed_destination("pg").read_bytes().splitlines()
    ]
    assert failed["event"]["price"] == 1e25
    assert "numeric field overflow" in failed["error"]
    [line] = streams(c.config, open_state(c.config))  # the batch destination has none
    assert (line.destination, line.acknowledged, line.loaded, line.failed,
            line.difference) == ("pg", 3, 2, 1, 0)  # fmt: skip
    assert not list(c.layout.sealed_segments())  # streamed without a rotation
    # The batch destination gets the same events once the segment is sealed.
    _seal(c)
    report = process_once(c.config, spark)
    assert report is not None
    assert report.loaded == {("warehouse", "buy"): 3}
    assert not c.layout.sealed_segments()  # loaded by the batch side, read by the stream


def test_a_micro_batch_waits_out_a_reader_holding_the_duckdb_file_without_failing_events(
    start_collector: Any, spark: Any, monkeypatch: Any
) -> None:
    from eventpipe.destinations import duckdb as duckdb_destination
    from tests.integration.destinations.test_duckdb import _hold_read_only

    warehouse = {"type": "duckdb", "mode": "stream"}
    c = start_collector(destinations={"warehouse": warehouse})
    _post(c, [{"n": 1}], server=True)
    stream.run_once(spark, c.config)
    # A user's session keeps the file open for 2 s, longer than the writer waits (0.2 s):
    # the micro-batch fails as transient and is retried in place (after 1 s, then 2 s).
    monkeypatch.setattr(duckdb_destination, "lock_wait", lambda timeout: 0.2)
    _post(c, [{"n": 2}], server=True)
    holder = _hold_read_only(c.layout.warehouse, 2.0)
    try:
        stream.run_once(spark, c.config)
    finally:
        holder.wait(10)
    assert _query(c, "SELECT n FROM events ORDER BY n") == [(1,), (2,)]
    assert not c.layout.failed_destination("warehouse").exists()
    assert tail.lag(c.layout, "warehouse").events == 0


def test_a_column_dropped_behind_the_streams_back_is_found_and_the_load_retried(
    start_collector: Any, spark: Any
) -> None:
    import logging
    import time

    import duckdb

    from eventpipe.destinations.duckdb import _open_for_writing

    def wait_for(sql: str, expected: list[Any]) -> None:
        deadline = time.monotonic() + 90
        found: Any = None
        while found != expected:
            assert time.monotonic() < deadline, found
            time.sleep(0.2)
            try:
                found = _query(c, sql)
            except (duckdb.Error, QueryError) as exc:  # not created yet, or held by the load
                found = exc

    warnings: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: warnings.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("eventpipe").addHandler(handler)
    c = start_collector(destinations={"warehouse": {"type": "duckdb", "mode": "stream"}})
    streams = stream.StreamSupervisor(spark, c.config)
    streams.start()
    try:
        _post(c, [{"seq": 1, "n": 1}], server=True)  # creates the table
        wait_for("SELECT seq, n FROM events", [(1, 1)])
        _post(c, [{"seq": 2, "n": 2}], server=True)  # its schema read, then kept in memory
        wait_for("SELECT seq, n FROM events ORDER BY seq", [(1, 1), (2, 2)])
        # A user drops a column the stream believes is there.
        db = _open_for_writing(c.layout.warehouse, 30)
        db.execute("ALTER TABLE events DROP COLUMN n")
        db.close()
        _post(c, [{"seq": 3, "n": 3}], server=True)
        wait_for("SELECT seq, n FROM events ORDER BY seq", [(1, None), (2, None), (3, 3)])
    finally:
        streams.stop()
        logging.getLogger("eventpipe").removeHandler(handler)
    # The load failed with the schema kept in memory, which was then read again.
    assert any("load failed with the schema kept in memory" in w for w in warnings), warnings
    assert not c.layout.failed_destination("warehouse").exists()


def test_an_unreadable_line_in_the_active_segment_fails_under_its_key(
    start_collector: Any, spark: Any
) -> None:

    c = start_collector(destinations={"warehouse": {"type": "duckdb", "mode": "stream"}})
    _post(c, [{"n": 1}], server=True)
    [active] = c.layout.active_segments()
    with active.open("ab") as out:
        out.write(b'{"broken": \n')
    _post(c, [{"n": 2}], server=True)
    stream.run_once(spark, c.config)
    assert _query(c, "SELECT n FROM events ORDER BY n") == [(1,), (2,)]
    [failed] = read_lines(c.layout.failed_received("web"))
    assert failed["raw"] == '{"broken": '
    assert failed["api_key"] == "web"
