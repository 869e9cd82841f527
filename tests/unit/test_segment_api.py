"""The Segment API's messages as eventpipe events: the write key, batches and their shared
fields, clock-skew correction, table names, addresses and user agents, refusals."""

from __future__ import annotations

import base64
from datetime import UTC, datetime

import pytest

from eventpipe.collector import segment_api
from eventpipe.collector.segment_api import MessageError, messages, to_event

RECEIVED = datetime(2026, 11, 24, 12, 0, 0, tzinfo=UTC)


def test_the_write_key_is_the_user_name_of_basic_auth() -> None:
    header = "Basic " + base64.b64encode(b"s2s-secret:").decode()
    assert segment_api.basic_user(header) == "s2s-secret"
    assert segment_api.basic_user("Basic " + base64.b64encode(b"k:ignored").decode()) == "k"
    assert segment_api.basic_user("Bearer s2s-secret") is None
    assert segment_api.basic_user("Basic !!!") is None
    assert segment_api.basic_user(None) is None
    assert segment_api.body_write_key({"writeKey": "js-key", "batch": []}) == "js-key"
    assert segment_api.body_write_key([1]) is None


def test_paths_name_the_type_they_take() -> None:
    assert segment_api.path_type("track") == "track"
    assert segment_api.path_type("import") == segment_api.BATCH
    assert segment_api.path_type("b") == segment_api.BATCH
    assert segment_api.path_type("p") == "page"
    assert segment_api.path_type("nothing") is None


def test_a_batch_gives_its_shared_fields_to_each_message() -> None:
    body = {
        "batch": [
            {"type": "track", "event": "A", "userId": "u", "context": {"ip": "1.2.3.4"}},
            {"type": "page", "userId": "u", "sentAt": "2026-11-24T11:00:00Z"},
            "not a message",
        ],
        "context": {"library": {"name": "analytics-python"}, "ip": "9.9.9.9"},
        "sentAt": "2026-11-24T12:00:00Z",
        "writeKey": "secret",
    }
    first, second, third = messages(body, segment_api.BATCH)
    assert first["context"] == {"library": {"name": "analytics-python"}, "ip": "1.2.3.4"}
    assert first["sentAt"] == "2026-11-24T12:00:00Z"
    assert second["sentAt"] == "2026-11-24T11:00:00Z"  # its own wins
    assert third == "not a message"  # enrichment rejects it alone
    assert "writeKey" not in first
    single = messages({"type": "page", "event": "x", "userId": "u"}, "track")
    assert single[0]["type"] == "track"  # the path decides
    with pytest.raises(MessageError, match="batch"):
        messages({"messages": []}, segment_api.BATCH)
    with pytest.raises(MessageError, match="JSON object"):
        messages([{}], "track")


def test_a_message_becomes_an_event_with_corrected_time_and_names() -> None:
    # The client's clock is 5 minutes fast: it says it sent at 12:05, the event at 12:04.
    message = {
        "type": "track", "event": "Order Completed", "userId": "u1", "messageId": "m-1",
        "timestamp": "2026-11-24T12:04:00.000Z", "sentAt": "2026-11-24T12:05:00.000Z",
        "properties": {"revenue": 9.5},
        "context": {"ip": "81.2.69.10", "userAgent": "Mozilla/5.0 Firefox/133.0"},
        "writeKey": "must-not-be-stored",
    }  # fmt: skip
    event = to_event(message, RECEIVED, server=True)
    assert event["_timestamp"] == "2026-11-24T11:59:00.000000Z"  # received 12:00, 1 min before
    assert event["originalTimestamp"] == "2026-11-24T12:04:00.000Z"
    assert event["receivedAt"] == "2026-11-24T12:00:00.000000Z"
    assert event["event_type"] == "Order Completed"
    assert event["source_ip"] == "81.2.69.10"
    assert event["eventn_ctx"] == {"user_agent": "Mozilla/5.0 Firefox/133.0"}
    assert event["src"] == "segment"
    assert event["messageId"] == "m-1"  # enrichment makes it the event id
    assert "writeKey" not in event


