"""The days an archive file's events may belong to (its manifest's hint for reprocess),
and the SQL that selects a set of days."""

from __future__ import annotations

import orjson

from eventpipe.archive.files import event_days
from eventpipe.destinations.base import day_ranges, of_days


def _days(*stamps: object) -> set[str] | None:
    lines = [orjson.dumps({"n": i, "_timestamp": s}) + b"\n" for i, s in enumerate(stamps)]
    return event_days(b"".join(lines), lines)


def test_collector_stamps_give_their_exact_days() -> None:
    assert _days("2026-11-20T23:59:59.999999Z", "2026-11-21T00:00:00Z") == {
        "2026-11-20", "2026-11-21",
    }  # fmt: skip


def test_other_forms_count_for_the_days_around_them() -> None:
    assert _days("2026-11-20T01:00:00+05:00", "2026-11-22T00:00:00.000000Z") == {
        "2026-11-19", "2026-11-20", "2026-11-21", "2026-11-22",
    }  # fmt: skip
    assert _days("2026-12-31 23:00:00") == {"2026-12-30", "2026-12-31", "2027-01-01"}


def test_a_timestamp_without_a_date_makes_the_file_any_day() -> None:
    assert _days("2026-11-20T01:00:00Z", "yesterday") is None
    assert _days("2026-13-45T00:00:00") is None


def test_events_that_never_load_add_no_day() -> None:
    # A number never converts to a timestamp (schema/casts.py); a damaged line fails.
    lines = [b'{"_timestamp": 1700000000}\n', b"{not json\n", b'{"x": 1}\n']
    assert event_days(b"".join(lines), lines) == set()


def test_a_nested_timestamp_does_not_count() -> None:
    line = orjson.dumps({"_timestamp": "2026-11-20T01:00:00Z",
                         "inner": {"_timestamp": "1999-01-01T00:00:00Z"}}) + b"\n"  # fmt: skip
    assert event_days(line, [line]) == {"2026-11-20"}


def test_days_become_ranges_and_sql() -> None:
    days = ["2026-11-21", "2026-11-20", "2026-11-25", "2026-11-21"]
    assert [(a.isoformat(), b.isoformat()) for a, b in day_ranges(days)] == [
        ("2026-11-20", "2026-11-22"), ("2026-11-25", "2026-11-26"),
    ]  # fmt: skip
    assert of_days(lambda c: f'"{c}"', days) == (
        '("_timestamp" >= TIMESTAMP \'2026-11-20 00:00:00\' AND "_timestamp" < TIMESTAMP '
        "'2026-11-22 00:00:00') OR (\"_timestamp\" >= TIMESTAMP '2026-11-25 00:00:00' AND "
        "\"_timestamp\" < TIMESTAMP '2026-11-26 00:00:00')"
    )
