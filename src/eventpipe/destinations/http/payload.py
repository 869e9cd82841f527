"""The HTTP sink's payloads: an event as the API takes it (``dataset``: addEvents'
``{"attrs": ..., "ts": ...}`` in a session's ``events``; ``ndjson``: its attributes, one
event per line), a session's head, and an event too large alone trimmed to fit."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

TRIMMED_ATTRIBUTE = "eventpipe_trimmed"
SESSIONS = uuid.UUID("6f1d2c3e-8a4b-4f5e-9c0d-1e2f3a4b5c6d")
"""The namespace of session ids and idempotency keys."""
_TAIL = b'],"threads":[]}'
"""The end of a dataset payload, after its events."""


def session_id(destination: str, key: str) -> str:
    """A stable session id per destination and key (addEvents: one writer per session)."""
    return str(uuid.uuid5(SESSIONS, f"{destination}\x00{key}"))


@dataclass(frozen=True)
class Payloads:
    """The payloads of one destination, in its ``format``."""

    destination: str
    format: Literal["dataset", "ndjson"]

    def event(self, ts_ns: int | None, attrs: dict[str, Any] | bytes) -> bytes:
        """One event as it goes into a payload; ``attrs`` a dict or its JSON object."""
        if isinstance(attrs, dict):
            attrs = orjson.dumps(attrs)
        if self.format == "ndjson":
            return attrs
        ts = b',"ts":"%d"}' % ts_ns if ts_ns is not None else b"}"
        return b'{"attrs":' + attrs + ts

    def besides_attributes(self, ts_ns: int | None) -> int:
        """Bytes an event takes besides its attributes."""
        return len(self.event(ts_ns, {}))

    def head(self, key: str, info: dict[str, Any]) -> bytes:
        """A session's payload up to its first event (``dataset``: the session and its
        info, the ``group_by`` values; ``ndjson``: nothing)."""
        if self.format == "ndjson":
            return b""
        sid = session_id(self.destination, key)
        return orjson.dumps({"session": sid, "sessionInfo": info})[:-1] + b',"events":['

    def envelope(self, head: bytes) -> int:
        """Bytes of a payload that are not events (a 2-byte margin)."""
        return len(head) + len(_TAIL) + 2 if head else 0

    def payload(self, head: bytes, events: Sequence[bytes]) -> bytes:
        if self.format == "ndjson":
            return b"".join(e + b"\n" for e in events)
        return head + b",".join(events) + _TAIL


def trim(attrs: dict[str, Any], budget: int, extra: int = 0) -> dict[str, Any]:
    """``attrs`` cut to fit ``budget`` bytes of JSON (besides ``extra``): attributes kept
    whole smallest first while they fit, the first string that does not fit truncated,
    the rest dropped; marked with ``eventpipe_trimmed``."""
    kept: dict[str, Any] = {TRIMMED_ATTRIBUTE: True}
    used = extra + len(orjson.dumps(kept))
    sized = sorted(attrs.items(), key=lambda kv: (len(orjson.dumps(kv[1])), kv[0]))
    for name, value in sized:
        size = len(orjson.dumps({name: value})) - 1  # the comma replaces one brace
        if used + size <= budget:
            kept[name] = value
            used += size
            continue
        if isinstance(value, str):
            room = budget - used - (len(orjson.dumps({name: ""})) - 1)
            if room > 0:
                kept[name] = _truncate(value, room)
        break
    return kept


def _truncate(text: str, room: int) -> str:
    """The longest prefix of ``text`` whose JSON string fits ``room`` bytes."""
    low, high = 0, len(text)
    while low < high:
        middle = (low + high + 1) // 2
        if len(orjson.dumps(text[:middle])) - 2 <= room:
            low = middle
        else:
            high = middle - 1
    return text[:low]
