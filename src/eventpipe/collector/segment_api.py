"""The Segment tracking API: what Segment's SDKs, RudderStack's and anything else that
speaks it send, so that switching to eventpipe is a change of host and write key.

``POST /v1/track|identify|page|screen|group|alias``   one message of that type
``POST /v1/batch`` (and ``/v1/import``)               ``{"batch": [message...]}``
``POST /v1/t|i|p|s|g|a`` (and ``/v1/b``)              analytics.js's short paths
``GET  /v1/pixel/<type>?data=<base64 JSON>``          the same, as a 1x1 GIF

Authentication is Segment's: the write key is the user name of HTTP Basic auth, or a
``writeKey`` field of the body (analytics.js in a browser). A key's server secret is a
write key out of the box (server events: ``context.ip`` is believed); its browser
secret is one too (browser events: the origin is checked, the address is the peer's).

How a message becomes an event (docs/segment.md):

* the message is kept as it is, fields and nesting included (``type``, ``event``,
  ``name``, ``properties``, ``traits``, ``context``, ``userId``, ``anonymousId``...),
  so that the Segment warehouse schema's names are the columns' names after flattening
  (``context_page_url``, ``properties_price``); the secret in ``writeKey`` is dropped;
* ``messageId`` is the event id (enrichment reads it), so an SDK's retry of a message
  is one row in a destination with a primary key on ``eventn_ctx_event_id``;
* ``_timestamp`` is when it happened by the server's clock, as Segment computes its
  ``timestamp``: the client's time (``timestamp``, else ``originalTimestamp``, which
  RudderStack's SDKs send instead) corrected for the client's clock,
  ``receivedAt - (sentAt - time)``, when it sent ``sentAt``; that time as it is without
  ``sentAt``; else the time it was received. The client's fields are kept as sent (a
  ``timestamp`` is copied to ``originalTimestamp`` when that is absent), and
  ``receivedAt`` is added;
* ``event_type`` is the event name for ``track`` (as Jitsu names tables by it) and the
  type for the others (``identify``, ``page``...), so the default table template
  ``{{ event_type }}`` gives Segment's per-event tables plus ``identify``, ``page``...;
* ``context.ip`` (server keys only) and ``context.userAgent`` fill ``source_ip`` and
  ``eventn_ctx.user_agent``, which the lookups read; ``src`` is ``segment``.

A batch's own ``context`` and ``integrations`` apply to each of its messages (the
message's keys win), and its ``sentAt`` to those without their own.
"""

from __future__ import annotations

import base64
import binascii
from datetime import UTC, datetime
from typing import Any

from eventpipe.events import format_timestamp

TYPES = ("track", "identify", "page", "screen", "group", "alias")
BATCH = "batch"
SHORT = {"t": "track", "i": "identify", "p": "page", "s": "screen", "g": "group",
         "a": "alias", "b": BATCH}  # fmt: skip
"""analytics.js's paths (``/v1/t``...) and the type each takes."""

REQUIRED = {"track": ("event",), "alias": ("previousId",), "group": ("groupId",)}
"""Fields a message of a type cannot go without (Segment's spec); and every message
needs ``userId`` or ``anonymousId``."""

PIXEL_GIF = base64.b64decode("R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7")
"""A transparent 1x1 GIF, the answer of every pixel request."""


