"""Browser origins (RFC 6454) and the patterns of ``api_keys[].origins``.

Origin patterns (``ApiKey.origins``): ``*`` allows any origin; ``https://shop.example.com``
allows exactly that origin; ``https://*.example.com`` allows any subdomain of example.com
over https (not example.com itself); a pattern without a scheme allows any scheme. Ports
must match: a pattern without one allows the scheme's default port only, ``:8443`` that
port, ``:*`` any port. Origins are parsed, not compared as text: a path, a fragment or
user info (``https://evil.com/.example.com``, ``https://evil.com#.example.com``,
``https://user@a.example.com``) is not an origin and matches nothing. With
origins configured, a browser request without an ``Origin`` header is refused: browsers
always send one on POST, so its absence means the caller is not a browser.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Origin:
    """A parsed origin (RFC 6454): scheme, host and port, or a pattern of them."""

    scheme: str | None
    """None in a pattern: any scheme."""
    host: str
    port: int | None
    """None: the scheme's default port. In a pattern, :data:`ANY_PORT` allows any."""


ANY_PORT = -1
_DEFAULT_PORTS = {"http": 80, "https": 443}
_HOST = re.compile(r"^(?:[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?\.)*[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?$")
_IPV6 = re.compile(r"^\[[0-9a-f:.]+\]$")


def parse_origin(text: str, *, pattern: bool = False) -> Origin | None:
    """``scheme://host[:port]`` (a browser's ``Origin`` header), None when it is not one:
    anything with a path, query, fragment, user info, or a host that is not a DNS name or
    an IP literal. ``pattern``: the scheme may be left out, the host may start with
    ``*.`` and the port may be ``*``."""
    text = text.lower()
    if text.endswith("/"):  # the root path, which some clients write out
        text = text[:-1]
    scheme: str | None = None
    rest = text
    if "://" in text:
        scheme, rest = text.split("://", 1)
        if not scheme or not scheme.isalnum():
            return None
    elif not pattern:
        return None
    host, port_text = rest, ""
    if rest.startswith("["):  # an IPv6 literal: its colons are not the port's
        close = rest.find("]")
        host, port_text = rest[: close + 1], rest[close + 1 :].removeprefix(":")
        if close < 0 or (rest[close + 1 :] and not rest[close + 1 :].startswith(":")):
            return None
    elif ":" in rest:
        host, port_text = rest.split(":", 1)
    name = host[2:] if pattern and host.startswith("*.") else host
    if not (_HOST.match(name) or _IPV6.match(name)):
        return None  # also refuses "/", "?", "#", "@" and any other character in a host
    port: int | None = None
    if port_text:
        if pattern and port_text == "*":
            port = ANY_PORT
        elif port_text.isdigit() and 0 < int(port_text) < 65536:
            port = int(port_text)
        else:
            return None
    if scheme is not None and port == _DEFAULT_PORTS.get(scheme):
        port = None
    return Origin(scheme, host, port)


def origin_allowed(origin: str, patterns: Sequence[str]) -> bool:
    """Whether ``origin`` (``scheme://host[:port]``) matches one of ``patterns``."""
    if not patterns:
        return True
    if "*" in patterns:
        return True
    parsed = parse_origin(origin)
    if parsed is None:
        return False  # "null", or not an origin at all
    for text in patterns:
        wanted = parse_origin(text, pattern=True)
        if wanted is None or (wanted.scheme is not None and wanted.scheme != parsed.scheme):
            continue
        if wanted.port != ANY_PORT and wanted.port != parsed.port:
            continue
        if wanted.host.startswith("*."):
            if parsed.host.endswith(wanted.host[1:]):  # a subdomain, never the domain
                return True
        elif wanted.host == parsed.host:
            return True
    return False
