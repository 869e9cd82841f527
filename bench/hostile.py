"""Hostile bodies against the collector, next to valid bodies of the same size, in one run.

For each kind of bad body (1 MB of items that are not objects, 1 MB of oversized events,
a body of deeply nested items, integers past 64 bits), the collector's time per request
next to a valid body of about the same size, the bytes it wrote to failed/ per byte it
rejected, and the size of its answer. The collector runs in this process on 127.0.0.1
with its real settings (key check, enrichment, fsync before the answer).

    .venv/bin/python bench/hostile.py [--requests 20]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import httpx
import orjson
import uvicorn

from eventpipe.collector.app import Collector
from eventpipe.collector.server import uvicorn_config
from eventpipe.config import parse_config

SERVER_KEY = "bench-server-key-123"


def start(data: Path) -> tuple[uvicorn.Server, str]:
    raw = {"data_dir": str(data), "server": {"host": "127.0.0.1", "port": 0},
           "api_keys": [{"id": "bench", "server": SERVER_KEY}]}  # fmt: skip
    collector = Collector(parse_config(raw, source="bench", env={}))
    collector.open()
    server = uvicorn.Server(uvicorn_config(collector))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/api/v1/s2s/event"


def bodies() -> dict[str, tuple[bytes, bytes]]:
    """Each kind: (the hostile body, a valid body of about its size)."""
    valid_event = orjson.dumps({"event_type": "page_view", "url": "https://example.com/a",
                                "user": {"id": 12345}, "n": 1})  # fmt: skip

    def valid(size: int) -> bytes:
        count = max(1, size // (len(valid_event) + 1))
        return b"[" + b",".join([valid_event] * count) + b"]"

    numbers = b"[" + b",".join([b"1"] * 499_000) + b"]"
    oversized = orjson.dumps([{"big": "x" * 60_000}] * 16)
    deep_item = b'{"a":' + b"[" * 70 + b"1" + b"]" * 70 + b"}"  # past max_json_depth (64)
    deep = b"[" + b",".join([deep_item] * 6_500) + b"]"
    digits = b"[" + b",".join([b'{"n":' + b"9" * 45 + b"}"] * 15_000) + b"]"
    return {name: (body, valid(len(body))) for name, body in
            {"not objects": numbers, "oversized events": oversized,
             "too deep": deep, "integers of 45 digits": digits}.items()}  # fmt: skip


def failed_bytes(data: Path) -> int:
    return sum(p.stat().st_size for p in (data / "failed").glob("*.log"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="eventpipe-hostile-") as tmp:
        data = Path(tmp) / "data"
        server, url = start(data)
        headers = {"X-Auth-Token": SERVER_KEY}
        print(f"{'body':24} {'size':>9} {'hostile ms':>11} {'valid ms':>9} {'ratio':>6} "
              f"{'failed/ B per rejected B':>25} {'answer B':>9}")  # fmt: skip
        with httpx.Client(timeout=120) as client:
            for name, (hostile, valid) in bodies().items():
                times: dict[str, float] = {}
                before = failed_bytes(data)
                answer = 0
                for label, body in (("hostile", hostile), ("valid", valid)):
                    started = time.perf_counter()
                    for _ in range(args.requests):
                        response = client.post(url, content=body, headers=headers)
                        assert response.status_code in (200, 400), response.text[:200]
                        if label == "hostile":
                            answer = len(response.content)
                    times[label] = (time.perf_counter() - started) / args.requests * 1000
                    if label == "hostile":
                        written = failed_bytes(data) - before
                ratio = written / (len(hostile) * args.requests)
                print(f"{name:24} {len(hostile):>9} {times['hostile']:>11.1f} "
                      f"{times['valid']:>9.1f} {times['hostile'] / times['valid']:>6.2f} "
                      f"{ratio:>25.4f} {answer:>9}")  # fmt: skip
        server.should_exit = True


if __name__ == "__main__":
    main()
