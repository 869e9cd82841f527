"""Reading and parsing request bodies, with limits enforced before the work is done.

* Size: a declared Content-Length over the limit is refused before a byte is read; a
  chunked body is refused as soon as what was read passes the limit, and the rest is never
  read (the connection is closed).
* JSON: orjson, which rejects invalid UTF-8, lone surrogates, raw control characters, NaN
  and trailing content, and reports the position. An escaped ``\\u0000`` is valid JSON and
  is kept (destinations that cannot store NUL apply their own documented rule).
* Empty keys: Spark's JSON reader drops a key named ``""`` when it infers a batch's
  schema, so the collector names empty keys before they are logged: ``_unnamed`` (the
  column name seed 1 gives an empty key), or ``_unnamed_1``, ``_unnamed_2``... when the
  object already has that key. Only bodies that contain ``""`` followed by a colon are
  walked (found in the one pass of :mod:`eventpipe.collector.scan`, as are the numbers
  below).
* Integers: orjson reads an integer beyond 64 bits as a float, which loses digits, and a
  number too small for a float (``1e-400``) as 0. A body with a run of 20 digits or more
  or a negative exponent of three digits or more that ends a number (``e-400,``) is
  read again by the standard library, which keeps every integer exact: one beyond
  64 bits is written to the log as the digits it was sent as (an ``orjson.Fragment``), up
  to 38 digits, the most a destination's DECIMAL(38,0) holds; an item with a longer one
  is rejected alone (:class:`IntegerTooLong`), as no destination could store it exactly;
  a number that would be 0 is rejected alone (:class:`NumberUnderflow`). Nothing else
  underflows: with an exponent of two digits, a float reads as 0 only after 224 zeros,
  a run of digits. (Any ``e-`` sent the body to the slower reading before, and most
  UUIDs hold one: an SDK's batch of 100 messages with UUID ids took 947 us to parse
  instead of 377.)
* gzip (the Segment API's SDKs send it): decompressed in one pass bounded by the same
  ``max_body_bytes``, so a small body that inflates to gigabytes (a zip bomb) is refused
  once the limit is passed, having cost that much memory at most.
* Depth: orjson stops at 1,024 levels by itself (a 400 for the whole body);
  ``max_json_depth`` is checked per event by :mod:`eventpipe.collector.enrich` with
  :func:`deeper_than`, so that one deep item in an array is rejected alone.
"""

from __future__ import annotations

import asyncio
import io
import json
import zlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.requests import ClientDisconnect

from eventpipe.collector.scan import BIG_INTEGER, BODY, EMPTY_KEY, TINY_NUMBER

EMPTY_KEY_NAME = "_unnamed"
MAX_INTEGER_DIGITS = 38
"""The most digits of an integer eventpipe keeps exactly (DECIMAL(38,0), PostgreSQL's and
DuckDB's widest exact integers; Spark's too)."""


