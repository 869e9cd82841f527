"""ClickHouse's HTTP interface, as the ClickHouse destination uses it.

Plain HTTP over httpx (already eventpipe's HTTP client) rather than clickhouse-connect:
that library is written and tested for current servers (25.x), and the server Debian
ships, which the tests run, is 18.16; the HTTP interface, its formats and its error
texts are the same on both. The credentials go in ClickHouse's own headers
(``X-ClickHouse-User``, ``X-ClickHouse-Key``), never in a URL that a log or an error
could print, and :class:`ClickHouseClient`'s repr leaves the password out.

What a server can do is read from the server itself, never from its version number:
the formats it reads (``system.formats``), the types it has
(``system.data_type_families``) and its settings (``system.settings``); see
:class:`ServerFeatures`.

Errors are classified here, once, by ClickHouse's exception code (``Code: N`` opens
every error text, whatever the version):

* transient (retried by the run): no connection, a timeout, HTTP 5xx without a code,
  and the codes of a server that is busy or briefly unable (:data:`TRANSIENT_CODES`,
  ``TOO_MANY_PARTS`` among them);
* credentials refused (HTTP 401/403 and the authentication codes): a ConfigError that
  names the user, never the password;
* anything else (a syntax error, a value a column cannot take, a read-only user asked
  to write): terminal, with the server's own message.
"""

from __future__ import annotations

import decimal
import functools
import json
import re
import ssl
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx

from eventpipe.errors import ConfigError, TerminalError, TransientError

TRANSIENT_CODES: Mapping[int, str] = {
    159: "TIMEOUT_EXCEEDED",
    202: "TOO_MANY_SIMULTANEOUS_QUERIES",
    209: "SOCKET_TIMEOUT",
    210: "NETWORK_ERROR",
    241: "MEMORY_LIMIT_EXCEEDED",
    242: "TABLE_IS_READ_ONLY",
    252: "TOO_MANY_PARTS",
    319: "UNKNOWN_STATUS_OF_INSERT",
    425: "SYSTEM_ERROR",
    439: "CANNOT_SCHEDULE_TASK",
    999: "KEEPER_EXCEPTION",
}
"""Codes of a server that may succeed on the next try."""

AUTHENTICATION_CODES = frozenset({192, 193, 194, 516})
"""UNKNOWN_USER, WRONG_PASSWORD, REQUIRED_PASSWORD (old servers), AUTHENTICATION_FAILED."""

MESSAGE_LIMIT = 1_000
"""Characters of a server's error text kept in an error (a syntax error lists every
keyword the parser expected)."""

_CODE = re.compile(r"Code:\s*(\d+)")


class ServerError(TerminalError):
    """ClickHouse refused a statement for good; ``code`` is its exception code."""

    name = "clickhouse_error"

    def __init__(self, message: str, *, code: int | None, **fields: Any) -> None:
        super().__init__(message, code=code, **fields)
        self.code = code


def error_code(text: str) -> int | None:
    """ClickHouse's exception code at the start of an error text, if there is one."""
    found = _CODE.search(text[:200])
    return int(found.group(1)) if found else None


def classify(status: int, text: str, *, user: str, url: str) -> Exception:
    """The error for a response with HTTP ``status`` and body ``text``."""
    code = error_code(text)
    message = " ".join(text.split())[:MESSAGE_LIMIT]
    if status in (401, 403) or code in AUTHENTICATION_CODES:
        return ConfigError(
            f"ClickHouse at {url} refused user {user!r}: {message}",
            fix="check the user and the environment variable holding its password",
        )
    if code in TRANSIENT_CODES or (code is None and status >= 500):
        return TransientError(f"ClickHouse at {url} answered {status}: {message}")
    return ServerError(f"ClickHouse: {message}", code=code)


@dataclass(frozen=True)
class ServerFeatures:
    """What one server can do, as it says itself."""

    version: str
    input_formats: frozenset[str]
    types: frozenset[str]
    settings: frozenset[str]

    @property
    def datetime64(self) -> bool:
        """Timestamps with microseconds (``DateTime64(6, 'UTC')``); without it, DateTime
        keeps whole seconds."""
        return "DateTime64" in self.types

    @property
    def parquet_input(self) -> bool:
        return "Parquet" in self.input_formats

    @property
    def deduplication_tokens(self) -> bool:
        """An insert's own key against doing it twice (``insert_deduplication_token``)."""
        return "insert_deduplication_token" in self.settings

    @property
    def low_cardinality_is_experimental(self) -> bool:
        """``LowCardinality`` columns need ``allow_experimental_low_cardinality_type``."""
        return "allow_experimental_low_cardinality_type" in self.settings


