"""table_name_template: parsed once, compiled to Spark, sanitised exactly like Python does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from pyspark.sql import functions as F

from eventpipe.errors import ConfigError
from eventpipe.processing.steps import reused
from eventpipe.processing.steps.template import (
    render,
    rendered,
    sanitize_table_name,
    sanitized,
    table_names,
)
from eventpipe.schema.naming import table_name
from eventpipe.schema.templates import Template, java_date_pattern


def _render(
    spark: Any, tmp_path: Path, template: str, events: list[dict[str, Any]]
) -> list[tuple[str, str | None]]:
    path = tmp_path / "seg.log"
    path.write_bytes(b"".join(orjson.dumps({"i": i, **e}) + b"\n" for i, e in enumerate(events)))
    frame = spark.read.json(str(path))
    text, error = render(Template.parse(template), frame.schema)
    name = sanitize_table_name(text)
    rows = frame.select("i", name.alias("t"), error.alias("e")).orderBy("i").collect()
    return [(r.t, r.e) for r in rows]


@pytest.mark.parametrize(
    ("strftime", "java"),
    [("%Y_%m", "yyyy'_'MM"), ("%Y%m%d", "yyyyMMdd"), ("%y-%j", "yy'-'DDD"),
     ("x%%y", "'x%y'"), ("%H%M%S", "HHmmss"), ("it's", "'it''s'")],
)  # fmt: skip
def test_strftime_codes_become_spark_patterns(strftime: str, java: str) -> None:
    assert java_date_pattern(strftime) == java


@pytest.mark.parametrize(
    ("text", "message"),
    [("{{ a b }}", "unbalanced"), ("{{ a..b }}", "not a field path"),
     ("{{ a | date('%Q') }}", "%Q is not supported"), ("x }}", "unbalanced")],
)  # fmt: skip
def test_bad_templates_are_config_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Template.parse(text)
    # At config check, not when Spark first runs it.
    from tests.conftest import make_config

    with pytest.raises(ConfigError, match=message):
        make_config(Path("data"), destinations={"dw": {"type": "duckdb",
                                                       "table_name_template": text}})  # fmt: skip


def test_a_template_without_placeholders_is_a_literal() -> None:
    assert Template.parse("Web Events").literal == "Web Events"
    assert Template.parse("web_{{ event_type }}").literal is None
    assert Template.parse("{{ event_type }}").literal is None


def test_rendering(spark: Any, tmp_path: Path) -> None:
    rows = _render(spark, tmp_path, "{{ event_type }}_{{ _timestamp | date('%Y_%m') }}", [
        {"event_type": "Page View", "_timestamp": "2026-11-21T10:00:00.123456Z"},
        {"event_type": "click", "_timestamp": "2026-01-02T00:00:00Z"},
        {"_timestamp": "2026-01-02T00:00:00Z"},
        {"event_type": "x", "_timestamp": "not a time"},
    ])  # fmt: skip
    assert rows[0] == ("page_view_2026_11", None)
    assert rows[1] == ("click_2026_01", None)
    assert rows[2] == ("_2026_01", None)  # absent field renders empty
    assert rows[3][1] == "_timestamp is not a timestamp"


def test_empty_results_mean_skip_and_objects_are_errors(spark: Any, tmp_path: Path) -> None:
    rows = _render(spark, tmp_path, "{{ props.kind }}", [
        {"props": {"kind": "a"}}, {"props": {}}, {"other": 1},
    ])  # fmt: skip
    assert rows == [("a", None), ("", None), ("", None)]
    errors = _render(spark, tmp_path, "t_{{ props }}", [{"props": {"kind": "a"}}])
    assert errors[0][1] == "props is an object or array"
    assert _render(spark, tmp_path, "events", [{"a": 1}]) == [("events", None)]


@pytest.mark.parametrize(
    "text",
    ["events", "Page View", "x; DROP TABLE y", "?!", "名前", "1a", "a" * 100, "select",
     "ünïcödé", "", "__", "Ab-Cd.Ef",
     # names already (the fast path) and texts that only look like them
     "page_view", "_1", "_a", "a" * 63, "a" * 64, "a\n", "_eventpipe_x", "__unmapped_data",
     "_unmapped_data_2", "a__b", "1_"],
)  # fmt: skip
def test_native_sanitising_matches_the_python_rules(spark: Any, text: str) -> None:
    [row] = spark.range(1).select(sanitize_table_name(F.lit(text)).alias("t")).collect()
    assert row.t == table_name(text)


@pytest.mark.parametrize("limit", [1000, 0])
def test_table_names_by_distinct_texts_and_natively_agree(spark: Any, limit: int) -> None:
    texts = ["Page View", "x; DROP TABLE y", "?!", "1a", "a" * 100, "", "Page View"]
    frame = spark.createDataFrame([(t,) for t in texts], "text string")
    # limit 0 forces the native expression: both paths give naming.table_name's result.
    named = frame.select(table_names(frame, F.col("text"), limit=limit).alias("t")).collect()
    assert [r.t for r in named] == [table_name(t) for t in texts]


def _render_read(
    spark: Any, tmp_path: Path, template: str, events: list[Any]
) -> list[tuple[str, str | None]]:
    """As the pipeline renders: the batch read by read_events (arrays as JSON text)."""
    from eventpipe.processing.batch.read import read_events

    path = tmp_path / f"batch{len(list(tmp_path.iterdir()))}.log"
    # json, not orjson: it writes integers past 64 bits, as clients may.
    path.write_text("".join(json.dumps({"i": i, **e}) + "\n" for i, e in enumerate(events)))
    frame = read_events(spark, [str(path)])
    text, error = render(Template.parse(template), frame.schema)
    rows = frame.select("i", sanitize_table_name(text).alias("t"), error.alias("e"))
    return [(r.t, r.e) for r in rows.orderBy("i").collect()]


@pytest.mark.parametrize(
    "neighbours",
    [[], [{"event_type": "click"}], [{"event_type": 5.5}], [{"event_type": True}],
     [{"event_type": {"a": 1}}], [{"event_type": 12345678901234567890123}]],
)  # fmt: skip
def test_a_number_names_the_same_table_whatever_its_batch(
    spark: Any, tmp_path: Path, neighbours: list[dict[str, Any]]
) -> None:
    sent = [{"event_type": 5}, {"event_type": 5.0}, {"event_type": "5"}, {"event_type": 1e2},
            {"event_type": -0.0}]  # fmt: skip
    rows = _render_read(spark, tmp_path, "{{ event_type }}", sent + neighbours)
    assert rows[: len(sent)] == [("_5", None), ("_5", None), ("_5", None), ("_100", None),
                                 ("_0", None)]  # fmt: skip


@pytest.mark.parametrize("neighbours", [[], [{"event_type": "click"}], [{"event_type": 5}]])
def test_an_object_or_array_is_the_events_error_whatever_its_batch(
    spark: Any, tmp_path: Path, neighbours: list[dict[str, Any]]
) -> None:
    sent = [{"event_type": {"a": 1}}, {"event_type": [1, 2]}, {"event_type": []}]
    rows = _render_read(spark, tmp_path, "{{ event_type }}", sent + neighbours)
    for _, error in rows[: len(sent)]:
        assert error == "event_type is an object or array"
    assert all(error is None for _, error in rows[len(sent) :])
    # A text that only looks like JSON is a text.
    assert _render_read(spark, tmp_path, "{{ event_type }}", [{"event_type": "{x}"}]) == [
        ("_x_", None)
    ]


def test_a_path_into_an_object_sent_beside_texts_reads_the_events_value(
    spark: Any, tmp_path: Path
) -> None:
    """Spark reads a field of objects and texts as text; the path reads on into it."""
    events = [{"props": {"kind": "a", "n": 7}}, {"props": "plain"}, {"props": {"other": 1}}]
    assert _render_read(spark, tmp_path, "{{ props.kind }}{{ props.n }}", events) == [
        ("a7", None), ("", None), ("", None),
    ]  # fmt: skip
    alone = _render_read(spark, tmp_path, "{{ props.kind }}{{ props.n }}", events[:1])
    assert alone == [("a7", None)]


def test_a_streams_table_names_are_built_once_per_template_and_types(
    spark: Any, tmp_path: Path
) -> None:
    """Each micro-batch names its tables with the expressions the one before built, as
    long as the fields the template reads keep their types; their names are right for
    every batch's own rows."""
    template = Template.parse("web_{{ event_type }}_{{ ctx.page }}")

    def batch(n: int, events: list[dict[str, Any]]) -> Any:
        path = tmp_path / f"batch{n}.log"
        path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
        return spark.read.json(str(path))

    first = batch(1, [{"event_type": "Page View", "ctx": {"page": "Home"}, "other": 1}])
    second = batch(2, [{"event_type": "Sign-up", "ctx": {"page": "x", "more": True}}])
    numbered = batch(3, [{"event_type": 5, "ctx": {"page": "p"}}])
    assert rendered(template, first.schema) is rendered(template, second.schema)
    assert sanitized(template, first.schema) is sanitized(template, second.schema)
    assert sanitized(template, numbered.schema) is not sanitized(template, first.schema)
    names = [frame.select(sanitized(template, frame.schema)).first()[0]
             for frame in (first, second, numbered)]  # fmt: skip
    assert names == [table_name("web_Page View_Home"), table_name("web_Sign-up_x"), "web_5_p"]


def test_kept_expressions_are_built_again_for_another_spark_session(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kept = reused.Reused(max_kept=2)
    monkeypatch.setattr(reused, "_session_owner", lambda: "session 1")
    built = [kept.get("a", lambda: ["a"]), kept.get("a", lambda: ["other"])]
    assert built[0] is built[1]
    kept.get("b", lambda: ["b"])
    kept.get("c", lambda: ["c"])  # past max_kept: the oldest made goes
    assert kept.get("a", lambda: ["a again"]) == ["a again"]
    monkeypatch.setattr(reused, "_session_owner", lambda: "session 2")
    assert kept.get("c", lambda: ["c in session 2"]) == ["c in session 2"]
