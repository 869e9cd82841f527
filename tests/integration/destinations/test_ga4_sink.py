"""The ``type: ga4`` sink's delivery against a server that answers like GA4's Measurement
Protocol (tests/ga4.py): requests per client within GA4's limits, events GA4 would not
take refused with the reason before any request, GA4's validation answer turned into
failed events, retries. The job's side is in tests/e2e/test_http.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eventpipe.config import Ga4Config
from eventpipe.destinations.http import Ga4Sink, deliver
from eventpipe.destinations.http.settings import HttpSettings
from tests.ga4 import Ga4Server, ga4_server

T0 = 1_795_000_000 * 10**9  # an event's _timestamp, in nanoseconds


@pytest.fixture
def ga4() -> Iterator[Ga4Server]:
    with ga4_server() as running:
        yield running


def _settings(server: Ga4Server, tmp_path: Path, **config: Any) -> HttpSettings:
    config = {"api_secret": server.api_secret, **config}
    dest = Ga4Config(measurement_id=server.measurement_id, url=server.url,
                     retry_initial_seconds=0.01, retry_max_seconds=0.05, **config)  # fmt: skip
    tasks = Ga4Sink("ga", dest).settings(progress=str(tmp_path / "sent"), run="r", tasks=1,
                                          hold_seconds=30)  # fmt: skip
    return tasks.settings


def _row(row: int, client: str | None, user: str | None = None, **attrs: Any) -> tuple[Any, ...]:
    """A row as the send step gives it: the session key and info are the client's and
    the user's columns, the rest are the event's attributes."""
    info = {"user_anonymous_id": client, "user_id": user}
    return (row, f"{client}\x1f{user or ''}", info, T0 + row * 10**6, attrs)


def test_events_go_per_client_in_requests_of_25_with_their_names_params_and_times(
    ga4: Ga4Server, tmp_path: Path
) -> None:
    rows = [_row(i, "c1.111", "u1", event_type="page_view", page_location=f"/p/{i}",
                 _timestamp="2026-11-20", n=i, vip=True) for i in range(60)]  # fmt: skip
    rows += [_row(60 + i, "c2.222", None, event_type="purchase", currency="EUR", value=9.5)
             for i in range(3)]  # fmt: skip
    stats, failed = deliver(_settings(ga4, tmp_path), rows)
    assert failed == []
    assert stats.delivered == 63
    assert [len(body["events"]) for body in ga4.collected if body["client_id"] == "c1.111"] == [
        25,
        25,
        10,
    ]
    events = ga4.events
    first = next(e for e in events if e["params"].get("n") == 0)
    assert first == {"name": "page_view", "client_id": "c1.111", "user_id": "u1",
                     "timestamp_micros": T0 // 1000,
                     "params": {"page_location": "/p/0", "n": 0, "vip": "true"}}  # fmt: skip
    buy = next(e for e in events if e["name"] == "purchase")
    assert (buy["client_id"], buy["user_id"], buy["params"]) == (
        "c2.222", None, {"currency": "EUR", "value": 9.5})  # fmt: skip
    assert ga4.validated == len(ga4.collected)  # each payload checked first


def test_events_ga4_would_not_take_fail_with_the_reason_and_the_rest_is_sent(
    ga4: Ga4Server, tmp_path: Path
) -> None:
    wide = {f"p{i}": i for i in range(30)}
    rows = [
        _row(0, "c1", event_type="signup", plan="pro"),
        _row(1, "c1", event_type="session_start"),  # one of GA4's own
        _row(2, "c1", event_type="add to cart"),  # not a GA4 name
        _row(3, "c1", event_type="wide", **wide),  # 30 parameters
        _row(4, "c1", event_type="bad_param", **{"ga_session": 1}),  # GA4's prefix
        _row(5, "c1", event_type="purchase", currency="EURO", value=1),  # GA4's validation
        _row(6, "c1", event_type="long", title="x" * 300, page_location="y" * 2000),
        _row(7, None, event_type="anonymous"),  # no client id
        _row(8, "c1", event_type="last"),
    ]
    stats, failed = deliver(_settings(ga4, tmp_path), rows)
    reasons = {f.row: f.error for f in failed}
    assert sorted(reasons) == [1, 2, 3, 4, 5, 7]
    assert "'session_start' is one of GA4's own" in reasons[1]
    assert "GA4 event name 'add to cart'" in reasons[2]
    assert "30 GA4 parameters, GA4 takes 25" in reasons[3]
    assert "GA4 parameter name 'ga_session'" in reasons[4]
    assert reasons[5] == ("GA4 validation: Currency [EURO] is not a valid ISO 4217 code. "
                          "(VALUE_INVALID, at events[1].params.currency)")  # fmt: skip
    assert "no GA4 client_id: the event's user_anonymous_id is empty" in reasons[7]
    assert [e["name"] for e in ga4.events] == ["signup", "long", "last"]
    long = ga4.events[1]["params"]
    assert (len(long["title"]), len(long["page_location"])) == (100, 1000)  # GA4's lengths
    assert stats.delivered == 3


def test_a_wrong_secret_is_said_for_every_event_never_dropped_silently(
    ga4: Ga4Server, tmp_path: Path
) -> None:
    settings = _settings(ga4, tmp_path, api_secret="not the stream's")
    stats, failed = deliver(settings, [_row(0, "c1", event_type="signup")])
    assert stats.delivered == 0
    assert [f.error for f in failed] == [
        "GA4 validation: Unable to find measurement_id or api_secret (VALUE_INVALID, at the "
        "request)"
    ]


def test_5xx_and_429_are_retried_and_without_validation_one_request_per_payload(
    ga4: Ga4Server, tmp_path: Path
) -> None:
    ga4.errors, ga4.too_many = 2, 1
    rows = [_row(i, "c1", event_type="click") for i in range(5)]
    stats, failed = deliver(_settings(ga4, tmp_path, validate_events=False), rows)
    assert (stats.delivered, failed, stats.retries) == (5, [], 3)
    assert ga4.validated == 0
    assert len(ga4.collected) == 1


def test_a_resumed_task_sends_nothing_twice_and_refuses_again_what_it_refused(
    ga4: Ga4Server, tmp_path: Path
) -> None:
    rows = [_row(i, "c1", event_type="session_start" if i == 2 else "click") for i in range(6)]
    settings = _settings(ga4, tmp_path)
    _, failed = deliver(settings, rows)
    assert [f.row for f in failed] == [2]
    again, failed_again = deliver(settings, rows)  # the same progress records
    assert (again.already_sent, again.delivered, failed_again) == (6, 0, [])
    assert len(ga4.events) == 5
