"""A real Spark standalone cluster on this machine: a master and workers of one core,
started with pyspark's own ``spark-class`` (nothing downloaded). Used by tests/cluster
and bench/cluster.py.

Each worker runs in a mount namespace of its own (``unshare -m``) whose ``/tmp`` is an
empty tmpfs: the driver's private files (pytest's temporary directories, the driver's
Spark scratch space) do not exist for executors, as on separate machines. What all see
is what a cluster shares: ``/var/tmp`` (where the data directory goes, as a network
volume would be mounted everywhere), the installed Python and eventpipe's source.

``unshare`` needs root or CAP_SYS_ADMIN: without, :func:`standalone_cluster` fails
saying so.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyspark

SPARK_HOME = Path(pyspark.__file__).parent
ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Cluster:
    master: str
    """``spark://127.0.0.1:<port>``"""
    ui: str
    logs: Path
    worker_memory: str = "1g"
    executor_java_options: str = ""
    """Given to the executors of every app that runs here (``spark_settings``)."""
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def spark_settings(self, executor_memory: str = "768m") -> dict[str, object]:
        """The ``spark:`` section of a config that runs on this cluster."""
        settings: dict[str, object] = {
            "master": self.master,
            "spark.executor.cores": 1,
            "spark.executor.memory": executor_memory,
            "spark.cores.max": len(self.workers),
            "sql.shuffle.partitions": 2,
            # Executors read each other's shuffle files over the network, as on separate
            # machines: all of these are "127.0.0.1", and Spark would otherwise open a
            # same-host executor's files directly, which its own /tmp hides.
            "spark.shuffle.readHostLocalDisk": False,
        }
        if self.executor_java_options:
            settings["spark.executor.extraJavaOptions"] = self.executor_java_options
        return settings

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
            if time.monotonic() > deadline:
                master_log = (self.logs / "master.log").read_text()[-2000:]
                raise RuntimeError(f"{count} workers did not come up: {master_log}")
            time.sleep(0.2)

    def start_worker(self, n: int) -> None:
        """Worker ``n`` (started again if it was)."""
        command = [
            str(SPARK_HOME / "bin/spark-class"), "org.apache.spark.deploy.worker.Worker",
            "--host", "127.0.0.1", "--cores", "1", "--memory", self.worker_memory,
            "--work-dir", "/tmp/spark-work", "--webui-port", str(_free_port()), self.master,
        ]  # fmt: skip
        env = {**spark_env(), "SPARK_LOCAL_DIRS": "/tmp/spark-local"}
        with (self.logs / f"worker-{n}.log").open("ab") as out:
            process = subprocess.Popen(_in_own_tmp(command), env=env, stdout=out, stderr=out,
                                       start_new_session=True)  # fmt: skip
        if n < len(self.workers):
            self.workers[n] = process
        else:
            self.workers.append(process)

    def kill_worker(self, n: int) -> None:
        """SIGKILL to worker ``n`` and its executors (one process group), as a machine
        that dies."""
        os.killpg(self.workers[n].pid, signal.SIGKILL)
        self.workers[n].wait()

    def finished_apps(self) -> list[str]:
        """The names of the applications that ran on the cluster and ended."""
        return [app["name"] for app in self._state().get("completedapps", [])]


def spark_env() -> dict[str, str]:
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_NO_DAEMONIZE": "1"}
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _in_own_tmp(command: list[str]) -> list[str]:
    """``command`` in a mount namespace of its own, under an empty tmpfs on /tmp."""
    script = f'{empty_tmp()} && exec "$@"'
    return ["unshare", "-m", "--", "sh", "-c", script, "sh", *command]


def empty_tmp() -> str:
    """Shell commands, for a mount namespace of their own, that put an empty tmpfs on /tmp
    as a separate machine has, but keep what every host has even when it lives under
    /tmp: this checkout (its source and virtualenv) and the running Python. Each such
    directory is opened first and mounted back from that descriptor over the empty /tmp
    (a checkout under /tmp used to vanish from the simulated hosts)."""
    under_tmp = [p for p in (ROOT, Path(sys.prefix), Path(sys.base_prefix),
                             Path(sys.executable).resolve().parent)
                 if p.resolve().is_relative_to("/tmp")]  # fmt: skip
    keep: list[Path] = []
    for path in sorted({p.resolve() for p in under_tmp}, key=lambda p: len(p.parts)):
        if not any(path.is_relative_to(k) for k in keep):
            keep.append(path)
    fds = range(3, 3 + len(keep))
    opened = " ".join(f"{fd}<{shlex.quote(str(path))}" for fd, path in zip(fds, keep, strict=True))
    steps = [f"exec {opened}"] if keep else []
    steps.append("mount -t tmpfs tmpfs /tmp")
    for fd, path in zip(fds, keep, strict=True):
        quoted = shlex.quote(str(path))
        steps.append(f"mkdir -p {quoted} && mount --no-canonicalize --bind /proc/self/fd/{fd} "
                     f"{quoted}")  # fmt: skip
    if keep:
        steps.append("exec " + " ".join(f"{fd}<&-" for fd in fds))
    return " && ".join(steps)


def check_namespaces() -> None:
    probe = subprocess.run(["unshare", "-m", "--", "sh", "-c", "mount -t tmpfs tmpfs /tmp"],
                           capture_output=True, text=True)  # fmt: skip
    if probe.returncode != 0:
        raise RuntimeError(
            "the cluster's workers run in mount namespaces of their own, and `unshare -m` "
            f"cannot make one here (it needs root or CAP_SYS_ADMIN): {probe.stderr.strip()}"
        )


@contextmanager
def standalone_cluster(
    logs: Path, workers: int = 2, worker_memory: str = "1g", executor_java_options: str = ""
) -> Iterator[Cluster]:
    """A master and ``workers`` one-core workers, up; stopped when the block ends. The
    master and workers are JVMs of this process's environment (``SPARK_DAEMON_JAVA_OPTS``
    is theirs)."""
    check_namespaces()
    port, ui_port = _free_port(), _free_port()
    master_command = [
        str(SPARK_HOME / "bin/spark-class"), "org.apache.spark.deploy.master.Master",
        "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui_port),
    ]  # fmt: skip
    with (logs / "master.log").open("ab") as out:
        master = subprocess.Popen(master_command, env=spark_env(), stdout=out, stderr=out,
                                  start_new_session=True)  # fmt: skip
    found = Cluster(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui_port}", logs,
                    worker_memory, executor_java_options)  # fmt: skip
    try:
        for n in range(workers):
            found.start_worker(n)
        found.wait_for_workers(workers)
        yield found
    finally:
        for process in [*found.workers, master]:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in [*found.workers, master]:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
