"""``eventpipe query`` is read-only for real: one query, no writes, no other files, on
every destination that has tables."""

from __future__ import annotations

from pathlib import Path

import pytest

from eventpipe.destinations.base import Destination, LoadRequest
from eventpipe.errors import QueryError
from eventpipe.schema.diff import Table, diff
from eventpipe.schema.types import DataType
from tests.integration.destinations.test_conformance import _destination, _parquet


@pytest.fixture(params=["duckdb", "postgres", "clickhouse", "parquet", "parquet-uri"])
def loaded(request: pytest.FixtureRequest, tmp_path: Path) -> Destination:
    dest = _destination(request.param, request, tmp_path)
    columns = {"n": DataType.INT64}
    dest.patch(diff(None, Table("events", columns)))
    rows = _parquet(tmp_path / "rows.parquet", [{"n": 1}, {"n": 2}])
    dest.load(LoadRequest("events", "b1", (rows,), columns))
    return dest


def test_a_query_reads(loaded: Destination) -> None:
    assert loaded.query("SELECT sum(n) AS total FROM events") == (["total"], [(3,)])


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 1; DELETE FROM events",
        "COMMIT; DELETE FROM events",
        "DELETE FROM events",
        "DROP TABLE events",
        "INSERT INTO events VALUES (9)",
        "CREATE TABLE x AS SELECT 1 AS a",
    ],
)
def test_writes_and_several_statements_are_refused(loaded: Destination, sql: str) -> None:
    with pytest.raises(QueryError):
        loaded.query(sql)
    assert loaded.query("SELECT count(*) FROM events")[1] == [(2,)]


@pytest.mark.parametrize(
    ("kinds", "sql"),
    [
        ({"duckdb", "parquet"}, "COPY (SELECT 1) TO '{tmp}/out.csv'"),
        ({"duckdb", "parquet"}, "SELECT * FROM read_csv('/etc/passwd')"),
        ({"duckdb", "parquet"}, "ATTACH '{tmp}/other.duckdb'"),
        ({"duckdb", "parquet"}, "SET enable_external_access = true"),
        ({"parquet-uri"}, "SELECT * FROM text.`/etc/passwd`"),
        ({"parquet-uri"}, "INSERT OVERWRITE DIRECTORY '{tmp}/out' SELECT 1"),
        ({"parquet-uri"}, "SELECT reflect('java.lang.System', 'getProperty', 'user.home')"),
        ({"parquet-uri"}, "SET spark.sql.runSQLOnFiles=true"),
    ],
)
def test_other_files_are_out_of_reach(
    loaded: Destination, request: pytest.FixtureRequest, tmp_path: Path, kinds: set[str], sql: str
) -> None:
    kind = request.node.callspec.params["loaded"]
    if kind not in kinds:
        return  # the statement is another engine's
    with pytest.raises(QueryError):
        loaded.query(sql.format(tmp=tmp_path))
    assert not (tmp_path / "out.csv").exists()
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "sql",
    [
        "COPY events TO '{tmp}/out.csv'",
        "COPY events TO PROGRAM 'touch {tmp}/out'",
        "SELECT query_to_xml('COPY events TO PROGRAM ''touch {tmp}/out''', true, true, '')",
        "SELECT pg_read_file('/etc/passwd')",
        "SELECT * FROM pg_ls_dir('.')",
        "SELECT lo_export(lo_import('/etc/passwd'), '{tmp}/out.csv')",
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity",
        "SELECT pg_catalog.PG_CANCEL_BACKEND(1)",
        "SELECT rolname, rolpassword FROM pg_authid",
        "SELECT passwd FROM pg_shadow",
        "SELECT set_config('default_transaction_read_only', 'off', false)",
        "SELECT pg_advisory_lock(1)",
        "WITH gone AS (DELETE FROM events RETURNING *) SELECT count(*) FROM gone",
        "SELECT * FROM events FOR UPDATE",
        "SELECT n INTO copied FROM events",
        "EXPLAIN ANALYZE DELETE FROM events",
        "DO $$ BEGIN PERFORM 1; END $$",
    ],
)
def test_postgres_queries_reach_no_file_program_session_or_secret(
    request: pytest.FixtureRequest, tmp_path: Path, sql: str
) -> None:
    """The test server's user is a superuser, for whom a read-only transaction alone
    lets every one of these run: the parse refuses them before they are sent."""
    dest = _destination("postgres", request, tmp_path)
    columns = {"n": DataType.INT64}
    dest.patch(diff(None, Table("events", columns)))
    dest.load(LoadRequest("events", "b1", (_parquet(tmp_path / "r.parquet", [{"n": 1}]),), columns))
    with pytest.raises(QueryError):
        dest.query(sql.format(tmp=tmp_path))
    assert not (tmp_path / "out.csv").exists()
    assert not (tmp_path / "out").exists()
    assert dest.query("SELECT count(*) FROM events")[1] == [(1,)]
    # Reads of the tables and of the catalog of the query's own tables still run.
    assert dest.query("SELECT pg_typeof(n)::text, n FROM events")[1] == [("bigint", 1)]
    assert dest.query("SHOW statement_timeout")[0] == ["statement_timeout"]


