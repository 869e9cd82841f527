"""Product classification (seed 5): eventpipe's Spark expressions against the filter
semantics written out independently in plain SQL in DuckDB, on generated events."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import duckdb
import pytest

from eventpipe.errors import ConfigError
from eventpipe.processing.steps.metering import (
    Filter,
    Product,
    classify,
    json_text_at,
    load_products,
    products_of,
)  # fmt: skip
from tests import metering_sql

NAMES = ["search", "export", "upload", "login", "report"]

PRODUCTS = [
    Product("search-all", "search"),
    Product("search-eu", "search", (Filter("$.properties.region", within=("eu",)),)),
    Product("search-paid", "search", (Filter("$.properties.tier", not_within=("free",)),)),
    Product("export-any-tier", "export",
            (Filter("$.properties.tier", within=("pro", "team"), optional=True),)),
    Product("export-not-us", "export",
            (Filter("$.properties.region", not_within=("us",), optional=True),)),
    Product("upload-big", "upload", (Filter("$.properties.size", within=("2", "3")),
                                     Filter("$.properties.region", not_within=("apac",)))),
    Product("upload-tagged", "upload", (Filter("$.properties.tags[0]", within=("a",)),)),
    Product("search-level", "search", (Filter("$.properties.level", within=("2",)),
                                       Filter("$.properties.ratio", not_within=("0.5",),
                                              optional=True))),
    Product("report-odd", "report",
            (Filter("$.properties.flag", within=("true",), optional=True),
             Filter("$.properties.region", within=("eu", "us"), not_within=("us",)))),
]  # fmt: skip
"""Plain, _in, not_in, optional with each, two filters, numbers as text, an array element,
booleans, _in and not_in together; several products per event name; login has none."""


def _events(count: int) -> list[tuple[int, str]]:
    rng = random.Random(2026)
    events = []
    for n in range(count):
        properties: dict[str, Any] = {"name": rng.choice(NAMES)}
        for key, choices in {
            "region": ["eu", "us", "apac", None, "missing"],
            "tier": ["free", "pro", "team", None, "missing"],
            "size": [1, 2, 3, "2", "missing"],
            "flag": [True, False, "missing"],
            "tags": [["a", "b"], ["b"], [], "missing"],
            "level": [1, 2, 3, "missing"],
            "ratio": [0.5, 2.5, "missing"],
        }.items():
            value = rng.choice(choices)
            if value != "missing":
                properties[key] = value
        events.append((n, json.dumps({"transaction_id": f"t{n}", "properties": properties})))
    return events


def _expected(events: list[tuple[int, str]]) -> set[tuple[int, str]]:
    """(event, product) pairs by the seed's semantics, in SQL."""
    db = duckdb.connect()
    db.execute("CREATE TABLE events (id INTEGER, doc JSON)")
    db.executemany("INSERT INTO events VALUES (?, ?)", events)
    metering_sql.load_products(db, PRODUCTS)
    rows = db.execute(metering_sql.MATCHES.format(events="events")).fetchall()
    return {(int(i), str(u)) for i, u in rows}


def _of_text(doc: Any) -> Any:
    from pyspark.sql import functions as F

    return lambda path: F.get_json_object(doc, path)


@pytest.mark.parametrize("read", ["json text", "columns"])
def test_classification_equals_the_seeds_semantics_in_sql(spark: Any, read: str) -> None:
    """Values read by get_json_object from the event's text, and from the columns Spark's
    JSON reader makes of it (as the pipeline reads events), both equal the SQL's."""
    from pyspark.sql import functions as F

    events = _events(3000)
    frame = spark.createDataFrame(events, "id int, doc string")
    value_at = _of_text(F.col("doc"))
    if read == "columns":
        schema = spark.read.json(frame.rdd.map(lambda r: r["doc"])).schema
        frame = frame.select("id", "doc", F.from_json("doc", schema).alias("e"))
        frame = frame.select("id", "doc", "e.*")
        value_at = json_text_at(schema, lambda: pytest.fail("every path is read from columns"))
        types = {f.name: f.dataType.typeName() for f in schema["properties"].dataType.fields}
        assert {types[n] for n in ("size", "tags", "flag", "level", "ratio")} == {
            "string", "array", "boolean", "long", "double"}  # fmt: skip
    matched = frame.select("id", F.explode(classify(value_at, PRODUCTS)).alias("uid"))
    found = {(r["id"], r["uid"]) for r in matched.collect()}
    expected = _expected(events)
    assert found == expected
    # Every kind of outcome happened: several products for one event, none for some.
    per_event: dict[int, int] = {}
    for event, _ in expected:
        per_event[event] = per_event.get(event, 0) + 1
    assert max(per_event.values()) >= 3
    assert len(per_event) < len(events)  # unclassified events exist (login, failed filters)
    assert {u for _, u in expected} == {p.uid for p in PRODUCTS}  # each product matched


def test_an_event_without_products_gets_an_empty_list(spark: Any) -> None:
    from pyspark.sql import functions as F

    frame = spark.createDataFrame([(1, '{"properties": {"name": "login"}}'), (2, "{}")],
                                  "id int, doc string")  # fmt: skip
    value_at = _of_text(F.col("doc"))
    rows = frame.select("id", classify(value_at, PRODUCTS).alias("uids")).collect()
    assert [(r["id"], r["uids"]) for r in rows] == [(1, []), (2, [])]
    assert frame.select(classify(value_at, []).alias("u")).first()["u"] == []


