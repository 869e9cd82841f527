"""uvicorn's httptools protocol with a limit on the size of the request head.

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

It leans on uvicorn's protocol class; uvicorn is pinned below 1.0 and
``tests/integration/test_http_bad_input.py`` checks this behaviour.
"""

from __future__ import annotations

from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class _HeadTooLarge(Exception):
    pass


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    max_header_bytes = 65_536

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes = 0  # exact, from callbacks
        self._unparsed_head_bytes = 0  # read while the head is incomplete
        self._head_done = False
        self._head_refused = False

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0
        self._unparsed_head_bytes = 0
        self._head_done = False

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._head_done = True
        super().on_headers_complete()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._head_done or self.transport.is_closing():
            return
        self._unparsed_head_bytes += len(data)
        if self._unparsed_head_bytes > self.max_header_bytes:
            self._head_refused = True
            self.send_400_response("")

    def send_400_response(self, msg: str) -> None:
        if not self._head_refused:
            super().send_400_response(msg)
            return
        body = orjson.dumps(
            {
                "status": "error",
                "error": f"request line and headers are over max_header_bytes "
                f"({self.max_header_bytes} bytes)",
            }
        )
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
            b"content-type: application/json\r\nconnection: close\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        self.transport.close()

    def _count(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > self.max_header_bytes:
            self._head_refused = True
            raise _HeadTooLarge  # httptools re-raises it as HttpParserCallbackError


def limited_protocol(max_header_bytes: int) -> type[LimitedHttpToolsProtocol]:
    return type(
        "LimitedHttpToolsProtocol",
        (LimitedHttpToolsProtocol,),
        {"max_header_bytes": max_header_bytes},
    )
