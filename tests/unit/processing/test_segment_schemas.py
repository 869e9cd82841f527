"""Segment schemas kept by the service's wait (processing/batch/segment_schemas.py): merged, they
are what Spark's inference of the same segments read together gives, or they are not
used. Checked on the hostile suite's generated events and on the ordinary ways segments
differ (a field new in one, nulls in one, integers beside floats)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventpipe.paths import DataLayout
from eventpipe.processing.batch import segment_schemas
from eventpipe.processing.batch.segment_schemas import (
    Inexact,
    SegmentSchema,
    infer,
    keep_schema,
    kept_schema,
    may_hold_empty_object,
    merge_all,
)
from eventpipe.processing.steps.fields import json_text_arrays
from tests.hostile.test_generated import events

SEGMENT = "incoming.tok=web-2026-11-25T10-00-{:02d}.000.log"


def _write(layout: DataLayout, segments: list[list[Any]]) -> list[str]:
    layout.incoming.mkdir(parents=True, exist_ok=True)
    paths = []
    for n, lines in enumerate(segments):
        path = layout.incoming / SEGMENT.format(n)
        text = "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in lines)
        path.write_bytes(text.encode("utf-8", errors="surrogatepass"))
        paths.append(str(path))
    return paths


def _as_read(schema: Any) -> Any:
    """A schema as the pipeline reads with it: arrays as their JSON text."""
    return json_text_arrays(schema)


def _kept(spark: Any, layout: DataLayout, paths: list[str]) -> Any:
    settings_digest = segment_schemas.inference_settings(spark)
    for path in paths:
        keep_schema(spark, layout, Path(path).name, settings_digest)
    return kept_schema(spark, layout, paths)


def _union(spark: Any, paths: list[str]) -> Any:
    schema, corrupt = infer(spark, paths)
    return schema, corrupt in schema.fieldNames()


ORDINARY = [
    # a field new in the second segment, another gone from it
    [[{"a": 1, "old": "x"}], [{"a": 2, "new": {"b": True}}]],
    # integers in one segment, floats in the other: floats
    [[{"price": 3, "p": {"q": 1}}], [{"price": 2.5, "p": {"q": 1.5}}]],
    # arrays of other element types (read as JSON text either way)
    [[{"tags": ["a"]}], [{"tags": [1, 2]}, {"tags": []}]],
    # a field that is an object in one segment and a number in the other: text
    [[{"v": {"x": 1}}], [{"v": 5}]],
    # a boolean beside a number: text, as Spark merges them
    [[{"flag": True}], [{"flag": 1}]],
    # three segments, one with nothing new; keys outside the BMP and above U+E000
    [[{"\U0001f389": 1, "\ue000": 2, "z": 0}], [{"z": 1}], [{"\U0001f389": 2, "b": "t"}]],
    # text in one, absent in the other
    [[{"s": "x"}], [{"n": 1}]],
]


@pytest.mark.parametrize("segments", ORDINARY)
def test_ordinary_segments_merge_to_what_inference_gives(
    spark: Any, tmp_path: Path, segments: list[list[Any]]
) -> None:
    layout = DataLayout(tmp_path / "data")
    paths = _write(layout, segments)
    kept = _kept(spark, layout, paths)
    union, corrupt = _union(spark, paths)
    assert not corrupt
    assert kept is not None, "merged"
    assert _as_read(kept) == _as_read(union)


REFUSED = [
    # nulls only in one segment (kept as text), numbers in the other: Spark says numbers
    ([[{"a": None}], [{"a": 1}]], "text (maybe nulls only)"),
    # nulls only beside an object
    ([[{"a": None}], [{"a": {"b": 1}}]], "text (maybe nulls only)"),
    # an empty object in one segment (dropped by inference), a number in the other:
    # Spark merges them as text
    ([[{"a": {}}], [{"a": 1}]], "absent beside empty objects"),
    ([[{"a": {"": 1}}], [{"a": 1}]], "absent beside empty objects"),
    # keys that differ only in case: Spark keeps the first one's
    ([[{"o": {"k": 1}}], [{"o": {"K": 1}}]], "differ only in case"),
    # integers past int64 (decimals) beside floats
    ([[{"big": 2**70}], [{"big": 1.5}]], "decimal"),
]


@pytest.mark.parametrize(("segments", "why"), REFUSED)
def test_segments_that_may_not_merge_exactly_are_inferred(
    spark: Any, tmp_path: Path, segments: list[list[Any]], why: str
) -> None:
    layout = DataLayout(tmp_path / "data")
    paths = _write(layout, segments)
    kept = [
        SegmentSchema(infer(spark, [p])[0], may_hold_empty_object(Path(p))) for p in paths
    ]  # fmt: skip
    with pytest.raises(Inexact, match=re.escape(why)):
        merge_all(kept)
    assert _kept(spark, layout, paths) is None  # the run infers


def test_a_segment_with_lines_spark_cannot_parse_keeps_no_schema(
    spark: Any, tmp_path: Path
) -> None:
    layout = DataLayout(tmp_path / "data")
    paths = _write(layout, [[{"a": 1}], [{"a": 2}]])
    with open(paths[1], "ab") as segment:
        segment.write(b"{not json\n")
    assert _kept(spark, layout, paths) is None
    assert _kept(spark, layout, paths[:1]) is not None


def test_a_kept_schema_is_not_used_for_a_segment_that_changed(spark: Any, tmp_path: Path) -> None:
    layout = DataLayout(tmp_path / "data")
    paths = _write(layout, [[{"a": 1}]])
    assert _kept(spark, layout, paths) is not None
    with open(paths[0], "ab") as segment:
        segment.write(b'{"a": 1, "b": 2}\n')
    assert kept_schema(spark, layout, paths) is None


def test_a_kept_schema_that_cannot_be_read_leaves_the_run_to_infer(
    spark: Any, tmp_path: Path
) -> None:
    layout = DataLayout(tmp_path / "data")
    paths = _write(layout, [[{"a": 1}], [{"a": 2.5}]])
    assert _kept(spark, layout, paths) is not None
    kept = segment_schemas.schema_file(layout, Path(paths[1]).name)
    record = json.loads(kept.read_text())
    record["schema"] = {"type": "struct", "fields": [{"name": "a"}]}  # no type
    kept.write_text(json.dumps(record))
    assert kept_schema(spark, layout, paths) is None


def test_the_empty_object_scan_finds_one_across_a_chunk_boundary(tmp_path: Path) -> None:
    path = tmp_path / "lines"
    for text, found in [
        (b'{"a":1}\n' * 3 + b'{"b":{ \t }}\n', True),
        (b'{"a":1}\n{"": 2}\n', True),
        (b'{"a":"x"}\n' * 5, False),
    ]:
        path.write_bytes(text)
        for chunk in (1, 2, 3, 5, 7, 1 << 20):
            assert may_hold_empty_object(path, chunk=chunk) is found, (text, chunk)


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(segments=st.lists(st.lists(events(), min_size=1, max_size=5), min_size=2, max_size=3))
def test_kept_schemas_of_hostile_events_merge_exactly_or_not_at_all(
    spark: Any, tmp_path_factory: Any, segments: list[list[Any]]
) -> None:
    """The hostile suite's events (eventpipe's own names, unicode keys, empty and
    duplicate keys, integers past int64, mixed arrays, deep nesting), in 2-3 segments:
    the merged schema is what Spark infers of them read together, or there is none."""
    layout = DataLayout(tmp_path_factory.mktemp("hostile") / "data")
    paths = _write(layout, segments)
    kept = _kept(spark, layout, paths)
    union, corrupt = _union(spark, paths)
    if kept is not None:
        assert not corrupt
        assert _as_read(kept) == _as_read(union)
