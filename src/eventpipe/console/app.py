"""The console's pages and API (Starlette), and :func:`serve`.

Pages (server-rendered, a little script for what updates live):

``GET  /``                      overview: per destination events/s, backlog, lag,
                                failures, last load; charts of the last hour
``GET  /live``                  the events arriving (a sample at high rates), filtered
``GET  /failed``                failed events by destination and reason; ``POST
                                /failed/replay`` replays a destination's
``GET  /runs``                  the run history
``GET  /trace``                 where is my event: an event id's path (and the row it
                                became); ``POST /trace/preview`` how it would land
``GET  /ledger``                per run and destination: acknowledged = loaded + failed +
                                skipped + filtered + dropped (a range of days added up);
                                and what waits
``GET  /destinations``          tables, columns and types; schema history; recent loads
``POST /runs/reprocess``        reprocess days (or their dry run)
``GET  /login``, ``POST /login``, ``POST /logout``

API (JSON; the pages are one client of it, scripts another; docs/console.md):

``GET  /api/overview``          the latest figures and the last hour's
``GET  /api/overview/stream``   server-sent events: each new sample of the figures
``GET  /api/events/stream``     server-sent events: arriving events (``key``, ``type``,
                                ``source``, ``q`` filter them)
``GET  /api/failed``            a destination's newest failed events (``destination``,
                                ``reason``, ``limit``), and their reasons
``GET  /api/replays``           the replays started here, with their outcome
``GET  /api/runs``              the last runs (``limit``)
``GET  /api/trace``             an event's path (``id``); ``POST /api/trace/preview``
``GET  /api/ledger``            the ledger (``limit`` runs; ``since``, ``until``)
``GET  /api/destinations``      the destinations page's data
``POST /api/reprocess``         a reprocess, or its dry run
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict
from datetime import UTC, date, datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote

import orjson
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from eventpipe.config import Config
from eventpipe.console.destinations import destinations
from eventpipe.console.failed import FailedPage, newest_records
from eventpipe.console.ledger import ledger, streams, totals
from eventpipe.console.live import Filters, LiveTail, Received
from eventpipe.console.replays import Replays
from eventpipe.console.security import (
    LOGIN_COOKIE,
    SESSION_COOKIE,
    SESSION_SECONDS,
    SecurityHeaders,
    Session,
    Sessions,
    same,
)
from eventpipe.console.trace import BadEventId, Stored, Trace, stored_line, trace
from eventpipe.events import failed_event_id, utc_now
from eventpipe.figures import Sample, Watch
from eventpipe.paths import SegmentName
from eventpipe.state.store import StateStore, open_state

log = logging.getLogger("eventpipe.console")

HISTORY_SECONDS = 3600
"""How much of the figures' history the charts show."""
LIVE_POLL_SECONDS = 0.5


class Figures:
    """The figures sampled every ``console.sample_seconds`` and the last hour of them."""

    def __init__(self, config: Config, store: StateStore) -> None:
        self.every = config.console.sample_seconds
        self.watch = Watch(config, store)
        self.history: deque[Sample] = deque(maxlen=max(2, int(HISTORY_SECONDS / self.every)))
        self.changed = asyncio.Condition()

    async def run(self) -> None:
        while True:
            try:
                sample = await asyncio.to_thread(self.watch.sample)
            except Exception:
                log.exception("console: the figures could not be sampled; trying again")
            else:
                self.history.append(sample)
                async with self.changed:
                    self.changed.notify_all()
            await asyncio.sleep(self.every)

    @property
    def latest(self) -> Sample | None:
        return self.history[-1] if self.history else None


COLLECTOR = "collector"
"""The failed page's name for what the collector refused (failed.tok=*.log)."""
FAILED_SHOWN = 100
LEDGER_MOST = 1000
"""Runs a ledger adds up at most."""
MAX_CHOSEN = 1000
"""Event ids one replay of a selection takes at most (each is an argument of its
process)."""