def test_time_without_sent_at_is_the_clients_and_without_either_the_servers() -> None:
    told = to_event({"type": "identify", "userId": "u", "timestamp": "2026-11-20T08:00:00+02:00"},
                    RECEIVED, server=True)  # fmt: skip
    assert told["_timestamp"] == "2026-11-20T06:00:00.000000Z"
    assert told["event_type"] == "identify"
    untold = to_event({"type": "alias", "userId": "u", "previousId": "a"}, RECEIVED, server=True)
    assert untold["_timestamp"] == "2026-11-24T12:00:00.000000Z"


def test_original_timestamp_is_corrected_as_segment_corrects_it() -> None:
    """RudderStack's SDKs send originalTimestamp and sentAt, no timestamp: the event's
    time was the receipt time (57.8 s late at the median after retries)."""
    rudder = {
        "type": "track",
        "event": "e",
        "anonymousId": "a",
        "originalTimestamp": "2026-11-24T12:04:00.000Z",
        "sentAt": "2026-11-24T12:05:00Z",
    }
    event = to_event(rudder, RECEIVED, server=True)
    assert event["_timestamp"] == "2026-11-24T11:59:00.000000Z"  # the clock 5 min fast
    assert event["originalTimestamp"] == "2026-11-24T12:04:00.000Z"  # as sent
    assert "timestamp" not in event
    both = {"type": "track", "event": "e", "anonymousId": "a", "timestamp": "2026-11-24T10:00:00Z",
            "originalTimestamp": "2026-11-24T09:00:00Z"}  # fmt: skip
    event = to_event(both, RECEIVED, server=True)
    assert event["_timestamp"] == "2026-11-24T10:00:00.000000Z"  # timestamp first
    assert event["originalTimestamp"] == "2026-11-24T09:00:00Z"  # kept as sent
    with pytest.raises(MessageError, match="originalTimestamp must be an ISO 8601 string"):
        to_event({"type": "page", "anonymousId": "a", "originalTimestamp": 5}, RECEIVED,
                 server=True)  # fmt: skip


def test_a_browser_key_cannot_choose_the_address() -> None:
    event = to_event({"type": "page", "anonymousId": "a", "context": {"ip": "6.6.6.6"}},
                     RECEIVED, server=False)  # fmt: skip
    assert "source_ip" not in event  # the collector fills the peer's


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ({"type": "launch", "userId": "u"}, "bad_type"),
        ({"type": "track", "userId": "u"}, "missing_field"),
        ({"type": "track", "event": "E"}, "missing_field"),
        ({"type": "group", "userId": "u"}, "missing_field"),
        ({"type": "page", "userId": "u", "timestamp": "yesterday"}, "bad_timestamp"),
        ({"type": "page", "userId": "u", "timestamp": 5}, "bad_timestamp"),
        ({"type": "page", "userId": "u", "timestamp": "0001-01-01T00:00:00Z",
          "sentAt": "9999-12-31T00:00:00Z"}, "bad_timestamp"),
    ],
)  # fmt: skip
def test_messages_the_spec_refuses_are_refused_with_a_reason(
    message: dict[str, object], reason: str
) -> None:
    with pytest.raises(MessageError) as refused:
        to_event(message, RECEIVED, server=True)
    assert refused.value.reason == reason


def test_a_pixel_carries_base64_json_standard_or_url_safe() -> None:
    raw = b'{"type":"track","event":"Opened ~?","userId":"u"}'
    assert segment_api.pixel_body(base64.b64encode(raw).decode()) == raw
    assert segment_api.pixel_body(base64.urlsafe_b64encode(raw).decode().rstrip("=")) == raw
    with pytest.raises(MessageError):
        segment_api.pixel_body("not base64!")
    with pytest.raises(MessageError):
        segment_api.pixel_body(None)
