"""A small run's lines looked at by the driver (processing/batch/glance.py): the schema it
infers is exactly Spark's inference of the same lines, or there is none (Spark infers);
checked on ordinary events, on the ways Spark's rules surprise, and on the hostile
suite's generated events."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventpipe.processing.batch.glance import glance, infer
from eventpipe.processing.batch.segment_schemas import infer as spark_infer
from eventpipe.reserved import CORRUPT, unguessable
from tests.hostile.test_generated import events


def _line(event: Any) -> bytes:
    """``event`` as the log's writers write it (orjson), or as JSON text where orjson
    cannot (integers past 64 bits, lone surrogates)."""
    try:
        return orjson.dumps(event)
    except (orjson.JSONEncodeError, TypeError):
        text = json.dumps(event, ensure_ascii=False)
        return text.encode("utf-8", errors="surrogatepass")


def _spark(spark: Any, path: Path, lines: list[bytes]) -> Any:
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    schema, corrupt = spark_infer(spark, [str(path)])
    return schema, corrupt in schema.fieldNames()


ORDINARY = [
    [{"a": 1, "s": "x", "f": 1.5, "b": True, "n": None, "o": {"p": {"q": [1, 2]}}}],
    # integers beside floats, at the top and inside arrays of objects
    [{"price": 3, "items": [{"q": 1}]}, {"price": 2.5, "items": [{"q": 1.5}, {"r": "x"}]}],
    # a field new in the second line, another gone from it; nulls, then a value
    [{"a": 1, "old": "x", "later": None}, {"a": 2, "new": {"b": True}, "later": 7}],
    # nulls only: text; arrays of nulls and empty arrays: arrays of text
    [{"n": None, "e": [], "en": [None]}],
    # an object beside a number, a boolean beside a number, an array beside text: text
    [{"v": {"x": 1}, "flag": True, "t": ["a"]}, {"v": 5, "flag": 1, "t": "a"}],
    # empty objects and "" keys disappear, also inside arrays; one beside a number: text
    [{"e": {}, "k": {"": 1, "x": 1}, "arr": [{}], "m": {}}, {"m": 3}],
    # keys outside the BMP and above U+E000 (Java's order, not Python's)
    [{"\U0001f389": 1, "\ue000": 2, "z": 0, "y": {"\U0001f389": 1, "\uffff": 2}}],
    # arrays of arrays, arrays of mixed kinds
    [{"aa": [[1], [2.5]], "mixed": [1, "a", {"b": 1}]}],
    # integers at the edges of 64 bits
    [{"lo": -(2**63), "hi": 2**63 - 1}],
]


@pytest.mark.parametrize("lines", ORDINARY)
def test_ordinary_lines_are_inferred_as_spark_infers_them(
    spark: Any, tmp_path: Path, lines: list[Any]
) -> None:
    text = [_line(e) for e in lines]
    union, corrupt = _spark(spark, tmp_path / "lines.log", text)
    assert not corrupt
    assert infer(text) == union


REFUSED = [
    # not what orjson writes: spaces, a duplicate key, an escape written otherwise
    b'{"a": 1}',
    b'{"a":1,"a":"x"}',
    b'{"a":"\\u0041"}',
    # integers past 64 bits (Spark: decimals); NaN (Spark may read it)
    b'{"big":' + str(2**64).encode() + b"}",
    b'{"n":NaN}',
    # not an object; not JSON; a carriage return Spark may split on
    b"[1,2]",
    b'{"a":',
    b'{"a":1}\r',
    # keys that differ only in case, in one object or across lines
    b'{"o":{"k":1,"K":2}}',
    # deeper than Jackson may read; a key longer than it may read
    pytest.param(b'{"d":' + b"[" * 450 + b"]" * 450 + b"}", id="deep"),
    pytest.param(b'{"' + b"k" * 10_001 + b'":1}', id="long key"),
]


@pytest.mark.parametrize("line", REFUSED)
def test_lines_spark_may_read_otherwise_are_left_to_spark(line: bytes) -> None:
    assert infer([b'{"a":1}', line]) is None


def test_keys_differing_in_case_across_lines_are_left_to_spark() -> None:
    assert infer([b'{"o":{"k":1}}', b'{"o":{"K":1}}']) is None


def test_lines_without_a_field_left_are_left_to_spark() -> None:
    assert infer([b'{"e":{}}', b'{"":1}']) is None
    assert infer([]) is None


def test_the_glance_reads_small_files_only(tmp_path: Path) -> None:
    path = tmp_path / "segment.log"
    server = {"event": "signup", "src": "api", "n": 1}
    path.write_bytes(b"".join(orjson.dumps(server) + b"\n" for _ in range(3)) + b"\n")
    seen = glance([str(path)])
    assert not seen.browser_events
    assert seen.schema is not None
    assert seen.schema.fieldNames() == ["event", "n", "src"]
    known = glance([str(path)], infer=False)  # a schema kept already: none inferred
    assert not known.browser_events
    assert known.schema is None
    too_large = glance([str(path)], most=10)
    assert too_large.browser_events
    assert too_large.schema is None
    path.write_bytes(path.read_bytes() + b'{"event":"click","n":2}\n')
    assert glance([str(path)]).browser_events
    assert glance([str(tmp_path / "gone.log")]).browser_events


EXAMPLES = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _plain_events() -> st.SearchStrategy[dict[str, Any]]:
    """Events as clients send them: lower-case keys, JSON's kinds nested a few levels."""
    scalars = st.one_of(
        st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1),
        st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=5),
    )  # fmt: skip
    values = st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(st.sampled_from("abcde"), inner, max_size=3)
        ),
        max_leaves=8,
    )
    return st.dictionaries(st.sampled_from("abcdef"), values, min_size=1, max_size=5)


@EXAMPLES
@given(lines=st.lists(_plain_events(), min_size=1, max_size=8))
def test_plain_events_are_inferred_as_spark_infers_them(
    spark: Any, tmp_path_factory: Any, lines: list[Any]
) -> None:
    """Events written by orjson, without what is left to Spark: inferred here, always,
    and as Spark infers them (unless no field is left: an event of empty objects)."""
    text = [orjson.dumps(e) for e in lines]
    union, corrupt = _spark(spark, tmp_path_factory.mktemp("plain") / "lines.log", text)
    assert not corrupt
    inferred = infer(text)
    if union.fields:
        assert inferred == union
    else:
        assert inferred is None


@EXAMPLES
@given(lines=st.lists(events(), min_size=1, max_size=8))
def test_hostile_events_are_inferred_as_spark_infers_them_or_left_to_it(
    spark: Any, tmp_path_factory: Any, lines: list[Any]
) -> None:
    """The hostile suite's events (eventpipe's own names, unicode keys, empty and
    duplicate keys, integers past int64, mixed arrays, deep nesting)."""
    text = [_line(e) for e in lines]
    inferred = infer(text)
    union, corrupt = _spark(spark, tmp_path_factory.mktemp("hostile") / "lines.log", text)
    if inferred is not None:
        assert not corrupt
        assert unguessable(CORRUPT) not in union.fieldNames()
        assert inferred == union
