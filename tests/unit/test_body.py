"""Bodies: size limits before reading, strict JSON with positions, depth limits."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
import pytest

from eventpipe.collector.body import (
    BodyError,
    NumberUnderflow,
    check_declared_length,
    deeper_than,
    parse_events,
    read_limited,
)
from eventpipe.collector.imports import LineSplitter, Oversized, ndjson_lines


def _parse_error(body: bytes) -> BodyError:
    with pytest.raises(BodyError) as info:
        parse_events(body)
    return info.value


def test_an_object_or_an_array_of_items() -> None:
    assert parse_events(b'{"a": 1}') == ([{"a": 1}], False)
    assert parse_events(b'[{"a": 1}, 2]') == ([{"a": 1}, 2], True)
    assert parse_events(b"[]") == ([], True)


@pytest.mark.parametrize("body", [b"", b"  \n\t "])
def test_empty_bodies(body: bytes) -> None:
    error = _parse_error(body)
    assert (error.status, error.reason) == (400, "empty_body")


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (b'{"a": 1', "line 1 column 8"),
        (b"<html></html>", "line 1 column 1"),
        (b'{"a": NaN}', "line 1 column 7"),
        (b'{"a": 1} trailing', "line 1 column 10"),
        (b'{"a": "\x00"}', "control character"),
        (b'{"a": "\\ud800"}', "surrogate"),
        (b'{"a": "\xff\xfe"}', "not valid UTF-8"),
    ],
)
def test_malformed_json_says_what_and_where(body: bytes, where: str) -> None:
    error = _parse_error(body)
    assert error.status == 400
    assert error.message.startswith("body is not valid JSON")
    assert where in error.message


def test_an_escaped_nul_is_valid_json_and_kept() -> None:
    assert parse_events(b'{"a": "x\\u0000y"}') == ([{"a": "x\x00y"}], False)


@pytest.mark.parametrize("body", [b"42", b'"text"', b"null", b"true"])
def test_scalars_are_not_events(body: bytes) -> None:
    error = _parse_error(body)
    assert (error.status, error.reason) == (400, "not_an_object")


def test_hundred_thousand_levels_are_refused_quickly() -> None:
    error = _parse_error(b"[" * 100_000 + b"]" * 100_000)
    assert (error.status, error.reason) == (400, "too_deep")


def test_deeper_than_names_the_place() -> None:
    document = {"a": {"b": [{"c": {}}]}}  # depth 5
    assert deeper_than(document, 5) is None
    assert deeper_than(document, 4) == "/a/b/0/c"
    assert deeper_than(document, 3, base=2) == "/a/b"
    assert deeper_than({"x/y~": {"z": {}}}, 2) == "/x~1y~0/z"


def test_declared_length_is_checked_before_reading() -> None:
    check_declared_length(None, 10)
    check_declared_length("10", 10)
    with pytest.raises(BodyError) as too_large:
        check_declared_length("11", 10)
    assert too_large.value.status == 413
    with pytest.raises(BodyError) as not_a_number:
        check_declared_length("-1", 10)
    assert not_a_number.value.status == 400


def test_reading_stops_as_soon_as_the_limit_is_passed() -> None:
    pulled = []

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(1000):
            pulled.append(i)
            yield b"x" * 100

    with pytest.raises(BodyError) as info:
        asyncio.run(read_limited(chunks(), 1000, 30))
    assert info.value.status == 413
    assert len(pulled) == 11  # the 11th chunk passes 1,000 bytes; no more are read


def test_reading_within_the_limit_returns_everything() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"a":'
        yield b""
        yield b"1}"

    assert asyncio.run(read_limited(chunks(), 100, 30)) == b'{"a":1}'


def test_a_body_not_all_there_in_time_is_408_and_leaves_the_task_uncancelled() -> None:
    async def stalls() -> AsyncIterator[bytes]:
        yield b'{"a":'
        await asyncio.sleep(30)
        yield b"1}"

    async def scenario() -> int:
        with pytest.raises(BodyError) as info:
            await read_limited(stalls(), 100, 0.05)
        assert info.value.status == 408
        assert "got 5 bytes" in info.value.message
        task = asyncio.current_task()
        assert task is not None
        await asyncio.sleep(0)  # no cancellation left pending for the next await
        return task.cancelling()

    assert asyncio.run(scenario()) == 0


def test_a_cancellation_from_outside_is_not_a_timeout() -> None:
    started = asyncio.Event()

    async def waits() -> AsyncIterator[bytes]:
        started.set()
        await asyncio.sleep(30)
        yield b""

    async def scenario() -> None:
        reader = asyncio.create_task(read_limited(waits(), 100, 30))
        await started.wait()
        reader.cancel()  # a server shutting down
        with pytest.raises(asyncio.CancelledError):
            await reader

    asyncio.run(scenario())


def test_a_bulk_body_that_stalls_is_408_after_the_lines_before_it() -> None:
    async def stalls() -> AsyncIterator[bytes]:
        yield b'{"a":1}\n{"a":2}\n{"a"'
        await asyncio.sleep(30)
        yield b":3}\n"

    taken: list[tuple[int, bytes]] = []

    async def take() -> None:
        async for line in ndjson_lines(
            stalls(), gzip=False, limit=1000, idle_seconds=0.05, max_line=1000
        ):
            taken.append(line)

    async def scenario() -> list[tuple[int, bytes]]:
        with pytest.raises(BodyError) as info:
            await take()
        assert info.value.status == 408
        assert "after line 2" in info.value.message
        task = asyncio.current_task()
        assert task is not None
        await asyncio.sleep(0)
        assert task.cancelling() == 0
        return taken

    assert asyncio.run(scenario()) == [(1, b'{"a":1}'), (2, b'{"a":2}')]


@pytest.mark.parametrize(
    "number",
    [b"1e-400", b"1E-0400", b"12.5e-330", b"-3e-999", b"0." + b"0" * 330 + b"1"],
)
@pytest.mark.parametrize("after", [b"}", b" }", b"\n}"])
def test_a_number_too_small_for_a_float_is_marked_wherever_it_ends(
    number: bytes, after: bytes
) -> None:
    (item,), _ = parse_events(b'{"id": "7e-4123-aa", "x": ' + number + after)
    assert isinstance(item["x"], NumberUnderflow)
    assert item["x"].text == number.decode()
    (items, _) = parse_events(b"[" + number + b"]")
    assert isinstance(items[0], NumberUnderflow)


@pytest.mark.parametrize("number", [b"1e-99", b"1.5E-10", b"2e-300", b"5e-324"])
def test_small_numbers_a_float_holds_are_kept(number: bytes) -> None:
    (item,), _ = parse_events(b'{"x": ' + number + b"}")
    assert item["x"] == float(number) != 0


def test_ids_that_look_like_exponents_keep_the_fast_reading(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # UUIDs hold "e-" often, and their digits after it: none of them ends a number.
    def slower(body: bytes) -> None:
        raise AssertionError(f"read again: {body!r}")

    monkeypatch.setattr("eventpipe.collector.body.exact_json", slower)
    body = orjson.dumps(
        [{"messageId": f"0190ab7e-{n:04d}-7e-400e-123e-456", "at": "2026-11-28T07:00:00Z"}
         for n in range(100)]
    )  # fmt: skip
    items, _ = parse_events(body)
    assert items[0]["messageId"] == "0190ab7e-0000-7e-400e-123e-456"


def test_empty_keys_are_named_at_any_depth_and_never_collide() -> None:
    body = b'[{"": 1, "a": {"" : "x", "_unnamed": 2, "_unnamed_1": 3}, "l": [{"": true}]}]'
    items, _ = parse_events(body)
    assert items == [{
        "_unnamed": 1,
        "a": {"_unnamed_2": "x", "_unnamed": 2, "_unnamed_1": 3},
        "l": [{"_unnamed": True}],
    }]  # fmt: skip
    assert list(items[0]["a"]) == ["_unnamed_2", "_unnamed", "_unnamed_1"]  # order kept


def test_empty_string_values_are_not_keys() -> None:
    event = {"a": "", "b": ["", ""], "c": '"":', "": {"d": ""}}
    items, _ = parse_events(orjson.dumps(event))
    assert items == [{"a": "", "b": ["", ""], "c": '"":', "_unnamed": {"d": ""}}]


def test_lines_split_in_bounded_memory_whatever_the_chunks() -> None:
    """Lines across chunks, runs of blank lines, and a line over the limit that spans
    chunks, which comes out as its size alone."""
    body = b'{"a":1}\n\n \r\n{"b":' + b"2}\n" + b"x" * 50 + b"\n\n\n" + b'{"c":3}'
    for size in (1, 3, 7, len(body)):
        splitter = LineSplitter(max_line=20)
        lines = []
        for start in range(0, len(body), size):
            lines += splitter.feed(body[start : start + size])
        lines += splitter.finish()
        assert lines == [(1, b'{"a":1}'), (4, b'{"b":2}'), (5, Oversized(50)), (8, b'{"c":3}')], (
            size
        )
    blank = LineSplitter(max_line=20)
    assert blank.feed(b"\n" * 1_000_000) == []
    assert blank.number == 1_000_000
