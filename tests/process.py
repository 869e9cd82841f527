"""Running `eventpipe` as a real process, as a user or an init system would."""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

EVENTPIPE = [sys.executable, "-m", "eventpipe.cli"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_config(path: Path, data_dir: Path, port: int, **extra: Any) -> Path:
    config: dict[str, Any] = {
        "data_dir": str(data_dir),
        "server": {"host": "127.0.0.1", "port": port, "shutdown_grace_seconds": 5},
        "api_keys": [{"id": "web", "js": "js-web-secret-1", "server": "s2s-web-secret-1"}],
        "logging": {"level": "info"},
    }
    for key, value in extra.items():
        config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
    path.write_text(yaml.safe_dump(config))
    return path


def gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie waiting for its parent counts)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def running_in_group(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` that have not exited (see ``gone``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            pid = int(entry.name)
            try:
                if os.getpgid(pid) == pgid and not gone(pid):
                    found.append(pid)
            except ProcessLookupError:
                continue
    return found


def wait_until_dead(pid: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not gone(pid):
        assert time.monotonic() < deadline, f"process {pid} still runs after {timeout} s"
        time.sleep(0.02)


def run(
    *args: str, cwd: Path | None = None, timeout: float = 60, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*EVENTPIPE, *args],
        input=input,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(),
    )


def wait_answering(
    proc: subprocess.Popen[bytes], url: str, what: str, log: Path, timeout: float
) -> None:
    """Until ``url`` answers 200; a RuntimeError with the end of ``log`` if ``proc``
    exits first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited: {log.read_text(errors='replace')[-2000:]}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not answer {url} in {timeout} s")


def stop(proc: subprocess.Popen[bytes] | None, timeout: float = 30) -> None:
    """Stop a server the tests started: SIGTERM, then SIGKILL after ``timeout`` s."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _env() -> dict[str, str]:
    src = str(Path(__file__).resolve().parents[1] / "src")
    return {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}


class CollectorProcess:
    """`eventpipe collect` in a child process (``-c CONFIG``, or built-in defaults in
    ``cwd``), its output kept in a file; ``wrap``: a command that runs it (``unshare``);
    ``env``: variables set for it beside the suite's."""

    def __init__(
        self,
        config: Path | None,
        port: int,
        log_path: Path,
        *,
        cwd: Path | None = None,
        command: str = "collect",
        wrap: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self._log = log_path.open("ab")
        args = ["-c", str(config)] if config else ["--port", str(port)]
        self.proc = subprocess.Popen(
            [*wrap, *EVENTPIPE, command, *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**_env(), **(env or {})},
            cwd=cwd,
            start_new_session=True,
        )
        _STARTED.append(self)

    def wait_ready(self, timeout: float = 30) -> None:
        wait_answering(self.proc, self.url + "/health", "collector", self.log_path, timeout)

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 30) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._log.close()

    def kill(self) -> None:
        """SIGKILL to the collector and its workers (its process group) at once."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self._log.close()


_STARTED: list[CollectorProcess] = []


@atexit.register
def kill_left_behind() -> None:
    """SIGKILL every CollectorProcess still running (and its workers): what a test that
    failed before stopping its processes left (after each module, and when pytest
    exits: they run in sessions of their own, out of the terminal's reach)."""
    left = [p for p in _STARTED if p.proc.poll() is None]
    _STARTED.clear()
    for process in left:
        process.kill()
