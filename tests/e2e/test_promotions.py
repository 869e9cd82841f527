"""Every lattice type into a column of every type, through the job, for each destination:
a value that converts exactly loads, any other goes to failed/ naming the column."""

from __future__ import annotations

import json
from datetime import datetime
from decimal import Decimal
from typing import Any

import pytest

from eventpipe.processing.batch.job import process_once
from eventpipe.processing.runtime.pipeline import Runtime
from tests.e2e.test_batch_pipeline import _post, _seal

COLUMNS = {"b": True, "i": 5, "f": 1.5, "s": "x", "t": "2026-11-21T10:00:00Z"}
VALUES = {"bool": True, "int": 5, "float": 1.5, "text": "x", "stamp": "2026-11-21T10:00:00Z"}
STAMP = datetime(2026, 11, 21, 10)
# What loads, per (column, value): the loaded value; absent: the event fails.
LOADS = {
    ("b", "bool"): True,
    ("i", "bool"): 1, ("i", "int"): 5,
    ("f", "bool"): 1.0, ("f", "int"): 5.0, ("f", "float"): 1.5,
    ("s", "bool"): "true", ("s", "int"): "5", ("s", "float"): "1.5", ("s", "text"): "x",
    ("s", "stamp"): "2026-11-21T10:00:00Z",
    ("t", "stamp"): STAMP,
}  # fmt: skip


@pytest.fixture(params=["duckdb", "postgres"])
def destination(request: pytest.FixtureRequest) -> dict[str, Any]:
    if request.param == "duckdb":
        return {"type": "duckdb"}
    return {"type": "postgres", "dsn": request.getfixturevalue("postgres_dsn"),
            "schema": request.getfixturevalue("postgres_schema")}  # fmt: skip


def test_every_value_type_into_every_column_type(
    start_collector: Any, spark: Any, destination: dict[str, Any]
) -> None:
    c = start_collector(destinations={"w": destination})
    _post(c, [{**COLUMNS, "event_id": "first"}], server=True)  # makes b, i, f, s, t
    _seal(c)
    process_once(c.config, spark)
    _post(c, [{column: value, "event_id": f"{column}-{kind}"}
              for column in COLUMNS for kind, value in VALUES.items()], server=True)  # fmt: skip
    _seal(c)
    report = process_once(c.config, spark)
    assert report is not None
    dest = Runtime(c.config).open_destination("w")
    described = dest.describe("events")
    assert described is not None
    assert {k: described.columns[k].value for k in COLUMNS} == {
        "b": "BOOL", "i": "INT64", "f": "FLOAT64", "s": "STRING", "t": "TIMESTAMP"
    }  # fmt: skip
    names, rows = dest.query("SELECT eventn_ctx_event_id, b, i, f, s, t FROM events")
    loaded = {}
    for row in rows:
        if row[0] == "first":
            continue
        column, _ = row[0].split("-")
        value = row[names.index(column)]
        loaded[tuple(row[0].split("-"))] = float(value) if isinstance(value, Decimal) else value
    assert {k: v.replace(tzinfo=None) if isinstance(v, datetime) else v
            for k, v in loaded.items()} == LOADS  # fmt: skip
    failed = [json.loads(x) for x in c.layout.failed_destination("w").read_text().splitlines()]
    assert len(failed) == len(COLUMNS) * len(VALUES) - len(LOADS)
    for error in failed:
        column = error["event"]["eventn_ctx"]["event_id"].split("-")[0]
        assert f"column {column} (" in error["error"]
