"""The HTTP sink (``type: http``): events to an ingestion API, in sessions (seed 2).

An API like DataSet's ``addEvents`` takes one request per session at a time, at most
6 MB per payload, and has servers that restart now and then. :class:`Delivery` feeds it
from one Spark task, which owns its sessions (the job partitions events by session key):

* **Sessions**: the key is the values of the ``group_by`` fields; they leave the event's
  attributes and go into the session info. Each session fills its own buffer until the
  next event would pass ``max_payload_bytes`` (measured before compression), and the
  buffer is published when full, when older than ``max_lifetime_seconds``, or when the
  input ends.
* **One request in flight per session**; at most ``parallel`` requests in flight in all
  (requests of different sessions overlap, on threads). While a session's request is in
  flight, its next buffer fills; when that one is full too, reading stops until the
  request ends. Buffered and in-flight bytes stay under ``max_buffer_bytes``: the durable
  log is the buffer, not memory.
* **Retries**: connection errors, timeouts, 429 and 5xx are retried with exponential
  backoff and jitter (half to all of the delay, retry.Backoff), ``Retry-After`` honoured,
  for up to ``retry_max_elapsed_seconds``; each session keeps its own error state (one
  session's success never clears another's). A request that timed out may have been
  stored: its events are counted as possible duplicates. With ``hold_seconds`` (the
  job's), a request still failing after that long is handed back: the session sends
  nothing more in this task (order holds), the others go on, and the job runs the send
  again later, from the driver, holding no Spark slot while it waits.
* **Credentials refused** (401, 403, 407): no event causes them, so the payload is never
  split for them (it took about 2N requests to learn that of N events): they are retried
  like an API that is down, then handed back or failed with the answer.
* **Terminal answers** (other 4xx, and 501/505, which no retry changes): the payload is
  split in halves and each half sent again, down to single events, so that only the
  events the API refuses fail, with the response; the rest is delivered. Events whose
  retries run out fail with the last response. Failed events are returned to the job,
  which writes them to failed/: none is dropped (seed 2's library drops them).
* **Trimming**: an event larger than the payload limit on its own keeps its smallest
  attributes whole while they fit, the first string that does not fit is truncated, the
  rest is dropped, and the event gets ``eventpipe_trimmed: true`` and is counted.
* **Bounds**: an answer's body is read up to :data:`MAX_ANSWER_BYTES` (the reason keeps
  its start); sessions with nothing buffered or in flight are let go at each sweep, so
  memory follows the sessions in use, not every ``group_by`` value ever seen.
* **Progress**: each request's outcome (the session, its last row, what was delivered,
  what failed and why) is appended to a :class:`Progress` directory the moment it is
  known. A task that starts again (a resumed run, a Spark task retry) skips what a
  record covers, so a crash resends at most the request each session had in flight.
  Every request carries ``X-Eventpipe-Session`` and an ``Idempotency-Key`` that is the
  same when the same events are sent again, for APIs that can drop repeats.

Length (over 500 lines): one delivery engine whose parts (buffers, requests, retries,
splitting) share each session's state and its locks. The progress records are
http_progress.py.
"""

from __future__ import annotations

import email.utils
import enum
import gzip
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

import orjson

from eventpipe.destinations.base import SinkRetries
from eventpipe.destinations.http_progress import Failed, Progress, Totals
from eventpipe.retry import Backoff

if TYPE_CHECKING:
    import pyarrow as pa

    from eventpipe.config import HttpConfig

log = logging.getLogger("eventpipe.http")

TRIMMED_ATTRIBUTE = "eventpipe_trimmed"
NEVER_TRANSIENT = frozenset({501, 505})
AUTHENTICATION = frozenset({401, 403, 407})
"""Answers about the credentials, never about an event: retried, never split."""
MAX_ANSWER_BYTES = 8192
"""Bytes of an answer's body that are read (a hostile or broken API may send gigabytes)."""
"""5xx answers that no retry changes (Not Implemented, HTTP Version Not Supported)."""
_SESSIONS = uuid.UUID("6f1d2c3e-8a4b-4f5e-9c0d-1e2f3a4b5c6d")
_TAIL = b'],"threads":[]}'
"""The end of a dataset payload, after its events."""


