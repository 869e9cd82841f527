"""The collector: its shared steps and eventpipe's own endpoints (Jitsu 1's shapes).

``POST /api/v1/event``      browser events; js key in ``?token=`` or ``X-Auth-Token``
``POST /api/v1/s2s/event``  server events; server key only
``POST /api/v1/s2s/bulk``   NDJSON of server events, stored as it streams
``OPTIONS`` (any event path) CORS preflights
``GET  /health``            200 while accepting, 503 under backpressure
``GET  /metrics``           Prometheus text format

The Segment API (``/v1/...``, the pixel) and Jitsu 2's (``/api/s/...``, ``/p.js``) are
collector/segment_endpoints.py, on the same steps.

The order of checks is cheapest first, and nothing is read that will be refused anyway:
key (401/403), origin (403), backpressure (503), declared size (413), body (413/400),
then enrichment, where a bad item is rejected alone. The answer is 200 only after every
accepted event, and the EventError of every rejected one, has been written and fsynced.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response

from eventpipe.collector import imports
from eventpipe.collector.auth import KeyKind, KeyRing
from eventpipe.collector.backpressure import Backpressure, Limits
from eventpipe.collector.body import (
    ENCODINGS,
    BodyError,
    check_declared_length,
    decoded_limited,
    parse_events,
    read_limited,
)
from eventpipe.collector.bulk import BulkUpload
from eventpipe.collector.cors import allowed_request_headers, cors_headers
from eventpipe.collector.enrich import (
    EnrichedBatch,
    EnrichSettings,
    Rejection,
    RequestContext,
    anonymize,
    client_address,
    enrich_batch,
    summary_line,
    tracking_plans,
)
from eventpipe.collector.http import error_body, json_answer, request_token
from eventpipe.collector.metrics import CollectorMetrics
from eventpipe.collector.received import ReceivedSample, as_parsed
from eventpipe.collector.secrets import Scrubber
from eventpipe.config import ApiKey, Config
from eventpipe.errors import ConfigError
from eventpipe.events import format_timestamp, utc_now
from eventpipe.log.segments import LogClosedError, LogHooks, LogWriteError, SegmentLog
from eventpipe.log.settings import LogSettings
from eventpipe.log.writers import host_writer
from eventpipe.origins import origin_allowed

log = logging.getLogger("eventpipe.collector")

BROWSER_PATH = "/api/v1/event"
SERVER_PATH = "/api/v1/s2s/event"
BULK_PATH = "/api/v1/s2s/bulk"
_ALLOWED_ENCODINGS = {"", "identity"}


@dataclass(frozen=True)
class _Endpoint:
    path: str
    browser: bool
    label: str


_BROWSER = _Endpoint(BROWSER_PATH, browser=True, label="event")
_SERVER = _Endpoint(SERVER_PATH, browser=False, label="s2s_event")


@dataclass
class _Prepared:
    events: bytes
    failed: bytes
    batch: EnrichedBatch
    accepted: int
    request_bytes: int | None
    """What the client sent for it: the body and the User-Agent copied into its events
    (None: a bulk upload's chunk, bounded by ``max_bulk_events`` instead)."""

    @classmethod
    def of(cls, batch: EnrichedBatch, request_bytes: int | None) -> _Prepared:
        """The batch's lines joined for one append; the batch lets go of its own."""
        prepared = cls(b"".join(batch.lines), b"".join(batch.failed_lines), batch,
                       len(batch.lines), request_bytes)  # fmt: skip
        del batch.lines, batch.failed_lines
        return prepared


STORED_ALLOWANCE_BYTES = 4 * 1024 * 1024
"""What any request may store, whatever its size; past it, ``server.max_amplification``
bytes per byte it sent."""


def _read_script(path: Path | None) -> bytes | None:
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"server.jitsu_script: cannot read {path}: {exc.strerror}") from None


