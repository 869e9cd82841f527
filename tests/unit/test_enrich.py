"""Context enrichment: the fields seed 1 and the contract specify, exactly."""

from __future__ import annotations

import ipaddress
import random
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from eventpipe.collector.enrich import (
    EnrichSettings,
    RequestContext,
    anonymize,
    client_address,
    enrich_batch,
)

WHEN = datetime(2026, 11, 21, 10, 0, 0, 123456, tzinfo=UTC)
SETTINGS = EnrichSettings(max_event_bytes=51_200, anonymize_ip=False)


def _ctx(*, browser: bool, user_agent: str | None = "Mozilla/5.0 test") -> RequestContext:
    return RequestContext(
        key_id="web",
        browser=browser,
        source_ip="203.0.113.7",
        user_agent=user_agent,
        received_at=WHEN,
        timestamp="2026-11-21T10:00:00.123456Z",
    )


def _enrich(items: list[Any], **kwargs: Any) -> list[dict[str, Any]]:
    settings = kwargs.pop("settings", SETTINGS)
    batch = enrich_batch(items, _ctx(**kwargs), settings)
    return [orjson.loads(line) for line in batch.lines]


def test_browser_event_gets_exactly_the_browser_context() -> None:
    [event] = _enrich([{"event_type": "page"}], browser=True)
    event_id = event["eventn_ctx"]["event_id"]
    assert event == {
        "event_type": "page",
        "source_ip": "203.0.113.7",
        "_timestamp": "2026-11-21T10:00:00.123456Z",
        "api_key": "web",
        "eventn_ctx": {"event_id": event_id, "user_agent": "Mozilla/5.0 test"},
    }
    assert uuid.UUID(event_id).version == 7


def test_server_event_gets_src_api_and_no_user_agent() -> None:
    [event] = _enrich([{"event_type": "order"}], browser=False)
    assert event["src"] == "api"
    assert "user_agent" not in event["eventn_ctx"]
    assert event["api_key"] == "web"


def test_generated_ids_are_unique_and_time_ordered() -> None:
    events = _enrich([{} for _ in range(1000)], browser=False)
    ids = [e["eventn_ctx"]["event_id"] for e in events]
    assert len(set(ids)) == 1000
    assert ids == sorted(ids)


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        ({"eventn_ctx": {"event_id": "a"}, "eventn_ctx_event_id": "b", "event_id": "c"}, "a"),
        ({"eventn_ctx_event_id": "b", "event_id": "c", "messageId": "d"}, "b"),
        ({"event_id": "c", "messageId": "d"}, "c"),
        ({"messageId": "d"}, "d"),
        ({"event_id": 42}, "42"),
        ({"event_id": "", "messageId": "d"}, "d"),
        ({"event_id": True, "messageId": "d"}, "d"),
    ],
)
def test_the_clients_id_is_kept(item: dict[str, Any], expected: str) -> None:
    [event] = _enrich([item], browser=False)
    assert event["eventn_ctx"]["event_id"] == expected


def test_client_values_win_where_the_contract_says_if_absent() -> None:
    [event] = _enrich(
        [
            {
                "_timestamp": "2020-01-01T00:00:00Z",
                "src": "backfill",
                "eventn_ctx": {"user_agent": "client-ua", "utc_time": "x"},
            }
        ],
        browser=True,
    )
    assert event["_timestamp"] == "2020-01-01T00:00:00Z"
    assert event["eventn_ctx"]["user_agent"] == "client-ua"
    assert event["eventn_ctx"]["utc_time"] == "x"
    [server] = _enrich([{"src": "backfill", "_timestamp": None}], browser=False)
    assert server["src"] == "backfill"
    assert server["_timestamp"] == "2026-11-21T10:00:00.123456Z"  # null counts as absent


def test_the_key_id_and_browser_ip_cannot_be_forged() -> None:
    [event] = _enrich([{"api_key": "admin", "source_ip": "1.2.3.4"}], browser=True)
    assert event["api_key"] == "web"
    assert event["source_ip"] == "203.0.113.7"


def test_a_server_event_may_carry_its_own_source_ip() -> None:
    [event] = _enrich([{"source_ip": "198.51.100.9"}], browser=False)
    assert event["source_ip"] == "198.51.100.9"
    anonymized = EnrichSettings(max_event_bytes=51_200, anonymize_ip=True)
    [event] = _enrich(
        [{"source_ip": "2001:db8::1234:5678:9abc"}], browser=False, settings=anonymized
    )
    assert event["source_ip"] == "2001:db8::"


