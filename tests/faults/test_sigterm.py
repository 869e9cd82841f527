"""SIGTERM to `eventpipe process`: a load under way gets `shutdown_grace_seconds` to
finish and record its progress; past the grace the process stops anyway, and the next
run completes the work, loading nothing twice."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from eventpipe.state.store import StateStore
from tests.process import EVENTPIPE, _env, write_config

SEGMENT = "incoming.tok=web-2026-11-21T10-00-00.000.log"


@pytest.fixture
def table(postgres_dsn: str, postgres_schema: str) -> str:
    """The events table, made beforehand so that the test can lock it."""
    name = f'"{postgres_schema}".events'
    with psycopg.connect(postgres_dsn, autocommit=True) as db:
        db.execute(f'CREATE SCHEMA "{postgres_schema}"')
        db.execute(f"CREATE TABLE {name} (event_id text, n bigint)")
    return name


def _setup(tmp_path: Path, dsn: str, schema: str, grace: float) -> tuple[Path, Path]:
    data = tmp_path / "data"
    (data / "incoming").mkdir(parents=True)
    lines = [orjson.dumps({"event_id": f"e{i}", "n": i}) for i in range(50)]
    (data / "incoming" / SEGMENT).write_bytes(b"\n".join(lines) + b"\n")
    config = write_config(
        tmp_path / "eventpipe.yaml", data, 0,
        destinations={"pg": {"type": "postgres", "dsn": dsn, "schema": schema}},
        processing={"batch_period_seconds": 3600, "shutdown_grace_seconds": grace},
        spark={"master": "local[1]", "spark.sql.shuffle.partitions": 1},
    )  # fmt: skip
    return config, data


def _start(config: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:  # the child keeps its own handle
        return subprocess.Popen([*EVENTPIPE, "process", "-c", str(config)], env=_env(),
                                stdout=out, stderr=subprocess.STDOUT)  # fmt: skip


def _wait_for_blocked_load(dsn: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Until the pipeline's load waits for the test's lock on the table."""
    deadline = time.monotonic() + 240
    with psycopg.connect(dsn, autocommit=True) as db:
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            waiting = db.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            ).fetchone()
            if waiting and waiting[0]:
                return
            time.sleep(0.2)


@contextmanager
def _blocked_load(
    dsn: str, table: str, config: Path, log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """`eventpipe process` started while the test holds a lock on ``table``; yields it
    once its load waits for the lock, which is released on leaving."""
    with psycopg.connect(dsn) as holder:
        holder.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        proc = _start(config, log)
        _wait_for_blocked_load(dsn, proc, log)
        yield proc


def _rows(dsn: str, table: str) -> list[Any]:
    with psycopg.connect(dsn) as db:
        return db.execute(f"SELECT event_id, count(*) FROM {table} GROUP BY 1").fetchall()


def test_a_load_under_way_finishes_within_the_grace(
    tmp_path: Path, postgres_dsn: str, postgres_schema: str, table: str
) -> None:
    config, data = _setup(tmp_path, postgres_dsn, postgres_schema, grace=60)
    log = tmp_path / "process.log"
    with _blocked_load(postgres_dsn, table, config, log) as proc:
        proc.send_signal(signal.SIGTERM)
        time.sleep(2)
        assert proc.poll() is None  # waiting for its load, not killed
    # The lock is released (the transaction ends): the load finishes, then the process.
    assert proc.wait(60) == 0, log.read_text()[-3000:]
    assert sorted(_rows(postgres_dsn, table)) == sorted((f"e{i}", 1) for i in range(50))
    store = StateStore(data / "state.sqlite")
    assert store.table_ok([SEGMENT], "pg", "events")  # the progress was recorded
    assert store.unfinished_runs() == []
    assert "loads under way get up to 60 s to finish" in log.read_text()


def test_past_the_grace_it_stops_and_the_next_run_completes(
    tmp_path: Path, postgres_dsn: str, postgres_schema: str, table: str
) -> None:
    config, data = _setup(tmp_path, postgres_dsn, postgres_schema, grace=2)
    log = tmp_path / "process.log"
    with _blocked_load(postgres_dsn, table, config, log) as proc:
        stopped = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        waited = time.monotonic() - stopped
    assert code == 143  # as killed by SIGTERM
    assert waited >= 2  # it gave the load its grace first
    assert "still busy after 2 s: exiting" in log.read_text()
    assert _rows(postgres_dsn, table) == []
    assert len(StateStore(data / "state.sqlite").unfinished_runs()) == 1
    again = subprocess.run([*EVENTPIPE, "process", "--once", "-c", str(config)], env=_env(),
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed" in again.stdout
    assert sorted(_rows(postgres_dsn, table)) == sorted((f"e{i}", 1) for i in range(50))
