"""The pipeline's locks across hosts: with a PostgreSQL state store, two hosts that share
a data directory (here: two lock directories, as two hosts whose ``flock``s do not see
each other) still hold one pipeline and one patch of a table at a time, and a refused
process is told who holds the lock."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from eventpipe.config import Config
from eventpipe.locks import FileLocks
from eventpipe.processing.runtime.pipeline import PipelineBusyError, pipeline_lock
from eventpipe.state.locks import PostgresLocks, open_locks
from tests.conftest import make_config


def _hosts(dsn: str, schema: str, tmp_path: Path) -> tuple[PostgresLocks, PostgresLocks]:
    return (
        PostgresLocks(dsn, schema, FileLocks(tmp_path / "host-a")),
        PostgresLocks(dsn, schema, FileLocks(tmp_path / "host-b")),
    )


def _busy(holder: str) -> Exception:
    return RuntimeError(f"held by {holder}")


def test_a_lock_held_on_one_host_is_refused_on_another_naming_its_holder(
    postgres_dsn: str, tmp_path: Path
) -> None:
    a, b = _hosts(postgres_dsn, "store_one", tmp_path)
    with a.holding("pipeline", _busy):
        with pytest.raises(RuntimeError) as refused, b.holding("pipeline", _busy):
            pytest.fail("two hosts held the pipeline lock")
        assert str(refused.value) == f"held by pid {os.getpid()} on {socket.gethostname()}"
        with b.holding("stream.dst=web", _busy):  # another name is another lock
            pass
        other_store = PostgresLocks(postgres_dsn, "store_two", FileLocks(tmp_path / "c"))
        with other_store.holding("pipeline", _busy):  # another store's data directory
            pass
    with b.holding("pipeline", _busy):  # let go when the block ended
        pass


def test_a_lock_goes_with_its_holder_when_the_connection_ends(
    postgres_dsn: str, tmp_path: Path
) -> None:
    import psycopg

    a, b = _hosts(postgres_dsn, "store_dies", tmp_path)
    held = a.holding("pipeline", _busy)
    held.__enter__()
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:  # the holder's host is gone
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name LIKE 'eventpipe-lock pid %'"
        )
    deadline = time.monotonic() + 10
    while True:
        try:
            with b.holding("pipeline", _busy):
                break
        except RuntimeError:
            assert time.monotonic() < deadline, "the lock outlived its connection"
            time.sleep(0.1)
    held.__exit__(None, None, None)  # closing a connection the server ended is quiet


def test_patches_of_one_table_take_turns_across_hosts(postgres_dsn: str, tmp_path: Path) -> None:
    a, b = _hosts(postgres_dsn, "store_turns", tmp_path)
    inside: list[str] = []
    overlaps: list[str] = []

    def patch(locks: PostgresLocks, who: str) -> None:
        for _ in range(5):
            with locks.waiting("patch.dst=warehouse.table=events"):
                if inside:
                    overlaps.append(f"{who} entered while {inside[0]} held it")
                inside.append(who)
                time.sleep(0.02)
                inside.remove(who)

    threads = [threading.Thread(target=patch, args=(h, n)) for h, n in ((a, "a"), (b, "b"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert overlaps == []
    assert inside == []


def test_a_pipeline_on_another_host_is_busy(postgres_state: dict[str, str], tmp_path: Path) -> None:
    config: Config = make_config(tmp_path / "data", state=postgres_state)
    locks = open_locks(config)
    assert isinstance(locks, PostgresLocks)
    other_host = PostgresLocks(locks.dsn, locks.schema, FileLocks(tmp_path / "other-host"))
    busy = pytest.raises(PipelineBusyError, match=r"another pipeline \(pid \d+ on ")
    with other_host.holding("pipeline", _busy), busy, pipeline_lock(config):
        pytest.fail("the pipeline ran while another host's held the lock")
    with pipeline_lock(config):
        pass


def test_without_a_postgres_store_the_locks_are_files(tmp_path: Path) -> None:
    config: Any = make_config(tmp_path / "data")
    locks = open_locks(config)
    assert isinstance(locks, FileLocks)
    assert locks.directory == config.layout.locks


def test_a_lock_let_go_is_taken_at_once_by_another_host(postgres_dsn: str, tmp_path: Path) -> None:
    """A pipeline that dies in-process closes its lock connection; the server drops the
    lock as that backend exits, a moment after the client has gone. The next pipeline,
    started at once, takes the lock instead of being told that "?" holds it."""
    a, b = _hosts(postgres_dsn, "store_at_once", tmp_path)
    for _ in range(100):
        with a.holding("pipeline", _busy):
            pass
        with b.holding("pipeline", _busy):
            pass