class Collector:
    """State shared by the routes: keys, the log, limits, metrics."""

    def __init__(
        self, config: Config, *, metrics: CollectorMetrics | None = None, worker: int = 0
    ) -> None:
        self.config = config
        self.metrics = metrics or CollectorMetrics()
        self.keyring = KeyRing(config.api_keys)
        self.scrub = Scrubber.of_keys(config.api_keys)
        self.segment_log = SegmentLog(
            config.layout,
            LogSettings.of(config),
            writer=host_writer(worker, config.server.writer_id),
            hooks=LogHooks(on_round=self.metrics.on_round, on_sealed=self.metrics.on_sealed),
        )
        self.received = ReceivedSample(config.layout, self.segment_log.writer, self.scrub,
                                       anonymize_ip=config.server.anonymize_ip)  # fmt: skip
        self.backpressure = Backpressure(
            config.layout,
            self.segment_log,
            Limits(config.incoming.max_backlog_bytes, config.incoming.min_free_disk_bytes),
            self.metrics,
        )
        self.trusted = tuple(
            ipaddress.ip_network(n, strict=False) for n in config.server.trusted_proxies
        )
        self.jitsu_script = _read_script(config.server.jitsu_script)
        self.enrich_settings = EnrichSettings(
            max_event_bytes=config.server.max_event_bytes,
            anonymize_ip=config.server.anonymize_ip,
            max_json_depth=config.server.max_json_depth,
            max_future_skew_seconds=config.server.max_future_skew_seconds,
            contracts=tracking_plans(config) if config.contracts.collector != "off" else None,
            reject_violations=config.contracts.collector == "reject",
        )

    def open(self, wait_seconds: float = 0.0) -> None:
        """Take the log (lock, torn-line repair, sealing leftovers). Call before serving;
        ``wait_seconds``: for a process stopping with the same writer id."""
        report = self.segment_log.open(wait_seconds)
        self.metrics.torn_lines.inc(len(report.torn))
        for path in report.sealed:
            self.metrics.segments_sealed.labels(reason="startup").inc()
            log.debug("sealed at start-up: %s", path.name)

    # ------------------------------------------------------------------ routes

    async def ingest_browser(self, request: Request) -> Response:
        return await self._ingest(request, _BROWSER)

    async def ingest_server(self, request: Request) -> Response:
        return await self._ingest(request, _SERVER)

    async def _ingest(self, request: Request, endpoint: _Endpoint) -> Response:
        response = await self._ingest_inner(request, endpoint)
        self.metrics.request(endpoint.label, response.status_code)
        return response

    async def _ingest_inner(self, request: Request, endpoint: _Endpoint) -> Response:
        headers = request.headers
        match = self.keyring.match(request_token(request))
        if match is None:
            self.metrics.events_rejected.labels(api_key="-", reason="unauthorized").inc()
            error = "missing or unknown API key: pass it as ?token=KEY or X-Auth-Token"
            early = self.error_cors(headers) if endpoint.browser else {}  # errors only
            return json_answer(401, error_body("unauthorized", error), early)
        key = match.key
        wanted = KeyKind.JS if endpoint.browser else KeyKind.SERVER
        if match.kind is not wanted:
            self.metrics.events_rejected.labels(api_key=key.id, reason="wrong_key_kind").inc()
            other = SERVER_PATH if endpoint.browser else BROWSER_PATH
            error = (f"this is the {match.kind} key of {key.id!r}; {endpoint.path} takes "
                     f"{wanted} keys only (post to {other})")  # fmt: skip
            early = self.error_cors(headers) if endpoint.browser else {}
            return json_answer(403, error_body("wrong_key_kind", error), early)
        cors = self.cors(key, headers) if endpoint.browser else {}
        if isinstance(cors, Response):
            return cors
        if self.backpressure.reason is not None:
            return self.busy(key.id, self.backpressure.reason, cors)
        try:
            body = await self.read_body(request, endpoint.label)
            items, in_array = parse_events(body)
        except BodyError as exc:
            return self.refused_body(key.id, exc, cors)
        ctx = self.context(request, key.id, browser=endpoint.browser)
        excess = self.cap(items)
        prepared = self.prepare(ctx, items, body, in_array=in_array, excess=excess)
        del items, body  # see _prepare
        stored = await self.append(ctx, prepared, cors)
        if isinstance(stored, Response):
            return stored
        accepted, batch = stored
        if not batch.rejections:
            return json_answer(200, {"status": "ok", "accepted": accepted}, cors)
        answer: dict[str, Any] = {"accepted": accepted}
        answer["rejected"] = [{"index": r.index, "error": r.message} for r in batch.rejections]
        if batch.unrecorded:  # the answer lists the first ones; failed/ has the body
            answer["rejected_count"] = batch.rejected.total()
        refused = {**cors, "X-Eventpipe-Rejected": str(batch.rejected.total())}
        if accepted == 0:
            return json_answer(
                400, {**error_body("rejected", "no event was accepted"), **answer}, refused
            )
        return json_answer(200, {"status": "partial", **answer}, refused)

    # Bulk uploads

    async def bulk(self, request: Request) -> Response:
        """``POST /api/v1/s2s/bulk``: NDJSON (or gzip of it) stored as it streams, up to
        ``server.max_bulk_bytes``, in chunks of imports.CHUNK lines, each appended and
        fsynced; ids derived from content as ``eventpipe import`` does, so a retried
        upload adds nothing to a destination with a primary key on the event id."""
        response = await self._bulk(request)
        self.metrics.request("bulk", response.status_code)
        return response

    async def _bulk(self, request: Request) -> Response:
        headers = request.headers
        match = self.keyring.match(request_token(request))
        if match is None or match.kind is not KeyKind.SERVER:
            reason = "unauthorized" if match is None else "wrong_key_kind"
            self.metrics.events_rejected.labels(api_key="-", reason=reason).inc()
            error = "bulk uploads take a server key (X-Auth-Token or ?token=)"
            return json_answer(401 if match is None else 403, error_body(reason, error))
        key_id = match.key.id
        if self.backpressure.reason is not None:
            return self.busy(key_id, self.backpressure.reason, {})
        encoding = headers.get("content-encoding", "").strip().lower()
        if encoding not in (*_ALLOWED_ENCODINGS, "gzip"):
            return self.refused_body(key_id, BodyError(415, "unsupported_encoding",
                                      f"Content-Encoding {encoding!r}: send NDJSON, plain "
                                      "or gzip"), {})  # fmt: skip
        ctx = self.context(request, key_id, browser=False)
        server = self.config.server
        lines = imports.ndjson_lines(request.stream(), gzip=encoding == "gzip",
                                     limit=server.max_bulk_bytes,
                                     idle_seconds=server.body_timeout_seconds,
                                     max_line=server.max_event_bytes)  # fmt: skip

        async def store(batch: EnrichedBatch) -> int | Response:
            stored = await self.append(ctx, _Prepared.of(batch, None), {})
            return stored if isinstance(stored, Response) else stored[0]

        upload = BulkUpload(ctx, self.enrich_settings, store, server.max_bulk_events)
        result = await upload.read(lines)
        if isinstance(result, Response):
            return result
        answer: dict[str, Any] = {"accepted": result.accepted}
        if result.rejected:
            answer["rejected_count"] = result.rejected.total()
            answer["rejected"] = result.first
        if (stopped := result.stopped) is not None:
            self.metrics.events_rejected.labels(api_key=key_id, reason=stopped.reason).inc()
            if stopped.reason == "client_disconnected":
                log.info("bulk upload of %s: %s (%d accepted)", key_id, stopped.message,
                         result.accepted)  # fmt: skip
            stop = error_body(stopped.reason, stopped.message)
            return json_answer(stopped.status, {**stop, **answer}, {"Connection": "close"})
        return json_answer(200, {"status": "partial" if result.rejected else "ok", **answer})

    # Steps shared by the endpoints

    def cors(self, key: ApiKey, headers: Headers) -> dict[str, str] | Response:
        """A browser request's CORS answer headers, or the 403 of an origin the key does
        not allow."""
        origin = headers.get("origin")
        if key.origins and (origin is None or not origin_allowed(origin, key.origins)):
            self.metrics.events_rejected.labels(api_key=key.id, reason="origin").inc()
            error = f"origin {origin!r} is not allowed for key {key.id!r}"
            return json_answer(403, error_body("origin", error))
        if origin is None:
            return {}
        return cors_headers(origin)

    def error_cors(self, headers: Headers) -> dict[str, str]:
        """CORS headers for an answer given before a key is known (no key, a bad body):
        for an origin some browser key allows, so that the browser shows the answer to
        the page instead of a network error that SDKs retry."""
        origin = headers.get("origin")
        if origin is None:
            return {}
        if any(origin_allowed(origin, key.origins) for key in self.keyring.keys_with_js()):
            return cors_headers(origin)
        return {}

    async def read_body(self, request: Request, label: str) -> bytes:
        """The request's body within the limits (BodyError otherwise), decoded from its
        Content-Encoding (gzip, deflate, br, zstd) within ``max_body_bytes`` too."""
        headers = request.headers
        encoding = headers.get("content-encoding", "").strip().lower()
        if encoding not in _ALLOWED_ENCODINGS and encoding not in ENCODINGS:
            raise BodyError(
                415,
                "unsupported_encoding",
                f"Content-Encoding {encoding!r} is not supported; send the body "
                f"uncompressed or in {', '.join(ENCODINGS)}",
            )
        max_body = self.config.server.max_body_bytes
        check_declared_length(headers.get("content-length"), max_body)
        body = await read_limited(
            request.stream(), max_body, self.config.server.body_timeout_seconds
        )
        self.metrics.body_read(label, len(body))
        if encoding in ENCODINGS:
            return decoded_limited(body, encoding, max_body)
        return body

    def refused_body(
        self, key_id: str, exc: BodyError, cors: dict[str, str], *, segment_api: bool = False
    ) -> Response:
        self.metrics.events_rejected.labels(api_key=key_id, reason=exc.reason).inc()
        if exc.reason == "client_disconnected":
            log.info("request of %s: %s", key_id, exc.message)
        extra = {"Connection": "close"} if exc.status in (408, 413) else {}
        payload = error_body(exc.reason, exc.message, segment_api=segment_api)
        return json_answer(exc.status, payload, {**cors, **extra})

    def context(self, request: Request, key_id: str, *, browser: bool) -> RequestContext:
        headers = request.headers
        client = request.scope.get("client")
        peer = client[0] if client else "0.0.0.0"
        source_ip = client_address(peer, headers.get("x-forwarded-for"), self.trusted)
        if self.config.server.anonymize_ip:
            source_ip = anonymize(source_ip)
        now = utc_now()
        return RequestContext(
            key_id=key_id,
            browser=browser,
            source_ip=source_ip,
            user_agent=headers.get("user-agent"),
            received_at=now,
            timestamp=format_timestamp(now),
        )

    def prepare(
        self,
        ctx: RequestContext,
        items: list[Any],
        body: bytes,
        *,
        in_array: bool,
        refused: dict[int, tuple[str, str]] | None = None,
        excess: int = 0,
    ) -> _Prepared:
        """The items enriched into log lines, and the rejected ones' records; ``excess``:
        items past ``max_events_per_request`` that :meth:`_cap` cut off.

        The caller drops its parsed items and body before awaiting :meth:`_append`: with
        many requests waiting for one fsync round, keeping them alive measurably slowed
        parsing of the next requests (cache churn; docs/collector.md, Performance)."""
        # The live view's sample of items as received (only while one is open).
        chosen = [(i, raw) for i in self.received.choose(len(items))
                  if (raw := as_parsed(items[i])) is not None]  # fmt: skip
        batch = enrich_batch(items, ctx, self.enrich_settings, in_array=in_array,
                             refused=refused)  # fmt: skip
        if chosen:
            self.received.keep(chosen, items)
        if excess:
            cap = len(items)
            batch.rejected["too_many_events"] += excess
            if len(batch.rejections) < batch.record_limit:
                batch.rejections.append(Rejection(cap, "too_many_events",
                    f"items {cap} to {cap + excess - 1} are past max_events_per_request "
                    f"({cap}): send them in another request"))  # fmt: skip
        if batch.unrecorded:
            batch.failed_lines.append(summary_line(batch, ctx, body))
        return _Prepared.of(batch, len(body) + len(ctx.user_agent or ""))

    def cap(self, items: list[Any]) -> int:
        """Cut ``items`` to ``max_events_per_request``; how many were cut. Every item
        costs some 150 bytes of enrichment whatever its size: a body of 300,000 ``{}``
        would store 55 MB."""
        cap = self.config.server.max_events_per_request
        excess = len(items) - cap
        if excess <= 0:
            return 0
        del items[cap:]
        return excess

    async def append(
        self,
        ctx: RequestContext,
        prepared: _Prepared,
        cors: dict[str, str],
        *,
        segment_api: bool = False,
    ) -> tuple[int, EnrichedBatch] | Response:
        """Append (fsynced) what :meth:`_prepare` made: the accepted count and the batch,
        or the 503 of a log that cannot take them, or the 413 of a request that would
        store far more than it sent (nothing of it stored)."""
        if (sent := prepared.request_bytes) is not None:
            stored = len(prepared.events) + len(prepared.failed)
            if stored > STORED_ALLOWANCE_BYTES + self.config.server.max_amplification * sent:
                return self._amplified(ctx, prepared, stored, cors, segment_api=segment_api)
        events, failed = self.scrub(prepared.events), self.scrub(prepared.failed)
        prepared.events = prepared.failed = b""
        accepted, batch = prepared.accepted, prepared.batch
        try:
            await self.segment_log.append(ctx.key_id, events, failed)
        except (LogWriteError, LogClosedError) as exc:
            self.backpressure.note_write_error(exc.fields.get("errno"))
            log.error("could not append %d events for %s: %s", accepted, ctx.key_id, exc)
            return self.busy(ctx.key_id, exc.message, cors)
        del events, failed
        if accepted:
            self.metrics.accepted(ctx.key_id, accepted)
        for reason, count in batch.rejected.items():
            self.metrics.events_rejected.labels(api_key=ctx.key_id, reason=reason).inc(count)
        action = "refused" if self.enrich_settings.reject_violations else "flagged"
        for (plan, rule), count in batch.violations.items():
            self.metrics.contract_violations.labels(plan=plan, rule=rule,
                                                    action=action).inc(count)  # fmt: skip
        return accepted, batch

    def _amplified(
        self,
        ctx: RequestContext,
        prepared: _Prepared,
        stored: int,
        cors: dict[str, str],
        *,
        segment_api: bool,
    ) -> Response:
        """413 for a request whose events would take far more room than it: every event
        gets some 150 bytes of enrichment and the User-Agent, so 10,000 ``{}`` under a
        40 KB User-Agent would store 400 MB from 70 KB."""
        items = prepared.accepted + prepared.batch.rejected.total()
        self.metrics.events_rejected.labels(api_key=ctx.key_id, reason="amplification").inc(items)
        limit = self.config.server.max_amplification
        error = (
            f"this request would store {stored:,} bytes from {prepared.request_bytes:,} sent "
            f"(body and User-Agent), past server.max_amplification ({limit}x, beyond "
            f"{STORED_ALLOWANCE_BYTES // 2**20} MiB): send fewer events per request, or a "
            "shorter User-Agent"
        )
        log.warning("refused %d item(s) of %s: %s", items, ctx.key_id, error)
        return json_answer(413, error_body("amplification", error, segment_api=segment_api), cors)

    def busy(
        self, key_id: str, reason: str, cors: dict[str, str], *, segment_api: bool = False
    ) -> Response:
        self.metrics.events_rejected.labels(api_key=key_id, reason="backpressure").inc()
        retry = str(self.config.incoming.retry_after_seconds)
        error = f"not accepting events now: {reason}; retry later"
        payload = error_body("backpressure", error, segment_api=segment_api)
        return json_answer(503, payload, {**cors, "Retry-After": retry})

    async def preflight(self, request: Request) -> Response:
        """CORS preflight for the browser endpoint.

        With ``?token=`` in the URL the key's own origins decide; otherwise (the token will
        come in a header the preflight does not carry) any browser key that allows the
        origin is enough, and the POST itself is checked against its key.
        """
        origin = request.headers.get("origin")
        if origin is None:
            return json_answer(400, error_body("no_origin", "a CORS preflight needs an Origin"))
        token = request.query_params.get("token")
        if token:
            match = self.keyring.match(token)
            candidates = [match.key] if match and match.kind is KeyKind.JS else []
        else:
            candidates = self.keyring.keys_with_js()
        if not any(origin_allowed(origin, key.origins) for key in candidates):
            return json_answer(403, error_body("origin", f"origin {origin!r} is not allowed"))
        requested = request.headers.get("access-control-request-headers")
        return Response(
            status_code=204,
            headers={
                **cors_headers(origin),
                "Access-Control-Allow-Methods": "POST, GET, OPTIONS",
                "Access-Control-Allow-Headers": allowed_request_headers(requested),
                "Access-Control-Max-Age": str(self.config.server.cors_max_age_seconds),
                "Vary": "Origin, Access-Control-Request-Headers",
            },
        )

    async def health(self, request: Request) -> Response:
        reason = self.backpressure.reason
        if reason is None:
            return json_answer(200, {"status": "ok"})
        return json_answer(
            503,
            {"status": "busy", "reason": reason},
            {"Retry-After": str(self.config.incoming.retry_after_seconds)},
        )

    async def metrics_page(self, request: Request) -> Response:
        return Response(self.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    # ------------------------------------------------------------------ lifecycle

    @asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await self.segment_log.start()
        self.backpressure.refresh()
        monitor = asyncio.create_task(self.backpressure.run(), name="eventpipe-backpressure")
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            # `eventpipe rotate` asks a running collector to seal with SIGUSR1.
            loop.add_signal_handler(signal.SIGUSR1, self.segment_log.request_rotation, "command")
        try:
            yield
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(signal.SIGUSR1)
            monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await monitor
            sealed = await self.segment_log.close()
            log.info("collector %s stopped; sealed %d segment(s)", self.segment_log.writer,
                     len(sealed))  # fmt: skip
