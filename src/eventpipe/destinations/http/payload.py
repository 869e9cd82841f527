"""The HTTP sink's payloads: an event as the API takes it (``dataset``: addEvents'
``{"attrs": ..., "ts": ...}`` in a session's ``events``; ``ndjson``: its attributes, one
event per line; ``ga4``: one of GA4's Measurement Protocol events, in a request per
client), a session's head, and an event too large alone trimmed to fit."""

from __future__ import annotations

import re
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
_GA4_TAIL = b"]}"

Format = Literal["dataset", "ndjson", "ga4"]

GA4_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,39}$")
"""An event's or a parameter's name in GA4: a letter, then letters, digits and ``_``."""
GA4_RESERVED_EVENTS = frozenset({
    "ad_activeview", "ad_click", "ad_exposure", "ad_impression", "ad_query", "ad_reward",
    "adunit_exposure", "app_background", "app_clear_data", "app_exception", "app_remove",
    "app_store_refund", "app_store_subscription_cancel", "app_store_subscription_convert",
    "app_store_subscription_renew", "app_update", "app_upgrade", "dynamic_link_app_open",
    "dynamic_link_app_update", "dynamic_link_first_open", "error", "firebase_campaign",
    "firebase_in_app_message_action", "firebase_in_app_message_dismiss",
    "firebase_in_app_message_impression", "first_open", "first_visit", "in_app_purchase",
    "notification_dismiss", "notification_foreground", "notification_open",
    "notification_receive", "os_update", "session_start", "session_start_with_rollout",
    "user_engagement",
})  # fmt: skip
"""Names GA4 keeps for its own events (its Measurement Protocol reference)."""
GA4_RESERVED_PREFIXES = ("_", "firebase_", "ga_", "google_", "gtag.")
GA4_MAX_PARAMS = 25
GA4_LONG_VALUES = {"page_location": 1000, "page_referrer": 420, "page_title": 300}
"""Parameters GA4 keeps longer than :data:`GA4_MAX_VALUE` characters."""
GA4_MAX_VALUE = 100
GA4_NOT_PARAMS = frozenset({"api_key", "source_ip", "src"})
GA4_NOT_PARAMS_PREFIXES = ("_", "eventn_ctx_")
"""What the collector adds to every event (collector/enrich.py: the key, the sender's IP
address, the event's context, ``_timestamp``): not sent as parameters unless listed (GA4's
policy forbids personal data such as an IP address in them)."""


class Refused(ValueError):
    """An event (or a session's events) the API would not take: the reason. It goes to
    failed/ with it, never in a request."""


@dataclass(frozen=True)
class Ga4Fields:
    """Which flattened columns make a GA4 request's ids and each event's name and
    parameters."""

    client_id: str
    user_id: str | None
    event_name: str
    params: tuple[str, ...] = ()
    """Empty: every column but the ones above and the collector's
    (:data:`GA4_NOT_PARAMS`)."""


def session_id(destination: str, key: str) -> str:
    """A stable session id per destination and key (addEvents: one writer per session)."""
    return str(uuid.uuid5(SESSIONS, f"{destination}\x00{key}"))


