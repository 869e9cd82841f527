"""API keys and browser origins.

Secrets are compared in constant time: the presented token is hashed once (SHA-256) and its
digest compared with ``hmac.compare_digest`` against every configured secret's digest,
without stopping at a match, so neither the position of the matching key nor the length of
a secret shows in the response time.

Origin patterns (``ApiKey.origins``): ``*`` allows any origin; ``https://shop.example.com``
allows exactly that origin; ``https://*.example.com`` allows any subdomain of example.com
over https (not example.com itself); a pattern without a scheme allows any scheme. With
origins configured, a browser request without an ``Origin`` header is refused: browsers
always send one on POST, so its absence means the caller is not a browser.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from eventpipe.config import ApiKey


class KeyKind(StrEnum):
    JS = "js"
    SERVER = "server"


@dataclass(frozen=True)
class KeyMatch:
    key: ApiKey
    kind: KeyKind


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", errors="surrogatepass")).digest()


class KeyRing:
    """Finds which configured key, and which of its two secrets, a token is."""

    def __init__(self, keys: Sequence[ApiKey]) -> None:
        entries: list[tuple[bytes, ApiKey, KeyKind]] = []
        for key in keys:
            if key.js is not None:
                entries.append((_digest(key.js.get_secret_value()), key, KeyKind.JS))
            if key.server is not None:
                entries.append((_digest(key.server.get_secret_value()), key, KeyKind.SERVER))
        self._entries = tuple(entries)

    def match(self, token: str | None) -> KeyMatch | None:
        if not token:
            return None
        digest = _digest(token)
        found: KeyMatch | None = None
        for candidate, key, kind in self._entries:
            if hmac.compare_digest(candidate, digest):
                found = KeyMatch(key, kind)
        return found

    def keys_with_js(self) -> list[ApiKey]:
        return [key for _, key, kind in self._entries if kind is KeyKind.JS]


def _split_origin(origin: str) -> tuple[str | None, str]:
    if "://" in origin:
        scheme, _, host = origin.partition("://")
        return scheme, host
    return None, origin


def origin_allowed(origin: str, patterns: Sequence[str]) -> bool:
    """Whether ``origin`` (``scheme://host[:port]``) matches one of ``patterns``."""
    if not patterns:
        return True
    origin = origin.rstrip("/").lower()
    scheme, host = _split_origin(origin)
    for pattern in patterns:
        if pattern == "*":
            return True
        p_scheme, p_host = _split_origin(pattern)
        if p_scheme is not None and p_scheme != scheme:
            continue
        if p_host.startswith("*."):
            if host.endswith(p_host[1:]) and len(host) > len(p_host) - 1:
                return True
        elif p_host == host:
            return True
    return False
