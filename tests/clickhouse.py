"""A throwaway ClickHouse server for the tests: Debian's ``clickhouse-server``, with a
config of its own in a temporary directory, listening on 127.0.0.1 only, on free ports,
as an ordinary server a user runs. Two users: ``default`` with a password made for the
run, and ``reader`` in a read-only profile. `make test` installs the package
(scripts/ensure-apt.sh clickhouse-server). Stopped and removed when the tests end.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.process import free_port, wait_answering

SERVER = "/usr/sbin/clickhouse-server"

CONFIG = """<?xml version="1.0"?>
<yandex>
  <logger><level>warning</level><console>1</console></logger>
  <listen_host>127.0.0.1</listen_host>
  <http_port>{http_port}</http_port>
  <tcp_port>{tcp_port}</tcp_port>
  <path>{root}/data/</path>
  <tmp_path>{root}/tmp/</tmp_path>
  <user_files_path>{root}/user_files/</user_files_path>
  <format_schema_path>{root}/format_schemas/</format_schema_path>
  <users_config>{root}/users.xml</users_config>
  <default_profile>default</default_profile>
  <default_database>default</default_database>
  <mark_cache_size>268435456</mark_cache_size>
  <timezone>UTC</timezone>
</yandex>
"""

USERS = """<?xml version="1.0"?>
<yandex>
  <profiles><default/><readonly><readonly>1</readonly></readonly></profiles>
  <users>
    <default><password>{password}</password><networks><ip>127.0.0.1</ip></networks>
      <profile>default</profile><quota>default</quota></default>
    <reader><password>{password}</password><networks><ip>127.0.0.1</ip></networks>
      <profile>readonly</profile><quota>default</quota></reader>
  </users>
  <quotas><default/></quotas>
</yandex>
"""


class ClickHouseServer:
    """One server in a temporary directory; ``stop()`` and ``start()`` it again (a
    destination that goes away and comes back), ``remove()`` at the end."""

    def __init__(self) -> None:
        if not Path(SERVER).is_file():
            raise RuntimeError("ClickHouse is not installed: run `make test` (it installs it)")
        self.root = Path(tempfile.mkdtemp(prefix="eventpipe-ch-"))
        self.http_port, self.tcp_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.http_port}"
        self.password = secrets.token_hex(12)
        values = {"root": self.root, "http_port": self.http_port, "tcp_port": self.tcp_port}
        (self.root / "config.xml").write_text(CONFIG.format(**values))
        (self.root / "users.xml").write_text(USERS.format(password=self.password))
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> None:
        with (self.root / "server.log").open("ab") as log:  # the server keeps its own copy
            self._process = subprocess.Popen(
                [SERVER, f"--config-file={self.root / 'config.xml'}"],
                stdout=log, stderr=log, cwd=self.root,
            )  # fmt: skip
        wait_answering(self._process, self.url + "/ping", "clickhouse-server",
                       self.root / "server.log", timeout)  # fmt: skip

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
