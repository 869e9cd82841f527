"""A real Spark standalone cluster for the tests of this directory: a master and two
workers of one core, started with pyspark's own ``spark-class`` (nothing downloaded).

Each worker runs in a mount namespace of its own (``unshare -m``) whose ``/tmp`` is an
empty tmpfs: the driver's private files (pytest's temporary directories, the driver's
Spark scratch space) do not exist for executors, as on separate machines. What both
see is what a cluster shares: ``/var/tmp`` (the data directory of these tests, as a
network volume would be mounted everywhere), the installed Python and eventpipe's
source. The jobs are run as a user would, by ``eventpipe`` commands in processes of
their own, since this test process's Spark session is a local one.

If ``unshare`` cannot make the namespaces (it needs root or CAP_SYS_ADMIN), the tests
fail saying so.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyspark
import pytest

SPARK_HOME = Path(pyspark.__file__).parent
SRC = Path(__file__).resolve().parents[2] / "src"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Cluster:
    master: str
    """``spark://127.0.0.1:<port>``"""
    ui: str
    workers: list[subprocess.Popen[bytes]]
    logs: Path

    def spark_settings(self) -> dict[str, object]:
        """The ``spark:`` section of a config that runs on this cluster."""
        return {
            "master": self.master,
            "spark.executor.cores": 1,
            "spark.executor.memory": "768m",
            "spark.cores.max": 2,
            "sql.shuffle.partitions": 2,
            # Executors read each other's shuffle files over the network, as on separate
            # machines: all of these are "127.0.0.1", and Spark would otherwise open a
            # same-host executor's files directly, which its own /tmp hides.
            "spark.shuffle.readHostLocalDisk": False,
        }

    def _state(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.ui + "/json/", timeout=5) as answer:
            return dict(json.load(answer))

    def alive_workers(self) -> int:
        return int(self._state().get("aliveworkers", 0))

    def wait_for_workers(self, count: int, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.alive_workers() == count:
                    return
            except OSError:
                pass
            assert time.monotonic() < deadline, (
                f"{count} workers did not come up: {(self.logs / 'master.log').read_text()[-2000:]}"
            )
            time.sleep(0.5)

    def kill_worker(self, n: int) -> None:
        """SIGKILL to worker ``n`` and its executors (one process group), as a machine
        that dies."""
        os.killpg(self.workers[n].pid, signal.SIGKILL)
        self.workers[n].wait()

    def restart_worker(self, n: int) -> None:
        self.workers[n] = start_worker(self.master, self.logs, n)

    def finished_apps(self) -> list[str]:
        """The names of the applications that ran on the cluster and ended."""
        return [app["name"] for app in self._state().get("completedapps", [])]


def _env() -> dict[str, str]:
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_NO_DAEMONIZE": "1"}
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _in_own_tmp(command: list[str]) -> list[str]:
    """``command`` in a mount namespace of its own, under an empty tmpfs on /tmp."""
    script = 'mount -t tmpfs tmpfs /tmp && exec "$@"'
    return ["unshare", "-m", "--", "sh", "-c", script, "sh", *command]


def start_worker(master: str, logs: Path, n: int) -> subprocess.Popen[bytes]:
    command = [
        str(SPARK_HOME / "bin/spark-class"), "org.apache.spark.deploy.worker.Worker",
        "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
        "--work-dir", "/tmp/spark-work", "--webui-port", str(_free_port()), master,
    ]  # fmt: skip
    env = {**_env(), "SPARK_LOCAL_DIRS": "/tmp/spark-local"}
    with (logs / f"worker-{n}.log").open("ab") as out:
        return subprocess.Popen(_in_own_tmp(command), env=env, stdout=out, stderr=out,
                                start_new_session=True)  # fmt: skip


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    probe = subprocess.run(["unshare", "-m", "--", "sh", "-c", "mount -t tmpfs tmpfs /tmp"],
                           capture_output=True, text=True)  # fmt: skip
    assert probe.returncode == 0, (
        "the cluster's workers run in mount namespaces of their own, and `unshare -m` "
        f"cannot make one here (it needs root or CAP_SYS_ADMIN): {probe.stderr.strip()}"
    )
    logs = tmp_path_factory.mktemp("cluster-logs")
    port, ui_port = _free_port(), _free_port()
    master_command = [
        str(SPARK_HOME / "bin/spark-class"), "org.apache.spark.deploy.master.Master",
        "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui_port),
    ]  # fmt: skip
    with (logs / "master.log").open("ab") as out:
        master = subprocess.Popen(master_command, env=_env(), stdout=out, stderr=out,
                                  start_new_session=True)  # fmt: skip
    url = f"spark://127.0.0.1:{port}"
    found = Cluster(url, f"http://127.0.0.1:{ui_port}", [], logs)
    try:
        found.workers = [start_worker(url, logs, n) for n in range(2)]
        found.wait_for_workers(2)
        yield found
    finally:
        for process in [*found.workers, master]:
            if process.poll() is None:
                os.killpg(process.pid, 15)
        for process in [*found.workers, master]:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, 9)
                process.wait()


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every node sees (``/var/tmp``, outside the workers' own ``/tmp``)."""
    path = Path("/var/tmp") / f"eventpipe-cluster-{uuid.uuid4().hex[:10]}"
    path.mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)
