"""Secrets never reach the disk: the last step before the collector appends anything.

Two rules, applied to the bytes of one append (its event lines and its failed/ records
alike, raw-body records included), so that no path to the disk can miss them:

* **Configured secrets, anywhere.** Every key's js and server secret, as JSON writes it
  inside a string, is replaced by ``[redacted]`` wherever it appears: a ``writeKey`` of
  any name and depth, an ``Authorization`` header a client copied into ``context``, the
  raw body of a refused request. A replacement inside a JSON string keeps the line
  valid JSON (secrets are 8 characters or more, config/collector.py).
* **``writeKey`` fields, any depth, any casing**, are removed from events and from the
  events of failed/ records (Segment's SDKs put the key there; whatever it holds, it is
  somebody's key, and a column of it is a secret in the warehouse).

Cost: one pass of Hyperscan over the append's bytes for all of them at once
(:mod:`eventpipe.collector.scan`; about 0.2 us per event of 570 bytes, where a lowered
copy, a search for ``"writekey":`` in it and one search per secret took about 1 us);
the searches of Python's own and the lines' parsing again happen only when something
was found.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from eventpipe.collector.body import exact_json
from eventpipe.collector.scan import Patterns
from eventpipe.config import ApiKey

REDACTED = b"[redacted]"

_WRITE_KEY = b'"writekey":'
"""How a ``writeKey`` field of any casing reads in orjson's output, lowered."""


class Scrubber:
    """Removes the configured secrets and ``writeKey`` fields from lines to be written."""

    @classmethod
    def of_keys(cls, keys: Iterable[ApiKey]) -> Scrubber:
        """A scrubber of every secret of ``keys``."""
        return cls(
            secret.get_secret_value()
            for key in keys
            for secret in (key.js, key.server)
            if secret is not None
        )

    def __init__(self, secrets: Iterable[str]) -> None:
        # As JSON encodes each inside a string: the quotes cut off, escapes kept.
        encoded = {orjson.dumps(s)[1:-1] for s in secrets if s}
        # Longest first: a secret that holds another is replaced whole.
        self._secrets = tuple(sorted(encoded, key=len, reverse=True))
        self._patterns = Patterns([_WRITE_KEY, *self._secrets], literal=True,
                                  caseless=frozenset({0}))  # fmt: skip

    def __call__(self, data: bytes) -> bytes:
        """``data`` (JSON lines) without secrets and ``writeKey`` fields."""
        found = self._patterns.found(data)
        if not found:  # nearly always
            return data
        if found & 1:
            data = b"".join(_without_write_keys(line) for line in data.splitlines(keepends=True))
        for secret in self._secrets:  # in order, as each replacement leaves the text
            if secret in data:
                data = data.replace(secret, REDACTED)
        return data


def _without_write_keys(line: bytes) -> bytes:
    if _WRITE_KEY not in line.lower():
        return line
    # Read with every integer exact (orjson reads one past 64 bits as a float); rare.
    document = exact_json(line)
    return orjson.dumps(drop_write_keys(document), option=orjson.OPT_APPEND_NEWLINE)


def drop_write_keys(value: Any) -> Any:
    """``value`` without object fields named ``writeKey`` in any casing, at any depth (in
    place; returned for convenience)."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for name in [k for k in node if k.lower() == "writekey"]:
                del node[name]
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return value