class ClickHouseClient:
    """Statements over one server's HTTP interface, as one user, in one database."""

    def __init__(
        self,
        url: str,
        *,
        user: str = "default",
        password: str = "",
        database: str = "default",
        timeout_seconds: float = 300.0,
    ) -> None:
        self.url = url.rstrip("/") + "/"
        self.user = user
        self.database = database
        headers = {"X-ClickHouse-User": user}
        if password:
            headers["X-ClickHouse-Key"] = password
        self._http = httpx.Client(headers=headers, timeout=timeout_seconds, verify=_tls())

    def __repr__(self) -> str:
        return f"ClickHouseClient({self.url!r}, user={self.user!r}, database={self.database!r})"

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ClickHouseClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def execute(
        self,
        sql: str,
        *,
        data: bytes | Sequence[bytes] | None = None,
        settings: Mapping[str, str | int] | None = None,
    ) -> bytes:
        """Run ``sql``; with ``data``, the statement is an ``INSERT ... FORMAT F`` and
        ``data`` its rows in that format, whole or in parts (sent one after the other,
        never joined: a block is tens of megabytes). Returns the answer's body."""
        # The database as a parameter: servers before 19.x ignore X-ClickHouse-Database.
        params = {"database": self.database, **{k: str(v) for k, v in (settings or {}).items()}}
        headers = {}
        content: bytes | Iterator[bytes]
        if data is None:
            content = sql.encode()
        elif isinstance(data, bytes):  # the statement in the URL, the rows as the body
            params["query"] = sql
            content = data
        else:
            params["query"] = sql
            headers["Content-Length"] = str(sum(len(part) for part in data))
            content = iter(data)
        try:
            response = self._http.post(self.url, params=params, content=content, headers=headers)
        except httpx.TransportError as exc:  # timeouts among them
            raise TransientError(f"ClickHouse at {self.url}: {type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise classify(response.status_code, response.text, user=self.user, url=self.url)
        return response.content

    def query(
        self, sql: str, *, settings: Mapping[str, str | int] | None = None
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """A SELECT's column names and rows, exact: 64-bit integers (which ClickHouse's
        JSON writes as text) as ints, decimals (which it writes as bare numbers, wider
        than a float) as Decimal."""
        body = self.execute(f"{sql}\nFORMAT JSONCompact", settings=settings)
        answer = json.loads(body, parse_float=decimal.Decimal)
        names = [column["name"] for column in answer["meta"]]
        readers = [_reader(column["type"]) for column in answer["meta"]]
        rows = [
            tuple(None if v is None else read(v) for v, read in zip(row, readers, strict=True))
            for row in answer["data"]
        ]
        return names, rows

    def features(self) -> ServerFeatures:
        """What this server can do (three small reads of its system tables)."""
        [[version]] = self.query("SELECT version()")[1]
        formats = self.query("SELECT name FROM system.formats WHERE is_input")[1]
        types = self.query("SELECT name FROM system.data_type_families")[1]
        settings = self.query("SELECT name FROM system.settings")[1]
        return ServerFeatures(
            version=str(version),
            input_formats=frozenset(str(n) for (n,) in formats),
            types=frozenset(str(n) for (n,) in types),
            settings=frozenset(str(n) for (n,) in settings),
        )


@functools.cache
def _tls() -> ssl.SSLContext:
    """One TLS context for every client: making one reads the system's certificates
    (40 ms), and a destination opens a client per call."""
    return ssl.create_default_context()


def _reader(sql_type: str) -> Callable[[Any], Any]:
    """How a value of ``sql_type`` in ClickHouse's JSON becomes a Python value."""
    inner = sql_type.removeprefix("Nullable(").removeprefix("LowCardinality(")
    if inner.startswith(("Int", "UInt")):
        return int  # 64 bits and wider come as text
    if inner.startswith("Decimal"):
        return decimal.Decimal
    if inner.startswith("Float"):
        return float
    if inner.startswith("DateTime"):  # UTC wall-clock time, as the other destinations give it
        return _datetime
    return _same


def _datetime(value: Any) -> Any:
    return datetime.fromisoformat(value) if isinstance(value, str) else value


def _same(value: Any) -> Any:
    return value
