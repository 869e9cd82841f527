"""HTTP sink benchmark: eventpipe delivering the benchmark's events to an addEvents-like
server in 8 sessions, next to a hand-written sender of the same payloads, in one run.

    .venv/bin/python bench/http_sink.py --events 1000000

1. The events of bench/batch.py (5 event types, nested, varying types), each with a
   ``host`` of 8 values, as sealed segments. ``group_by: [host]``: 8 sessions.
2. The server is tests/addevents.py in a process of its own (it decompresses and parses
   every payload, counts its events, and flags two requests of one session that
   overlap); a fresh one per contender.
3. eventpipe: `process_once` on a warm Spark session (an earlier run of 20,000 other
   events), the implicit browser lookups off (`--lookups` turns them on): read,
   flatten, stage, then the send on Spark tasks. Reported: wall time, the send step
   alone, events/s, requests, mean payload (the limit is 6,000,000 bytes), the most
   event bytes one task held, and peak RSS of the driver, the Python workers (where
   the sending happens) and the JVM.
4. Baseline: a hand-written sender in this process, the floor for the transport. It
   reads the same segments, moves ``host`` into the session info, fills each session's
   payload up to the limit, gzips it and posts it, one thread and one request in flight
   per session (httpx). It does not flatten, retry, record progress or keep failures.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import logging
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

SESSIONS = 8
LIMIT = 6_000_000


def generate(incoming: Path, events: int, seed: int) -> int:
    """bench/batch.py's events, each with a ``host`` of ``SESSIONS`` values."""
    from batch import generate as generate_events

    return generate_events(incoming, events, seed=seed,
                           extra=lambda n: {"host": f"host-{n % SESSIONS}"})  # fmt: skip


class Server:
    """tests/addevents.py in a child process."""

    def __init__(self) -> None:
        from tests.process import free_port

        port = free_port()
        self.url = f"http://127.0.0.1:{port}/api/addEvents"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.addevents", "--port", str(port)], cwd=ROOT
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                self.summary()
                return
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def summary(self) -> dict[str, Any]:
        return dict(httpx.get(self.url, timeout=10).json())

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def reset_peaks(pid: int) -> None:
    """Start the peak resident memory (VmHWM) of this process and its children afresh
    (Linux: ``5`` to ``/proc/<pid>/clear_refs``), so that generating the events does not
    count as the driver's."""
    import psutil

    for p in [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]:
        with contextlib.suppress(OSError):  # exited meanwhile
            Path(f"/proc/{p}/clear_refs").write_text("5")


def rss_peaks(pid: int) -> dict[str, float]:
    """Peak resident memory (VmHWM, MB) of this process, and of the JVM and the largest
    of the Python workers among its children."""
    import psutil

    from batch import peak_rss_mb

    peaks = {"driver": peak_rss_mb(pid), "jvm": 0.0, "python workers": 0.0}
    for child in psutil.Process(pid).children(recursive=True):
        kind = "jvm" if "java" in child.name() else "python workers"
        peaks[kind] = max(peaks[kind], peak_rss_mb(child.pid))
    return peaks


