"""Context enrichment (seed 1): what the collector adds to each event before writing it.

For every event:

* ``source_ip``: the peer address (see :func:`client_address` for proxies). A server event
  may carry its own ``source_ip``, which must then be an IP address as text, without an
  IPv6 zone (``%eth0``), and is stored in its canonical form. With ``anonymize_ip``
  the last octet (IPv4) or last 80 bits (IPv6) are zeroed before anything is written.
* ``_timestamp``: the time the request was received, UTC RFC 3339, set only if absent
  (missing or null). All events of one request get the same value.
* ``api_key``: the id of the key used (never the secret); overwrites what the client sent.
* ``eventn_ctx.event_id``: the client's id found at ``/eventn_ctx/event_id``,
  ``/eventn_ctx_event_id``, ``/event_id`` or ``/messageId`` (first non-empty string or
  integer), else a new UUIDv7. Written into the log, so it never changes on reprocessing.

Browser events also get ``eventn_ctx.user_agent`` from the User-Agent header, if absent;
server events get ``src: "api"``, if absent.

An item that cannot be stored (not an object, ``eventn_ctx`` not an object, a bad
``source_ip``, nested deeper than ``max_json_depth``, too large once enriched) is rejected
alone; the rest of the batch goes on. What is recorded of rejected items is bounded per
request (:data:`MAX_RECORDED_REJECTIONS`, :data:`MAX_RECORDED_BYTES`).

Cost matters here: this runs for every event on the collector's single event loop. The
depth limit is checked exactly only for events whose serialized line holds more ``{`` and
``[`` bytes than the limit, since nesting can never exceed that count; such lines are
found by one pass of Hyperscan over all of a request's lines (:mod:`.scan`: 0.1 us per
event, where two ``bytes.count`` per line took 0.4-0.7 us).
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from eventpipe.collector.body import (
    MAX_INTEGER_DIGITS,
    IntegerTooLong,
    NumberUnderflow,
    deeper_than,
)
from eventpipe.collector.scan import crowded_lines
from eventpipe.config import Config
from eventpipe.contracts.check import Contracts
from eventpipe.events import Stage, client_event_id, event_error_line, new_event_id
from eventpipe.reserved import CHECKED

_APPEND_NEWLINE = orjson.OPT_APPEND_NEWLINE

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class RequestContext:
    """What one request contributes to each of its events."""

    key_id: str
    browser: bool
    source_ip: str
    user_agent: str | None
    received_at: datetime
    timestamp: str
    """``received_at`` formatted once per request."""


@dataclass(frozen=True)
class EnrichSettings:
    max_event_bytes: int
    anonymize_ip: bool
    max_json_depth: int = 64
    max_future_skew_seconds: float = 3600.0
    """How far past the time of receipt a browser event's ``_timestamp`` may be."""
    contracts: Contracts | None = None
    """Tracking plans each event is checked against (``contracts.collector`` not off)."""
    reject_violations: bool = False
    """An event that breaks its plan is refused (``reject``), not marked (``flag``)."""


def tracking_plans(config: Config) -> Contracts | None:
    """The config's tracking plans, ready to check events (read again, as they are now;
    the config's check read them already); None without plans. (Here, not in
    eventpipe.contracts, which the config itself imports.)"""
    from eventpipe.contracts.plans import PlanError, read_plans
    from eventpipe.errors import ConfigError

    if not config.contracts.plans:
        return None
    try:
        plans = read_plans(config.contracts.plans)
    except PlanError as exc:
        raise ConfigError(f"tracking plan {exc}") from None
    return Contracts(plans, config.contracts.version_field)


SERVER_SRC = "api"
"""The ``src`` of server events: a browser event may not claim it."""

_CLAIMS_SERVER = (
    "server_only_field",
    'src "api" marks events sent with a server key; a browser key cannot send it',
)


@dataclass(frozen=True)
class Rejection:
    index: int
    reason: str
    """One of a small fixed set, for metrics labels."""
    message: str