def test_bad_items_are_rejected_alone_with_reasons() -> None:
    items: list[Any] = [
        {"ok": 1},
        7,
        "text",
        None,
        [1],
        {"eventn_ctx": "not an object"},
        {"source_ip": "not-an-ip"},
        {"big": "x" * 60_000},
        {"ok": 2},
    ]
    batch = enrich_batch(items, _ctx(browser=False), SETTINGS)
    assert [orjson.loads(line)["ok"] for line in batch.lines] == [1, 2]
    assert [(r.index, r.reason) for r in batch.rejections] == [
        (1, "not_an_object"),
        (2, "not_an_object"),
        (3, "not_an_object"),
        (4, "not_an_object"),
        (5, "bad_eventn_ctx"),
        (6, "bad_source_ip"),
        (7, "event_too_large"),
    ]
    assert batch.rejections[0].message == "is a JSON number, not an object"
    assert "max_event_bytes is 51200" in batch.rejections[6].message
    failed = [orjson.loads(line) for line in batch.failed_lines]
    assert [f["event"] for f in failed[:4]] == [7, "text", None, [1]]
    assert all(f["stage"] == "receiving" and f["api_key"] == "web" for f in failed)
    assert failed[5]["error"] == "item 6: source_ip 'not-an-ip' is not an IP address"


def test_the_event_size_limit_applies_to_the_stored_line() -> None:
    small = EnrichSettings(max_event_bytes=300, anonymize_ip=False)
    batch = enrich_batch([{"pad": "x" * 100}, {"pad": "x" * 250}], _ctx(browser=True), small)
    assert len(batch.lines) == 1
    assert len(batch.lines[0]) <= 301
    assert batch.rejections[0].index == 1


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("203.0.113.77", "203.0.113.0"),
        ("10.1.2.255", "10.1.2.0"),
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1::"),
        ("::1", "::"),
    ],
)
def test_anonymize_zeroes_the_last_octet_or_80_bits(address: str, expected: str) -> None:
    assert anonymize(address) == expected


PROXIES = [ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("::1/128")]


@pytest.mark.parametrize(
    ("peer", "header", "expected"),
    [
        ("198.51.100.1", "1.1.1.1", "198.51.100.1"),  # untrusted peer: header ignored
        ("10.0.0.5", None, "10.0.0.5"),
        ("10.0.0.5", "1.1.1.1", "1.1.1.1"),
        ("10.0.0.5", "6.6.6.6, 1.1.1.1", "1.1.1.1"),  # the client could forge the left part
        ("10.0.0.5", "1.1.1.1, 10.0.0.9", "1.1.1.1"),  # a chain of trusted proxies
        ("10.0.0.5", "10.0.0.8, 10.0.0.9", "10.0.0.8"),  # all trusted: the farthest
        ("10.0.0.5", "1.1.1.1, garbage", "10.0.0.5"),  # garbage stops the walk
        ("::1", "2001:db8::1", "2001:db8::1"),
    ],
)
def test_x_forwarded_for_is_believed_only_from_trusted_proxies(
    peer: str, header: str | None, expected: str
) -> None:
    assert client_address(peer, header, PROXIES) == expected


def test_without_trusted_proxies_the_peer_is_the_client() -> None:
    assert client_address("10.0.0.5", "1.1.1.1", []) == "10.0.0.5"


def _nested(levels: int) -> dict[str, Any]:
    node: dict[str, Any] = {}
    for _ in range(levels - 1):
        node = {"n": node}
    return node


def test_depth_is_checked_per_item_counting_the_array_level() -> None:
    settings = EnrichSettings(max_event_bytes=51_200, anonymize_ip=False, max_json_depth=6)
    items = [_nested(5), _nested(6), {"ok": True}]
    in_array = enrich_batch(items, _ctx(browser=False), settings, in_array=True)
    assert [(r.index, r.reason) for r in in_array.rejections] == [(1, "too_deep")]
    assert "max_json_depth (6) at /n/n/n/n/n" in in_array.rejections[0].message
    alone = enrich_batch([_nested(6)], _ctx(browser=False), settings, in_array=False)
    assert alone.rejections == []  # a lone object starts at level 1


def test_brackets_inside_strings_do_not_count_as_depth() -> None:
    settings = EnrichSettings(max_event_bytes=51_200, anonymize_ip=False, max_json_depth=3)
    batch = enrich_batch([{"a": "[[[[[[[[{{{{{{{{"}], _ctx(browser=True), settings)
    assert batch.rejections == []


