"""The BigQuery destination against a stand-in that answers BigQuery's REST API
(bqemulator, tests/bigquery.py) through Google's own client: what the conformance suite
does not ask of every destination. An append is one load job of the batch's own id, never
run twice; a keyed load whose transaction fails after its rows went in leaves nothing and
runs again once; tables partitioned by day and clustered by their key; ``eventpipe
query`` kept to reads; Google's errors classified; no server."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eventpipe.destinations.base import LoadRequest
from eventpipe.destinations.bigquery import BigQueryDestination
from eventpipe.destinations.snowflake.query import check_query
from eventpipe.errors import ConfigError, QueryError, TerminalError, TransientError
from eventpipe.locks import FileLocks
from eventpipe.schema.diff import Table, diff
from eventpipe.schema.types import DataType

S, N, T = DataType.STRING, DataType.INT64, DataType.TIMESTAMP
COLUMNS = {"id": S, "n": N, "_timestamp": T}


@pytest.fixture
def dest(bigquery_server: Any, bigquery_dataset: str, tmp_path: Path) -> BigQueryDestination:
    settings = bigquery_server.settings(bigquery_dataset)
    del settings["type"]
    return BigQueryDestination("bq", FileLocks(tmp_path / "locks"), **settings)


def _ensure(dest: BigQueryDestination, table: Table) -> None:
    dest.patch(diff(dest.describe(table.name), table))


def _rows(dest: BigQueryDestination, sql: str) -> list[tuple[Any, ...]]:
    return dest.query(sql)[1]


def _file(path: Path, rows: list[dict[str, Any]]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_an_append_is_a_load_job_of_the_batchs_own_id_and_a_rerun_never_appends_twice(
    dest: BigQueryDestination, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from google.api_core import exceptions as google
    from google.cloud import bigquery

    from eventpipe.destinations.bigquery.destination import _job_id

    _ensure(dest, Table("events", COLUMNS))
    at = datetime(2026, 11, 21, 10)
    rows = [{"id": f"e{i}", "n": i, "_timestamp": at} for i in range(500)]
    request = LoadRequest("events", "b1", (_file(tmp_path / "a.parquet", rows),), COLUMNS)
    client, base = dest.api.client(), _job_id(dest.project, dest.dataset, request)
    # An earlier attempt whose job failed: its id is spent (BigQuery refuses it again).
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"not parquet")
    config = bigquery.LoadJobConfig(source_format=bigquery.SourceFormat.PARQUET)
    for _ in range(2):
        with garbage.open("rb") as data, pytest.raises(google.GoogleAPICallError):
            client.load_table_from_file(data, dest.api.ref("events"), job_id=f"{base}_0",
                                        job_config=config).result()  # fmt: skip
    # This attempt's job appends the rows, then the run dies before the record.
    recorded = dest._commit

    def dying(*args: Any) -> int:
        raise RuntimeError("died before the record")

    monkeypatch.setattr(dest, "_commit", dying)
    with pytest.raises(RuntimeError, match="before the record"):
        dest.load(request)
    monkeypatch.setattr(dest, "_commit", recorded)
    assert _rows(dest, "SELECT count(*) FROM events") == [(500,)]
    assert _rows(dest, "SELECT count(*) FROM _eventpipe_loads") == [(0,)]
    result = dest.load(request)  # finds its job done by its id: nothing appended again
    assert (result.rows, result.already_loaded) == (500, False)
    again = dest.load(request)
    assert (again.rows, again.already_loaded) == (500, True)
    assert _rows(dest, "SELECT count(*), count(DISTINCT id), sum(n) FROM events") == [
        (500, 500, 500 * 499 // 2)
    ]
    assert client.get_job(f"{base}_1").state == "DONE"
    with pytest.raises(google.NotFound):
        client.get_job(f"{base}_2")


def test_a_staged_file_that_fits_is_appended_as_it_is_its_columns_matched_by_name(
    dest: BigQueryDestination, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    from eventpipe.destinations.bigquery import destination as module
    from eventpipe.reserved import ROW

    _ensure(dest, Table("staged", {**COLUMNS, "extra": S}))
    at = datetime(2026, 11, 21, 10, tzinfo=UTC)
    # As the run stages a batch: its row ids first, the columns in an order of its own,
    # timestamps as instants; the table's column "extra" not in the batch.
    staged = pa.table({ROW: [7, 8], "n": [1, 2], "_timestamp": [at, at], "id": ["a", "b"]})
    file = tmp_path / "part-0.parquet"
    pq.write_table(staged, file)
    request = LoadRequest("staged", "b1", (file,), COLUMNS)

    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a staged file that fits was converted")

    monkeypatch.setattr(module, "converted_rows", never)
    assert dest.load(request).rows == 2
    assert dest.load(request).already_loaded
    assert _rows(dest, "SELECT id, n, extra, _timestamp FROM staged ORDER BY id") == [
        ("a", 1, None, at), ("b", 2, None, at),
    ]  # fmt: skip
    types = {"id": "VARCHAR", "n": "BIGINT", "_timestamp": "TIMESTAMPTZ", "extra": "VARCHAR"}
    assert module._as_staged(request, types)
    naive = tmp_path / "naive.parquet"  # a timestamp with no zone is not an instant
    pq.write_table(staged.set_column(2, "_timestamp", pa.array([at, at], pa.timestamp("us"))),
                   naive)  # fmt: skip
    floats = tmp_path / "floats.parquet"
    pq.write_table(staged.set_column(1, "n", pa.array([1.5, 2.0])), floats)
    for files in ((naive,), (floats,), (file, floats)):
        assert not module._as_staged(LoadRequest("staged", "b2", files, COLUMNS), types)
    # Several staged files that fit: joined into one upload, unconverted.
    other = tmp_path / "part-1.parquet"
    pq.write_table(staged.set_column(3, "id", pa.array(["c", "d"])), other)
    assert dest.load(LoadRequest("staged", "b3", (file, other), COLUMNS)).rows == 4
    assert _rows(dest, "SELECT count(*), count(DISTINCT id) FROM staged") == [(6, 4)]


def test_a_keyed_transaction_that_fails_after_its_rows_leaves_nothing_and_a_rerun_loads_once(
    dest: BigQueryDestination, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from eventpipe.destinations.bigquery import destination as bigquery

    key = ("id",)
    _ensure(dest, Table("events", COLUMNS, key))
    at = datetime(2026, 11, 21, 10)
    rows = [{"id": f"e{i}", "n": i, "_timestamp": at} for i in range(500)]
    request = LoadRequest("events", "b1", (_file(tmp_path / "a.parquet", rows),), COLUMNS, key)
    moved = bigquery._move

    def then_failing(*args: Any) -> str:  # the rows in, then an error: before the COMMIT
        return moved(*args) + "; SELECT ERROR('cut inside the transaction')"

    monkeypatch.setattr(bigquery, "_move", then_failing)
    with pytest.raises(TerminalError, match="cut inside the transaction"):
        dest.load(request)
    monkeypatch.undo()
    assert _rows(dest, "SELECT count(*) FROM events") == [(0,)]
    assert _rows(dest, "SELECT count(*) FROM _eventpipe_loads") == [(0,)]
    assert dest.tables() == ["events"]  # the stage table went with the attempt
    assert dest.load(request).rows == 500
    again = dest.load(request)
    assert (again.rows, again.already_loaded) == (500, True)
    assert _rows(dest, "SELECT count(*), count(DISTINCT id), sum(n) FROM events") == [
        (500, 500, 500 * 499 // 2)
    ]


def test_a_keyed_table_is_partitioned_by_day_clustered_by_its_key_and_merged(
    dest: BigQueryDestination, tmp_path: Path, bigquery_server: Any
) -> None:
    _ensure(dest, Table("users", {**COLUMNS, "plan": S}, ("id",)))
    found = dest.api.client().get_table(dest.api.ref("users"))
    assert (found.time_partitioning.field, found.clustering_fields) == ("_timestamp", ["id"])
    first = _file(tmp_path / "1.parquet", [
        {"id": "u1", "n": 1, "_timestamp": datetime(2026, 11, 20, 9), "plan": "free"},
        {"id": "u2", "n": 2, "_timestamp": datetime(2026, 11, 20, 9), "plan": "free"},
    ])  # fmt: skip
    dest.load(LoadRequest("users", "b1", (first,), {**COLUMNS, "plan": S}, ("id",)))
    second = _file(tmp_path / "2.parquet", [
        {"id": "u1", "n": 10, "_timestamp": datetime(2026, 11, 21, 9), "plan": "pro"},
        {"id": "u1", "n": 11, "_timestamp": datetime(2026, 11, 21, 8), "plan": "older"},
        {"id": "u2", "n": 20, "_timestamp": datetime(2026, 11, 19, 9), "plan": "stale"},
    ])  # fmt: skip
    result = dest.load(LoadRequest("users", "b2", (second,), {**COLUMNS, "plan": S}, ("id",)))
    assert result.rows == 2  # the keys the batch brought
    assert _rows(dest, "SELECT id, n, plan FROM users ORDER BY id") == [
        ("u1", 10, "pro"), ("u2", 2, "free")]  # fmt: skip


@pytest.mark.parametrize(
    ("sql", "refusal"),
    [
        ("DELETE FROM events WHERE true", "only reads"),
        ("SELECT 1; DROP TABLE events", "one statement at a time"),
        ("BEGIN TRANSACTION", "only reads"),
        ("SELEC 1 FROM", "not a statement bigquery reads"),
    ],
)
def test_query_refuses_what_is_not_a_read_before_sending_it(sql: str, refusal: str) -> None:
    with pytest.raises(QueryError, match=refusal):
        check_query(sql, "bigquery")


def test_query_reads_and_says_the_servers_error(dest: BigQueryDestination) -> None:
    _ensure(dest, Table("events", COLUMNS))
    assert dest.query("SELECT count(*) AS n FROM events") == (["n"], [(0,)])
    with pytest.raises(QueryError, match="bigquery"):
        dest.query("SELECT nope FROM events")


def test_googles_errors_are_transient_terminal_or_configuration(
    dest: BigQueryDestination,
) -> None:
    from google.api_core import exceptions as google

    def raised(exc: Exception) -> Exception:
        try:
            with dest.api.errors("events"):
                raise exc
        except Exception as found:  # noqa: BLE001 - the classification is the point
            return found
        raise AssertionError("nothing raised")

    throttled = google.Forbidden("quota", errors=[{"reason": "rateLimitExceeded"}])
    assert isinstance(raised(google.TooManyRequests("slow down")), TransientError)
    assert isinstance(raised(google.ServiceUnavailable("down")), TransientError)
    assert isinstance(raised(throttled), TransientError)
    assert isinstance(raised(google.BadRequest("no such column")), TerminalError)
    assert isinstance(raised(google.Unauthorized("who")), ConfigError)
    denied = google.Forbidden("denied", errors=[{"reason": "accessDenied"}])
    assert isinstance(raised(denied), ConfigError)


def test_no_server_is_transient(tmp_path: Path) -> None:
    from tests.process import free_port

    closed = f"http://127.0.0.1:{free_port()}"
    nowhere = BigQueryDestination("bq", FileLocks(tmp_path / "locks"), project="p",
                                  dataset="d", endpoint=closed)  # fmt: skip
    nowhere.api.call["timeout"] = 5
    from eventpipe.destinations.bigquery import api as bigquery_api

    bigquery_api.RETRY_SECONDS, before = 2.0, bigquery_api.RETRY_SECONDS
    try:
        with pytest.raises(TransientError, match="bigquery"):
            nowhere.describe("events")
    finally:
        bigquery_api.RETRY_SECONDS = before


@pytest.fixture
def writing(bigquery_server: Any, bigquery_dataset: str, tmp_path: Path) -> BigQueryDestination:
    settings = bigquery_server.settings(bigquery_dataset)
    del settings["type"]
    return BigQueryDestination("bq", FileLocks(tmp_path / "locks"), appends="storage_write",
                               **settings)  # fmt: skip


def test_storage_write_appends_once_whichever_step_a_run_dies_at(
    writing: BigQueryDestination, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from eventpipe.destinations.bigquery import write as bigquery_write

    _ensure(writing, Table("events", {**COLUMNS, "extra": S}))
    at = datetime(2026, 11, 21, 10, tzinfo=UTC)
    # Requests of a few rows each: the stream's offsets carry the batch across many.
    monkeypatch.setattr(bigquery_write, "MAX_REQUEST_BYTES", 2_000)
    writer = writing.api.writer()
    committed, recorded, ran = writer.commit, writing._commit, writing.api.run

    def dies(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("died")

    def dies_preparing(sql: str, *args: Any, **kwargs: Any) -> Any:
        if sql.startswith("INSERT INTO") and "_eventpipe_streams" in sql:
            raise RuntimeError("died")
        return ran(sql, *args, **kwargs)

    steps = [
        (writing.api, "run", dies_preparing),  # the stream written, not yet prepared
        (writer, "commit", dies),  # prepared, not committed (the rerun commits it)
        (writing, "_commit", dies),  # committed, not recorded (the rerun records it)
    ]
    for n, (obj, name, dying) in enumerate(steps):
        rows = [{"id": f"{n}-{i}", "n": i, "_timestamp": at} for i in range(300)]
        request = LoadRequest("events", f"b{n}", (_file(tmp_path / f"{n}.parquet", rows),),
                              COLUMNS)  # fmt: skip
        with monkeypatch.context() as patched:
            patched.setattr(obj, name, dying)
            with pytest.raises(RuntimeError, match="died"):
                writing.load(request)
        assert (writer.commit, writing._commit, writing.api.run) == (committed, recorded, ran)
        assert writing.load(request).rows == 300
        assert writing.load(request).already_loaded
    assert _rows(writing, "SELECT count(*), count(DISTINCT id), count(extra) FROM events") == [
        (900, 900, 0)
    ]
    assert _rows(writing, "SELECT min(_timestamp), sum(n) FROM events") == [(at, 3 * 44_850)]
    # A stream prepared for each batch: b1's, prepared before its run died, committed by
    # the rerun; b0's first stream, never prepared, was never committed.
    assert _rows(writing, "SELECT batch_id, rows FROM _eventpipe_streams ORDER BY 1") == [
        ("b0", 300), ("b1", 300), ("b2", 300),
    ]  # fmt: skip


def test_storage_write_converts_what_does_not_fit_and_leaves_out_what_does_not_convert(
    writing: BigQueryDestination, tmp_path: Path
) -> None:
    _ensure(writing, Table("mixed", COLUMNS))
    at = datetime(2026, 11, 21, 10, tzinfo=UTC)
    staged = pa.table({"id": ["a", "b"], "n": ["1", "two"], "_timestamp": [at, at]})
    file = tmp_path / "mixed.parquet"
    pq.write_table(staged, file)
    result = writing.load(LoadRequest("mixed", "b1", (file,), COLUMNS))
    assert (result.rows, [p for p, _ in result.rejected]) == (1, [1])
    assert _rows(writing, "SELECT id, n FROM mixed") == [("a", 1)]