def console_app(config: Config, config_path: Path | None = None) -> Starlette:
    """The console of ``config`` (its ``console.token`` set); ``config_path``: the file
    it came from, which a replay started here reads too."""
    assert config.console.token is not None, "the console needs console.token"
    sessions = Sessions(config.console.token.get_secret_value())
    pages = Environment(
        loader=PackageLoader("eventpipe.console", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
    )
    store = open_state(config)
    figures = Figures(config, store)
    replays = Replays(config_path)
    live_most = max(1, int(config.console.live_events_per_second * LIVE_POLL_SECONDS))

    def page(request: Request, name: str, session: Session | None, **values: Any) -> Response:
        html = pages.get_template(name).render(
            csrf=session.csrf if session else None, path=request.url.path, **values
        )
        return HTMLResponse(html)

    def guarded(
        handler: Callable[[Request, Session | None], Response | Awaitable[Response]],
        *,
        api: bool = False,
    ) -> Callable[[Request], Any]:
        """``handler`` for a logged-in browser (or, for the API, a bearer token); a POST
        from a session needs its CSRF token."""

        async def endpoint(request: Request) -> Response:
            session = sessions.of(request)
            if session is None and not (api and sessions.bearer(request)):
                if api:
                    return JSONResponse({"error": "the console's admin token is needed"}, 401)
                return RedirectResponse("/login", 303)
            if request.method == "POST" and session is not None:
                form = await request.form()
                given = request.headers.get("x-csrf-token") or form.get("csrf")
                if not same(given if isinstance(given, str) else None, session.csrf):
                    return JSONResponse({"error": "missing or wrong CSRF token"}, 403)
            if inspect.iscoroutinefunction(handler):
                answer: Response = await handler(request, session)
                return answer
            # Files and the state store are read off the event loop: the live streams
            # of other pages go on meanwhile.
            return cast(Response, await run_in_threadpool(handler, request, session))

        return endpoint

    async def login_form(request: Request) -> Response:
        nonce = request.cookies.get(LOGIN_COOKIE) or _nonce()
        response = page(request, "login.html", None, login_csrf=nonce, failed=False)
        response.set_cookie(LOGIN_COOKIE, nonce, httponly=True, samesite="strict", path="/login")
        return response

    async def login(request: Request) -> Response:
        form = await request.form()
        given, token = form.get("csrf"), form.get("token")
        cookie = request.cookies.get(LOGIN_COOKIE)
        if cookie is None or not same(given if isinstance(given, str) else None, cookie):
            return JSONResponse({"error": "missing or wrong CSRF token"}, 403)
        if not isinstance(token, str) or not sessions.token_matches(token):
            await asyncio.sleep(0.5)  # a guesser's pace
            response = page(request, "login.html", None, login_csrf=cookie, failed=True)
            response.status_code = 401
            return response
        key, _ = sessions.open()
        response = RedirectResponse("/", 303)
        secure = request.url.scheme == "https"
        response.set_cookie(SESSION_COOKIE, key, max_age=SESSION_SECONDS, httponly=True,
                            samesite="strict", secure=secure, path="/")  # fmt: skip
        response.delete_cookie(LOGIN_COOKIE, path="/login")
        return response

    def logout(request: Request, session: Session | None) -> Response:
        if (key := request.cookies.get(SESSION_COOKIE)) is not None:
            sessions.close(key)
        response = RedirectResponse("/login", 303)
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response

    def overview(request: Request, session: Session | None) -> Response:
        return page(request, "overview.html", session, sample=figures.latest,
                    every=config.console.sample_seconds)  # fmt: skip

    def live(request: Request, session: Session | None) -> Response:
        filters = _filters(request)
        return page(request, "live.html", session, filters=filters,
                    per_second=config.console.live_events_per_second)  # fmt: skip

    def overview_api(request: Request, session: Session | None) -> Response:
        latest = figures.latest
        return _json({"latest": latest.as_json() if latest else None,
                      "history": [s.as_json() for s in figures.history]})  # fmt: skip

    def overview_stream(request: Request, session: Session | None) -> Response:
        async def samples() -> AsyncIterator[bytes]:
            seen = None
            while not await request.is_disconnected():
                latest = figures.latest
                if latest is not None and latest is not seen:
                    seen = latest
                    yield _event("sample", latest.as_json())
                async with figures.changed:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(figures.changed.wait(), 15)
                yield b": keep-alive\n\n"

        return _stream(samples())

    def events_stream(request: Request, session: Session | None) -> Response:
        filters = _filters(request)
        tail = LiveTail(config.layout)
        received = Received(config.layout)

        async def arriving() -> AsyncIterator[bytes]:
            while not await request.is_disconnected():
                polled = await asyncio.to_thread(tail.poll, live_most, filters, received.ids())
                await asyncio.to_thread(received.refresh)
                for event in polled.events:
                    yield _event("event", event)
                    if (sent := received.of(event)) is not None:
                        yield _event("received", {"event_id": sent[0], "received": sent[1]})
                if polled.passed_over:
                    yield _event("passed_over", {"events": polled.passed_over})
                yield b": keep-alive\n\n"
                await asyncio.sleep(LIVE_POLL_SECONDS)

        return _stream(arriving())

    def failed_of(request: Request) -> tuple[str, FailedPage] | Response:
        q = request.query_params
        chosen = q.get("destination") or next(iter(config.destinations), COLLECTOR)
        if chosen == COLLECTOR:
            paths = sorted(config.layout.failed.glob("failed.tok=*.log"))
        elif chosen in config.destinations:
            paths = [config.layout.failed_destination(chosen)]
        else:
            return JSONResponse({"error": f"no destination {chosen!r}"}, 404)
        limit = min(max(int(q.get("limit") or FAILED_SHOWN) if (q.get("limit") or "").isdigit()
                        else FAILED_SHOWN, 1), 1000)  # fmt: skip
        return chosen, newest_records(paths, limit, q.get("reason") or None)

    def failed(request: Request, session: Session | None) -> Response:
        found = failed_of(request)
        if isinstance(found, Response):
            return found
        chosen, records = found
        return page(request, "failed.html", session, chosen=chosen, failed=records,
                    choices=[*config.destinations, COLLECTOR], collector=COLLECTOR,
                    reason=request.query_params.get("reason") or "",
                    replay=replays.of(chosen), as_json=_pretty,
                    event_id_of=failed_event_id)  # fmt: skip

    def failed_api(request: Request, session: Session | None) -> Response:
        found = failed_of(request)
        if isinstance(found, Response):
            return found
        chosen, records = found
        reasons = [{"reason": r, "events": n} for r, n in records.reasons]
        return _json({"destination": chosen, "records": records.records,
                      "reasons": reasons, "looked_at": records.looked_at,
                      "whole_file": records.whole_file})  # fmt: skip

    async def replay(request: Request, session: Session | None) -> Response:
        form = await request.form()
        chosen = form.get("destination")
        if not isinstance(chosen, str) or chosen not in config.destinations:
            return JSONResponse({"error": "replay: no such destination"}, 404)
        reason = form.get("reason")
        event_ids = [i for i in form.getlist("event_id") if isinstance(i, str) and i]
        if len(event_ids) > MAX_CHOSEN or any(len(i) > 200 for i in event_ids):
            return JSONResponse({"error": f"replay: at most {MAX_CHOSEN} event ids"}, 400)
        started = replays.start(chosen, reason if isinstance(reason, str) and reason else None,
                                event_ids)  # fmt: skip
        if session is None:  # a script
            return _json(started.as_json())
        return RedirectResponse(f"/failed?destination={quote(chosen)}", 303)

    def replays_api(request: Request, session: Session | None) -> Response:
        return _json([r.as_json() for r in replays.all()])

    def runs_of(request: Request) -> list[Any]:
        given = request.query_params.get("limit") or ""
        limit = min(int(given), 200) if given.isdigit() else 20
        return [asdict(r) for r in store.history(max(limit, 1))]

    def runs(request: Request, session: Session | None) -> Response:
        reprocessing = [r for r in replays.all() if r.kind == "reprocess"]
        return page(request, "runs.html", session, runs=runs_of(request),
                    destinations=[d for d, dest in config.destinations.items() if dest.tables],
                    reprocessing=reprocessing, today=utc_now().date().isoformat())  # fmt: skip

    async def reprocess(request: Request, session: Session | None) -> Response:
        form = await request.form()
        chosen = form.get("destination")
        if not isinstance(chosen, str) or chosen not in config.destinations:
            return JSONResponse({"error": "reprocess: no such destination"}, 404)
        try:
            first = date.fromisoformat(str(form.get("from") or ""))
            last = date.fromisoformat(str(form.get("to") or first))
        except ValueError:
            return JSONResponse({"error": "reprocess: days are YYYY-MM-DD"}, 400)
        if last < first:
            return JSONResponse({"error": "reprocess: the last day is before the first"}, 400)
        started = replays.reprocess(chosen, first, last, force=form.get("force") == "1",
                                    dry_run=form.get("dry_run") == "1")  # fmt: skip
        if session is None:  # a script
            return _json(started.as_json())
        return RedirectResponse("/runs#reprocess", 303)

    def runs_api(request: Request, session: Session | None) -> Response:
        return _json(runs_of(request))

    async def traced(request: Request) -> Trace | Response | None:
        wanted = (request.query_params.get("id") or "").strip()
        if not wanted:
            return None
        try:
            return await asyncio.to_thread(trace, config, store, wanted)
        except BadEventId as exc:
            return JSONResponse({"error": str(exc)}, 400)

    async def trace_page(request: Request, session: Session | None) -> Response:
        found = await traced(request)
        if isinstance(found, Response):
            return found
        place = _place(found.stored[0]) if found and found.stored else None
        shown = f"the event at {place}"
        previews = [r for r in replays.all() if r.kind == "preview" and r.selection == shown]
        sent = await asyncio.to_thread(as_received, found)
        return page(request, "trace.html", session, trace=found, as_json=_pretty,
                    wanted=request.query_params.get("id") or "", position=place,
                    previews=previews, destinations=list(config.destinations),
                    received=sent)  # fmt: skip

    async def trace_preview(request: Request, session: Session | None) -> Response:
        form = await request.form()
        chosen, wanted = form.get("destination"), form.get("id")
        if not isinstance(chosen, str) or chosen not in config.destinations:
            return JSONResponse({"error": "preview: no such destination"}, 404)
        if not isinstance(wanted, str) or not wanted:
            return JSONResponse({"error": "preview: give the event's id"}, 400)
        try:  # as it was stored, in the log or the archive: no destination is asked
            found = await asyncio.to_thread(stored_line, config, wanted.strip())
        except BadEventId as exc:
            return JSONResponse({"error": str(exc)}, 400)
        if found is None:
            return JSONResponse({"error": "preview: no event with this id in the log or "
                                 "the archive's days searched"}, 404)  # fmt: skip
        started = replays.preview(chosen, found[1], f"the event at {_place(found[0])}")
        if session is None:  # a script
            return _json(started.as_json())
        return RedirectResponse(f"/trace?id={quote(wanted.strip())}#preview", 303)

    def as_received(found: Trace | None) -> Any:
        """The traced event as its client sent it, where the live view's sample holds
        it (None: not there)."""
        if found is None or found.event is None:
            return None
        sample = Received(config.layout)
        sample.refresh(watch=False)  # a trace is not a live view: no sample asked for
        sent = sample.of(found.event)
        return None if sent is None else sent[1]

    async def trace_api(request: Request, session: Session | None) -> Response:
        found = await traced(request)
        if found is None:
            return JSONResponse({"error": "give the event's id: ?id=..."}, 400)
        if isinstance(found, Response):
            return found
        sent = await asyncio.to_thread(as_received, found)
        return _json({**asdict(found), "received": sent})

    def ledger_of(request: Request) -> dict[str, Any] | Response:
        q = request.query_params
        given = q.get("limit") or ""
        try:  # days (YYYY-MM-DD: from its start, to its end) or times, UTC
            since = _day_or_time(q.get("since"), end=False)
            until = _day_or_time(q.get("until"), end=True)
        except ValueError:
            return JSONResponse({"error": "since and until are YYYY-MM-DD or ISO 8601 times"},
                                400)  # fmt: skip
        most = LEDGER_MOST if since or until else 20
        limit = min(int(given), LEDGER_MOST) if given.isdigit() else most
        lines, waiting = ledger(config, store, max(limit, 1), since, until)
        flowing = streams(config, store, since, until)  # older micro-batches: by day
        return {"since": since, "until": until, "limit": limit,
                "runs": [{**asdict(line), "difference": line.difference} for line in lines],
                "totals": [asdict(t) for t in totals(lines)],
                "streams": [{**asdict(line), "difference": line.difference}
                            for line in flowing],
                "waiting": [asdict(w) for w in waiting]}  # fmt: skip

    def destinations_of(request: Request) -> list[dict[str, Any]] | Response:
        only = request.query_params.get("destination") or None
        if only is not None and only not in config.destinations:
            return JSONResponse({"error": f"no destination {only!r}"}, 404)
        return [asdict(v) for v in destinations(config, store, only)]

    def destinations_page(request: Request, session: Session | None) -> Response:
        found = destinations_of(request)
        if isinstance(found, Response):
            return found
        return page(request, "destinations.html", session, destinations=found)

    def destinations_api(request: Request, session: Session | None) -> Response:
        found = destinations_of(request)
        return found if isinstance(found, Response) else _json(found)

    def ledger_page(request: Request, session: Session | None) -> Response:
        found = ledger_of(request)
        if isinstance(found, Response):
            return found
        q = request.query_params
        return page(request, "ledger.html", session, ledger=found,
                    since=q.get("since") or "", until=q.get("until") or "")  # fmt: skip

    def ledger_api(request: Request, session: Session | None) -> Response:
        found = ledger_of(request)
        return found if isinstance(found, Response) else _json(found)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        sampling = asyncio.create_task(figures.run())
        try:
            yield
        finally:
            sampling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampling

    static = resources.files("eventpipe.console") / "static"
    app = Starlette(
        routes=[
            Route("/login", login_form, methods=["GET"]),
            Route("/login", login, methods=["POST"]),
            Route("/logout", guarded(logout), methods=["POST"]),
            Route("/", guarded(overview)),
            Route("/live", guarded(live)),
            Route("/failed", guarded(failed)),
            Route("/failed/replay", guarded(replay), methods=["POST"]),
            Route("/runs", guarded(runs)),
            Route("/runs/reprocess", guarded(reprocess), methods=["POST"]),
            Route("/trace", guarded(trace_page)),
            Route("/trace/preview", guarded(trace_preview), methods=["POST"]),
            Route("/ledger", guarded(ledger_page)),
            Route("/destinations", guarded(destinations_page)),
            Route("/api/overview", guarded(overview_api, api=True)),
            Route("/api/overview/stream", guarded(overview_stream, api=True)),
            Route("/api/events/stream", guarded(events_stream, api=True)),
            Route("/api/failed", guarded(failed_api, api=True)),
            Route("/api/failed/replay", guarded(replay, api=True), methods=["POST"]),
            Route("/api/replays", guarded(replays_api, api=True)),
            Route("/api/runs", guarded(runs_api, api=True)),
            Route("/api/reprocess", guarded(reprocess, api=True), methods=["POST"]),
            Route("/api/trace", guarded(trace_api, api=True)),
            Route("/api/trace/preview", guarded(trace_preview, api=True), methods=["POST"]),
            Route("/api/ledger", guarded(ledger_api, api=True)),
            Route("/api/destinations", guarded(destinations_api, api=True)),
            Mount("/static", StaticFiles(directory=str(static)), name="static"),
        ],
        lifespan=lifespan,
    )
    app.add_middleware(SecurityHeaders)
    return app


def serve(config: Config, config_path: Path | None = None) -> None:
    """Serve the console until SIGTERM or Ctrl-C; exits 130 after Ctrl-C (SIGINT), so
    that ``eventpipe run``'s supervisor, stopping too, does not take it for a crash."""
    import signal

    import uvicorn

    class Server(uvicorn.Server):
        interrupted = False

        def handle_exit(self, sig: int, frame: Any) -> None:
            self.interrupted = self.interrupted or sig == signal.SIGINT
            super().handle_exit(sig, frame)

    console = config.console
    log.info("console on http://%s:%d (docs/console.md)", console.host, console.port)
    server = Server(uvicorn.Config(
        console_app(config, config_path), host=console.host, port=console.port,
        log_level="warning", access_log=False, server_header=False, proxy_headers=False,
    ))  # fmt: skip
    server.run()
    if server.interrupted:
        raise SystemExit(130)


def _filters(request: Request) -> Filters:
    q = request.query_params
    return Filters(q.get("key") or None, q.get("type") or None, q.get("source") or None,
                   q.get("q") or None)  # fmt: skip


def _day_or_time(text: str | None, *, end: bool) -> str | None:
    """A bound of a ledger's range as the state store compares run starts (ISO 8601 UTC
    text): a day means its start (``since``) or the next day's (``until``, so that the
    day is in the range)."""
    if not text:
        return None
    if len(text) == 10:
        day = date.fromisoformat(text)
        return (day + timedelta(days=1) if end else day).isoformat()
    parsed = datetime.fromisoformat(text)
    if parsed.tzinfo is not None:
        parsed = parsed.astimezone(UTC).replace(tzinfo=None)
    return parsed.isoformat()


def _place(stored: Stored) -> str:
    """Where an event is stored, as the trace page says it: its log position in a sealed
    segment, else its file and line (an active segment's, the archive's)."""
    return _log_position(stored) or f"{stored.file}:{stored.line}"


def _log_position(stored: Stored | None) -> str | None:
    """The log position (``SEGMENT:LINE``, as ``eventpipe log show`` reads it) of an
    event stored in a sealed segment of incoming/."""
    if stored is None or stored.where != "log":
        return None
    name = SegmentName.parse(stored.file)
    if name is None or name.sealed is None:
        return None
    return f"{name.id}:{stored.line}"


def _json(value: Any) -> Response:
    return Response(orjson.dumps(value), media_type="application/json")


def _event(kind: str, value: Any) -> bytes:
    """One server-sent event: JSON has no raw newline, so one ``data:`` line."""
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(value) + b"\n\n"


def _stream(chunks: AsyncIterator[bytes]) -> Response:
    return StreamingResponse(chunks, media_type="text/event-stream",
                             headers={"x-accel-buffering": "no"})  # fmt: skip


def _pretty(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()


def _nonce() -> str:
    import secrets

    return secrets.token_urlsafe(32)