def test_items_too_deep_for_the_encoder_are_reported_as_too_deep() -> None:
    settings = EnrichSettings(max_event_bytes=10**9, anonymize_ip=False, max_json_depth=200)
    batch = enrich_batch([_nested(300)], _ctx(browser=False), settings)
    assert batch.rejections[0].reason == "too_deep"
    [record] = [orjson.loads(line) for line in batch.failed_lines]  # the record is kept
    assert record["event_clipped"] == "nested deeper than 100 levels; cut there"
    depth, node = 0, record["event"]
    while isinstance(node, dict):
        depth, node = depth + 1, node["n"]
    assert (depth, node) == (100, "<clipped>")


@pytest.mark.parametrize(
    "given",
    [
        "fe80::1%' OR 1=1 --",
        "fe80::1%eth0",
        3232235777,
        ["1.2.3.4"],
        "1.2.3.4 ",
        "::ffff:1.2.3.4%x",
    ],
)
def test_a_server_source_ip_must_be_a_plain_address(given: Any) -> None:
    batch = enrich_batch([{"source_ip": given}], _ctx(browser=False), SETTINGS)
    assert batch.lines == []
    assert [r.reason for r in batch.rejections] == ["bad_source_ip"]


@pytest.mark.parametrize("anonymize_ip", [False, True])
def test_a_server_source_ip_in_ipv4_text_is_taken_as_ipaddress_reads_it(
    anonymize_ip: bool,
) -> None:
    """The text of an IPv4 address is taken as it is only where the standard library
    reads and writes it the same (leading zeros, octets past 255, other digits,
    whitespace and other forms refused or rewritten as before)."""
    rng = random.Random(7)
    pieces = ["0", "00", "01", "9", "10", "099", "100", "199", "249", "250", "255", "256",
              "300", "1000", "٣", "1 ", "", "+1", "0x1"]  # fmt: skip
    texts = [
        ".".join(rng.choice(pieces) for _ in range(rng.choice([3, 4, 4, 4, 5])))
        for _ in range(3000)
    ] + ["1.2.3.4\n", "127.0.0.1", "0.0.0.0", "255.255.255.255"]
    settings = replace(SETTINGS, anonymize_ip=anonymize_ip)
    for text in texts:
        batch = enrich_batch([{"source_ip": text}], _ctx(browser=False), settings)
        try:
            address = ipaddress.IPv4Address(text)
        except ValueError:
            if ":" not in text:
                assert batch.lines == [], text
            continue
        expected = str(anonymize(str(address)) if anonymize_ip else address)
        assert [orjson.loads(line)["source_ip"] for line in batch.lines] == [expected], text


def test_a_server_source_ip_is_stored_in_its_canonical_form() -> None:
    [event] = _enrich([{"source_ip": "2001:DB8:0:0::1"}], browser=False)
    assert event["source_ip"] == "2001:db8::1"


@pytest.mark.parametrize(
    ("sent", "stored"),
    [
        ("2026-11-21T10:59:00Z", "2026-11-21T10:59:00Z"),  # within the skew: kept
        ("2026-11-21T11:00:01Z", None),  # past it: the time of receipt
        ("2999-01-01T00:00:00+05:00", None),
        ("10000-01-01T00:00:00Z", None),  # a year no destination holds
        ("yesterday", "yesterday"),  # not a time: the pipeline's to read or refuse
        (1_700_000_000, 1_700_000_000),
    ],
)
def test_a_browser_timestamp_in_the_future_becomes_the_time_of_receipt(
    sent: Any, stored: Any
) -> None:
    [event] = _enrich([{"_timestamp": sent}], browser=True)
    if stored is None:
        assert event["_timestamp"] == "2026-11-21T10:00:00.123456Z"
        assert event["eventn_ctx"]["client_timestamp"] == sent
    else:
        assert event["_timestamp"] == stored
        assert "client_timestamp" not in event["eventn_ctx"]
    [server] = _enrich([{"_timestamp": "2999-01-01T00:00:00Z"}], browser=False)
    assert server["_timestamp"] == "2999-01-01T00:00:00Z"  # a server key is believed


def test_browser_event_ids_live_in_their_key_namespace() -> None:
    def given() -> list[dict[str, Any]]:
        return [{"event_id": "a"}, {"messageId": 7}, {"eventn_ctx": {"event_id": "b"}}, {}]

    ids = [e["eventn_ctx"]["event_id"] for e in _enrich(given(), browser=True)]
    assert ids[:3] == ["js:web:a", "js:web:7", "js:web:b"]
    assert uuid.UUID(ids[3]).version == 7  # the server's own: no namespace needed
    server = [e["eventn_ctx"]["event_id"] for e in _enrich(given()[:3], browser=False)]
    assert server == ["a", "7", "b"]


