"""A throwaway stand-in for Snowflake in the tests: fakesnow's server mode (``fakesnow
-s``, Snowflake's wire protocol over HTTP with DuckDB behind it), on a free port of
127.0.0.1, reached by the official connector as Snowflake is (``host``, ``port``,
``protocol: http``). It holds its databases in memory; :data:`DATABASE` is made at
start. What it does not do as Snowflake does is said in docs/destinations.md.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from tests.process import free_port, stop

DATABASE = "EVENTPIPE"


class SnowflakeServer:
    user = "loader"
    password = "fakesnow-takes-any"
    account = "eventpipe-test"

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="eventpipe-snow-"))
        self.port = free_port()
        self._process: subprocess.Popen[bytes] | None = None

    def settings(self, schema: str) -> dict[str, object]:
        """A ``type: snowflake`` destination's settings on this server."""
        return {"type": "snowflake", "account": self.account, "user": self.user,
                "password": self.password, "database": DATABASE, "schema": schema,
                "host": "127.0.0.1", "port": self.port, "protocol": "http"}  # fmt: skip

    def start(self, timeout: float = 60.0) -> None:
        import time

        import snowflake.connector

        fakesnow = Path(sys.executable).with_name("fakesnow")
        with (self.root / "server.log").open("ab") as log:
            self._process = subprocess.Popen(
                [str(fakesnow), "-s", "-p", str(self.port)], stdout=log, stderr=log,
                cwd=self.root,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while True:
            if self._process.poll() is not None:
                raise RuntimeError(f"fakesnow exited: {(self.root / 'server.log').read_text()}")
            try:
                with snowflake.connector.connect(
                    user=self.user, password=self.password, account=self.account,
                    host="127.0.0.1", port=self.port, protocol="http", login_timeout=5,
                ) as connection:  # fmt: skip
                    connection.cursor().execute(f"CREATE DATABASE IF NOT EXISTS {DATABASE}")
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)

    def remove(self) -> None:
        import shutil

        stop(self._process, timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)
