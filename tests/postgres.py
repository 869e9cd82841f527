"""A throwaway PostgreSQL server for the tests: Debian's binaries, a cluster in a temporary
directory, listening on 127.0.0.1 only, on a free port, trusting local connections, with
logical decoding on (``wal_level = logical``; Debian's wal2json plugin).

``initdb`` refuses to run as root, so as root the server runs as the ``postgres`` user
(Debian's package creates it); as anyone else, as that user. `make test` installs the
package (scripts/ensure-apt.sh postgresql). Stopped and removed when the tests end.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.process import free_port


def _bindir() -> Path:
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    if not versions:
        raise RuntimeError("PostgreSQL is not installed: run `make test` (it installs it)")
    return versions[-1].parent


def _as_owner(command: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


class PostgresServer:
    """One cluster in a temporary directory; ``stop()`` and ``start()`` it again (a
    destination that goes away and comes back), ``remove()`` at the end."""

    def __init__(self) -> None:
        self.bindir = _bindir()
        self.root = Path(tempfile.mkdtemp(prefix="eventpipe-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self._pg(["initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                  "--encoding=UTF8", "--locale=C.UTF-8", "--no-sync"])  # fmt: skip

    def _pg(self, command: list[str], check: bool = True) -> None:
        subprocess.run(_as_owner([str(self.bindir / command[0]), *command[1:]]), check=check,
                       capture_output=True, cwd=self.root)  # fmt: skip

    def start(self) -> None:
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={self.port} "
            f"-c unix_socket_directories={self.root}"
            " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            # Change data capture (sources/postgres/) reads logical replication slots.
            " -c wal_level=logical -c max_replication_slots=20 -c max_wal_senders=20"
        )
        self._pg(["pg_ctl", "-D", str(self.data), "-o", options, "-l",
                  str(self.root / "server.log"), "-w", "-t", "60", "start"])  # fmt: skip
        _wait(self.dsn)

    def stop(self, mode: str = "fast") -> None:
        """Stop: ``fast`` cuts the connections and writes what is committed (the
        server runs with synchronous_commit off: ``immediate`` may lose the last commits,
        as a crash of such a server would)."""
        self._pg(["pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop"], check=False)

    def remove(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


@contextmanager
def postgres_server() -> Iterator[str]:
    """Start a server; yield the DSN of its ``postgres`` database (superuser ``postgres``)."""
    server = PostgresServer()
    try:
        server.start()
        yield server.dsn
    finally:
        server.remove()


def _wait(dsn: str, timeout: float = 30) -> None:
    import psycopg

    deadline = time.monotonic() + timeout
    while True:
        try:
            psycopg.connect(dsn, connect_timeout=2).close()
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
