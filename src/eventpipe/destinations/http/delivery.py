"""The HTTP sink's sessions: one Spark task's events buffered by session, published when
full, old or at the end, one request in flight per session, memory bounded; a payload
refused for its events split in halves (the package's docstring)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from eventpipe.destinations.http.payload import Payloads, Refused, trim
from eventpipe.destinations.http.progress import Failed, Progress
from eventpipe.destinations.http.sending import Outcome, Post, Sender, Sent
from eventpipe.destinations.http.settings import HttpSettings

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass
class Stats:
    delivered: int = 0
    requests: int = 0
    payload_bytes: int = 0
    """Uncompressed bytes of the payloads delivered."""
    trimmed: int = 0
    retries: int = 0
    possible_duplicates: int = 0
    """Events of requests that timed out and were sent again (the API may have stored
    them the first time)."""
    peak_buffered_bytes: int = 0
    """The most event bytes held at once (buffers and requests in flight)."""
    already_sent: int = 0
    """Events skipped because a progress record says an earlier attempt handled them."""
    unsent: int = 0
    """Events of sessions handed back (``hold_seconds``): neither delivered nor failed."""
    retry_after: float = 0.0
    """The longest wait the API asked for (Retry-After) when a session was handed back."""


@dataclass
class _Event:
    row: int
    body: bytes
    """The event as it goes into the payload (JSON)."""
    refusal: str = ""
    """Why the API would not take it (payload.Refused): it goes to failed/ with this, in
    its turn among the session's events, never into a payload."""


@dataclass
class _Session:
    key: str
    head: bytes
    """The payload's start, up to its first event (``dataset``: session and sessionInfo;
    ``ndjson``: nothing)."""
    refusal: str = ""
    """Why none of its events can be sent (``ga4``: no client id)."""
    events: list[_Event] = field(default_factory=list)
    size: int = 0
    """Bytes of ``events`` in a payload (with their separators)."""
    started: float = 0.0
    in_flight: Future[None] | None = None
    handed_back: bool = False
    """The API kept failing longer than ``hold_seconds``: the session's further events
    are left for the next attempt, in order (none is sent after one that was not)."""


