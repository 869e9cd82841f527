"""uvicorn's httptools protocol with limits on the request head: its size and its time.

Time: a client that connects and sends nothing, or sends a request's head a byte at a
time, holds a connection (slowloris); uvicorn has no timer for that. A timer armed when
the connection is made, and when a read leaves a request's head incomplete, answers 408
and closes the connection when the head is not complete within
``header_timeout_seconds``. (Between requests, uvicorn's keep-alive timeout closes an
idle connection; the body's time limit is the app's: collector/body.py.)

Size:

httptools (llhttp) accepts request lines and header blocks of any size (measured here: a
200 KB header and 20,000 headers were both taken), which lets one client make the server
buffer without bound. This subclass answers 431 and closes the connection once the request
line plus headers pass ``max_header_bytes``. Two counters, because the parser reports a
header only once it is complete:

* parser callbacks (URL fragments, each complete header) count the head exactly, wherever
  the read boundaries fall; going over raises inside the callback, which uvicorn turns into
  its "send 400 and close" path, answered here with 431 instead;
* bytes read while the head is still incomplete after parsing catch a single header that
  keeps growing (a slow drip never reaches a callback). Body bytes never count.

One write per answer: uvicorn writes a response's head and its body to the socket in two
writes. A collector killed between the two (SIGKILL, the OOM killer) left the client a
``200`` head with its body cut off: the events were logged, yet an SDK takes that as a
failed batch it must not retry (RudderStack's Node SDK reports it as an error). All writes
of one step of the event loop now leave in one write (:class:`OneWrite`), so a kill leaves
either the whole answer or none, which the SDK retries and the event id makes one row.

It leans on uvicorn's protocol class; uvicorn is pinned below 1.0 and
``tests/integration/test_http_bad_input.py`` checks this behaviour.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class _HeadTooLarge(Exception):
    pass


class OneWrite:
    """A transport whose writes within one step of the event loop reach the socket as
    one write, at the end of that step; ``close`` writes what is held first. Every other
    call goes to the transport as it is.

    uvicorn's ``send`` writes a response's head and then its body with no await between
    them, so they leave together. Order is kept: the protocol and its requests all write
    through this one object.
    """

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._held:
            self._loop.call_soon(self.flush)
        self._held.append(data)

    def flush(self) -> None:
        if not self._held:
            return
        data = b"".join(self._held)
        self._held.clear()
        if not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    max_header_bytes = 65_536
    header_timeout_seconds = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes = 0  # exact, from callbacks
        self._unparsed_head_bytes = 0  # read while the head is incomplete
        self._head_done = False
        self._head_refused = False
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.transport = OneWrite(transport, self.loop)  # type: ignore[assignment]
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0
        self._unparsed_head_bytes = 0
        self._head_done = False

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.header_timeout_seconds, self._head_late)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self._head_done or self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a request in progress (pipelined): its own limits apply
        self._close_with(
            b"408 Request Timeout",
            f"request line and headers not received within header_timeout_seconds "
            f"({self.header_timeout_seconds:g} s)",
        )

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._head_done = True
        self._cancel_head_timer()
        super().on_headers_complete()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._head_done or self.transport.is_closing():
            return
        self._unparsed_head_bytes += len(data)
        if self._unparsed_head_bytes > self.max_header_bytes:
            self._head_refused = True
            self.send_400_response("")
        elif self._head_timer is None:
            # A head that came whole in one read (nearly every request) needs no timer.
            self._arm_head_timer()

    def send_400_response(self, msg: str) -> None:
        if not self._head_refused:
            super().send_400_response(msg)
            return
        self._close_with(
            b"431 Request Header Fields Too Large",
            f"request line and headers are over max_header_bytes ({self.max_header_bytes} bytes)",
        )

    def _close_with(self, status: bytes, error: str) -> None:
        """Answer ``status`` with a JSON error, then close the connection."""
        body = orjson.dumps({"status": "error", "error": error})
        self.transport.write(
            b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n"
            b"connection: close\r\ncontent-length: " + str(len(body)).encode()
            + b"\r\n\r\n" + body
        )  # fmt: skip
        self.transport.close()

    def _count(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > self.max_header_bytes:
            self._head_refused = True
            raise _HeadTooLarge  # httptools re-raises it as HttpParserCallbackError


def limited_protocol(
    max_header_bytes: int, header_timeout_seconds: float
) -> type[LimitedHttpToolsProtocol]:
    limits: dict[str, object] = {"max_header_bytes": max_header_bytes}
    limits["header_timeout_seconds"] = header_timeout_seconds
    return type("LimitedHttpToolsProtocol", (LimitedHttpToolsProtocol,), limits)
