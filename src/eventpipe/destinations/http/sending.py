"""The HTTP sink's requests: one payload posted, and retried while the failure is one a
later try may not have (connection errors, timeouts, 429, 5xx, refused credentials),
with exponential backoff and jitter (retry.Backoff), ``Retry-After`` honoured, until
``retry_max_elapsed_seconds`` (or the run's deadline) runs out, or, past
``hold_seconds``, handed back to the job. A terminal answer is returned at once: the
delivery splits the payload to find the events refused."""

from __future__ import annotations

import email.utils
import enum
import gzip
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from eventpipe.destinations.http.payload import SESSIONS, session_id
from eventpipe.destinations.http.settings import HttpSettings
from eventpipe.retry import Backoff

log = logging.getLogger("eventpipe.http")

NEVER_TRANSIENT = frozenset({501, 505})
"""5xx answers that no retry changes (Not Implemented, HTTP Version Not Supported)."""
AUTHENTICATION = frozenset({401, 403, 407})
"""Answers about the credentials, never about an event: retried, never split."""
MAX_ANSWER_BYTES = 8192
"""Bytes of an answer's body that are read (a hostile or broken API may send gigabytes)."""

Post = Callable[[bytes, dict[str, str]], tuple[int, dict[str, str], bytes]]
"""Post a body with headers: the status, the headers (lower-case names), the body's start."""


class Outcome(enum.Enum):
    DELIVERED = "delivered"
    REFUSED = "refused"
    """A terminal answer (4xx, 501, 505): split the payload to find the events refused."""
    FAILED = "failed"
    """Retries ran out."""
    LATER = "later"
    """Still failing after ``hold_seconds``: left for the next attempt."""


@dataclass(frozen=True)
class Sent:
    """What came of one payload."""

    outcome: Outcome
    reason: str
    """Why it was not delivered ("" when it was)."""
    timed_out: bool
    """A try timed out: the API may have stored the events (possible duplicates)."""
    retries: int
    retry_after: float
    """What the API asked for (Retry-After) when it was handed back, else 0."""
    answer: bytes = b""
    """The body of a 2xx answer (its first :data:`MAX_ANSWER_BYTES`)."""


class Sender:
    """Sends payloads to the settings' URL: one client (its connection pool) for the
    task's sender threads. ``post`` replaces HTTP (tests)."""

    def __init__(
        self,
        settings: HttpSettings,
        *,
        post: Post | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = settings
        self._clock = clock
        self._sleep = sleep
        self._client: Any = None
        if post is None:
            import httpx

            self._client = httpx.Client(
                timeout=settings.timeout_seconds,
                limits=httpx.Limits(max_connections=max(1, settings.parallel)),
            )
        self._post = post or self._http_post

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def send(
        self, key: str, rows: tuple[int, int], payload: bytes, *, url: str | None = None
    ) -> Sent:
        """Post the payload of session ``key`` (its events' first and last rows),
        retrying transient failures (the module's docstring); to ``url`` instead of the
        settings' (a validation endpoint: its answer is returned)."""
        s = self.settings
        body = gzip.compress(payload, compresslevel=3) if s.gzip else payload
        sid = session_id(s.destination, key)
        headers = {
            **s.headers,
            "Content-Type": "application/json",
            "X-Eventpipe-Session": sid,
            # The same events of the same run: the same key, however often resent.
            "Idempotency-Key": str(uuid.uuid5(SESSIONS, f"{sid}\x00{s.run}\x00"
                                              f"{rows[0]}\x00{rows[1]}")),
        }  # fmt: skip
        if s.format == "ndjson":
            headers["Content-Type"] = "application/x-ndjson"
        if s.gzip:
            headers["Content-Encoding"] = "gzip"
        backoff = Backoff(
            s.retry_initial_seconds, s.retry_max_seconds, clock=self._clock,
            max_elapsed=s.retry_max_elapsed_seconds if s.give_up_at is None else None,
            deadline=s.give_up_at,
        )  # fmt: skip
        backoff.start()  # the time allowed counts from the first attempt
        timed_out, retries = False, 0
        while True:
            try:
                if url is None:
                    status, response_headers, text = self._post(body, headers)
                else:
                    status, response_headers, text = self._http_post(body, headers, url)
            except _Timeout as exc:
                status, response_headers, text = 0, {}, f"timed out: {exc}".encode()
                timed_out = True
            except OSError as exc:
                status, response_headers, text = 0, {}, f"cannot connect: {exc}".encode()
            if 200 <= status < 300:
                return Sent(Outcome.DELIVERED, "", timed_out, retries, 0.0, text)
            reason = _reason(status, text)
            retried = status == 429 or status >= 500 or status in AUTHENTICATION
            if status and (not retried or status in NEVER_TRANSIENT):
                return Sent(Outcome.REFUSED, reason, timed_out, retries, 0.0)
            retry_after = _retry_after(response_headers.get("retry-after")) or 0.0
            wait = backoff.wait(retry_after)
            if wait is None:
                gave_up = f"{reason} (gave up after {s.retry_max_elapsed_seconds:.0f} s)"
                return Sent(Outcome.FAILED, gave_up, timed_out, retries, 0.0)
            if s.hold_seconds is not None and backoff.elapsed() + wait > s.hold_seconds:
                log.warning("%s session %s: %s; handed back to wait outside the task",
                            s.destination, sid, reason)  # fmt: skip
                return Sent(Outcome.LATER, reason, timed_out, retries, retry_after)
            retries += 1
            log.warning("%s session %s: %s; retrying in %.1f s", s.destination, sid, reason,
                        wait)  # fmt: skip
            self._sleep(wait)

    def _http_post(
        self, body: bytes, headers: dict[str, str], url: str | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        import httpx

        try:
            with self._client.stream("POST", url or self.settings.url, content=body,
                                     headers=headers) as response:  # fmt: skip
                answer = b""
                for chunk in response.iter_bytes():
                    answer += chunk
                    if len(answer) >= MAX_ANSWER_BYTES:
                        break  # the rest is not read: the connection is closed
                return (
                    response.status_code,
                    {k.lower(): v for k, v in response.headers.items()},
                    answer[:MAX_ANSWER_BYTES],
                )
        except httpx.TimeoutException as exc:
            raise _Timeout(str(exc) or type(exc).__name__) from exc
        except httpx.TransportError as exc:
            raise OSError(str(exc) or type(exc).__name__) from exc


class _Timeout(OSError):
    pass


def _reason(status: int, text: bytes) -> str:
    excerpt = text[:500].decode("utf-8", errors="replace").strip()
    return f"HTTP {status}: {excerpt}" if status else excerpt


def _retry_after(value: str | None) -> float | None:
    """``Retry-After``: seconds, or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