class BodyError(Exception):
    """The body cannot be taken; ``status`` and a message that says what and where."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message


def check_declared_length(content_length: str | None, max_bytes: int) -> None:
    if content_length is None:
        return
    if not content_length.isdigit():
        raise BodyError(
            400, "bad_content_length", f"Content-Length {content_length!r} is not a number"
        )
    if int(content_length) > max_bytes:
        raise BodyError(
            413,
            "body_too_large",
            f"body is {int(content_length)} bytes; max_body_bytes is {max_bytes}",
        )


class Deadline:
    """Cancels the task it is entered in once ``seconds`` have passed, and turns that
    cancellation into TimeoutError on the way out, as ``asyncio.timeout`` does, for a
    seventh of its cost: one timer handle (measured under uvloop: 1.4 us per use, against
    9.4 us for ``asyncio.timeout``, on every request of the collector's one loop; and no
    task per wait, as ``asyncio.wait_for`` makes).

    A deadline that passes while the task waits for the client throws CancelledError
    into that wait, inside the block, even if the data arrived in the same turn of the
    loop; any other cancellation goes through untouched."""

    __slots__ = ("expired", "handle", "seconds", "task")

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.expired = False

    def __enter__(self) -> None:
        task = asyncio.current_task()
        assert task is not None, "a deadline is entered in a task"
        self.task = task
        self.handle = asyncio.get_running_loop().call_later(self.seconds, self._expire)

    def _expire(self) -> None:
        self.expired = True
        self.task.cancel()

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self.handle.cancel()
        if self.expired and kind is asyncio.CancelledError:
            self.task.uncancel()
            raise TimeoutError


async def read_limited(chunks: AsyncIterator[bytes], max_bytes: int, timeout: float) -> bytes:
    """Collect the body, giving up as soon as it passes ``max_bytes``, or when it is not
    all there within ``timeout`` seconds (408: a client that announced more than it sends
    would hold the connection and the request's memory)."""
    parts: list[bytes] = []
    total = 0
    try:
        with Deadline(timeout):
            async for chunk in chunks:
                total += len(chunk)
                if total > max_bytes:
                    raise BodyError(
                        413, "body_too_large", f"body is over max_body_bytes ({max_bytes} bytes)"
                    )
                if chunk:
                    parts.append(chunk)
    except TimeoutError:
        raise BodyError(
            408,
            "body_timeout",
            f"body not received within body_timeout_seconds ({timeout:g} s); got {total} bytes",
        ) from None
    except ClientDisconnect:
        raise gone(f"after {total} bytes") from None
    return b"".join(parts)


def gone(where: str) -> BodyError:
    """The client closed its connection mid-body: nobody reads the answer, and the
    collector says so in its log in one line, not an ASGI traceback."""
    return BodyError(400, "client_disconnected", f"the client went away {where}")


def gunzip_limited(data: bytes, max_bytes: int) -> bytes:
    """``data`` (a gzip stream) decompressed, refused (413) once it passes ``max_bytes``,
    or (400) when it is not gzip."""
    inflater = zlib.decompressobj(wbits=31)
    try:
        out = inflater.decompress(data, max_bytes + 1)
    except zlib.error as exc:
        raise BodyError(400, "bad_encoding", f"body is not valid gzip: {exc}") from None
    if len(out) > max_bytes:
        raise BodyError(
            413, "body_too_large", f"body is over max_body_bytes ({max_bytes} bytes) unzipped"
        )
    if not inflater.eof:
        raise BodyError(400, "bad_encoding", "body is not valid gzip: it ends early")
    return out


ENCODINGS = ("gzip", "deflate", "br", "zstd")
"""The Content-Encodings a request body may come in (besides none): each decoded within
the body size limit, counted decoded."""


def decoded_limited(data: bytes, encoding: str, max_bytes: int) -> bytes:
    """``data`` in ``encoding`` (one of ENCODINGS) decoded, refused (413) once it passes
    ``max_bytes`` without decoding further (a compression bomb costs at most that), or
    (400) when it is not that encoding or ends early."""
    if encoding == "gzip":
        return gunzip_limited(data, max_bytes)
    decode = {"deflate": _inflate, "br": _unbrotli, "zstd": _unzstd}[encoding]
    try:
        out, finished = decode(data, max_bytes + 1)
    except _DecodeError as exc:
        raise BodyError(400, "bad_encoding", f"body is not valid {encoding}: {exc}") from None
    if len(out) > max_bytes:
        raise BodyError(
            413, "body_too_large", f"body is over max_body_bytes ({max_bytes} bytes) decoded"
        )
    if not finished:
        raise BodyError(400, "bad_encoding", f"body is not valid {encoding}: it ends early")
    return out


class _DecodeError(Exception):
    """A body that is not in the encoding it declares (each library's error, wrapped)."""


def _inflate(data: bytes, limit: int) -> tuple[bytes, bool]:
    """deflate: zlib's format (RFC 9110 says so), or raw deflate, which some clients send."""
    zlib_header = len(data) >= 2 and (data[0] << 8 | data[1]) % 31 == 0 and data[0] & 15 == 8
    inflater = zlib.decompressobj(wbits=15 if zlib_header else -15)
    try:
        return inflater.decompress(data, limit), inflater.eof
    except zlib.error as exc:
        raise _DecodeError(exc) from None


def _unbrotli(data: bytes, limit: int) -> tuple[bytes, bool]:
    import brotli

    decoder = brotli.Decompressor()
    try:
        out = decoder.process(data, output_buffer_limit=limit)
    except brotli.error as exc:
        raise _DecodeError(exc) from None
    return out, decoder.is_finished()


def _unzstd(data: bytes, limit: int) -> tuple[bytes, bool]:
    import zstandard

    try:
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)) as reader:
            out = reader.read(limit)  # bounded: a bomb stops here
        if len(out) >= limit:
            return out, True
        # Within the limit: whether the frame is whole (the reader does not say; a
        # truncated one reads as less data). Decoding again costs at most the limit.
        whole = zstandard.ZstdDecompressor().decompressobj()
        whole.decompress(data)
        return out, whole.eof
    except zstandard.ZstdError as exc:
        raise _DecodeError(exc) from None


