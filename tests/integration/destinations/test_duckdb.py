"""DuckDB only: what the conformance suite (test_conformance.py) does not cover."""

from __future__ import annotations

from pathlib import Path

import duckdb

from eventpipe.destinations.duckdb import DuckDBDestination
from eventpipe.schema.diff import Table, diff
from eventpipe.schema.types import DataType


def test_the_file_is_free_between_calls(tmp_path: Path) -> None:
    dest = DuckDBDestination("warehouse", tmp_path / "warehouse.duckdb", tmp_path / "locks")
    dest.patch(diff(None, Table("events", {"id": DataType.STRING})))
    other = duckdb.connect(str(dest.path))  # a user's own writing session
    other.execute("CREATE TABLE mine AS SELECT 1 AS x")
    other.close()
    assert dest.describe("mine") == Table("mine", {"x": DataType.INT64})
