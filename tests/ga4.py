"""A real HTTP server on 127.0.0.1 that answers like GA4's Measurement Protocol, for the
``type: ga4`` sink's tests.

``/mp/collect`` answers 2xx with no body, whatever it gets (as GA4 does: what it cannot
use it drops silently), and keeps what it got. ``/debug/mp/collect`` keeps nothing and
answers ``{"validationMessages": [...]}`` as GA4's validation server does, for the rules
GA4 documents: a client id, 25 events per request, names of events and parameters, 25
parameters per event, values' lengths, and one rule of values eventpipe leaves to GA4
(a ``currency`` is an ISO 4217 code: three capital letters). Either can be told to
answer 500 or 429 for the next requests.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson

NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,39}$")
RESERVED_EVENTS = {"session_start", "first_visit", "user_engagement", "error", "first_open"}


@dataclass
class Ga4Server:
    measurement_id: str = "G-TEST123"
    api_secret: str = "s3cret-api"
    collected: list[dict[str, Any]] = field(default_factory=list)
    """The bodies ``/mp/collect`` got, with the right measurement id and secret."""
    validated: int = 0
    """Requests to ``/debug/mp/collect``."""
    errors: int = 0
    """The next this many requests (either path) get 500."""
    too_many: int = 0
    """The next this many requests get 429 with ``Retry-After: 0``."""
    url: str = ""

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                server._handle(self)

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"

    @property
    def events(self) -> list[dict[str, Any]]:
        """Every event collected, with its request's ``client_id`` and ``user_id``."""
        return [{**event, "client_id": body.get("client_id"), "user_id": body.get("user_id")}
                for body in self.collected for event in body.get("events", [])]  # fmt: skip

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        body = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        parts = urlsplit(handler.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        with self._lock:
            if self.errors:
                self.errors -= 1
                return self._answer(handler, 500, b"internal error")
            if self.too_many:
                self.too_many -= 1
                return self._answer(handler, 429, b"", {"Retry-After": "0"})
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            payload = {}
        right = (query.get("measurement_id"), query.get("api_secret")) == (
            self.measurement_id, self.api_secret)  # fmt: skip
        if parts.path == "/debug/mp/collect":
            with self._lock:
                self.validated += 1
            messages = validate(payload) if right else [{
                "fieldPath": "", "description": "Unable to find measurement_id or api_secret",
                "validationCode": "VALUE_INVALID"}]  # fmt: skip
            return self._answer(handler, 200, orjson.dumps({"validationMessages": messages}))
        if parts.path == "/mp/collect":
            if right and isinstance(payload, dict):
                with self._lock:
                    self.collected.append(payload)
            return self._answer(handler, 204, b"")
        return self._answer(handler, 404, b"not found")

    @staticmethod
    def _answer(handler: BaseHTTPRequestHandler, status: int, body: bytes,
                headers: dict[str, str] | None = None) -> None:  # fmt: skip
        handler.send_response(status)
        for name, value in (headers or {}).items():
            handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)


def validate(payload: Any) -> list[dict[str, str]]:
    """GA4's validation messages for a request body."""
    found: list[dict[str, str]] = []

    def say(path: str, description: str, code: str = "VALUE_INVALID") -> None:
        found.append({"fieldPath": path, "description": description, "validationCode": code})

    if not isinstance(payload, dict) or not payload.get("client_id"):
        say("client_id", "client_id is required", "VALUE_REQUIRED")
        return found
    events = payload.get("events") or []
    if len(events) > 25:
        say("events", "A maximum of 25 events can be specified per request.", "MAX_VALUE")
    for i, event in enumerate(events):
        name = event.get("name", "")
        if not NAME.match(name) or name in RESERVED_EVENTS:
            say(f"events[{i}].name", f"Event at index: [{i}] has invalid name [{name}].",
                "NAME_INVALID")  # fmt: skip
        params = event.get("params") or {}
        if len(params) > 25:
            say(f"events[{i}].params", "Too many params.", "MAX_VALUE")
        for key, value in params.items():
            if not NAME.match(key) or key.startswith(("_", "ga_", "google_", "firebase_")):
                say(f"events[{i}].params.{key}", f"Param name [{key}] is invalid.",
                    "NAME_INVALID")  # fmt: skip
            if isinstance(value, str) and len(value) > 100 and key != "page_location":
                say(f"events[{i}].params.{key}", "Value is too long.", "VALUE_INVALID")
        currency = params.get("currency")
        if currency is not None and not re.fullmatch(r"[A-Z]{3}", str(currency)):
            say(f"events[{i}].params.currency",
                f"Currency [{currency}] is not a valid ISO 4217 code.")  # fmt: skip
    return found


@contextmanager
def ga4_server() -> Iterator[Ga4Server]:
    server = Ga4Server()
    thread = threading.Thread(target=server._http.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server._http.shutdown()
        server._http.server_close()
