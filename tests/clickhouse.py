"""A throwaway ClickHouse server for the tests: Debian's ``clickhouse-server``, with a
config of its own in a temporary directory, listening on 127.0.0.1 only, on free ports,
as an ordinary server a user runs. Two users: ``default`` with a password made for the
run, and ``reader`` in a read-only profile. `make test` installs the package
(scripts/ensure-apt.sh clickhouse-server). Stopped and removed when the tests end.

:class:`ClickHouseCluster`: Debian's ZooKeeper and two such servers, the replicas of the
one shard of a cluster ``events``.
"""

from __future__ import annotations

import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.process import free_port, stop, wait_answering

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
{extra}
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

    user = "default"
    cluster: str | None = None

    def __init__(self, password: str | None = None, users: str = USERS) -> None:
        if not Path(SERVER).is_file():
            raise RuntimeError("ClickHouse is not installed: run `make test` (it installs it)")
        self.root = Path(tempfile.mkdtemp(prefix="eventpipe-ch-"))
        self.http_port, self.tcp_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.http_port}"
        self.password = password or secrets.token_hex(12)
        (self.root / "users.xml").write_text(users.format(password=self.password))
        self.configure()
        self._process: subprocess.Popen[bytes] | None = None

    def configure(self, extra: str = "") -> None:
        """The server's config, with ``extra`` elements (a cluster's)."""
        values = {"root": self.root, "http_port": self.http_port, "tcp_port": self.tcp_port}
        (self.root / "config.xml").write_text(CONFIG.format(**values, extra=extra))

    def start(self, timeout: float = 30.0) -> None:
        with (self.root / "server.log").open("ab") as log:  # the server keeps its own copy
            self._process = subprocess.Popen(
                [SERVER, f"--config-file={self.root / 'config.xml'}"],
                stdout=log, stderr=log, cwd=self.root,
            )  # fmt: skip
        wait_answering(self._process, self.url + "/ping", "clickhouse-server",
                       self.root / "server.log", timeout)  # fmt: skip

    def stop(self) -> None:
        stop(self._process)
        self._process = None

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


ZOOKEEPER_JAR = "/usr/share/java/zookeeper.jar"
"""Debian's ``zookeeper`` package (`make test` installs it with the server)."""

CLUSTER_USERS = """<?xml version="1.0"?>
<yandex>
  <profiles><default/></profiles>
  <users>
    <default><password></password><networks><ip>127.0.0.1</ip></networks>
      <profile>default</profile><quota>default</quota></default>
    <loader><password>{password}</password><networks><ip>127.0.0.1</ip></networks>
      <profile>default</profile><quota>default</quota></loader>
  </users>
  <quotas><default/></quotas>
</yandex>
"""
"""A cluster's users: ``loader`` (eventpipe's, with a password) and ``default`` without
one, as the replicas of servers before 20.x reach each other (they send OPTIMIZE and
DROP PARTITION to the leader replica as ``default`` with no password)."""

CLUSTER = """
  <zookeeper><node><host>127.0.0.1</host><port>{zookeeper}</port></node></zookeeper>
  <distributed_ddl><path>/clickhouse/task_queue/ddl</path></distributed_ddl>
  <interserver_http_host>127.0.0.1</interserver_http_host>
  <interserver_http_port>{interserver}</interserver_http_port>
  <macros><shard>01</shard><replica>{replica}</replica></macros>
  <remote_servers>
    <events><shard><internal_replication>true</internal_replication>{replicas}</shard></events>
    <two_shards><shard>{first}</shard><shard>{second}</shard></two_shards>
  </remote_servers>
"""


class ZooKeeper:
    """Debian's ZooKeeper, standalone, in ``root``, on a free port of 127.0.0.1."""

    def __init__(self, root: Path) -> None:
        if not Path(ZOOKEEPER_JAR).is_file():
            raise RuntimeError("ZooKeeper is not installed: run `make test` (it installs it)")
        self.root = root
        self.port = free_port()
        (root / "data").mkdir(parents=True)
        (root / "zoo.cfg").write_text(
            f"tickTime=500\ndataDir={root / 'data'}\nclientPort={self.port}\n"
            "clientPortAddress=127.0.0.1\nadmin.enableServer=false\n"
        )
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> None:
        java = shutil.which("java") or "java"
        with (self.root / "zookeeper.log").open("ab") as log:
            self._process = subprocess.Popen(
                [java, "-Xmx128m", "-cp", ZOOKEEPER_JAR,
                 "org.apache.zookeeper.server.ZooKeeperServerMain", str(self.root / "zoo.cfg")],
                stdout=log, stderr=log, cwd=self.root,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"ZooKeeper exited: {(self.root / 'zookeeper.log').read_text()}")
            if b"Mode: standalone" in self._ask(b"srvr"):
                return
            time.sleep(0.2)
        raise RuntimeError(f"ZooKeeper did not answer on port {self.port} in {timeout:g} s")

    def _ask(self, word: bytes) -> bytes:
        """ZooKeeper's four-letter answer to ``word``; empty while it is not up."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(word)
                return sock.recv(4096)
        except OSError:
            return b""

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()


class ClickHouseCluster:
    """Two Debian servers, the replicas of cluster ``events`` (one shard), meeting in a
    ZooKeeper of their own; their config also names ``two_shards`` (each server a shard),
    a cluster eventpipe refuses. eventpipe loads as ``loader`` (``password``)."""

    cluster = "events"
    user = "loader"

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="eventpipe-chc-"))
        self.zookeeper = ZooKeeper(self.root / "zookeeper")
        self.password = secrets.token_hex(12)
        self.replicas = [ClickHouseServer(self.password, CLUSTER_USERS) for _ in range(2)]
        hosts = [f"<replica><host>127.0.0.1</host><port>{r.tcp_port}</port></replica>"
                 for r in self.replicas]  # fmt: skip
        for number, replica in enumerate(self.replicas, 1):
            replica.configure(CLUSTER.format(
                zookeeper=self.zookeeper.port, interserver=free_port(), replica=f"r{number}",
                replicas="".join(hosts), first=hosts[0], second=hosts[1],
            ))  # fmt: skip
        self.url = self.replicas[0].url

    def start(self) -> None:
        self.zookeeper.start()
        for replica in self.replicas:
            replica.start()

    def remove(self) -> None:
        for replica in self.replicas:
            replica.remove()
        self.zookeeper.stop()
        shutil.rmtree(self.root, ignore_errors=True)
