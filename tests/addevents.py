"""A real HTTP server on 127.0.0.1 that behaves like DataSet's addEvents API, for the HTTP
sink's tests and benchmark.

It records every request (session, events, start and end), and notes a violation when two
requests of one session overlap. It can be told to be unavailable for a while (connections
closed without an answer), to answer 429 with ``Retry-After``, a burst of 500s, slow
responses, 400 for payloads holding chosen events (``attrs.marker`` values), or 503 for
chosen sessions. NDJSON bodies are taken too (events as ``{"attrs": line}``, the session
from the ``X-Eventpipe-Session`` header).
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson


@dataclass
class Request:
    session: str
    session_info: dict[str, Any]
    events: list[dict[str, Any]]
    size: int
    """Uncompressed payload bytes."""
    started: float
    ended: float = 0.0
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    """Its headers, names in lower case."""
    count: int = 0
    """Its events (kept in ``events`` unless the server counts only)."""


@dataclass
class Behaviour:
    unavailable_until: float = 0.0
    """Before this monotonic time, connections are closed without an answer."""
    too_many: int = 0
    """The next this many requests get 429 with ``Retry-After: retry_after``."""
    retry_after: float = 1.0
    errors: int = 0
    """The next this many requests get 500."""
    delay: float = 0.0
    """Seconds each request takes before its answer."""
    stalls: int = 0
    """The next this many requests are stored, then answered after ``stall_seconds``
    (longer than the client waits: it times out although the events were stored)."""
    stall_seconds: float = 2.0
    reject_markers: set[str] = field(default_factory=set)
    """A payload with an event whose ``attrs.marker`` is one of these gets 400."""
    max_payload_bytes: int = 6_000_000
    status: int = 0
    """When set, every request gets this status (501: a plain web server, say)."""
    answer_bytes: int = 0
    """When set, every answer's body is this many bytes (an API that sends far too much)."""
    down_sessions: set[str] = field(default_factory=set)
    """Session ids whose requests get 503 (one shard of the API down)."""


class AddEventsServer:
    def __init__(self, *, keep_events: bool = True, port: int = 0) -> None:
        """``keep_events`` False: requests keep their count of events, not the events (a
        benchmark's million events would take gigabytes)."""
        self.keep_events = keep_events
        self.behaviour = Behaviour()
        self.requests: list[Request] = []
        self.violations: list[str] = []
        self._active: dict[str, int] = {}
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                server._handle(self)

            def do_GET(self) -> None:
                answer = orjson.dumps(server.summary())
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/api/addEvents"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def start(self) -> AddEventsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    @property
    def delivered(self) -> list[dict[str, Any]]:
        """Every event of every request answered 200, in order of the answers."""
        with self._lock:
            done = sorted((r for r in self.requests if r.status == 200), key=lambda r: r.ended)
        return [e for r in done for e in r.events]

    def summary(self) -> dict[str, Any]:
        """Requests answered 200: how many, their events and uncompressed bytes; the
        sessions seen, the statuses answered, and any violation."""
        with self._lock:
            ok = [r for r in self.requests if r.status == 200]
            statuses: dict[str, int] = {}
            for r in self.requests:
                statuses[str(r.status)] = statuses.get(str(r.status), 0) + 1
            return {
                "requests": len(ok),
                "events": sum(r.count for r in ok),
                "payload_bytes": sum(r.size for r in ok),
                "sessions": len({r.session for r in ok}),
                "statuses": statuses,
                "violations": list(self.violations),
            }

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        b = self.behaviour
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length)
        if time.monotonic() < b.unavailable_until:
            handler.close_connection = True
            handler.connection.close()  # a server restarting: no answer at all
            return
        body = gzip.decompress(raw) if handler.headers.get("Content-Encoding") == "gzip" else raw
        headers = {k.lower(): v for k, v in handler.headers.items()}
        if headers.get("content-type") == "application/x-ndjson":
            # NDJSON: the events are the lines; the session is named by a header.
            session, info = headers.get("x-eventpipe-session", ""), {}
            events = [{"attrs": orjson.loads(line)} for line in body.splitlines() if line]
        else:
            payload = orjson.loads(body)
            session, info, events = payload["session"], payload.get("sessionInfo", {}), \
                payload["events"]  # fmt: skip
        request = Request(session, info, events if self.keep_events else [], len(body),
                          time.monotonic(), headers=headers, count=len(events))  # fmt: skip
        with self._lock:
            self.requests.append(request)
            if self._active.get(session):
                self.violations.append(f"two requests of session {session} overlap")
            self._active[session] = self._active.get(session, 0) + 1
        with self._lock:
            stall = b.stalls > 0
            b.stalls -= stall
        try:
            if b.delay or stall:
                time.sleep(b.stall_seconds if stall else b.delay)
            status, headers, answer = self._answer(request)
        finally:
            with self._lock:
                self._active[session] -= 1
                request.ended = time.monotonic()
        if b.answer_bytes:
            answer = b"x" * b.answer_bytes
        request.status = status
        handler.send_response(status)
        for name, value in headers.items():
            handler.send_header(name, value)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(answer)))
        handler.end_headers()
        handler.wfile.write(answer)

    def _answer(self, request: Request) -> tuple[int, dict[str, str], bytes]:
        b = self.behaviour
        if b.status:
            return b.status, {}, b"Unsupported method"
        if request.session in b.down_sessions:
            return 503, {}, b'{"status":"error/server/unavailable"}'
        with self._lock:
            if b.too_many > 0:
                b.too_many -= 1
                backoff = b'{"status":"error/server/backoff"}'
                return 429, {"Retry-After": f"{b.retry_after:g}"}, backoff
            if b.errors > 0:
                b.errors -= 1
                return 500, {}, b'{"status":"error/server"}'
        if request.size > b.max_payload_bytes:
            return 413, {}, b'{"status":"error/client/tooLarge"}'
        bad = [e for e in request.events if e.get("attrs", {}).get("marker") in b.reject_markers]
        if bad:
            marker = bad[0]["attrs"]["marker"]
            return 400, {}, orjson.dumps({"status": "error/client/badParam",
                                          "message": f"event {marker} is invalid"})  # fmt: skip
        return 200, {}, b'{"status":"success"}'


@contextmanager
def addevents_server(*, keep_events: bool = True) -> Iterator[AddEventsServer]:
    server = AddEventsServer(keep_events=keep_events).start()
    try:
        yield server
    finally:
        server.stop()


def main() -> None:
    """``python -m tests.addevents --port N``: serve until interrupted, counting events
    only (a benchmark's server, in a process of its own); ``GET /`` gives the summary."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    server = AddEventsServer(keep_events=False, port=args.port)
    try:
        server.httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()


if __name__ == "__main__":
    main()
