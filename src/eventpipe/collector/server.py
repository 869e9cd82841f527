"""Running the collector: uvicorn (uvloop + httptools) around the app, with clean stops.

SIGTERM or Ctrl-C: uvicorn stops accepting connections and lets requests in flight finish
(up to ``server.shutdown_grace_seconds``); then the lifespan shutdown writes what is queued,
fsyncs, seals every active segment and releases the writer's lock.

Several workers (processes, ``server.workers``; started and supervised by service.py)
share one port: each listens on a socket of its own bound with ``SO_REUSEPORT``, and the
kernel spreads new connections over them. Nothing else may join them: the port is
claimed first (:func:`claim_port`), and a port something listens on already is refused.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import uvicorn

from eventpipe import __version__
from eventpipe.collector.app import BROWSER_PATH, Collector
from eventpipe.collector.asgi import create_app
from eventpipe.collector.protocol import limited_protocol
from eventpipe.config import ApiKey, Config, LoadedConfig, with_dev_keys
from eventpipe.errors import ConfigError

log = logging.getLogger("eventpipe.collector")


def prepare(loaded: LoadedConfig) -> tuple[Config, ApiKey | None]:
    """The config to serve with: embedded defaults get their development key pair."""
    config = loaded.config
    dev_key = None
    if loaded.embedded:
        config, dev_key = with_dev_keys(config)
    if not config.api_keys:
        raise ConfigError(
            f"api_keys: {loaded.source} configures no key, so no event could be accepted",
            fix="add one under api_keys: (see `eventpipe init`)",
        )
    return config, dev_key


def uvicorn_config(collector: Collector) -> uvicorn.Config:
    server = collector.config.server
    return uvicorn.Config(
        create_app(collector),
        host=server.host,
        port=server.port,
        loop="uvloop",
        http=limited_protocol(server.max_header_bytes, server.header_timeout_seconds),
        limit_concurrency=server.max_connections,
        lifespan="on",
        # X-Forwarded-For is honoured by our own code, only from server.trusted_proxies;
        # uvicorn's own proxy handling would trust 127.0.0.1 by default.
        proxy_headers=False,
        server_header=False,
        access_log=False,
        log_config=None,
        timeout_graceful_shutdown=int(server.shutdown_grace_seconds),
        timeout_keep_alive=5,
    )


class _Server(uvicorn.Server):
    """uvicorn's server, exiting 0 after a requested clean stop.

    uvicorn re-raises SIGTERM/SIGINT once it has shut down, so the process would end "killed
    by signal" even though everything was finished and sealed; supervisors (and `eventpipe
    run`) should see a clean stop as exit status 0.
    """

    _interrupts = 0

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # uvicorn stops at once, without the lifespan's shutdown (no sealing), on any
        # SIGINT after a stop began. A Ctrl-C reaches the workers twice over: from the
        # terminal (the whole process group) and as the supervisor's SIGTERM, in either
        # order. Only a second Ctrl-C is "stop now".
        if sig == signal.SIGINT:
            self._interrupts += 1
        if not self.should_exit or (sig == signal.SIGINT and self._interrupts > 1):
            super().handle_exit(sig, frame)
        self._captured_signals.clear()


def serve(
    config: Config,
    *,
    source: str,
    worker: int = 0,
    shared: bool = False,
    on_ready: Callable[[], None] | None = None,
) -> None:
    """Run one collector worker until SIGTERM/Ctrl-C; ``shared``: on a socket of its own
    that shares the port with the other workers (``SO_REUSEPORT``). ``on_ready``: called
    once it holds its writer id and its socket."""
    if not shared:  # the workers' supervisor claimed the port for them (service.py)
        claim_port(config.server.host, config.server.port)
    collector = Collector(config, worker=worker)
    server = _Server(uvicorn_config(collector))
    # A stop asked for while the worker starts (its supervisor stopping) waits until it
    # holds its writer id and has sealed what its predecessor left; then it starts and
    # stops at once, sealing what it opened. SIGTERM's default would end it in between.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, server.handle_exit)
    # Its supervisor started it with both blocked (service.start_with_stops_held): one
    # that came since is handled now.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGTERM, signal.SIGINT))
    # A worker may replace one still stopping (its requests get the grace period).
    collector.open(config.server.shutdown_grace_seconds + 5 if shared else 0.0)
    sockets = [shared_socket(config.server.host, config.server.port)] if shared else None
    if on_ready is not None:
        on_ready()
    log.info(
        "eventpipe %s collector: config from %s, data in %s, key(s) %s, writer %s",
        __version__,
        source,
        config.data_dir.resolve(),
        ", ".join(key.id for key in config.api_keys) or "none",
        collector.segment_log.writer,
    )
    browser = next((key for key in config.api_keys if key.js is not None), None)
    if worker == 0 and browser is not None and source != "built-in defaults":
        # The secret stays out of the log (logs go to files): where to find it instead.
        log.info(
            "try: curl -H 'Content-Type: application/json' -d '{\"event_type\":\"hello\"}' "
            "'http://%s:%d%s?token=<js of key %s in %s>'",
            config.server.host, config.server.port, BROWSER_PATH, browser.id, source,
        )  # fmt: skip
    try:
        server.run(sockets=sockets)
    finally:
        if collector.segment_log.started is False:
            collector.segment_log.close_sync()
    if not server.started:
        sys.exit(1)


def claim_port(host: str, port: int) -> None:
    """Raise ConfigError when something listens on ``host:port`` already.

    The workers of one collector share a port through ``SO_REUSEPORT``, which lets any
    process of the same user join the group: a second eventpipe started on a port in use
    took half of the first one's connections (its clients got 401 on every second
    request). Only this collector's own workers may share the port, so it is checked
    free first: a socket bound without ``SO_REUSEPORT`` cannot bind a port another one
    listens on (``SO_REUSEADDR`` lets it past connections of an earlier run that linger
    in TIME_WAIT)."""
    if port == 0:
        return
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            holder = port_holder(port)
            raise ConfigError(
                f"{host}:{port} is taken{f' by {holder}' if holder else ''} ({exc.strerror})",
                fix="stop what listens there, or set server.port (EVENTPIPE_SERVER__PORT) "
                "to another port",
            ) from None


def port_holder(port: int) -> str | None:
    """The process that listens on TCP ``port`` (``pid 123: eventpipe run``), where
    /proc tells (a process of this user); None elsewhere."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{fields[9]}]")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd) in inodes:
                    return _process(proc)
    return None


def _process(proc: Path) -> str:
    """``pid N: command line`` of a process; for a worker that multiprocessing spawned
    (whose command line says nothing), of the process that started it."""
    command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    if "multiprocessing" in command:
        with contextlib.suppress(OSError, ValueError, StopIteration):
            status = (proc / "status").read_text().splitlines()
            parent = next(line for line in status if line.startswith("PPid:")).split()[1]
            return _process(proc.parent / parent)
    return f"pid {proc.name}: {command.strip()[:160]}"


def shared_socket(host: str, port: int, *, listen: bool = True) -> socket.socket:
    """A TCP socket on ``host:port`` in the port's ``SO_REUSEPORT`` group (``listen``
    False: bound only, which keeps the port without taking connections)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    if listen:
        sock.listen(2048)
        sock.set_inheritable(True)
    return sock


def announce_dev_key(config: Config, key: ApiKey) -> None:
    assert key.js is not None
    assert key.server is not None
    url = f"http://{config.server.host}:{config.server.port}{BROWSER_PATH}"
    log.warning(
        "no eventpipe.yaml: using development keys from %s (run `eventpipe init` for a config)",
        config.layout.dev_keys,
    )
    log.warning(
        "  browser key: %s   server key: %s",
        key.js.get_secret_value(),
        key.server.get_secret_value(),
    )
    log.warning(
        "  try: curl -H 'Content-Type: application/json' -d '{\"event_type\":\"hello\"}' "
        "'%s?token=%s'",
        url,
        key.js.get_secret_value(),
    )