MAX_RECORDED_REJECTIONS = 10
"""Rejected items of one request that each get an EventError and a line in the answer.
Past them, items are counted by reason only, and the request's body is recorded once
(:func:`summary_line`): a body of a million bad items costs a few KB of failed/, not a
hundred MB, and no time on the event loop."""
MAX_RECORDED_BYTES = 4096
"""A rejected item larger than this as JSON is recorded as its first bytes, its size and
its SHA-256 (oversized events, huge strings), not whole."""


@dataclass
class EnrichedBatch:
    record_limit: int = MAX_RECORDED_REJECTIONS
    """Rejected items recorded one by one (the rest are counted)."""
    label: str = "item"
    """What a rejected item is called in its record: ``item 3``, ``line 12``."""
    numbers: Sequence[int] | None = None
    """Each item's number in its record (its line), if not its index."""
    lines: list[bytes] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    """The first :data:`MAX_RECORDED_REJECTIONS` rejected items, each with its reason."""
    failed_lines: list[bytes] = field(default_factory=list)
    rejected: Counter[str] = field(default_factory=Counter)
    """Every rejected item, recorded or not, counted by reason."""
    violations: Counter[tuple[str, str]] = field(default_factory=Counter)
    """Events that broke their tracking plan, by plan and rule (each rule once an
    event)."""
    broken: int = 0
    """Events that broke their tracking plan (refused or marked)."""

    @property
    def unrecorded(self) -> int:
        """Rejected items past the recorded ones (the body's summary stands for them)."""
        return self.rejected.total() - len(self.rejections)


