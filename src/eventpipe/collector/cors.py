"""CORS for the browser endpoints: what a preflight allows and what every answer to an
allowed origin carries (which origins are allowed: eventpipe.origins and the keys)."""

from __future__ import annotations

import re

_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$")
"""A header name (RFC 9110's token), as a preflight may ask to send it."""
MAX_REQUESTED_HEADERS = 32
KNOWN_HEADERS = "Content-Type, X-Auth-Token, Authorization"
"""Allowed in every preflight answer; the others a preflight asks for are echoed (SDKs
send their own: RudderStack's ``AnonymousId``, ``SentAt``, ``RSA-Retry-Attempt``...;
analytics-next's ``X-Retry-Count`` on retries)."""


def cors_headers(origin: str) -> dict[str, str]:
    """What an answer to an allowed ``origin`` carries, errors included: the origin itself
    (never ``*``), credentials allowed (``navigator.sendBeacon`` sends in that mode), and
    the headers a client may read."""
    return {
        "Access-Control-Allow-Origin": origin,
        "Access-Control-Allow-Credentials": "true",
        "Access-Control-Expose-Headers": "Retry-After, X-Eventpipe-Rejected",
        "Vary": "Origin",
    }


def allowed_request_headers(requested: str | None) -> str:
    """The ``Access-Control-Allow-Headers`` of a preflight: the known ones, and those it
    asks for that are header names (at most MAX_REQUESTED_HEADERS)."""
    asked = [name.strip() for name in (requested or "").split(",") if name.strip()]
    echoed = [n for n in asked[:MAX_REQUESTED_HEADERS] if _HEADER_NAME.match(n)]
    known = {n.strip().lower() for n in KNOWN_HEADERS.split(",")}
    return ", ".join([KNOWN_HEADERS, *(n for n in echoed if n.lower() not in known)])