@dataclass(frozen=True)
class HttpSettings:
    """What a task needs to deliver (picklable: it travels to Spark's executors)."""

    destination: str
    url: str
    headers: dict[str, str]
    format: Literal["dataset", "ndjson"] = "dataset"
    max_payload_bytes: int = 6_000_000
    max_lifetime_seconds: float = 5.0
    parallel: int = 4
    """Requests in flight at once, in this task."""
    retry_initial_seconds: float = 1.0
    retry_max_seconds: float = 30.0
    retry_max_elapsed_seconds: float = 300.0
    max_buffer_bytes: int = 64_000_000
    gzip: bool = True
    timeout_seconds: float = 30.0
    progress: str | None = None
    """The run's :class:`Progress` directory (shared by its tasks); None: not recorded."""
    hold_seconds: float | None = None
    """How long a request is retried in the task before the task hands its session back
    (``Stats.unsent``): the job waits without holding a Spark slot and runs the send
    again. None: retried in the task for ``retry_max_elapsed_seconds``."""
    give_up_at: float | None = None
    """Wall-clock time (``time.time()``) after which a transient failure is final; None:
    ``retry_max_elapsed_seconds`` after the request's first try."""
    run: str = ""
    """The run id: with the rows of a payload, its ``Idempotency-Key``."""

    def deliver(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return deliver_batches(self, batches)

    def until(self, give_up_at: float) -> HttpSettings:
        return replace(self, give_up_at=give_up_at)


@dataclass(frozen=True)
class HttpSink:
    """The ``type: http`` destination, opened: a sink (no tables). The job's send step
    (processing/batch/send.py) runs its settings' ``deliver`` (:func:`deliver_batches`) in
    Spark tasks."""

    id: str
    config: HttpConfig

    @property
    def sessions(self) -> tuple[str, ...]:
        return tuple(self.config.group_by)

    @property
    def retries(self) -> SinkRetries:
        dest = self.config
        return SinkRetries(dest.retry_initial_seconds, dest.retry_max_seconds,
                           dest.retry_max_elapsed_seconds)  # fmt: skip

    def outcome(self, progress: str) -> Totals:
        return Progress(progress).totals()

    def settings(self, *, progress: str, run: str, tasks: int, hold_seconds: float) -> HttpSettings:
        """What each of ``tasks`` Spark tasks of run ``run`` needs, its progress records
        in the directory ``progress``; a request that fails for ``hold_seconds`` in a
        task is handed back to the driver."""
        dest = self.config
        return HttpSettings(
            destination=self.id, url=dest.url, headers=dict(dest.headers), format=dest.format,
            max_payload_bytes=dest.max_payload_bytes,
            max_lifetime_seconds=dest.max_lifetime_seconds,
            parallel=max(1, dest.max_parallel_requests // tasks),
            retry_initial_seconds=dest.retry_initial_seconds,
            retry_max_seconds=dest.retry_max_seconds,
            retry_max_elapsed_seconds=dest.retry_max_elapsed_seconds,
            max_buffer_bytes=dest.max_buffer_bytes, gzip=dest.gzip, progress=progress, run=run,
            hold_seconds=min(hold_seconds, dest.retry_max_elapsed_seconds),
        )  # fmt: skip


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


@dataclass
class _Session:
    key: str
    head: bytes
    """The payload's start, up to its first event (``dataset``: session and sessionInfo;
    ``ndjson``: nothing)."""
    events: list[_Event] = field(default_factory=list)
    size: int = 0
    """Bytes of ``events`` in a payload (with their separators)."""
    started: float = 0.0
    in_flight: Future[None] | None = None
    handed_back: bool = False
    """The API kept failing longer than ``hold_seconds``: the session's further events
    are left for the next attempt, in order (none is sent after one that was not)."""

    @property
    def envelope(self) -> int:
        """Bytes of a payload that are not events (a 2-byte margin)."""
        return len(self.head) + len(_TAIL) + 2 if self.head else 0


def session_id(destination: str, key: str) -> str:
    """A stable session id per destination and key (addEvents: one writer per session)."""
    return str(uuid.uuid5(_SESSIONS, f"{destination}\x00{key}"))


class Delivery:
    """Delivers the events of one task; :meth:`add` each, then :meth:`finish`."""

    def __init__(
        self,
        settings: HttpSettings,
        *,
        post: Callable[[bytes, dict[str, str]], tuple[int, dict[str, str], bytes]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = settings
        self.stats = Stats()
        self.failed: list[Failed] = []
        self._clock = clock
        self._sleep = sleep
        self._sessions: dict[str, _Session] = {}
        self._pool = ThreadPoolExecutor(max_workers=max(1, settings.parallel))
        self._lock = threading.Lock()
        self._bytes = 0  # buffered and in flight
        self._room = threading.Condition(self._lock)
        self._client: Any = None
        if post is None:
            import httpx

            # One client (its connection pool) for the task's sender threads.
            self._client = httpx.Client(
                timeout=settings.timeout_seconds,
                limits=httpx.Limits(max_connections=max(1, settings.parallel)),
            )
        self._post = post or self._http_post
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
        if session is None:
            session = _Session(key, self._head(key, info))
            self._sessions[key] = session
        if session.handed_back:
            with self._lock:
                self.stats.unsent += 1
            return
        body = self._encode(ts_ns, attrs)
        room = self.settings.max_payload_bytes - session.envelope
        if len(body) > room:
            whole = orjson.loads(attrs) if isinstance(attrs, bytes) else attrs
            body = self._encode(ts_ns, trim(whole, room - 16, self._encode_attrs_size(ts_ns)))
            self.stats.trimmed += 1
        if session.events and session.size + len(body) + 1 > room:
            self._publish(session)
        self._reserve(len(body))
        if not session.events:
            session.started = self._clock()
        session.events.append(_Event(row, body))
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
            if self._client is not None:
                self._client.close()
            if self._progress is not None:
                self._progress.close()
        return self.stats

    # -- payloads ---------------------------------------------------------------------

    def _encode(self, ts_ns: int | None, attrs: dict[str, Any] | bytes) -> bytes:
        if isinstance(attrs, dict):
            attrs = orjson.dumps(attrs)
        if self.settings.format == "ndjson":
            return attrs
        ts = b',"ts":"%d"}' % ts_ns if ts_ns is not None else b"}"
        return b'{"attrs":' + attrs + ts

    def _encode_attrs_size(self, ts_ns: int | None) -> int:
        """Bytes an event takes besides its attributes."""
        return len(self._encode(ts_ns, {}))

    def _head(self, key: str, info: dict[str, Any]) -> bytes:
        if self.settings.format == "ndjson":
            return b""
        sid = session_id(self.settings.destination, key)
        return orjson.dumps({"session": sid, "sessionInfo": info})[:-1] + b',"events":['

    def _payload(self, session: _Session, events: list[_Event]) -> bytes:
        if self.settings.format == "ndjson":
            return b"".join(e.body + b"\n" for e in events)
        return session.head + b",".join(e.body for e in events) + _TAIL

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
        """Send ``events`` as one payload; on a terminal answer, each half again."""
        outcome, reason, timed_out = self._send(session, events)
        if outcome is _Outcome.DELIVERED:
            return
        duplicates = len(events) if timed_out else 0  # the API may have stored them
        if outcome is _Outcome.LATER:
            with self._lock:
                session.handed_back = True
                self.stats.unsent += len(events)
            if self._progress is not None:
                self._progress.waiting(session.key, events, duplicates=duplicates)
            return
        if outcome is _Outcome.REFUSED and len(events) > 1:
            middle = len(events) // 2
            self._send_all(session, events[:middle])
            if not session.handed_back:  # in order: not after events that wait
                self._send_all(session, events[middle:])
            else:
                with self._lock:
                    self.stats.unsent += len(events) - middle
            return
        with self._lock:
            self.failed.extend(Failed(e.row, reason) for e in events)
            self.stats.possible_duplicates += duplicates
        if self._progress is not None:
            self._progress.record(session.key, events, delivered=False, error=reason,
                                  duplicates=duplicates)  # fmt: skip

    def _send(self, session: _Session, events: list[_Event]) -> tuple[_Outcome, str, bool]:
        """Post ``events`` as one payload, retrying transient failures: the outcome, the
        reason when not delivered, and whether a try timed out."""
        s = self.settings
        payload = self._payload(session, events)
        body = gzip.compress(payload, compresslevel=3) if s.gzip else payload
        sid = session_id(s.destination, session.key)
        headers = {
            **s.headers,
            "Content-Type": "application/json",
            "X-Eventpipe-Session": sid,
            # The same events of the same run: the same key, however often resent.
            "Idempotency-Key": str(uuid.uuid5(_SESSIONS, f"{sid}\x00{s.run}\x00"
                                              f"{events[0].row}\x00{events[-1].row}")),
        }  # fmt: skip
        if s.format == "ndjson":
            headers["Content-Type"] = "application/x-ndjson"
        if s.gzip:
            headers["Content-Encoding"] = "gzip"
        if self._progress is not None:
            self._progress.sending(session.key, events)
        backoff = Backoff(
            s.retry_initial_seconds, s.retry_max_seconds, clock=self._clock,
            max_elapsed=s.retry_max_elapsed_seconds if s.give_up_at is None else None,
            deadline=s.give_up_at,
        )  # fmt: skip
        backoff.start()  # the time allowed counts from the first attempt
        timed_out = False
        while True:
            try:
                status, response_headers, text = self._post(body, headers)
            except _Timeout as exc:
                status, response_headers, text = 0, {}, f"timed out: {exc}".encode()
                timed_out = True
            except OSError as exc:
                status, response_headers, text = 0, {}, f"cannot connect: {exc}".encode()
            if 200 <= status < 300:
                with self._lock:
                    self.stats.delivered += len(events)
                    self.stats.requests += 1
                    self.stats.payload_bytes += len(payload)
                    if timed_out:
                        self.stats.possible_duplicates += len(events)
                if self._progress is not None:
                    self._progress.record(session.key, events, delivered=True,
                                          payload_bytes=len(payload),
                                          duplicates=len(events) if timed_out else 0)  # fmt: skip
                return _Outcome.DELIVERED, "", timed_out
            reason = _reason(status, text)
            retried = status == 429 or status >= 500 or status in AUTHENTICATION
            if status and (not retried or status in NEVER_TRANSIENT):
                return _Outcome.REFUSED, reason, timed_out
            retry_after = _retry_after(response_headers.get("retry-after")) or 0.0
            wait = backoff.wait(retry_after)
            if wait is None:
                gave_up = f"{reason} (gave up after {s.retry_max_elapsed_seconds:.0f} s)"
                return _Outcome.FAILED, gave_up, timed_out
            if s.hold_seconds is not None and backoff.elapsed() + wait > s.hold_seconds:
                log.warning("%s session %s: %s; handed back to wait outside the task",
                            s.destination, sid, reason)  # fmt: skip
                with self._lock:
                    self.stats.retry_after = max(self.stats.retry_after, retry_after)
                return _Outcome.LATER, reason, timed_out
            with self._lock:
                self.stats.retries += 1
            log.warning("%s session %s: %s; retrying in %.1f s", s.destination, sid, reason,
                        wait)  # fmt: skip
            self._sleep(wait)

    def _http_post(self, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        import httpx

        try:
            with self._client.stream("POST", self.settings.url, content=body,
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


class _Outcome(enum.Enum):
    DELIVERED = "delivered"
    REFUSED = "refused"
    """A terminal answer (4xx, 501, 505): split the payload to find the events refused."""
    FAILED = "failed"
    """Retries ran out."""
    LATER = "later"
    """Still failing after ``hold_seconds``: left for the next attempt."""


def _busy(session: _Session) -> bool:
    """Whether the session has a request in flight."""
    return session.in_flight is not None and not session.in_flight.done()


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


Row = tuple[int, str, dict[str, Any], int | None, dict[str, Any] | bytes]


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
