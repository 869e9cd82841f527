"""The collector's one-pass byte scans find exactly what Python's own searches find."""

from __future__ import annotations

import re
import threading

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from eventpipe.collector.enrich import EnrichSettings, RequestContext, enrich_batch
from eventpipe.collector.scan import (
    BIG_INTEGER,
    BODY,
    EMPTY_KEY,
    TINY_NUMBER,
    Patterns,
    crowded_lines,
)
from eventpipe.events import utc_now

# What each of BODY's patterns stands for, as Python's regular expressions say it.
_BY_PYTHON = {
    BIG_INTEGER: re.compile(rb"[0-9]{20}"),
    TINY_NUMBER: re.compile(rb"-(?<=[eE]-)[0-9]{3,}[,\]}\s]"),
    EMPTY_KEY: re.compile(rb'""\s*:'),
}

# Bytes made mostly of what the patterns are made of, so that matches are common.
_PIECES = st.sampled_from([b"0", b"1", b"9" * 19, b"e", b"E", b"-", b'"', b":", b" ", b"\n",
                           b",", b"]", b"}", b"{", b"[", b"a", b"\t", b"e-1000"])  # fmt: skip
_BYTES = st.lists(_PIECES, max_size=60).map(b"".join)


def _by_python(data: bytes) -> int:
    return sum(bit for bit, pattern in _BY_PYTHON.items() if pattern.search(data))


@given(_BYTES)
@settings(max_examples=400, deadline=None)
def test_the_body_scan_finds_what_python_finds(data: bytes) -> None:
    assert BODY.found(data) == _by_python(data)


def test_the_body_scan_on_ordinary_and_rare_bodies() -> None:
    assert BODY.found(orjson.dumps([{"id": 12345678901234567, "at": "2026-11-28"}])) == 0
    assert BODY.found(b'{"id": 123456789012345678901}') == BIG_INTEGER
    assert BODY.found(b'{"x": 1e-400, "": 2}') == TINY_NUMBER | EMPTY_KEY
    assert BODY.found(b'{"uuid": "0190a3e7-4123-7e00-9e2e-8e4123456789"}') == 0
    assert BODY.found(b"") == 0


@given(st.lists(st.sampled_from([b"ab", b"AbC", b"x\x00y", b"zz", b"q"]), max_size=30))
@settings(max_examples=200, deadline=None)
def test_literals_are_found_as_they_are_and_caseless_where_asked(parts: list[bytes]) -> None:
    patterns = Patterns([b"abc", b"x\x00y", b"z.z"], literal=True, caseless=frozenset({0}))
    data = b"".join(parts)
    expected = (
        (1 if b"abc" in data.lower() else 0)
        | (2 if b"x\x00y" in data else 0)
        | (4 if b"z.z" in data else 0)  # a literal: the dot is a dot
    )
    assert patterns.found(data) == expected


def test_no_patterns_find_nothing() -> None:
    assert Patterns([]).found(b"anything") == 0


def test_threads_scan_at_once_each_with_scratch_of_its_own() -> None:
    # One scratch space shared by two scans at once is refused by Hyperscan.
    patterns = Patterns([rb"[0-9]{20}", b"needle"])
    data = b"x" * 2_000_000 + b"12345678901234567890"
    results: list[int] = []
    errors: list[BaseException] = []

    def scan() -> None:
        try:
            results.extend(patterns.found(data) for _ in range(20))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=scan) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert results == [1] * 80


@given(st.integers(min_value=0, max_value=12), st.integers(min_value=1, max_value=12))
def test_crowded_lines_are_those_with_more_brackets_than_the_limit(
    brackets: int, most: int
) -> None:
    line = b'{"a":"' + b"[" * brackets + b'"}\n'
    other = b'{"b":1}\n'
    found = crowded_lines(most).found(other + line + other)
    assert bool(found) == (line.count(b"{") + line.count(b"[") > most)


def test_a_deep_item_among_many_is_rejected_alone() -> None:
    settings = EnrichSettings(max_event_bytes=51_200, anonymize_ip=False, max_json_depth=8)
    deep: dict[str, object] = {}
    for _ in range(8):
        deep = {"n": deep}
    wide = {"list": [[1], [2], [3], [4], [5], [6], [7], [8], [9]]}  # many brackets, shallow
    items = [{"a": i} for i in range(50)]
    items[7], items[20], items[33] = deep, wide, {"s": "[[[[[[[[[[[["}
    now = utc_now()
    ctx = RequestContext("k", False, "127.0.0.1", None, now, now.isoformat())
    batch = enrich_batch(items, ctx, settings, in_array=True)
    assert [(r.index, r.reason) for r in batch.rejections] == [(7, "too_deep")]
    assert len(batch.lines) == 49
    kept = [orjson.loads(line) for line in batch.lines]
    assert [k.get("a") for k in kept[:8]] == [0, 1, 2, 3, 4, 5, 6, 8]  # in order, 7 gone
    assert kept[19]["list"] == wide["list"]
    assert kept[32]["s"] == "[[[[[[[[[[[["