@dataclass(frozen=True)
class Payloads:
    """The payloads of one destination, in its ``format``."""

    destination: str
    format: Format
    ga4: Ga4Fields | None = None

    def event(self, ts_ns: int | None, attrs: dict[str, Any] | bytes) -> bytes:
        """One event as it goes into a payload; ``attrs`` a dict or its JSON object.
        Refused: an event the API would not take (``ga4``: :meth:`ga4_event`)."""
        if self.format == "ga4":
            return self.ga4_event(ts_ns, attrs)
        if isinstance(attrs, dict):
            attrs = orjson.dumps(attrs)
        if self.format == "ndjson":
            return attrs
        ts = b',"ts":"%d"}' % ts_ns if ts_ns is not None else b"}"
        return b'{"attrs":' + attrs + ts

    def besides_attributes(self, ts_ns: int | None) -> int:
        """Bytes an event takes besides its attributes."""
        return len(self.event(ts_ns, {}))

    def ga4_event(self, ts_ns: int | None, attrs: dict[str, Any] | bytes) -> bytes:
        """``{"name", "params", "timestamp_micros"}``, within GA4's limits: a name of
        GA4's syntax and not one of its own events, 25 parameters at most, named like
        events and not with GA4's prefixes; longer texts than GA4 keeps are cut to its
        length (100 characters; a page's location 1,000). Refused otherwise."""
        fields = self.ga4
        assert fields is not None
        values = orjson.loads(attrs) if isinstance(attrs, bytes) else attrs
        name = values.get(fields.event_name)
        if not isinstance(name, str) or not GA4_NAME.match(name):
            raise Refused(
                f"GA4 event name {name!r} (field {fields.event_name}): a letter, then "
                "letters, digits or _, 40 at most"
            )
        if name in GA4_RESERVED_EVENTS:
            raise Refused(f"GA4 event name {name!r} is one of GA4's own (reserved)")
        chosen = fields.params or tuple(
            k for k in values if k != fields.event_name and k not in GA4_NOT_PARAMS
            and not k.startswith(GA4_NOT_PARAMS_PREFIXES)
        )  # fmt: skip
        params: dict[str, Any] = {}
        for param in chosen:
            value = values.get(param)
            if value is None:
                continue
            if not GA4_NAME.match(param) or param.startswith(GA4_RESERVED_PREFIXES):
                raise Refused(
                    f"GA4 parameter name {param!r}: a letter, then letters, digits or _, 40 "
                    f"at most, not starting {', '.join(GA4_RESERVED_PREFIXES)}"
                )
            if isinstance(value, bool):
                value = str(value).lower()
            elif isinstance(value, str):
                value = value[: GA4_LONG_VALUES.get(param, GA4_MAX_VALUE)]
            params[param] = value
        if len(params) > GA4_MAX_PARAMS:
            raise Refused(
                f"{len(params)} GA4 parameters, GA4 takes {GA4_MAX_PARAMS}: list the ones to "
                "send in the destination's params"
            )
        event: dict[str, Any] = {"name": name, "params": params}
        if ts_ns is not None:
            event["timestamp_micros"] = ts_ns // 1000
        return orjson.dumps(event)

    def head(self, key: str, info: dict[str, Any]) -> bytes:
        """A session's payload up to its first event (``dataset``: the session and its
        info, the ``group_by`` values; ``ndjson``: nothing; ``ga4``: the client's and
        the user's ids, Refused without a client id)."""
        if self.format == "ndjson":
            return b""
        if self.format == "ga4":
            return self._ga4_head(info)
        sid = session_id(self.destination, key)
        return orjson.dumps({"session": sid, "sessionInfo": info})[:-1] + b',"events":['

    def _ga4_head(self, info: dict[str, Any]) -> bytes:
        fields = self.ga4
        assert fields is not None
        client = info.get(fields.client_id)
        if client is None or client == "":
            raise Refused(f"no GA4 client_id: the event's {fields.client_id} is empty")
        ids = {"client_id": str(client)}
        user = info.get(fields.user_id) if fields.user_id else None
        if user is not None and user != "":
            ids["user_id"] = str(user)
        return orjson.dumps(ids)[:-1] + b',"events":['

    def envelope(self, head: bytes) -> int:
        """Bytes of a payload that are not events (a 2-byte margin)."""
        return len(head) + len(_TAIL) + 2 if head else 0

    def payload(self, head: bytes, events: Sequence[bytes]) -> bytes:
        if self.format == "ndjson":
            return b"".join(e + b"\n" for e in events)
        tail = _GA4_TAIL if self.format == "ga4" else _TAIL
        return head + b",".join(events) + tail


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