def anonymize(address: str) -> str:
    """Zero the last octet of an IPv4 address, the last 80 bits of an IPv6 address."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv4Address):
        return str(ipaddress.IPv4Address(int(ip) & ~0xFF))
    return str(ipaddress.IPv6Address(int(ip) & ~((1 << 80) - 1)))


def client_address(peer: str, forwarded_for: str | None, trusted: Sequence[IPNetwork]) -> str:
    """The client's address: the peer, or, when the peer is a trusted proxy, the right-most
    X-Forwarded-For hop that is not itself a trusted proxy (RFC 7239 section 7.4 reasoning:
    only hops we trust can vouch for the one before them)."""
    if not forwarded_for or not trusted or not _in_networks(peer, trusted):
        return peer
    client = peer
    for hop in reversed([h.strip() for h in forwarded_for.split(",") if h.strip()]):
        try:
            ipaddress.ip_address(hop)
        except ValueError:
            break  # garbage in the header: trust nothing further left
        client = hop
        if not _in_networks(hop, trusted):
            break
    return client


def _in_networks(address: str, networks: Sequence[IPNetwork]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in net for net in networks)


def enrich_batch(
    items: list[Any],
    ctx: RequestContext,
    settings: EnrichSettings,
    *,
    in_array: bool = True,
    refused: Mapping[int, tuple[str, str]] | None = None,
    out: EnrichedBatch | None = None,
) -> EnrichedBatch:
    """Enrich each item; reject the ones that cannot be stored, each with its reason.

    ``in_array``: the items came in a JSON array, so each starts at nesting level 2.
    ``refused``: items already found unfit by the endpoint's own rules (index -> reason
    and message), rejected as the others are. ``out``: an empty batch saying how
    rejected items are recorded (``eventpipe import``: every one, by line number).

    This loop runs for every event on the collector's one event loop thread, so it is
    written flat, with names bound once (measured: about 1.6 us of Python per event before,
    see bench/ingest.py); the rare cases go to functions of their own (:func:`_reject`,
    :func:`_reject_deep`, :func:`_write_checked`).
    """
    out = out if out is not None else EnrichedBatch()
    lines, first = out.lines, len(out.lines)
    kept: list[int] = []  # the index of each line's item
    base = 2 if in_array else 1
    # Containers an item may hold: its own level counts, and enrichment may add eventn_ctx.
    max_containers = settings.max_json_depth - base + 1
    max_line = settings.max_event_bytes + 1  # the newline does not count
    dumps = orjson.dumps
    source_ip, timestamp, key_id = ctx.source_ip, ctx.timestamp, ctx.key_id
    browser, user_agent = ctx.browser, ctx.user_agent
    browser_ids = f"js:{key_id}:"
    latest = ctx.received_at + timedelta(seconds=settings.max_future_skew_seconds)
    contracts, reject = settings.contracts or None, settings.reject_violations
    pending: list[int] | None = [] if contracts is not None else None
    """The items to check against their plans, all at once (:func:`_write_checked`)."""
    for index, item in enumerate(items):
        if refused and index in refused:
            _reject(out, ctx, index, item, refused[index])
            continue
        if type(item) is not dict:
            _reject(out, ctx, index, item, _not_an_object(item))
            continue
        if CHECKED in item:
            del item[CHECKED]  # the check's mark: never a client's, whatever its key
        context = item.get("eventn_ctx")
        if context is None:
            context = item["eventn_ctx"] = {}
        elif type(context) is not dict:
            _reject(out, ctx, index, item, ("bad_eventn_ctx", "eventn_ctx must be an object"))
            continue
        if browser:
            item["source_ip"] = source_ip
            if user_agent is not None and context.get("user_agent") is None:
                context["user_agent"] = user_agent
            src = item.get("src")
            if type(src) is str and src.strip().lower() == SERVER_SRC:
                _reject(out, ctx, index, item, _CLAIMS_SERVER)
                continue
            stamp = item.get("_timestamp")
            if stamp is not None and _later_than(stamp, latest):
                context["client_timestamp"] = stamp
                item["_timestamp"] = timestamp
        else:
            if item.get("source_ip") is None:
                if source_ip:  # an import has no address to give
                    item["source_ip"] = source_ip
            else:
                problem = _own_source_ip(item, settings.anonymize_ip)
                if problem is not None:
                    _reject(out, ctx, index, item, problem)
                    continue
            if item.get("src") is None:
                item["src"] = "api"
        if (browser or contracts is not None) and (
            "contract" in context or "contract_violations" in context
        ):  # the job's names for a verdict: never a browser's, never kept where checked
            context.pop("contract", None)
            context.pop("contract_violations", None)
        if item.get("_timestamp") is None:
            item["_timestamp"] = timestamp
        item["api_key"] = key_id
        event_id = context.get("event_id")
        if type(event_id) is not str or not event_id:
            if (
                event_id is None
                and item.get("eventn_ctx_event_id") is None
                and item.get("event_id") is None
                and item.get("messageId") is None
            ):
                event_id = None
            else:
                event_id = client_event_id(item)
        if event_id is None:
            context["event_id"] = new_event_id()
        elif browser:  # a client's id, in its key's namespace
            context["event_id"] = browser_ids + event_id
        else:
            context["event_id"] = event_id
        if pending is not None:
            pending.append(index)  # its line is written once it is checked
            continue
        try:
            line = dumps(item, option=_APPEND_NEWLINE)
        except orjson.JSONEncodeError as exc:
            _reject(out, ctx, index, item, _unencodable(item, exc, settings.max_json_depth, base))
            continue
        if len(line) > max_line:
            _reject(out, ctx, index, item, _too_large(len(line) - 1, settings.max_event_bytes))
            continue
        lines.append(line)
        kept.append(index)
    if contracts is not None and pending:
        kept = _write_checked(out, ctx, items, pending, contracts, reject, settings, base)
    if len(lines) > first and crowded_lines(max_containers).found(b"".join(lines[first:])):
        _reject_deep(out, ctx, items, first, kept, settings.max_json_depth, base)
    return out


def _reject_deep(
    out: EnrichedBatch,
    ctx: RequestContext,
    items: list[Any],
    first: int,
    kept: list[int],
    max_depth: int,
    base: int,
) -> None:
    """Reject the items whose lines (``out.lines[first:]``, of ``items[kept[i]]``) nest
    deeper than ``max_depth``: only lines with more ``{`` and ``[`` than the depth
    allows are walked (rare: the scan found at least one)."""
    most = max_depth - base + 1
    lines: list[bytes] = []
    for line, index in zip(out.lines[first:], kept, strict=True):
        if line.count(b"{") + line.count(b"[") > most:
            problem = _depth_problem(items[index], max_depth, base)
            if problem is not None:
                _reject(out, ctx, index, items[index], problem)
                continue
        lines.append(line)
    out.lines[first:] = lines
    out.rejections.sort(key=lambda rejection: rejection.index)


def _write_checked(
    out: EnrichedBatch,
    ctx: RequestContext,
    items: list[Any],
    pending: list[int],
    contracts: Contracts,
    reject: bool,
    settings: EnrichSettings,
    base: int,
) -> list[int]:
    """Write the lines of the enriched events ``items[i]``, ``i`` in ``pending``, checked
    against their plans all at once (Contracts.check_many: the validator is asked about
    many events of a plan in one call); the indexes of those written. Each line ends
    with the event's mark (its plan and violations, for the job: Contracts.mark), which
    counts against no limit; under ``reject``, an event that breaks its plan is refused."""
    events = [items[index] for index in pending]
    dumps, lines, kept = orjson.dumps, out.lines, []
    max_line = settings.max_event_bytes + 1  # the newline does not count
    violations, mark_of, ok_marks = out.violations, contracts.mark_json, contracts.ok_marks
    for index, event, verdict in zip(pending, events, contracts.check_many(events), strict=True):
        if verdict is None:
            mark = mark_of(event, None)
        elif not verdict.violations:
            mark = ok_marks[verdict.plan]
        else:
            out.broken += 1
            for rule in verdict.rules:
                violations[(verdict.plan, rule)] += 1
            if reject:
                _reject(out, ctx, index, event, ("contract_violation", verdict.summary()))
                continue
            mark = mark_of(event, verdict)
        if mark is not None:
            event[CHECKED] = mark
        # Encoded and limited as in enrich_batch's loop, which keeps its lines inline:
        # a call per event there would cost every event, checked or not.
        try:
            line = dumps(event, option=_APPEND_NEWLINE)
        except orjson.JSONEncodeError as exc:
            _reject(out, ctx, index, event, _unencodable(event, exc, settings.max_json_depth, base))
            continue
        if len(line) > max_line:
            size = len(line) - 1 - (0 if mark is None else len(dumps({CHECKED: mark})) - 1)
            if size + 1 > max_line:  # its mark's bytes (a comma, no braces) aside
                _reject(out, ctx, index, event, _too_large(size, settings.max_event_bytes))
                continue
        lines.append(line)
        kept.append(index)
    if len(kept) < len(pending):
        out.rejections.sort(key=lambda rejection: rejection.index)
    return kept


def _too_large(size: int, max_event_bytes: int) -> tuple[str, str]:
    message = f"event is {size} bytes once enriched; max_event_bytes is {max_event_bytes}"
    return "event_too_large", message


def _reject(
    out: EnrichedBatch, ctx: RequestContext, index: int, item: Any, problem: tuple[str, str]
) -> None:
    reason, message = problem
    if type(item) is dict and CHECKED in item:
        del item[CHECKED]  # the event as it came, enriched
    out.rejected[reason] += 1
    if len(out.rejections) >= out.record_limit:
        return  # counted; summary_line records the body once
    out.rejections.append(Rejection(index, reason, message))
    number = out.numbers[index] if out.numbers is not None else index
    error = f"{out.label} {number}: {message}"
    try:
        text = orjson.dumps(item, default=str)
    except orjson.JSONEncodeError:
        text = b""  # too deep to write: event_error_line clips it
    if len(text) <= MAX_RECORDED_BYTES:
        line = event_error_line(event=item, error=error, stage=Stage.RECEIVING,
                                when=ctx.received_at, api_key=ctx.key_id)  # fmt: skip
    else:
        line = event_error_line(event=None, error=error, stage=Stage.RECEIVING,
                                when=ctx.received_at, api_key=ctx.key_id,
                                raw=_cut(text), raw_bytes=len(text),
                                raw_sha256=hashlib.sha256(text).hexdigest())  # fmt: skip
    out.failed_lines.append(line)


def _cut(data: bytes) -> str:
    """The first :data:`MAX_RECORDED_BYTES` of ``data`` as text (a character cut in two
    is dropped)."""
    return data[:MAX_RECORDED_BYTES].decode("utf-8", errors="ignore")


def summary_line(batch: EnrichedBatch, ctx: RequestContext, body: bytes) -> bytes:
    """The one EventError that stands for the rejected items past the recorded ones: their
    count by reason, and the request's body (its first :data:`MAX_RECORDED_BYTES`, its
    size and SHA-256)."""
    reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(batch.rejected.items()))
    return event_error_line(
        event=None,
        error=f"{batch.rejected.total()} items of the request rejected ({reasons}); the "
        f"first {len(batch.rejections)} are recorded one by one, the request's body here",
        stage=Stage.RECEIVING,
        when=ctx.received_at,
        api_key=ctx.key_id,
        raw=_cut(body),
        raw_bytes=len(body),
        raw_sha256=hashlib.sha256(body).hexdigest(),
    )


def _later_than(stamp: Any, latest: datetime) -> bool:
    """Whether a client's ``_timestamp`` is an RFC 3339 time after ``latest`` (a value
    that is no such time is the pipeline's to read or refuse, as before)."""
    if type(stamp) is not str:
        return False
    try:
        when = datetime.fromisoformat(stamp)
    except ValueError:
        return stamp[:5].isdigit()  # a year of five digits, which Python cannot hold
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when > latest


def _not_an_object(item: Any) -> tuple[str, str]:
    kind = "array" if isinstance(item, list) else type(item).__name__
    kind = {"str": "string", "int": "number", "float": "number", "NoneType": "null"}.get(kind, kind)
    return "not_an_object", f"is a JSON {kind}, not an object"


_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_CANONICAL_IPV4 = re.compile(rf"{_OCTET}(?:\.{_OCTET}){{3}}")
"""An IPv4 address as ``ipaddress`` writes it (four decimal octets, no leading zero):
the usual ``source_ip`` of a server event or an import, taken as it is (0.2 us, where
``ipaddress`` took 3-4 us to parse it and write it again)."""


def _own_source_ip(item: dict[str, Any], anonymize_ip: bool) -> tuple[str, str] | None:
    """A server event's own source_ip: it must be an IP address; anonymised if configured."""
    given = item["source_ip"]
    if type(given) is str and _CANONICAL_IPV4.fullmatch(given):
        if anonymize_ip:
            item["source_ip"] = given[: given.rindex(".")] + ".0"
        return None
    try:
        if type(given) is not str:
            raise TypeError
        ip = ipaddress.ip_address(given)
    except (ValueError, TypeError):
        return "bad_source_ip", f"source_ip {given!r} is not an IP address"
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id is not None:
        # The standard library takes any text after "%" as a zone (RFC 4007): it only
        # means something on the sender's host, and would carry any text into the log.
        return "bad_source_ip", f"source_ip {given!r} has a zone (%...): send the address alone"
    item["source_ip"] = anonymize(str(ip)) if anonymize_ip else str(ip)
    return None


def _unencodable(
    item: Any, exc: orjson.JSONEncodeError, max_depth: int, base: int
) -> tuple[str, str]:
    if NumberUnderflow.__name__ in str(exc):
        return (
            "number_underflow",
            "holds a number too small for a float64, which would be stored as 0; send it "
            "as a string",
        )
    if IntegerTooLong.__name__ in str(exc):
        return (
            "integer_too_long",
            f"holds an integer of more than {MAX_INTEGER_DIGITS} digits, which no destination "
            "stores exactly; send it as a string",
        )
    depth = _depth_problem(item, max_depth, base)
    return depth or ("unencodable", f"cannot be stored as JSON: {exc}")


def _depth_problem(item: Any, max_depth: int, base: int) -> tuple[str, str] | None:
    where = deeper_than(item, max_depth, base=base)
    if where is None:
        return None
    return "too_deep", f"is nested deeper than max_json_depth ({max_depth}) at {where}"
