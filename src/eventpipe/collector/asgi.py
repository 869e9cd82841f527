"""The collector's ASGI app: the event endpoints called directly, every other path
through Starlette's router; and the request as those endpoints read it, Starlette's
Request with headers looked up in a dict built once.

Starlette's ``Headers.get`` walks the header list on every call; the event endpoints
read six headers per request (key, encoding, length, user agent, forwarded-for, origin),
which took 4.9 us where one dict takes 0.7 us (docs/collector.md, "Single-event
requests"). Answers are the same: names are matched lower-case (ASGI servers send them
so), the first of repeated headers wins, values are decoded as latin-1.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from eventpipe.collector.app import BROWSER_PATH, BULK_PATH, SERVER_PATH
from eventpipe.collector.segment_endpoints import (
    JITSU_PREFIX,
    JITSU_SERVER_PREFIX,
    SegmentEndpoints,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

    from starlette.responses import Response

    from eventpipe.collector.app import Collector

    Endpoint = Callable[[Request], Coroutine[Any, Any, Response]]


class FirstHeaders(Headers):
    """Starlette's Headers, with ``get``, ``[]`` and ``in`` answered from a dict of
    each name's first value."""

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        super().__init__(raw=raw)
        self._first = dict(reversed(raw))

    def get(self, key: str, default: str | None = None) -> str | None:  # type: ignore[override]
        value = self._first.get(key.lower().encode("latin-1"))
        return default if value is None else value.decode("latin-1")

    def __getitem__(self, key: str) -> str:
        value = self._first.get(key.lower().encode("latin-1"))
        if value is None:
            raise KeyError(key)
        return value.decode("latin-1")

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key.lower().encode("latin-1") in self._first


class EventRequest(Request):
    """A Request whose headers are :class:`FirstHeaders`."""

    @property
    def headers(self) -> Headers:
        if not hasattr(self, "_headers"):
            self._headers = FirstHeaders(self.scope["headers"])
        return self._headers


class CollectorApp:
    """The collector's ASGI app. The event endpoints (the native ones and the Segment
    API's POSTs) are called directly; every other request goes through Starlette's
    router.

    Starlette's routing and its two middleware layers (server errors, exception
    handlers) wrap each request in about eight coroutine calls and a route match over
    every path: measured, 10-15% of the time of a single-event request
    (docs/collector.md, "Single-event requests"). The event endpoints need neither: an
    exception there is answered 500 by uvicorn as Starlette would answer it.
    """

    def __init__(self, collector: Collector) -> None:
        self.direct: dict[tuple[str, str], Endpoint] = {
            ("POST", BROWSER_PATH): collector.ingest_browser,
            ("POST", SERVER_PATH): collector.ingest_server,
        }
        segment = SegmentEndpoints(collector)
        self.segment = segment.segment
        self.jitsu = segment.jitsu
        self.router = Starlette(routes=[
            Route(BROWSER_PATH, collector.ingest_browser, methods=["POST"]),
            Route(BROWSER_PATH, collector.preflight, methods=["OPTIONS"]),
            Route(SERVER_PATH, collector.ingest_server, methods=["POST"]),
            Route(BULK_PATH, collector.bulk, methods=["POST"]),
            Route("/v1/pixel/{name}", segment.pixel, methods=["GET"]),
            Route("/v1/{name}", segment.segment, methods=["POST"]),
            Route("/v1/{name}", collector.preflight, methods=["OPTIONS"]),
            Route(JITSU_PREFIX + "{name}", collector.preflight, methods=["OPTIONS"]),
            Route("/p.js", segment.script, methods=["GET"]),
            Route("/health", collector.health, methods=["GET"]),
            Route("/metrics", collector.metrics_page, methods=["GET"]),
        ], lifespan=collector.lifespan)  # fmt: skip

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            method, path = scope["method"], scope["path"]
            endpoint = self.direct.get((method, path))
            if endpoint is None and method == "POST":
                endpoint = self._by_prefix(scope, path)
            if endpoint is not None:
                response = await endpoint(EventRequest(scope, receive))
                await response(scope, receive, send)
                return
        await self.router(scope, receive, send)

    def _by_prefix(self, scope: Scope, path: str) -> Endpoint | None:
        """The endpoint of a POST to ``/v1/<name>`` (the Segment API), ``/api/s/<name>`` or
        ``/api/s/s2s/<name>`` (Jitsu 2), its name set in the scope; None for others."""
        if path.startswith("/v1/"):
            name, endpoint, s2s = path[4:], self.segment, False
        elif path.startswith(JITSU_SERVER_PREFIX):
            name, endpoint, s2s = path[len(JITSU_SERVER_PREFIX) :], self.jitsu, True
        elif path.startswith(JITSU_PREFIX):
            name, endpoint, s2s = path[len(JITSU_PREFIX) :], self.jitsu, False
        else:
            return None
        if not name or "/" in name:
            return None
        scope["path_params"] = {"name": name, "s2s": s2s}
        return endpoint


def create_app(collector: Collector) -> CollectorApp:
    return CollectorApp(collector)