def test_a_browser_event_cannot_claim_to_be_a_server_event() -> None:
    batch = enrich_batch([{"src": "Api"}, {"src": "jitsu"}], _ctx(browser=True), SETTINGS)
    assert [r.reason for r in batch.rejections] == ["server_only_field"]
    [kept] = [orjson.loads(line) for line in batch.lines]
    assert kept["src"] == "jitsu"


def test_the_mark_of_a_check_does_not_count_against_max_event_bytes(tmp_path: Any) -> None:
    """An event that fits once enriched still fits with the check's mark on its line;
    one that does not is refused without the mark in what failed/ records."""
    from eventpipe.contracts.check import Contracts
    from eventpipe.contracts.plans import read_plans
    from eventpipe.reserved import CHECKED

    plan = {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "x-eventpipe": {"event_type": "checkout"}, "required": ["total"]}  # fmt: skip
    (tmp_path / "checkout.json").write_bytes(orjson.dumps(plan))
    contracts = Contracts(read_plans([tmp_path / "checkout.json"]))
    event = {"event_type": "checkout", "total": 1, "pad": ""}
    size = len(enrich_batch([dict(event)], _ctx(browser=False), SETTINGS).lines[0]) - 1
    event["pad"] = "x" * (1000 - size)  # exactly 1,000 bytes once enriched, unmarked
    settings = EnrichSettings(max_event_bytes=1000, anonymize_ip=False, contracts=contracts)
    batch = enrich_batch([dict(event)], _ctx(browser=False), settings)
    [line] = batch.lines
    assert orjson.loads(line)[CHECKED] == {"plans": contracts.digest, "plan": "checkout/1"}
    assert len(line) - 1 > 1000
    event["pad"] += "x"
    batch = enrich_batch([dict(event)], _ctx(browser=False), settings)
    assert batch.lines == []
    [rejection] = batch.rejections
    assert rejection.reason == "event_too_large"
    assert CHECKED.encode() not in b"".join(batch.failed_lines)


def test_checked_events_keep_their_order_and_each_is_refused_alone(tmp_path: Any) -> None:
    """The events of a request are checked together: under ``reject`` the lines kept are
    the events that met their plans (or have none), in the request's order, each ending
    with its mark; those refused, for breaking their plan or for anything else, are
    listed by index with their reasons, and each broken rule is counted."""
    from eventpipe.contracts.check import Contracts
    from eventpipe.contracts.plans import read_plans
    from eventpipe.reserved import CHECKED

    plan = {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "x-eventpipe": {"event_type": "checkout"}, "required": ["total"],
            "properties": {"total": {"type": "number", "minimum": 0}}}  # fmt: skip
    (tmp_path / "checkout.json").write_bytes(orjson.dumps(plan))
    contracts = Contracts(read_plans([tmp_path / "checkout.json"]))
    items = [
        {"event_type": "checkout", "total": 1, "n": 0},
        {"event_type": "checkout", "total": -1, "n": 1},
        "not an object",
        {"event_type": "page_view", "n": 3},
        {"event_type": "checkout", "n": 4},
        {"event_type": "checkout", "total": 2, "n": 5, "eventn_ctx": {"contract": "forged"}},
    ]
    settings = EnrichSettings(max_event_bytes=51_200, anonymize_ip=False, contracts=contracts,
                              reject_violations=True)  # fmt: skip
    batch = enrich_batch(items, _ctx(browser=False), settings)
    kept = [orjson.loads(line) for line in batch.lines]
    assert [event["n"] for event in kept] == [0, 3, 5]
    assert [event.get(CHECKED) for event in kept] == [
        {"plans": contracts.digest, "plan": "checkout/1"}, None,
        {"plans": contracts.digest, "plan": "checkout/1"}]  # fmt: skip
    assert "contract" not in kept[2]["eventn_ctx"]
    assert [(r.index, r.reason) for r in batch.rejections] == [
        (1, "contract_violation"), (2, "not_an_object"), (4, "contract_violation")]  # fmt: skip
    assert "/total minimum" in batch.rejections[0].message
    assert dict(batch.violations) == {("checkout/1", "minimum"): 1, ("checkout/1", "required"): 1}