class SendStep(logging.Handler):
    """The send step's seconds and the task's peak bytes, from the job's log lines."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds = 0.0
        self.held = 0

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("dataset: send: "):
            self.seconds = float(message.split()[-2])
        if "event bytes held by a task" in message:
            self.held = int(message.split("at most ")[1].split()[0])


def baseline(paths: list[Path], url: str) -> None:
    """The hand-written sender (see the module's docstring)."""
    client = httpx.Client(timeout=120, limits=httpx.Limits(max_connections=SESSIONS))
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    tail = b'],"threads":[]}'
    queues: dict[str, queue.Queue[bytes | None]] = {}
    threads = []

    def sender(payloads: queue.Queue[bytes | None]) -> None:
        while (payload := payloads.get()) is not None:
            client.post(url, content=gzip.compress(payload, 3), headers=headers).raise_for_status()

    heads: dict[str, bytes] = {}
    buffers: dict[str, list[bytes]] = {}
    sizes: dict[str, int] = {}

    def publish(host: str) -> None:
        queues[host].put(heads[host] + b",".join(buffers[host]) + tail)
        buffers[host], sizes[host] = [], 0

    for path in paths:
        with path.open("rb") as lines:
            for line in lines:
                event = orjson.loads(line)
                host = event.pop("host")
                if host not in queues:
                    queues[host] = queue.Queue(maxsize=1)  # one request in flight, one ready
                    threads.append(threading.Thread(target=sender, args=(queues[host],)))
                    threads[-1].start()
                    info = {"session": f"baseline-{host}", "sessionInfo": {"host": host}}
                    heads[host] = orjson.dumps(info)[:-1] + b',"events":['
                    buffers[host], sizes[host] = [], 0
                ts = datetime.fromisoformat(event["_timestamp"]).timestamp()
                body = orjson.dumps({"ts": str(int(ts * 1e9)), "attrs": event})
                if buffers[host] and sizes[host] + len(body) + 1 > LIMIT - 200:
                    publish(host)
                buffers[host].append(body)
                sizes[host] += len(body) + 1
    for host in queues:
        if buffers[host]:
            publish(host)
        queues[host].put(None)
    for thread in threads:
        thread.join()
    client.close()


def delivered(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    found = {k: after[k] - before[k] for k in ("requests", "events", "payload_bytes")}
    found["violations"] = after["violations"]
    found["statuses"] = after["statuses"]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--lookups", action="store_true", help="the implicit browser lookups")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="    %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    step = SendStep()
    logging.getLogger("eventpipe.processing").addHandler(step)

    from batch import timed
    from eventpipe.config import parse_config
    from eventpipe.processing.batch.job import process_once
    from eventpipe.processing.runtime.spark import start_session

    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="eventpipe-http-bench-") as tmp:
        work = Path(tmp)
        size = generate(work / "data" / "incoming", args.events, seed=2026)
        print(f"{args.events:,} events, {size / 1e6:.0f} MB of JSON lines", flush=True)
        # The baseline reads its own copy (eventpipe archives what it processed).
        generate(work / "copy", args.events, seed=2026)
        server = Server()
        try:

            def config_for(data: Path) -> Any:
                return parse_config(
                    {"data_dir": str(data), "enrichment": {"browser_rules": args.lookups},
                     "destinations": {"dataset": {
                        "type": "http", "url": server.url, "group_by": ["host"]}}},
                    source="bench",
                )  # fmt: skip

            config = config_for(work / "data")
            spark = timed("spark session start", results,
                          lambda: start_session(config.spark.settings))  # fmt: skip
            generate(work / "warm" / "incoming", 20_000, seed=1)
            timed("warm-up: eventpipe on 20,000 other events", results,
                  lambda: process_once(config_for(work / "warm"), spark))  # fmt: skip
            before = server.summary()
            reset_peaks(os.getpid())
            timed("eventpipe process --once -> http", results,
                  lambda: process_once(config, spark))  # fmt: skip
            ep = delivered(before, server.summary())
            peaks = rss_peaks(os.getpid())
            spark.stop()
        finally:
            server.stop()
        server = Server()
        try:
            paths = sorted((work / "copy").iterdir())
            timed("baseline: hand-written sender", results,
                  lambda: baseline(paths, server.url))  # fmt: skip
            base = delivered({"requests": 0, "events": 0, "payload_bytes": 0}, server.summary())
        finally:
            server.stop()

    total = results["eventpipe process --once -> http"]
    floor = results["baseline: hand-written sender"]
    print()
    for name, found, seconds in (("eventpipe", ep, total), ("baseline", base, floor)):
        print(
            f"{name}: {found['events']:,} events in {found['requests']} requests, mean "
            f"payload {found['payload_bytes'] / max(found['requests'], 1):,.0f} bytes, "
            f"{found['events'] / seconds:,.0f} events/s; statuses {found['statuses']}, "
            f"violations {len(found['violations'])}"
        )
    print(f"eventpipe's send step alone: {step.seconds:.1f} s, "
          f"{ep['events'] / max(step.seconds, 1e-9):,.0f} events/s")  # fmt: skip
    print(f"eventpipe / baseline time: {total / floor:.2f}x (send step alone: "
          f"{step.seconds / floor:.2f}x)")  # fmt: skip
    print(f"most event bytes one task held: {step.held / 1e6:.1f} MB")
    print("peak RSS: " + ", ".join(f"{k} {v:.0f} MB" for k, v in peaks.items()))


if __name__ == "__main__":
    main()
