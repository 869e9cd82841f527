"""Flattening on Spark: naming rules, arrays, collisions kept in _unmapped_data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson

from eventpipe.processing.steps.flatten import flatten


def _frame(spark: Any, tmp_path: Path, events: list[dict[str, Any]]) -> Any:
    path = tmp_path / "segment.log"
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    return spark.read.json(str(path))


def _rows(frame: Any) -> list[dict[str, Any]]:
    return [row.asDict() for row in frame.collect()]


def test_nested_objects_become_underscored_columns(spark: Any, tmp_path: Path) -> None:
    frame = _frame(spark, tmp_path, [
        {"Event Type": "page", "user": {"id": 7, "Address": {"ZIP": "10115"}}, "tags": ["a", "b"]},
    ])  # fmt: skip
    [row] = _rows(flatten(frame))
    assert row == {
        "event_type": "page",
        "tags": '["a","b"]',
        "user_address_zip": "10115",
        "user_id": 7,
    }


def test_hostile_keys(spark: Any, tmp_path: Path) -> None:
    # The empty key is not here: Spark's inference drops it (docs/pipeline.md, read step).
    frame = _frame(spark, tmp_path, [
        {"?!": 1, "名前": "x", "x; DROP TABLE y": 2, "1a": 4, "select": 5, "a" * 100: 6},
    ])  # fmt: skip
    row = _rows(flatten(frame))[0]
    assert row["x__drop_table_y"] == 2
    assert row["_1a"] == 4
    assert row["select"] == 5
    assert {v for k, v in row.items() if k.startswith("_k")} == {1, "x"}
    assert [v for k, v in row.items() if len(k) == 63] == [6]


def test_case_collisions_keep_the_winner_and_the_rest_in_unmapped(
    spark: Any, tmp_path: Path
) -> None:
    frame = _frame(spark, tmp_path, [
        {"n": 1, "A": "upper", "a": "lower"},
        {"n": 2, "a": "only lower"},
    ])  # fmt: skip
    rows = sorted(_rows(flatten(frame)), key=lambda r: r["n"])
    assert rows[0]["a"] == "upper"  # "A" < "a"
    assert json.loads(rows[0]["_unmapped_data"]) == {"/a": "lower"}
    assert rows[1]["a"] == "only lower"  # the winner is chosen among the present keys
    assert rows[1]["_unmapped_data"] is None


def test_path_collisions_keep_the_shorter_path(spark: Any, tmp_path: Path) -> None:
    frame = _frame(spark, tmp_path, [
        {"n": 1, "a_b": "flat", "a": {"b": "nested"}},
        {"n": 2, "a": {"b": "only nested"}},
    ])  # fmt: skip
    rows = sorted(_rows(flatten(frame)), key=lambda r: r["n"])
    assert rows[0]["a_b"] == "flat"
    assert json.loads(rows[0]["_unmapped_data"]) == {"/a/b": "nested"}
    assert rows[1]["a_b"] == "only nested"


def test_colliding_leaves_of_different_types_compare_as_strings(spark: Any, tmp_path: Path) -> None:
    frame = _frame(spark, tmp_path, [{"A": 1, "a": "x"}, {"a": "y"}])
    rows = sorted(_rows(flatten(frame)), key=lambda r: r["a"])
    assert [r["a"] for r in rows] == ["1", "y"]
    assert json.loads(rows[0]["_unmapped_data"]) == {"/a": "x"}


def test_an_object_in_some_events_and_a_scalar_in_others_is_json_text(
    spark: Any, tmp_path: Path
) -> None:
    frame = _frame(spark, tmp_path, [{"a": "s"}, {"a": {"b": 1}}])
    assert sorted(r["a"] for r in _rows(flatten(frame))) == ["s", '{"b":1}']


def test_two_thousand_distinct_keys(spark: Any, tmp_path: Path) -> None:
    event = {f"Key {i}": i for i in range(2000)}
    frame = flatten(_frame(spark, tmp_path, [event]))
    assert len(frame.columns) == 2000
    [row] = _rows(frame)
    assert row["key_1999"] == 1999


def test_corrupt_lines_pass_through(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "segment.log"
    path.write_text('{"a": 1}\n{"a": \n')
    frame = flatten(spark.read.json(str(path)).cache())
    rows = _rows(frame)
    assert sorted(r["_corrupt_record"] or "" for r in rows) == ["", '{"a": ']
