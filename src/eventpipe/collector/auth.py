"""API keys and browser origins.

Secrets are compared in constant time: the presented token is hashed once (SHA-256) and its
digest compared with ``hmac.compare_digest`` against every configured secret's digest,
without stopping at a match, so neither the position of the matching key nor the length of
a secret shows in the response time.

Origins are matched by :mod:`eventpipe.origins`.
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
        entries: list[tuple[bytes, KeyMatch]] = []
        for key in keys:
            if key.js is not None:
                entries.append((_digest(key.js.get_secret_value()), KeyMatch(key, KeyKind.JS)))
            if key.server is not None:
                secret = key.server.get_secret_value()
                entries.append((_digest(secret), KeyMatch(key, KeyKind.SERVER)))
        self._entries = tuple(entries)

    def match(self, token: str | None) -> KeyMatch | None:
        if not token:
            return None
        digest = _digest(token)
        found: KeyMatch | None = None
        for candidate, match in self._entries:
            if hmac.compare_digest(candidate, digest):
                found = match
        return found

    def match_write_key(self, token: str | None) -> KeyMatch | None:
        """A Jitsu 2 write key (``X-Write-Key``): ``id:secret``, the secret a key's and
        the id that key's own; or a secret alone."""
        found = self.match(token)
        if found is not None or not token or ":" not in token:
            return found
        key_id, _, secret = token.partition(":")
        found = self.match(secret)
        return found if found is not None and found.key.id == key_id else None

    def keys_with_js(self) -> list[ApiKey]:
        return [match.key for _, match in self._entries if match.kind is KeyKind.JS]