class Delivery:
    """Delivers the events of one task; :meth:`add` each, then :meth:`finish`."""

    def __init__(
        self,
        settings: HttpSettings,
        *,
        post: Post | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = settings
        self.stats = Stats()
        self.failed: list[Failed] = []
        self._clock = clock
        self._sender = Sender(settings, post=post, clock=clock, sleep=sleep)
        self._payloads = Payloads(settings.destination, settings.format, settings.ga4)
        self._sessions: dict[str, _Session] = {}
        self._pool = ThreadPoolExecutor(max_workers=max(1, settings.parallel))
        self._lock = threading.Lock()
        self._bytes = 0  # buffered and in flight
        self._room = threading.Condition(self._lock)
        self._sweep_at = 0.0  # the next look for buffers past their lifetime
        self._progress = Progress(settings.progress) if settings.progress else None
        self._done = self._progress.done() if self._progress else {}
        """The last row handled per session key, by earlier attempts."""

    # -- input ------------------------------------------------------------------------

    def add(self, row: int, key: str, info: dict[str, Any], ts_ns: int | None,
            attrs: dict[str, Any] | bytes) -> None:  # fmt: skip
        """One event of session ``key`` (whose ``group_by`` values are ``info``); rows
        come in order within a session. ``attrs``: a dict, or its JSON object as bytes
        (sent as it is, parsed only to be trimmed)."""
        if row <= self._done.get(key, -1):
            self.stats.already_sent += 1
            return
        session = self._sessions.get(key)
        payloads = self._payloads
        if session is None:
            try:
                session = _Session(key, payloads.head(key, info))
            except Refused as refused:
                session = _Session(key, b"", refusal=str(refused))
            self._sessions[key] = session
        if session.handed_back:
            with self._lock:
                self.stats.unsent += 1
            return
        refusal = session.refusal
        body = b""
        if not refusal:
            try:
                body = payloads.event(ts_ns, attrs)
            except Refused as refused:
                refusal = str(refused)
        room = self.settings.max_payload_bytes - payloads.envelope(session.head)
        if len(body) > room and payloads.format == "ga4":
            refusal, body = f"larger than a request may be ({room} bytes)", b""
        elif len(body) > room:
            whole = orjson.loads(attrs) if isinstance(attrs, bytes) else attrs
            besides = payloads.besides_attributes(ts_ns)
            body = payloads.event(ts_ns, trim(whole, room - 16, besides))
            self.stats.trimmed += 1
        full = self.settings.max_events is not None and (
            len(session.events) >= self.settings.max_events
        )
        if session.events and (full or session.size + len(body) + 1 > room):
            self._publish(session)
        self._reserve(len(body))
        if not session.events:
            session.started = self._clock()
        session.events.append(_Event(row, body, refusal))
        session.size += len(body) + 1
        self._publish_old()

    def finish(self) -> Stats:
        """Publish every buffer, wait for every request; ``self.failed`` holds the events
        that could not be delivered."""
        try:
            for session in self._sessions.values():
                if session.events:
                    self._publish(session)
            for session in self._sessions.values():
                if session.in_flight is not None:
                    session.in_flight.result()
        finally:
            self._pool.shutdown(wait=True)
            self._sender.close()
            if self._progress is not None:
                self._progress.close()
        return self.stats

    # -- publishing -------------------------------------------------------------------

    def _reserve(self, size: int) -> None:
        """Wait until ``size`` more bytes fit under ``max_buffer_bytes``: buffers not in
        flight are sent (fullest first), then requests in flight end and free theirs. A
        single event always fits."""
        while True:
            with self._room:
                if not self._bytes or self._bytes + size <= self.settings.max_buffer_bytes:
                    self._bytes += size
                    self.stats.peak_buffered_bytes = max(
                        self.stats.peak_buffered_bytes, self._bytes
                    )
                    return
                idle = [s for s in self._sessions.values() if s.events and not _busy(s)]
                if not idle:
                    self._room.wait(timeout=1.0)
                    continue
            self._publish(max(idle, key=lambda s: s.size))

    def _release(self, size: int) -> None:
        with self._room:
            self._bytes -= size
            self._room.notify_all()

    def _publish_old(self) -> None:
        """Publish buffers past their lifetime; looked for every tenth of the lifetime,
        not at every event (a task may own thousands of sessions)."""
        now = self._clock()
        if now < self._sweep_at:
            return
        self._sweep_at = now + self.settings.max_lifetime_seconds / 10
        idle = []
        for key, session in self._sessions.items():
            old = now - session.started >= self.settings.max_lifetime_seconds
            if session.events and old and not _busy(session):
                self._publish(session)
            elif not session.events and not _busy(session) and not session.handed_back:
                idle.append(key)  # a new event of it makes a new one (the same session id)
        for key in idle:
            done = self._sessions.pop(key).in_flight
            if done is not None:
                done.result()  # done: raises what its sender raised, as finish() would

    def _publish(self, session: _Session) -> None:
        """Hand the session's buffer to a sender thread, after its request in flight."""
        if session.in_flight is not None:
            session.in_flight.result()  # one request per session at a time
        events, session.events, session.size = session.events, [], 0
        if session.handed_back:  # its request in flight was: these wait for it
            with self._lock:
                self.stats.unsent += len(events)
            self._release(sum(len(e.body) for e in events))
            return
        session.in_flight = self._pool.submit(self._deliver, session, events)

    def _deliver(self, session: _Session, events: list[_Event]) -> None:
        try:
            self._send_all(session, events)
        finally:
            self._release(sum(len(e.body) for e in events))

    def _send_all(self, session: _Session, events: list[_Event]) -> None:
        """Send the events the API would take as one payload (checked at the validation
        endpoint first, if any); then the refused ones fail, with their reasons, unless
        the session was handed back (they are refused again next time)."""
        refused = [e for e in events if e.refusal]
        sendable = [e for e in events if not e.refusal]
        if sendable and self.settings.validate_url:
            checked = self._validated(session, sendable)
            refused += [_Event(e.row, e.body, why) for e in sendable
                        if (why := (checked or {}).get(e.row))]  # fmt: skip
            sendable = [] if checked is None else [e for e in sendable if e.row not in checked]
        if sendable:
            self._send_payload(session, sendable)
        if refused and not session.handed_back:
            refused.sort(key=lambda e: e.row)
            with self._lock:
                self.failed.extend(Failed(e.row, e.refusal) for e in refused)
            if self._progress is not None:
                for event in refused:
                    self._progress.record(session.key, [event], delivered=False,
                                          error=event.refusal)  # fmt: skip

    def _validated(self, session: _Session, sendable: list[_Event]) -> dict[int, str] | None:
        """The validation endpoint's verdict on ``sendable``'s payload: row -> why, for
        the events its answer names (a message naming no event: all of them). None when
        no verdict came: the events were handed back, or failed with the last answer."""
        payload = self._payloads.payload(session.head, [e.body for e in sendable])
        sent = self._sender.send(session.key, (sendable[0].row, sendable[-1].row), payload,
                                 url=self.settings.validate_url)  # fmt: skip
        with self._lock:
            self.stats.retries += sent.retries
        if sent.outcome is not Outcome.DELIVERED:
            self._not_sent(session, sendable, sent, duplicates=0)
            return None
        verdict: dict[int, str] = {}
        for index, why in validation_messages(sent.answer):
            chosen = sendable if index is None or index >= len(sendable) else [sendable[index]]
            for event in chosen:
                verdict.setdefault(event.row, why)
        return verdict

    def _send_payload(self, session: _Session, events: list[_Event]) -> None:
        """Send ``events`` as one payload; on a terminal answer, each half again."""
        payload = self._payloads.payload(session.head, [e.body for e in events])
        if self._progress is not None:
            self._progress.sending(session.key, events)
        sent = self._sender.send(session.key, (events[0].row, events[-1].row), payload)
        outcome = sent.outcome
        duplicates = len(events) if sent.timed_out else 0  # the API may have stored them
        with self._lock:
            self.stats.retries += sent.retries
        if outcome is Outcome.DELIVERED:
            with self._lock:
                self.stats.delivered += len(events)
                self.stats.requests += 1
                self.stats.payload_bytes += len(payload)
                self.stats.possible_duplicates += duplicates
            if self._progress is not None:
                self._progress.record(session.key, events, delivered=True,
                                      payload_bytes=len(payload),
                                      duplicates=duplicates)  # fmt: skip
            return
        if outcome is Outcome.REFUSED and len(events) > 1:
            middle = len(events) // 2
            self._send_payload(session, events[:middle])
            if not session.handed_back:  # in order: not after events that wait
                self._send_payload(session, events[middle:])
            else:
                with self._lock:
                    self.stats.unsent += len(events) - middle
            return
        self._not_sent(session, events, sent, duplicates)

    def _not_sent(self, session: _Session, events: list[_Event], sent: Sent,
                  duplicates: int) -> None:  # fmt: skip
        """``events`` handed back (``LATER``: the session waits for the next attempt) or
        failed with the answer."""
        if sent.outcome is Outcome.LATER:
            with self._lock:
                self.stats.retry_after = max(self.stats.retry_after, sent.retry_after)
                session.handed_back = True
                self.stats.unsent += len(events)
            if self._progress is not None:
                self._progress.waiting(session.key, events, duplicates=duplicates)
            return
        with self._lock:
            self.failed.extend(Failed(e.row, sent.reason) for e in events)
            self.stats.possible_duplicates += duplicates
        if self._progress is not None:
            self._progress.record(session.key, events, delivered=False, error=sent.reason,
                                  duplicates=duplicates)  # fmt: skip


Row = tuple[int, str, dict[str, Any], int | None, dict[str, Any] | bytes]

_EVENT_PATH = re.compile(r"^events\[(\d+)\]")


def validation_messages(answer: bytes) -> list[tuple[int | None, str]]:
    """GA4's validation answer (``{"validationMessages": [{"fieldPath", "description",
    "validationCode"}]}``) as (the event's index in the payload, or None for the whole
    request; the reason). An answer that is not that JSON: no messages."""
    try:
        messages = orjson.loads(answer).get("validationMessages") or []
    except (orjson.JSONDecodeError, AttributeError):
        return []
    found: list[tuple[int | None, str]] = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        path = str(message.get("fieldPath") or "")
        at = _EVENT_PATH.match(path)
        code = message.get("validationCode") or "no code"
        why = (f"GA4 validation: {message.get('description') or 'refused'} "
               f"({code}, at {path or 'the request'})")  # fmt: skip
        found.append((int(at.group(1)) if at else None, why))
    return found


def deliver(settings: HttpSettings, rows: Iterable[Row]) -> tuple[Stats, list[Failed]]:
    """Deliver ``rows`` (row id, session key, session info, ts in ns, attributes)."""
    delivery = Delivery(settings)
    try:
        for row in rows:
            delivery.add(*row)
    finally:
        stats = delivery.finish()
    return stats, delivery.failed


def deliver_batches(
    settings: HttpSettings, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """One Spark task (``mapInArrow``): rows ``row, key, info, ts, attrs`` (info and attrs
    as JSON text) in, one row of this attempt's stats (JSON) out. What was delivered and
    what failed is in the progress records (``settings.progress``), earlier attempts'
    included."""
    import pyarrow as pa

    assert settings.progress is not None, "a task's outcomes are read from its records"

    infos: dict[str, dict[str, Any]] = {}  # parsed once per session

    def rows() -> Iterator[Row]:
        for batch in batches:
            columns = [batch.column(name).to_pylist() for name in ("row", "key", "info", "ts",
                                                                    "attrs")]  # fmt: skip
            for row, key, info, ts, attrs in zip(*columns, strict=True):
                key = key or ""
                if key not in infos:
                    infos[key] = orjson.loads(info or "{}")
                # Spark's JSON text is sent as it is: no parse and dump per event.
                yield row, key, infos[key], ts, attrs.encode()

    stats, _ = deliver(settings, rows())
    summary = {name: getattr(stats, name) for name in Stats.__dataclass_fields__}
    yield pa.RecordBatch.from_pylist(
        [{"stats": orjson.dumps(summary).decode()}], schema=pa.schema([("stats", pa.string())])
    )


def _busy(session: _Session) -> bool:
    """Whether the session has a request in flight."""
    return session.in_flight is not None and not session.in_flight.done()
