"""The HTTP sink's delivery (destinations/http/) against a real addEvents-like server on
127.0.0.1 (tests/addevents.py): sessions, payload limits, retries, failures, memory."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from eventpipe.destinations.http import TRIMMED_ATTRIBUTE, Delivery, HttpSettings, deliver
from tests.addevents import AddEventsServer, addevents_server


@pytest.fixture
def server() -> Iterator[AddEventsServer]:
    with addevents_server() as running:
        yield running


def _settings(server: AddEventsServer, **overrides: Any) -> HttpSettings:
    values: dict[str, Any] = {
        "destination": "dataset", "url": server.url, "headers": {"Authorization": "Bearer t"},
        "max_payload_bytes": 20_000, "max_lifetime_seconds": 5.0, "parallel": 4,
        "retry_initial_seconds": 0.05, "retry_max_seconds": 0.4,
        "retry_max_elapsed_seconds": 30.0,
    }  # fmt: skip
    return HttpSettings(**{**values, **overrides})


def _rows(count: int, sessions: int = 4, **extra: Any) -> list[tuple[Any, ...]]:
    return [
        (i, f"host-{i % sessions}", {"host": f"host-{i % sessions}"}, 1_700_000_000_000_000_000 + i,
         {"seq": i, "marker": f"m{i}", "text": "x" * 100, **extra})
        for i in range(count)
    ]  # fmt: skip


def test_sessions_fill_payloads_near_the_limit_one_request_in_flight_each(
    server: AddEventsServer,
) -> None:
    server.behaviour.delay = 0.02  # requests take a while: sessions would overlap if allowed
    stats, failed = deliver(_settings(server), _rows(2000))
    assert failed == []
    assert server.violations == []
    delivered = server.delivered
    assert sorted(e["attrs"]["seq"] for e in delivered) == list(range(2000))  # each once
    assert stats.delivered == 2000
    assert stats.requests == len(server.requests)
    by_session: dict[str, list[int]] = {}
    for request in sorted(server.requests, key=lambda r: r.started):
        host = request.session_info["host"]
        assert all(e["attrs"]["seq"] % 4 == int(host[-1]) for e in request.events)
        by_session.setdefault(request.session, []).extend(e["attrs"]["seq"] for e in request.events)
        assert request.size <= 20_000
        assert request.events[0]["ts"].startswith("17000000000")
    assert len(by_session) == 4
    for seqs in by_session.values():
        assert seqs == sorted(seqs)  # in order within a session
    full = [r.size for r in server.requests][:-4]  # the last of each session may be short
    assert min(full) > 20_000 * 0.9


def test_429_with_retry_after_and_500_bursts_are_retried(server: AddEventsServer) -> None:
    server.behaviour.too_many = 2
    server.behaviour.retry_after = 0.5
    server.behaviour.errors = 3
    started = time.monotonic()
    stats, failed = deliver(_settings(server, parallel=1), _rows(50, sessions=1))
    assert failed == []
    assert sorted(e["attrs"]["seq"] for e in server.delivered) == list(range(50))
    assert stats.retries == 5
    assert time.monotonic() - started >= 1.0  # Retry-After: 0.5 s, twice
    assert [r.status for r in server.requests] == [429, 429, 500, 500, 500, 200]


def test_an_outage_is_waited_out_and_nothing_is_lost(server: AddEventsServer) -> None:
    server.behaviour.unavailable_until = time.monotonic() + 2.0  # 120 s, compressed
    stats, failed = deliver(_settings(server), _rows(500))
    assert failed == []
    assert sorted(e["attrs"]["seq"] for e in server.delivered) == list(range(500))
    assert stats.retries > 0
    assert server.violations == []


def test_only_the_events_the_api_refuses_fail_with_its_answer(server: AddEventsServer) -> None:
    server.behaviour.reject_markers = {"m17", "m123"}
    stats, failed = deliver(_settings(server), _rows(300))
    assert sorted(f.row for f in failed) == [17, 123]
    assert all(f.error.startswith("HTTP 400: ") for f in failed)
    assert "event m17 is invalid" in next(f.error for f in failed if f.row == 17)
    assert sorted(e["attrs"]["seq"] for e in server.delivered) == [
        i for i in range(300) if i not in (17, 123)
    ]  # fmt: skip
    assert stats.delivered == 298


def test_events_whose_retries_run_out_fail_with_the_last_answer(server: AddEventsServer) -> None:
    server.behaviour.errors = 10_000
    stats, failed = deliver(_settings(server, retry_max_elapsed_seconds=0.5), _rows(40))
    assert sorted(f.row for f in failed) == list(range(40))
    assert all("HTTP 500" in f.error and "gave up after" in f.error for f in failed)
    assert stats.delivered == 0


def test_an_event_over_the_limit_is_trimmed_smallest_attributes_first(
    server: AddEventsServer,
) -> None:
    attrs = {"small": 1, "medium": "y" * 50, "huge": "z" * 50_000, "bigger": "w" * 60_000}
    stats, failed = deliver(_settings(server), [(0, "k", {}, None, attrs)])
    assert failed == []
    assert stats.trimmed == 1
    [request] = server.requests
    assert request.size <= 20_000
    [event] = request.events
    sent = event["attrs"]
    assert sent[TRIMMED_ATTRIBUTE] is True
    assert (sent["small"], sent["medium"]) == (1, "y" * 50)  # kept whole
    assert sent["huge"] == "z" * len(sent["huge"])  # truncated
    assert 15_000 < len(sent["huge"]) < 20_000
    assert "bigger" not in sent  # dropped


def test_memory_stays_under_max_buffer_bytes_while_the_api_is_slow(
    server: AddEventsServer,
) -> None:
    server.behaviour.delay = 0.05
    limit = 100_000
    settings = _settings(server, max_buffer_bytes=limit, parallel=2)
    stats, failed = deliver(settings, _rows(3000, sessions=20))
    assert failed == []
    assert len(server.delivered) == 3000
    assert stats.peak_buffered_bytes <= limit
    assert server.violations == []


def test_a_buffer_older_than_its_lifetime_is_published(server: AddEventsServer) -> None:
    delivery = Delivery(_settings(server, max_lifetime_seconds=0.2))
    delivery.add(0, "a", {}, None, {"seq": 0})
    time.sleep(0.3)
    delivery.add(1, "b", {}, None, {"seq": 1})  # any new event checks the ages
    deadline = time.monotonic() + 5
    while not server.delivered and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [e["attrs"]["seq"] for e in server.delivered] == [0]  # "a" sent, "b" still buffered
    delivery.finish()
    assert sorted(e["attrs"]["seq"] for e in server.delivered) == [0, 1]


def test_a_501_is_not_retried(server: AddEventsServer) -> None:
    # A URL pointing at a plain web server answers 501: waiting would not change that.
    server.behaviour.status = 501
    stats, failed = deliver(_settings(server), _rows(4, sessions=1))
    assert stats.retries == 0
    assert sorted(f.row for f in failed) == [0, 1, 2, 3]
    assert all(f.error == "HTTP 501: Unsupported method" for f in failed)


def test_a_failing_session_is_handed_back_in_order_while_the_others_are_delivered(
    server: AddEventsServer, tmp_path: Any
) -> None:
    from eventpipe.destinations.http import session_id
    from eventpipe.destinations.http.progress import Progress

    # One shard of the API is down for host-1 (seed 2's KI1: its errors are its own).
    server.behaviour.down_sessions = {session_id("dataset", "host-1")}
    settings = _settings(server, progress=str(tmp_path / "sent"), hold_seconds=0.3,
                         max_payload_bytes=2000)  # fmt: skip
    rows = _rows(400, sessions=4)
    stats, failed = deliver(settings, rows)
    assert failed == []
    assert stats.unsent == 100  # every event of host-1, none sent after one that waits
    delivered = [e["attrs"]["seq"] for e in server.delivered]
    assert sorted(delivered) == [i for i in range(400) if i % 4 != 1]
    # The shard is back: the next attempt sends host-1's events, in order, and nothing twice.
    server.behaviour.down_sessions = set()
    stats, failed = deliver(settings, rows)
    assert (failed, stats.unsent, stats.already_sent) == ([], 0, 300)
    delivered = [e["attrs"]["seq"] for e in server.delivered]
    assert sorted(delivered) == list(range(400))
    assert [s for s in delivered if s % 4 == 1] == list(range(1, 400, 4))
    totals = Progress(tmp_path / "sent").totals()
    assert (totals.delivered, totals.possible_duplicates, totals.failed) == (400, 0, [])


def test_ndjson_payloads_are_lines_of_attributes_and_name_their_session_in_a_header(
    server: AddEventsServer,
) -> None:
    _, failed = deliver(_settings(server, format="ndjson"), _rows(50, sessions=2))
    assert failed == []
    assert {r.headers["content-type"] for r in server.requests} == {"application/x-ndjson"}
    assert len({r.session for r in server.requests}) == 2
    assert sorted(e["attrs"]["seq"] for e in server.delivered) == list(range(50))
    assert "ts" not in server.delivered[0]  # the attributes alone
    assert max(r.size for r in server.requests) <= 20_000


def test_attributes_given_as_json_text_are_sent_as_they_are_and_trimmed_alike(
    server: AddEventsServer,
) -> None:
    import orjson

    huge = {"small": 1, "huge": "z" * 50_000}
    rows = [
        (0, "k", {}, 7, orjson.dumps({"seq": 0, "tag": "é"})),  # as a Spark task gives them
        (1, "k", {}, 8, {"seq": 1, "tag": "é"}),
        (2, "k", {}, None, orjson.dumps(huge)),
        (3, "k", {}, None, huge),
    ]
    stats, failed = deliver(_settings(server), rows)
    assert failed == []
    assert stats.trimmed == 2
    sent = server.delivered
    assert sent[0] == {"attrs": {"seq": 0, "tag": "é"}, "ts": "7"}
    assert sent[1] == {"attrs": {"seq": 1, "tag": "é"}, "ts": "8"}
    assert sent[2] == sent[3]  # trimmed the same way from text and from a dict
    assert sent[2]["attrs"][TRIMMED_ATTRIBUTE] is True


def test_a_request_that_timed_out_after_the_api_stored_it_is_counted_as_duplicates(
    server: AddEventsServer, tmp_path: Any
) -> None:
    from eventpipe.destinations.http.progress import Progress

    server.behaviour.stalls = 1  # stored, answered after 2 s: the client gave up at 0.5 s
    settings = _settings(server, timeout_seconds=0.5, progress=str(tmp_path / "sent"))
    stats, failed = deliver(settings, _rows(10, sessions=1))
    assert failed == []
    deadline = time.monotonic() + 10
    while not all(r.status for r in server.requests) and time.monotonic() < deadline:
        time.sleep(0.05)  # the stalled request is stored once its answer is written
    seqs = [e["attrs"]["seq"] for e in server.delivered]
    assert sorted(seqs) == sorted([*range(10), *range(10)])  # the API has them twice
    assert stats.possible_duplicates == 10  # and they are counted, not hidden
    assert Progress(tmp_path / "sent").totals().possible_duplicates == 10
    # Both tries carried the same Idempotency-Key: an API that honours it keeps one.
    assert len({r.headers["idempotency-key"] for r in server.requests}) == 1


@pytest.mark.parametrize("status", [401, 403])
def test_refused_credentials_are_never_split_over_the_events(
    server: AddEventsServer, status: int
) -> None:
    # No event causes a 401: splitting the payload would send about 2N requests for N.
    server.behaviour.status = status
    settings = _settings(server, retry_max_elapsed_seconds=0.3)
    stats, failed = deliver(settings, _rows(64, sessions=1))
    assert sorted(f.row for f in failed) == list(range(64))
    assert all(f.error.startswith(f"HTTP {status}: ") for f in failed)
    assert len(server.requests) == stats.retries + 1  # one payload, retried, never halved


def test_an_answer_is_read_up_to_a_bound(server: AddEventsServer) -> None:
    server.behaviour.status = 400
    server.behaviour.answer_bytes = 50_000_000
    _, failed = deliver(_settings(server), _rows(1, sessions=1))
    assert [f.row for f in failed] == [0]
    assert len(failed[0].error) < 1000  # the reason: the answer's start


def test_sessions_with_nothing_to_send_are_let_go(server: AddEventsServer) -> None:
    clock = [0.0]
    delivery = Delivery(_settings(server, max_lifetime_seconds=1.0), clock=lambda: clock[0])

    def settle() -> None:
        """Until the sessions' requests have ended: nothing more arrives for 0.3 s."""
        deadline = time.monotonic() + 60
        seen = -1
        while seen != len(server.delivered) and time.monotonic() < deadline:
            seen = len(server.delivered)
            time.sleep(0.3)

    for i in range(500):  # 500 group_by values, one event each, over time
        clock[0] = i * 0.01
        delivery.add(i, f"user-{i}", {"user": i}, None, {"seq": i})
    for last in (500, 501):  # a sweep publishes the old sessions, the next lets them go
        settle()
        clock[0] += 10
        delivery.add(last, f"user-{last}", {"user": last}, None, {"seq": last})
    settle()
    held = len(delivery._sessions)
    delivery.finish()
    # Of 500 sessions, those a slow machine had not finished sending: a few, not 500.
    assert held <= 50, f"{held} sessions held"
    assert sorted(e["attrs"]["seq"] for e in server.delivered) == list(range(502))
