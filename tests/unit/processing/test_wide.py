"""Wide events (processing/steps/fields.py): a projection of many columns, and the JSON
text of an event, are written as SQL text so that the driver makes one call for them
instead of several per column. What comes out is what the Column objects gave: the same
names (any characters an event's key may hold), order, types, nullability and metadata,
and the same values."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.types import StringType, StructField, StructType

from eventpipe.processing.batch.read import event_json, read_events
from eventpipe.processing.steps.fields import JSON_TEXT, SQL_FROM_COLUMNS, projected, quoted

HOSTILE = ["a`b", "a.b", "", "é\n", "{x}", " sp ", "SELECT", "`", "a``b", "'q'", '"d"', "%s"]


def _frame(spark: Any, width: int) -> Any:
    names = [*HOSTILE, *(f"k{n}" for n in range(max(0, width - len(HOSTILE))))][:width]
    fields = [
        StructField(name, StringType(), n % 2 == 0, {JSON_TEXT: True} if n % 3 == 0 else {})
        for n, name in enumerate(names)
    ]
    row = tuple(f"v{n}" for n in range(width))
    return spark.createDataFrame([row], StructType(fields)), names


@pytest.mark.parametrize("width", [SQL_FROM_COLUMNS - 1, SQL_FROM_COLUMNS, 300])
def test_a_projection_keeps_names_order_types_and_metadata(spark: Any, width: int) -> None:
    frame, names = _frame(spark, width)
    wanted = list(reversed([(name, f"new {name}") for name in names]))
    out = projected(frame, [(new, quoted(old)) for old, new in wanted])
    assert out.columns == [new for _, new in wanted]
    source = {f.name: f for f in frame.schema.fields}
    for field, (old, _) in zip(out.schema.fields, wanted, strict=True):
        assert (field.dataType, field.nullable, field.metadata) == (
            source[old].dataType, source[old].nullable, source[old].metadata,
        )  # fmt: skip
    [row] = out.collect()
    assert list(row) == [f"v{names.index(old)}" for old, _ in wanted]
    assert not [t for t in spark.catalog.listTables() if t.isTemporary]  # its view is gone


def test_an_event_of_hostile_and_many_keys_is_its_json_again(tmp_path: Path, spark: Any) -> None:
    event: dict[str, Any] = {key: n for n, key in enumerate(HOSTILE)}
    event.update({f"k{n}": {"inner `x`": [n, "t"], "y": None} for n in range(200)})
    event["_timestamp"] = "2026-11-29T10:00:00Z"  # a reserved name: escaped while read
    event["list"] = [1, "a", {"b": 2}]
    path = tmp_path / "incoming.tok=web-2026-11-29T10-00-00.000.log"
    path.write_text(json.dumps(event) + "\n" + json.dumps({"small": 1}) + "\n")
    frame = read_events(spark, [str(path)], lines=True)
    assert frame.schema["list"].metadata.get(JSON_TEXT) is True  # an array: its own text
    texts = [json.loads(r[0]) for r in frame.select(event_json(frame)).collect()]
    # Spark's to_json leaves null fields out, as it did with the Column objects.
    expected = {**event, **{f"k{n}": {"inner `x`": [n, "t"]} for n in range(200)}}
    del expected[""]  # no column for an empty key (the collector renames it: docs/pipeline.md)
    assert texts[0] == expected
    assert list(texts[0]) == [*sorted(expected)]  # the columns' order: Spark's, by name
    assert texts[1] == {"small": 1}


def test_a_wide_batch_flattens_as_column_objects_flatten_it(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from eventpipe.processing.steps import fields
    from eventpipe.processing.steps.flatten import flatten_mapped

    events = [
        {**{key: n for n, key in enumerate(HOSTILE)}, "A": 1, "a": 2, "a_b": "x",
         "nest": {"b `c`": [1, {"d": "e"}], "f.g": None, "A": True}, "list": [1, "a"],
         **{f"k{n}": {"v": n} for n in range(60)}},
        {"a": 3, "nest": {"a": False, "b `c`": []}, "k0": {"v": "text"}},
    ]  # fmt: skip
    path = tmp_path / "incoming.tok=web-2026-11-29T10-00-00.000.log"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    frame = read_events(spark, [str(path)])
    as_sql = flatten_mapped(frame)
    monkeypatch.setattr(fields, "SQL_FROM_COLUMNS", 10**9)
    as_columns = flatten_mapped(frame)
    assert len(as_sql.frame.columns) > 60
    assert as_sql.frame.schema == as_columns.frame.schema
    assert as_sql.frame.collect() == as_columns.frame.collect()
    assert (as_sql.pointers, as_sql.sources) == (as_columns.pointers, as_columns.sources)
    row = as_sql.frame.collect()[0].asDict()
    assert row["nest_b__c_"] == '[1, {"d": "e"}]'  # an array: the text it was sent as
    assert '"/a":2' in row["_unmapped_data"]  # "A" and "a" collide: one kept aside


def test_arrays_of_a_wide_frame_are_flattened_to_their_json(
    spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from eventpipe.processing.steps import fields
    from eventpipe.processing.steps.flatten import flatten_mapped

    frame = spark.createDataFrame(
        [([1, 2], {"xs": ["a"]}, *range(40))],
        "ns array<int>, s struct<xs: array<string>>, " + ", ".join(f"c{n} int" for n in range(40)),
    )
    as_sql = flatten_mapped(frame).frame
    monkeypatch.setattr(fields, "SQL_FROM_COLUMNS", 10**9)
    as_columns = flatten_mapped(frame).frame
    assert as_sql.schema == as_columns.schema
    assert as_sql.collect() == as_columns.collect()
    row = as_sql.collect()[0]
    assert (row["ns"], row["s_xs"]) == ("[1,2]", '["a"]')
