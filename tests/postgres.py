"""A throwaway PostgreSQL server for the tests: Debian's binaries, a cluster in a temporary
directory, listening on 127.0.0.1 only, on a free port, trusting local connections.

``initdb`` refuses to run as root, so as root the server runs as the ``postgres`` user
(Debian's package creates it); as anyone else, as that user. `make test` installs the
package (scripts/ensure-apt.sh postgresql). Stopped and removed when the tests end.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _bindir() -> Path:
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    if not versions:
        raise RuntimeError("PostgreSQL is not installed: run `make test` (it installs it)")
    return versions[-1].parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_owner(command: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


@contextmanager
def postgres_server() -> Iterator[str]:
    """Start a server; yield the DSN of its ``postgres`` database (superuser ``postgres``)."""
    bindir = _bindir()
    root = Path(tempfile.mkdtemp(prefix="eventpipe-pg-"))
    data = root / "data"
    port = _free_port()
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    try:
        subprocess.run(
            _as_owner([str(bindir / "initdb"), "-D", str(data), "-U", "postgres",
                       "--auth=trust", "--encoding=UTF8", "--locale=C.UTF-8", "--no-sync"]),
            check=True, capture_output=True, cwd=root,
        )  # fmt: skip
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={root}"
            " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        subprocess.run(
            _as_owner([str(bindir / "pg_ctl"), "-D", str(data), "-o", options,
                       "-l", str(root / "server.log"), "-w", "-t", "60", "start"]),
            check=True, capture_output=True, cwd=root,
        )  # fmt: skip
        dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        _wait(dsn)
        yield dsn
    finally:
        subprocess.run(
            _as_owner([str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]),
            capture_output=True, cwd=root,
        )  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)


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