def test_the_catalogue_reads_from_csv_and_yaml(tmp_path: Path) -> None:
    csv_file = tmp_path / "products.csv"
    csv_file.write_text(
        "product_uid,event_name,filters\n"
        'p1,search,""\n'
        'p2,search,"[{""path"": ""$.properties.region"", ""_in"": [""eu""], ""not_in"": [], '
        '""optional"": false}]"\n'
        'p3,upload,"[{""path"": ""$.properties.size"", ""_in"": [2, 3]}]"\n'
    )
    yaml_file = tmp_path / "products.yaml"
    yaml_file.write_text(
        "- {product_uid: p1, event_name: search}\n"
        "- product_uid: p2\n  event_name: search\n"
        "  filters: [{path: $.properties.region, _in: [eu], not_in: [], optional: false}]\n"
        "- product_uid: p3\n  event_name: upload\n"
        "  filters: [{path: $.properties.size, _in: [2, 3]}]\n"
    )
    expected = [
        Product("p1", "search"),
        Product("p2", "search", (Filter("$.properties.region", ("eu",)),)),
        Product("p3", "upload", (Filter("$.properties.size", ("2", "3")),)),
    ]
    assert load_products(csv_file) == expected
    assert load_products(yaml_file) == expected


@pytest.mark.parametrize(("text", "message"), [
    ("- {event_name: x}\n", "entry 1: product_uid and event_name are required"),
    ("- {product_uid: a, event_name: x}\n- {product_uid: a, event_name: y}\n",
     "entry 2: product_uid 'a' is used twice"),
    ("- {product_uid: a, event_name: x, filters: [{_in: [1]}]}\n", "each filter needs a path"),
    ("- {product_uid: a, event_name: x, filters: [{path: properties.a}]}\n", "not a JSONPath"),
    ("- {product_uid: a, event_name: x, filters: [{path: $.a, in: [1]}]}\n",
     "unknown filter key(s) in"),
    ("{product_uid: a}\n", "a list of products is expected"),
])  # fmt: skip
def test_a_bad_catalogue_is_refused_naming_the_entry(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "products.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as refused:
        load_products(path)
    assert message in str(refused.value)
    assert str(path) in str(refused.value)


def test_catalogue_rows_of_a_duckdb_table_take_filters_as_structs_or_json() -> None:
    db = duckdb.connect()
    db.execute(
        "CREATE TABLE p AS SELECT * FROM (VALUES "
        "('eu', 'x', [{'path': '$.properties.region', '_in': ['eu'], "
        "  'not_in': NULL::VARCHAR[], 'optional': true}]::JSON), "
        "('all', 'x', NULL)) t(product_uid, event_name, filters)"
    )
    structs = db.execute(
        "SELECT product_uid, event_name, "
        "CAST(filters AS STRUCT(path VARCHAR, _in VARCHAR[], not_in VARCHAR[], "
        "optional BOOLEAN)[]) AS filters FROM p"
    ).fetchall()
    as_json = db.execute("SELECT * FROM p").fetchall()
    columns = ("product_uid", "event_name", "filters")
    expected = [
        Product("eu", "x", (Filter("$.properties.region", ("eu",), (), optional=True),)),
        Product("all", "x"),
    ]
    for rows in (structs, as_json):
        assert products_of([dict(zip(columns, r, strict=True)) for r in rows], "t") == expected


def test_values_read_from_columns_equal_get_json_object_over_the_text(spark: Any) -> None:
    """Paths beyond names and indexes are read from the event's text; every path gives
    what get_json_object gives over the event's JSON."""
    from pyspark.sql import functions as F

    docs = [json.dumps(d) for d in (
        {"a": {"b": [{"c": 1}, {"c": "x"}], "n": 2.5, "t": True, "o": {"k": [1, 2]}}},
        {"a": {"b": [], "n": None}},
        {"z": 1},
    )]  # fmt: skip
    frame = spark.createDataFrame([(d,) for d in docs], "doc string")
    schema = spark.read.json(frame.rdd.map(lambda r: r["doc"])).schema
    frame = frame.select("doc", F.from_json("doc", schema).alias("e")).select("doc", "e.*")
    value_at = json_text_at(schema, lambda: F.col("doc"))
    paths = ["$.a.b[0].c", "$.a.b[1].c", "$.a.b[5].c", "$.a.n", "$.a.t", "$.a.o", "$.a.o.k",
             "$.a.o.k[1]", "$.a.missing", "$.z", "$.a.b[*].c", "$['a']['n']"]  # fmt: skip
    got = frame.select(*(value_at(p).alias(str(i)) for i, p in enumerate(paths))).collect()
    want = frame.select(
        *(F.get_json_object("doc", p).alias(str(i)) for i, p in enumerate(paths))
    ).collect()
    assert [list(r) for r in got] == [list(r) for r in want]
    assert got[0][0] == "1"
    assert got[0][5] == '{"k":[1,2]}'
