"""The bulk endpoint (a server key) against bodies built to exhaust the collector: a gzip
that inflates to 1 GB without a newline, one of 200 MB of newlines, a body that trickles
in one byte at a time. A real `eventpipe collect` process, its memory read from /proc
while a normal client keeps posting beside the bomb."""

from __future__ import annotations

import socket
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.conftest import WEB_SERVER
from tests.process import CollectorProcess, free_port, write_config

MARGIN_BYTES = 150_000_000
"""What a bomb may add to the collector's resident memory: its bounded buffers (a few
MB of inflated steps) and the allocator's slack, far below what it inflates to."""


def _gzip_of(repeated: bytes, total: int) -> bytes:
    """A gzip member of ``repeated`` bytes, ``total`` of them, built in 1 MB steps."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = repeated * (1_000_000 // len(repeated))
    parts = [packer.compress(block) for _ in range(total // len(block))]
    return b"".join(parts) + packer.flush()


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CollectorProcess]:
    root = tmp_path_factory.mktemp("bombs")
    port = free_port()
    config = write_config(root / "eventpipe.yaml", root / "data", port,
                          server={"workers": 1, "body_timeout_seconds": 2})  # fmt: skip
    process = CollectorProcess(config, port, root / "collector.log")
    process.wait_ready()
    yield process
    process.kill()


class _Watch:
    """Peak resident memory of the collector's processes, and a normal client's
    answers, while a bomb is sent."""

    def __init__(self, collector: CollectorProcess) -> None:
        self.collector = collector
        self.peak = 0
        self.answers: list[int] = []
        self.slowest = 0.0
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._memory),
            threading.Thread(target=self._client),
        ]

    def _rss(self) -> int:
        parent = psutil.Process(self.collector.proc.pid)
        return sum(p.memory_info().rss for p in [parent, *parent.children(recursive=True)])

    def _memory(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss())
            time.sleep(0.05)

    def _client(self) -> None:
        with httpx.Client(base_url=self.collector.url, timeout=60) as client:
            while not self._stop.is_set():
                started = time.monotonic()
                answer = client.post("/api/v1/s2s/event", json={"event_type": "normal"},
                                     headers={"X-Auth-Token": WEB_SERVER})  # fmt: skip
                self.slowest = max(self.slowest, time.monotonic() - started)
                self.answers.append(answer.status_code)
                time.sleep(0.05)

    def __enter__(self) -> _Watch:
        self.before = self._rss()
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        # Reported, not asserted (no timing assertions): docs/hostile.md has the figures.
        print(f"rss before {self.before / 1e6:.0f} MB, peak {self.peak / 1e6:.0f} MB; normal "
              f"client: {len(self.answers)} answers, slowest {self.slowest:.2f} s")  # fmt: skip


def _bulk(collector: CollectorProcess, body: Any, **headers: str) -> httpx.Response:
    return httpx.post(collector.url + "/api/v1/s2s/bulk", content=body, timeout=300,
                      headers={"X-Auth-Token": WEB_SERVER, **headers})  # fmt: skip


def test_a_gigabyte_without_a_newline_is_one_refused_line_in_bounded_memory(
    collector: CollectorProcess,
) -> None:
    bomb = _gzip_of(b"a", 1_000_000_000)
    assert len(bomb) < 1_100_000
    with _Watch(collector) as watch:
        answer = _bulk(collector, bomb, **{"Content-Encoding": "gzip"})
    found = answer.json()
    assert (answer.status_code, found["accepted"], found["rejected_count"]) == (200, 0, 1)
    [refused] = found["rejected"]
    assert refused == {"line": 1, "error": "is a line of 1000000000 bytes, longer "
                       "than max_event_bytes: it was not read"}  # fmt: skip
    assert watch.answers
    assert set(watch.answers) == {200}
    assert watch.peak - watch.before < MARGIN_BYTES


def test_an_overlong_line_is_refused_and_the_lines_after_it_are_kept(
    collector: CollectorProcess,
) -> None:
    body = b'{"n": 1}\n' + b'{"pad": "' + b"x" * 5_000_000 + b'"}\n' + b'{"n": 3}\n'
    answer = _bulk(collector, zlib.compress(body, wbits=31), **{"Content-Encoding": "gzip"})
    found = answer.json()
    assert (answer.status_code, found["accepted"], found["rejected_count"]) == (200, 2, 1)
    [refused] = found["rejected"]
    assert refused["line"] == 2
    assert "is a line of 5000011 bytes, longer than max_event_bytes" in refused["error"]


def test_two_hundred_megabytes_of_newlines_cost_no_event_and_bounded_memory(
    collector: CollectorProcess,
) -> None:
    bomb = _gzip_of(b"\n", 200_000_000)
    with _Watch(collector) as watch:
        answer = _bulk(collector, bomb, **{"Content-Encoding": "gzip"})
    assert answer.status_code == 200
    assert answer.json() == {"status": "ok", "accepted": 0}
    assert set(watch.answers) == {200}
    assert watch.peak - watch.before < MARGIN_BYTES


def test_a_body_trickling_one_byte_at_a_time_is_cut_off(collector: CollectorProcess) -> None:
    """Each byte resets a per-read timeout; the average rate does not: 408."""

    def trickle() -> Iterator[bytes]:
        for _ in range(600):  # ten minutes, if nothing stopped it
            yield b" "
            time.sleep(1)

    started = time.monotonic()
    answer = _bulk(collector, trickle())
    assert answer.status_code == 408
    assert "bytes/s on average" in answer.json()["error"]
    print(f"cut off after {time.monotonic() - started:.1f} s")


def test_a_client_gone_mid_upload_keeps_the_lines_before_and_logs_one_line(
    collector: CollectorProcess,
) -> None:
    lines = b'{"n": "gone-1"}\n{"n": "gone-2"}\n'
    head = (b"POST /api/v1/s2s/bulk HTTP/1.1\r\nHost: collector\r\nX-Auth-Token: "
            + WEB_SERVER.encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\n")  # fmt: skip
    with socket.create_connection(("127.0.0.1", collector.port)) as client:
        client.sendall(head + f"{len(lines):x}\r\n".encode() + lines + b"\r\n")
        time.sleep(0.5)
    deadline = time.monotonic() + 10
    while "the client went away" not in collector.log_path.read_text():
        assert time.monotonic() < deadline, collector.log_path.read_text()[-2000:]
        time.sleep(0.1)
    assert "bulk upload of web: the client went away after line 2" in collector.log_path.read_text()
    incoming = collector.log_path.parent / "data" / "incoming"
    logged = b"".join(p.read_bytes() for p in incoming.glob("incoming.tok=web*"))
    assert b"gone-1" in logged
    assert b"gone-2" in logged


def test_the_collector_log_has_no_traceback(collector: CollectorProcess) -> None:
    text = Path(collector.log_path).read_text()
    assert "Traceback" not in text, text[-3000:]
