"""The pipeline's locks across hosts: PostgreSQL advisory locks when the state store is
PostgreSQL (``state: {type: postgres}``), ``flock``s in the data directory otherwise.

Hosts that share a data directory over NFS, EFS or CephFS cannot rely on ``flock``
there: some file systems keep such locks per client, some drop them when a client
reconnects. The state store they share is a PostgreSQL server, whose advisory locks
hold for every session that asks, on whatever host. Each lock is also taken as a file
lock first, so processes of one host still see each other's pid at once.

A session-level advisory lock is held by its connection: it goes when the process
dies, and also if the connection drops (the server ends the session: a network cut of
longer than TCP keepalive, ``pg_terminate_backend``). The connection is opened with
keepalives on, and the holder's pid and host are its ``application_name``, which is how
a refused process learns who holds the lock.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

from eventpipe.config import Config
from eventpipe.errors import TransientError, first_line
from eventpipe.locks import Busy, FileLocks, Locks

if TYPE_CHECKING:
    import psycopg

LET_GO_SECONDS = 5.0
"""How long a refused lock is asked for again while no live session is seen holding it."""

APPLICATION = "eventpipe-lock"
"""The start of a lock connection's ``application_name``; pid and host follow."""


def open_locks(config: Config) -> Locks:
    """The locks of ``config``'s data directory: advisory locks in the PostgreSQL state
    store when there is one, file locks under ``data_dir/locks`` otherwise."""
    files = FileLocks(config.layout.locks)
    if config.state.type == "postgres":
        assert config.state.dsn is not None  # the config checked it
        return PostgresLocks(config.state.dsn, config.state.db_schema, files)
    return files


class PostgresLocks:
    """:class:`~eventpipe.locks.Locks` as session-level advisory locks, keyed by the
    state store's schema (two stores on one server never share a lock) and the name."""

    def __init__(self, dsn: str, schema: str, files: FileLocks) -> None:
        self.dsn = dsn
        self.schema = schema
        self.files = files

    def key(self, name: str) -> str:
        return f"eventpipe:lock:{self.schema}:{name}"

    @contextmanager
    def holding(self, name: str, busy: Busy) -> Iterator[None]:
        with self.files.holding(name, busy), self._connect() as db:
            key = self.key(name)
            deadline = time.monotonic() + LET_GO_SECONDS
            while not _one(db, "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", key)[0]:
                holder = _holder(db, key)
                # "?": the holder let go between the two queries, or its session is
                # ending (a closed connection's backend drops its locks as it exits,
                # after the client has gone): ask again, for a moment.
                if holder != "?" or time.monotonic() > deadline:
                    raise busy(holder)
                time.sleep(0.05)
            try:
                yield
            finally:
                # Let go now: a closed connection's backend drops its locks only as it
                # exits, after the client has gone, and a process that takes the lock
                # right after this one would find it still held, by a named holder.
                # (A process that dies lets go when its connection closes.)
                with contextlib.suppress(Exception):
                    _one(db, "SELECT pg_advisory_unlock(hashtextextended(%s, 0))", key)

    @contextmanager
    def waiting(self, name: str) -> Iterator[None]:
        with self.files.waiting(name), self._connect() as db:
            _one(db, "SELECT pg_advisory_lock(hashtextextended(%s, 0))", self.key(name))
            yield

    def _connect(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        import psycopg

        from eventpipe.errors import redacted

        try:
            return psycopg.connect(
                self.dsn,
                autocommit=True,
                connect_timeout=10,
                application_name=f"{APPLICATION} pid {os.getpid()} on {socket.gethostname()}",
                keepalives=1,
                keepalives_idle=30,
                keepalives_interval=10,
                keepalives_count=3,
            )
        except psycopg.OperationalError as exc:
            raise TransientError(
                f"locks in the state store {redacted(self.dsn)}: cannot connect: {first_line(exc)}",
                fix="check that the server is up and state.dsn is right",
            ) from None


def _one(db: psycopg.Connection[Any], sql: str, *params: Any) -> tuple[Any, ...]:
    row = db.execute(sql, params).fetchone()
    assert row is not None
    return tuple(row)


def _holder(db: psycopg.Connection[Any], key: str) -> str:
    """Who holds the advisory lock ``key``: ``pid 42 on host b`` from its connection's
    name, or ``?`` if it let go meanwhile. pg_locks splits the 64-bit key in two oids."""
    row = db.execute(
        "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
        "AND ((l.classid::bigint << 32) | l.objid::bigint) = hashtextextended(%s, 0)",
        [key],
    ).fetchone()
    if row is None:
        return "?"
    holder = str(row[0])
    return holder.removeprefix(APPLICATION).strip() or "?"
