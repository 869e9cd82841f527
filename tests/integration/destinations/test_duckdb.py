"""DuckDB only: what the conformance suite (test_conformance.py) does not cover."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from eventpipe.destinations import duckdb as duckdb_destination
from eventpipe.destinations.duckdb import DuckDBDestination
from eventpipe.errors import TransientError
from eventpipe.locks import FileLocks
from eventpipe.schema.diff import Table, diff
from eventpipe.schema.types import DataType


def test_the_file_is_free_between_calls(tmp_path: Path) -> None:
    dest = DuckDBDestination(
        "warehouse", tmp_path / "warehouse.duckdb", FileLocks(tmp_path / "locks")
    )
    dest.patch(diff(None, Table("events", {"id": DataType.STRING})))
    other = duckdb.connect(str(dest.path))  # a user's own writing session
    other.execute("CREATE TABLE mine AS SELECT 1 AS x")
    other.close()
    assert dest.describe("mine") == Table("mine", {"x": DataType.INT64})


def _hold_read_only(path: Path, seconds: float) -> subprocess.Popen[bytes]:
    """Another process (a user's DuckDB session) holding ``path`` open read-only for
    ``seconds``; returns once it holds it."""
    script = (
        "import duckdb, sys, time\n"
        f"db = duckdb.connect({str(path)!r}, read_only=True)\n"
        "print('holding', flush=True)\n"
        f"time.sleep({seconds})\n"
        "db.close()\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    assert holder.stdout is not None
    with holder.stdout:
        assert holder.stdout.readline() == b"holding\n"
    return holder


def test_a_writer_waits_for_a_reader_to_let_go_of_the_file(tmp_path: Path) -> None:
    dest = DuckDBDestination(
        "warehouse", tmp_path / "warehouse.duckdb", FileLocks(tmp_path / "locks")
    )
    dest.patch(diff(None, Table("events", {"id": DataType.STRING})))
    holder = _hold_read_only(dest.path, 1.5)
    try:
        started = time.monotonic()
        dest.patch(
            diff(
                dest.describe("events"),
                Table("events", {"id": DataType.STRING, "n": DataType.INT64}),
            )
        )
        assert holder.poll() is not None  # it waited for the reader to close
    finally:
        holder.wait(10)
    assert time.monotonic() - started > 0.5
    assert dest.describe("events") == Table("events", {"id": DataType.STRING, "n": DataType.INT64})


def test_a_reader_that_holds_on_makes_the_write_fail_as_transient(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = DuckDBDestination(
        "warehouse", tmp_path / "warehouse.duckdb", FileLocks(tmp_path / "locks")
    )
    dest.patch(diff(None, Table("events", {"id": DataType.STRING})))
    monkeypatch.setattr(duckdb_destination, "lock_wait", lambda timeout: 0.3)
    holder = _hold_read_only(dest.path, 30)
    try:
        with pytest.raises(TransientError, match="Could not set lock") as failed:
            dest.describe("events")
        assert "readers included" in str(failed.value)
    finally:
        holder.kill()
        holder.wait(10)


def test_a_load_waits_for_readers_past_the_query_time_limit(tmp_path: Path) -> None:
    """An `eventpipe query` ends at query_timeout_seconds: a load waits longer than that."""
    from eventpipe.processing.runtime.pipeline import Runtime
    from tests.conftest import make_config

    config = make_config(tmp_path / "data", destinations={
        "slow": {"type": "duckdb", "query_timeout_seconds": 100},
        "quick": {"type": "duckdb", "path": str(tmp_path / "q.duckdb")},
    })  # fmt: skip
    for dest_id, wait in (("slow", 115.0), ("quick", 75.0)):
        opened = Runtime(config).open_destination(dest_id)
        assert isinstance(opened, DuckDBDestination)
        assert duckdb_destination.lock_wait(opened.query_timeout_seconds) == wait
    assert duckdb_destination.lock_wait(1) == duckdb_destination.LOCK_WAIT_SECONDS