def test_a_postgres_query_runs_as_the_query_user(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """``query_dsn``: the query's user is another, whose rights are the fence."""
    import uuid

    import psycopg

    from eventpipe.destinations.postgres import PostgresDestination

    dsn = request.getfixturevalue("postgres_dsn")
    schema = request.getfixturevalue("postgres_schema")
    role = f"reader_{uuid.uuid4().hex[:8]}"
    writer = PostgresDestination("warehouse", dsn, schema)
    columns = {"n": DataType.INT64}
    writer.patch(diff(None, Table("events", columns)))
    writer.load(
        LoadRequest("events", "b1", (_parquet(tmp_path / "r.parquet", [{"n": 7}]),), columns)
    )
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'reader-secret'")
        db.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO {role}')
    try:
        query_dsn = psycopg.conninfo.make_conninfo(dsn, user=role, password="reader-secret")
        reader = PostgresDestination("warehouse", dsn, schema, query_dsn=query_dsn)
        with pytest.raises(QueryError, match="permission denied"):
            reader.query("SELECT n FROM events")
        with psycopg.connect(dsn, autocommit=True) as db:
            db.execute(f'GRANT SELECT ON "{schema}".events TO {role}')
        assert reader.query("SELECT current_user, n FROM events")[1] == [(role, 7)]
    finally:
        with psycopg.connect(dsn, autocommit=True) as db:
            db.execute(f'REVOKE ALL ON ALL TABLES IN SCHEMA "{schema}" FROM {role}')
            db.execute(f'REVOKE ALL ON SCHEMA "{schema}" FROM {role}')
            db.execute(f"DROP ROLE {role}")


_DUCKDB_LONG = "SELECT count(*) FROM range(1000000) a, range(1000000) b WHERE a.range + b.range = 7"
LONG_QUERIES = {
    "duckdb": _DUCKDB_LONG,
    "postgres": "SELECT count(*) FROM generate_series(1, 100000000000) g WHERE g % 7 = 8",
    "parquet": _DUCKDB_LONG,
    "parquet-uri": "SELECT count(*) FROM range(1000000000000) WHERE id % 7 = 8",
    "clickhouse": "SELECT count() FROM system.numbers WHERE number % 7 = 8",
}


def test_a_query_ends_at_its_timeout(loaded: Destination, request: pytest.FixtureRequest) -> None:
    kind = request.node.callspec.params["loaded"]
    with pytest.raises(QueryError, match=r"longer than query_timeout_seconds \(1\)"):
        loaded.query(LONG_QUERIES[kind], timeout_seconds=1)
    assert loaded.query("SELECT count(*) FROM events")[1] == [(2,)]


def test_a_table_change_waits_for_a_reader_a_bounded_time_then_tries_again(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader's lock (a dashboard holding a transaction open) makes one attempt of
    ALTER TABLE give up after lock_timeout_seconds; the change tries again until the
    reader is gone. A reader that never goes ends the change with a transient error
    (the run is retried), never a wait with every later load queued behind it."""
    import threading
    import time

    import psycopg

    from eventpipe.destinations.postgres import destination as postgres
    from eventpipe.errors import TransientError

    dsn = request.getfixturevalue("postgres_dsn")
    schema = request.getfixturevalue("postgres_schema")
    dest = postgres.PostgresDestination("warehouse", dsn, schema, lock_timeout_seconds=0.2)
    dest.patch(diff(None, Table("events", {"n": DataType.INT64})))
    reader = psycopg.connect(dsn)
    reader.execute(f'LOCK TABLE "{schema}".events IN ACCESS SHARE MODE')
    threading.Timer(1.5, reader.rollback).start()
    started = time.monotonic()
    dest.patch(
        diff(dest.describe("events"), Table("events", {"n": DataType.INT64, "m": DataType.STRING}))
    )
    assert time.monotonic() - started >= 1.0  # it waited for the reader, in attempts
    described = dest.describe("events")
    assert described is not None
    assert "m" in described.columns

    monkeypatch.setattr(postgres, "DDL_PATIENCE_SECONDS", 1.0)
    reader.execute(f'LOCK TABLE "{schema}".events IN ACCESS SHARE MODE')
    try:
        with pytest.raises(TransientError):
            dest.patch(diff(described, Table("events", {**described.columns, "k": DataType.BOOL})))
    finally:
        reader.close()
