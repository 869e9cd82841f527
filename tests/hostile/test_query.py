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


@pytest.fixture(params=["duckdb", "postgres", "parquet", "parquet-uri"])
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
