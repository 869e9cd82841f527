"""Who may see the console and how its pages are kept to themselves.

* Every page and API call needs the admin token (``console.token``): a browser gives it
  once at ``/login`` and then holds a session cookie (random, HttpOnly, SameSite=Strict,
  kept in this process's memory only: a restart logs everyone out); a script sends
  ``Authorization: Bearer <token>``. Tokens are compared in constant time.
* Every POST from a session carries the session's CSRF token (a form field ``csrf`` or
  the ``X-CSRF-Token`` header); the login form its own, matched with a cookie (a double
  submit). A bearer call carries no cookie a browser would add by itself: no CSRF token.
* Every answer has a strict Content-Security-Policy (scripts, styles, images and
  connections from the console itself only; no inline script; no frames), and is never
  cached. No page holds the token or any key's secret.
"""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import dataclass

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

SESSION_COOKIE = "eventpipe_console"
LOGIN_COOKIE = "eventpipe_console_login"
SESSION_SECONDS = 12 * 3600
MAX_SESSIONS = 1000

HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "cache-control": "no-store",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
}
"""Sent with every answer of the console."""


@dataclass(frozen=True)
class Session:
    csrf: str
    expires: float


class Sessions:
    """The sessions of logged-in browsers (in memory)."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()
        self._sessions: dict[str, Session] = {}

    def token_matches(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self._token)

    def open(self) -> tuple[str, Session]:
        """A new session (the oldest dropped past MAX_SESSIONS)."""
        now = time.time()
        self._sessions = {k: s for k, s in self._sessions.items() if s.expires > now}
        while len(self._sessions) >= MAX_SESSIONS:
            self._sessions.pop(next(iter(self._sessions)))
        key = secrets.token_urlsafe(32)
        session = self._sessions[key] = Session(secrets.token_urlsafe(32), now + SESSION_SECONDS)
        return key, session

    def close(self, key: str) -> None:
        self._sessions.pop(key, None)

    def of(self, request: Request) -> Session | None:
        key = request.cookies.get(SESSION_COOKIE)
        session = self._sessions.get(key) if key else None
        if session is None or session.expires < time.time():
            return None
        return session

    def bearer(self, request: Request) -> bool:
        """Whether the request carries the admin token as ``Authorization: Bearer``."""
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and bool(given) and self.token_matches(given.strip())


def same(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


class SecurityHeaders:
    """Adds :data:`HEADERS` to every answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {k.lower() for k, _ in message.get("headers", [])}
                extra = [(k.encode(), v.encode()) for k, v in HEADERS.items()
                         if k.encode() not in present]  # fmt: skip
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await self.app(scope, receive, with_headers)