def parse_events(body: bytes) -> tuple[list[Any], bool]:
    """Parse a body into its items (one object, or an array of them), and whether it was
    an array."""
    if not body.strip():
        raise BodyError(400, "empty_body", "body is empty: send a JSON object or an array of them")
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        reason = "too_deep" if "depth" in str(exc) else "malformed_json"
        raise BodyError(400, reason, f"body is not valid JSON: {exc}") from None
    found = BODY.found(body)
    if found & (BIG_INTEGER | TINY_NUMBER):
        document = exact_json(body)
    if found & EMPTY_KEY:
        document = _named(document)
    if isinstance(document, dict):
        return [document], False
    if isinstance(document, list):
        return document, True
    raise BodyError(
        400,
        "not_an_object",
        f"body is a JSON {type(document).__name__}; send an object or an array of objects",
    )


class Unstorable:
    """A number no destination would store as sent, kept as its text: orjson refuses to
    write it, so its item is rejected with the reason (enrich.py names it by the class)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:  # how an EventError record keeps it: its digits, as text
        return self.text


class IntegerTooLong(Unstorable):
    """An integer of more than :data:`MAX_INTEGER_DIGITS` digits in an event (stored
    rounded, otherwise)."""


def _exact_integer(text: str) -> int | orjson.Fragment | IntegerTooLong:
    number = int(text)
    if -(1 << 63) <= number < (1 << 64):  # what orjson itself writes exactly
        return number
    if len(text.lstrip("-")) <= MAX_INTEGER_DIGITS:
        return orjson.Fragment(text.encode())
    return IntegerTooLong(text)


class NumberUnderflow(Unstorable):
    """A number with digits that a float64 reads as 0 (``1e-400``; orjson reads it as 0.0
    without a word)."""


def _exact_float(text: str) -> float | NumberUnderflow:
    value = float(text)
    if value == 0.0 and any(c in "123456789" for c in text.partition("e")[0].partition("E")[0]):
        return NumberUnderflow(text)
    return value


def exact_json(body: bytes) -> Any:
    """``body`` (valid JSON: orjson read it) read again with every integer exact, and
    numbers that would underflow to 0 marked (:class:`NumberUnderflow`)."""
    try:
        return json.loads(body, parse_int=_exact_integer, parse_float=_exact_float)
    except RecursionError:
        raise BodyError(400, "too_deep", "body is nested too deeply to be read") from None


def _named(node: Any) -> Any:
    """``node`` with every key ``""`` renamed (see the module's docstring)."""
    if isinstance(node, list):
        return [_named(item) for item in node]
    if not isinstance(node, dict):
        return node
    named: dict[str, Any] = {}
    for key, value in node.items():
        if key == "":
            key, n = EMPTY_KEY_NAME, 0
            while key in node:
                n += 1
                key = f"{EMPTY_KEY_NAME}_{n}"
        named[key] = _named(value)
    return named


def deeper_than(document: Any, max_depth: int, *, base: int = 1) -> str | None:
    """JSON pointer of the first container nested deeper than ``max_depth``, else None.

    ``document`` itself is at level ``base`` (2 for an item of an array body).
    """
    stack: list[tuple[Any, int, str]] = [(document, base, "")]
    while stack:
        node, depth, pointer = stack.pop()
        if depth > max_depth:
            return pointer or "/"
        if isinstance(node, dict):
            for key, value in node.items():
                if isinstance(value, dict | list):
                    escaped = key.replace("~", "~0").replace("/", "~1")
                    stack.append((value, depth + 1, f"{pointer}/{escaped}"))
        elif isinstance(node, list):
            for i, value in enumerate(node):
                if isinstance(value, dict | list):
                    stack.append((value, depth + 1, f"{pointer}/{i}"))
    return None
