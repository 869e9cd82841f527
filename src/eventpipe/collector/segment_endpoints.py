"""The Segment API's endpoints (``POST /v1/<type|batch>``, ``GET /v1/pixel/<type>``) and
Jitsu 2's (``POST /api/s/<type>``, ``/api/s/s2s/<type>``, ``GET /p.js``), on the steps
every endpoint of the collector shares (collector/app.py: key, origin, backpressure,
body, enrichment, the fsynced append). How a message becomes an event:
collector/segment_api.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from eventpipe.collector import segment_api
from eventpipe.collector.auth import KeyKind, KeyMatch
from eventpipe.collector.body import BodyError, parse_events
from eventpipe.collector.http import error_body, json_answer, request_token

if TYPE_CHECKING:
    from eventpipe.collector.app import Collector

JITSU_PREFIX = "/api/s/"
JITSU_SERVER_PREFIX = "/api/s/s2s/"


class SegmentEndpoints:
    """The Segment API and Jitsu 2's API of one collector (``core``)."""

    def __init__(self, core: Collector) -> None:
        self.core = core

    async def segment(self, request: Request) -> Response:
        kind = segment_api.path_type(request.path_params["name"])
        if kind is None:
            response = json_answer(404, {"success": False, "error": "no such Segment API path"})
        else:
            response = await self._handle(request, kind, None)
        self.core.metrics.request("segment", response.status_code)
        return response

    async def jitsu(self, request: Request) -> Response:
        """``POST /api/s/<type>`` (browsers) and ``/api/s/s2s/<type>`` (servers): Jitsu 2's
        API, what ``@jitsu/js`` sends. A body is one Segment message of the path's type;
        the key is ``X-Write-Key`` (``id:secret``), and the path decides its kind."""
        name = request.path_params["name"]
        wanted = KeyKind.SERVER if request.path_params.get("s2s") else KeyKind.JS
        if name not in segment_api.TYPES:
            response = json_answer(404, error_body("not_found", f"no such Jitsu API path: {name!r} "
                                         f"(one of {', '.join(segment_api.TYPES)})"))  # fmt: skip
        else:
            response = await self._handle(request, name, None, jitsu=wanted)
        self.core.metrics.request("jitsu", response.status_code)
        return response

    async def script(self, request: Request) -> Response:
        """``GET /p.js``: Jitsu 2's browser script (``server.jitsu_script``), which sends to
        the origin it came from; 404 with what to set when none is configured."""
        if self.core.jitsu_script is None:
            error = "no script configured: set server.jitsu_script to @jitsu/js's p.js"
            return json_answer(404, error_body("not_found", error))
        return Response(self.core.jitsu_script, media_type="application/javascript",
                        headers={"Cache-Control": "public, max-age=3600"})  # fmt: skip

    async def pixel(self, request: Request) -> Response:
        """A message in ``?data=``, answered with a 1x1 GIF whatever happened to it (the
        status says), never cached: e-mail opens, pages without JavaScript."""
        kind = request.path_params["name"]
        if kind not in segment_api.TYPES:
            answer = json_answer(404, {"success": False, "error": "no such pixel path"})
        else:
            try:
                data = segment_api.pixel_body(request.query_params.get("data"))
                answer = await self._handle(request, kind, data)
            except segment_api.MessageError as exc:
                self.core.metrics.events_rejected.labels(api_key="-", reason=exc.reason).inc()
                answer = json_answer(400, {"success": False, "error": str(exc)})
        self.core.metrics.request("pixel", answer.status_code)
        no_store = "no-store, no-cache, must-revalidate, max-age=0"
        return Response(segment_api.PIXEL_GIF, status_code=answer.status_code,
                        media_type="image/gif", headers={"Cache-Control": no_store,
                                                         "Pragma": "no-cache",
                                                         "Expires": "0"})  # fmt: skip

    async def _handle(
        self, request: Request, kind: str, pixel: bytes | None, *, jitsu: KeyKind | None = None
    ) -> Response:
        """A Segment API request; ``jitsu``: one of Jitsu 2's, whose path takes keys of
        that kind only, named in ``X-Write-Key`` (its body's ``writeKey`` is masked)."""
        headers = request.headers

        def early() -> dict[str, str]:  # an error before the key is known (errors only)
            return self.core.error_cors(headers)

        if jitsu is None:
            written = segment_api.basic_user(headers.get("authorization"))
            match = self.core.keyring.match(written)
        else:
            written = headers.get("x-write-key") or request_token(request)
            match = self.core.keyring.match_write_key(written)
            if match is None:
                return self._no_write_key(early(), jitsu=True)
            if match.kind is not jitsu:
                return self._wrong_jitsu_kind(match, jitsu, early())
        if written is not None and match is None:
            return self._no_write_key(early())
        if self.core.backpressure.reason is not None:
            key_id = match.key.id if match else "-"
            return self.core.busy(key_id, self.core.backpressure.reason, early(), segment_api=True)
        try:
            body = pixel if pixel is not None else await self.core.read_body(request, "segment")
            items, in_array = parse_events(body)
            if in_array:
                raise BodyError(400, "not_an_object", "a Segment API body is a JSON object")
            document = items[0]
        except BodyError as exc:
            return self.core.refused_body(match.key.id if match else "-", exc, early(),
                                      segment_api=True)  # fmt: skip
        if match is None:
            match = self.core.keyring.match(segment_api.body_write_key(document))
            if match is None:
                return self._no_write_key(early())
        key, browser = match.key, match.kind is KeyKind.JS
        # An <img> sends no Origin, and a pixel in an e-mail has none to send: a pixel
        # is checked against the key's origins only when its request names one.
        checked = browser and (pixel is None or "origin" in headers)
        cors = self.core.cors(key, headers) if checked else {}
        if isinstance(cors, Response):
            return cors
        try:
            messages = segment_api.messages(document, kind)
        except segment_api.MessageError as exc:
            self.core.metrics.events_rejected.labels(api_key=key.id, reason=exc.reason).inc()
            return json_answer(400, error_body(exc.reason, str(exc), segment_api=True), cors)
        ctx = self.core.context(request, key.id, browser=browser)
        excess = self.core.cap(messages)
        refused: dict[int, tuple[str, str]] = {}
        for index, message in enumerate(messages):
            try:
                segment_api.to_event(message, ctx.received_at, server=not browser,
                                 received=ctx.timestamp)  # fmt: skip
            except segment_api.MessageError as exc:
                refused[index] = (exc.reason, str(exc))
        prepared = self.core.prepare(ctx, messages, body, in_array=kind == segment_api.BATCH,
                                 refused=refused, excess=excess)  # fmt: skip
        count = len(messages) + excess
        del messages, document, items, body  # see _prepare
        stored = await self.core.append(ctx, prepared, cors, segment_api=True)
        if isinstance(stored, Response):
            return stored
        accepted, batch = stored
        answer: dict[str, Any] = {"success": accepted > 0 or count == 0, "accepted": accepted}
        if batch.rejections:
            answer["rejected"] = [{"index": r.index, "error": r.message} for r in batch.rejections]
            answer["rejected_count"] = batch.rejected.total()
            cors = {**cors, "X-Eventpipe-Rejected": str(batch.rejected.total())}
        # 400 only when nothing was taken: SDKs retry 5xx and 429, and drop what got a 4xx.
        if not answer["success"]:
            first = batch.rejections[0].message if batch.rejections else "no message accepted"
            answer = {**error_body("rejected", first, segment_api=True), **answer}
        return json_answer(200 if answer["success"] else 400, answer, cors)

    def _no_write_key(self, cors: dict[str, str], *, jitsu: bool = False) -> Response:
        self.core.metrics.events_rejected.labels(api_key="-", reason="unauthorized").inc()
        error = (
            "missing or unknown write key: send it as X-Write-Key: ID:SECRET"
            if jitsu
            else "missing or unknown write key: send it as the user name of HTTP Basic "
            "auth, or as writeKey in the body"
        )
        return json_answer(401, error_body("unauthorized", error, segment_api=True), cors)

    def _wrong_jitsu_kind(self, match: KeyMatch, wanted: KeyKind, cors: dict[str, str]) -> Response:
        key = match.key
        self.core.metrics.events_rejected.labels(api_key=key.id, reason="wrong_key_kind").inc()
        where = (f"{JITSU_SERVER_PREFIX}<type> (@jitsu/js: s2s: true)" if wanted is KeyKind.JS
                 else f"{JITSU_PREFIX}<type>")  # fmt: skip
        error = (f"this is the {match.kind} key of {key.id!r}; this path takes {wanted} keys "
                 f"only (post to {where})")  # fmt: skip
        return json_answer(403, error_body("wrong_key_kind", error, segment_api=True), cors)