class MessageError(ValueError):
    """A message that cannot be stored; ``reason`` labels metrics."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def path_type(name: str) -> str | None:
    """The type a ``/v1/<name>`` path takes (``batch`` for a batch), None if none."""
    if name in TYPES or name in (BATCH, "import"):
        return BATCH if name == "import" else name
    return SHORT.get(name)


def basic_user(authorization: str | None) -> str | None:
    """The user name of an HTTP Basic ``Authorization`` header (Segment's write key)."""
    if not authorization:
        return None
    scheme, _, encoded = authorization.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return decoded.partition(":")[0] or None


def body_write_key(document: Any) -> str | None:
    """The ``writeKey`` a body carries (analytics.js in a browser), if any."""
    if isinstance(document, dict):
        key = document.get("writeKey")
        return key if isinstance(key, str) and key else None
    return None


def pixel_body(data: str | None) -> bytes:
    """The body of a pixel request: ``?data=``, base64 (standard or URL-safe) of the
    message's JSON. Raises MessageError when it is not base64."""
    if not data:
        raise MessageError("empty_body", "a pixel request carries its message in ?data=")
    padded = data + "=" * (-len(data) % 4)
    alphabet = b"-_" if "-" in data or "_" in data else None  # URL-safe base64
    try:
        return base64.b64decode(padded, altchars=alphabet, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise MessageError("malformed_json", f"?data= is not base64: {exc}") from None


def messages(document: Any, kind: str) -> list[Any]:
    """The messages of a body sent to a path of ``kind`` (a type, or ``batch``), with a
    batch's shared fields applied. Raises MessageError for a body of the wrong shape."""
    if not isinstance(document, dict):
        raise MessageError("not_an_object", "a Segment API body is a JSON object")
    if kind != BATCH:
        return [{**document, "type": kind}]
    batch = document.get("batch")
    if not isinstance(batch, list):
        raise MessageError("bad_batch", 'a batch body is {"batch": [message, ...]}')
    shared_context = document.get("context")
    shared = {k: document[k] for k in ("integrations", "sentAt") if k in document}
    if not shared and not isinstance(shared_context, dict):
        return batch
    out: list[Any] = []
    for message in batch:
        if isinstance(message, dict):
            message = {**shared, **message}
            if isinstance(shared_context, dict):
                own = message.get("context")
                message["context"] = (
                    {**shared_context, **own}
                    if isinstance(own, dict)
                    else (own if own is not None else dict(shared_context))
                )
        out.append(message)
    return out


def to_event(
    message: Any, received_at: datetime, *, server: bool, received: str | None = None
) -> Any:
    """The eventpipe event of one Segment message (the module's docstring), made in
    place; a message that is not an object is returned as it is, for enrichment to
    reject. Raises MessageError for a message Segment's spec refuses. ``received``:
    ``received_at`` formatted, once per request."""
    if type(message) is not dict:
        return message
    if "writeKey" in message:  # first: a message refused below keeps no key in failed/
        del message["writeKey"]
    get = message.get
    kind = get("type")
    if kind not in TYPES:
        raise MessageError("bad_type", f"type must be one of {', '.join(TYPES)}, not {kind!r}")
    for name in REQUIRED.get(kind, ()):
        if not _text(get(name)):
            raise MessageError("missing_field", f"a {kind} message needs {name}")
    if not _text(get("userId")) and not _text(get("anonymousId")):
        raise MessageError("missing_field", "a message needs userId or anonymousId")
    received = received or format_timestamp(received_at)
    timed = "timestamp" in message or "originalTimestamp" in message
    happened = _when(message, received_at) if timed else received_at
    message["receivedAt"] = received
    message["_timestamp"] = received if happened is received_at else format_timestamp(happened)
    message["event_type"] = message["event"] if kind == "track" else kind
    message["src"] = "segment"
    context = get("context")
    if type(context) is dict:  # written flat: this runs for every message of a batch
        ip = context.get("ip")
        if server and type(ip) is str and ip:
            message["source_ip"] = ip
        agent = context.get("userAgent")
        if type(agent) is str and agent:
            own = message.setdefault("eventn_ctx", {})
            if type(own) is dict:
                own.setdefault("user_agent", agent)
    return message


def _when(message: dict[str, Any], received_at: datetime) -> datetime:
    """When the message happened by the server's clock (the module's docstring)."""
    name = "timestamp" if message.get("timestamp") is not None else "originalTimestamp"
    stamp = message.get(name)
    if stamp is None:
        return received_at
    happened = _parse(stamp, name)
    message.setdefault("originalTimestamp", stamp)
    sent = message.get("sentAt")
    if sent is None:
        return happened
    try:
        return received_at - (_parse(sent, "sentAt") - happened)
    except OverflowError:
        raise MessageError(
            "bad_timestamp", f"sentAt {sent!r} and {name} {stamp!r} are too far apart"
        ) from None


def _parse(value: Any, name: str) -> datetime:
    if not isinstance(value, str):
        raise MessageError("bad_timestamp", f"{name} must be an ISO 8601 string, not {value!r}")
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise MessageError("bad_timestamp", f"{name} {value!r} is not an ISO 8601 time") from None
    return parsed.astimezone(UTC) if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _text(value: Any) -> bool:
    """A non-empty string or an integer (an id may be either)."""
    kind = type(value)
    return (kind is str and value != "") or kind is int
