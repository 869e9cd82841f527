"""Typing per table on Spark: the lattice where Spark agrees, timestamps that really parse.

Every case runs twice: over a frame (one aggregation) and over the same frame staged as
Parquet partitioned by table, typed from the files' footers (the job's way); both must
give the same answer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from eventpipe.processing.flatten import flatten
from eventpipe.processing.typing import column_types, staged_column_types, token_types
from eventpipe.schema.types import DataType

S, N, F, B, T = (DataType.STRING, DataType.INT64, DataType.FLOAT64, DataType.BOOL,
                 DataType.TIMESTAMP)  # fmt: skip


@pytest.fixture(params=["frame", "staged"])
def typed(request: pytest.FixtureRequest, spark: Any, tmp_path: Path) -> Any:
    def types(events: list[dict[str, Any]]) -> dict[str, dict[str, DataType]]:
        path = tmp_path / "seg.log"
        path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
        frame = flatten(spark.read.json(str(path)))
        columns = [c for c in frame.columns if c != "tbl"]
        if request.param == "frame":
            return column_types(frame, "tbl", columns).types
        staged = tmp_path / "staged"
        frame.write.partitionBy("tbl").parquet(str(staged))
        return staged_column_types(staged, spark.read.parquet(str(staged)), "tbl", columns).types

    return types


def test_each_json_type_and_promotions_spark_agrees_with(typed: Any) -> None:
    types = typed([
        {"tbl": "a", "b": True, "n": 1, "f": 1.5, "s": "x", "nf": 1, "ts": "2026-11-21T10:00:00Z",
         "arr": [1, 2], "o": {"k": 1}},
        {"tbl": "a", "b": False, "n": 2, "f": 2, "s": "y", "nf": 2.5, "ts": "2026-11-21 10:00:00",
         "arr": [], "o": {"k": 2}},
    ])  # fmt: skip
    assert types == {"a": {"b": B, "n": N, "f": F, "s": S, "nf": F, "ts": T, "arr": S,
                           "o_k": N}}  # fmt: skip


def test_types_are_per_table_and_absent_columns_are_left_out(typed: Any) -> None:
    types = typed([
        {"tbl": "a", "when": "2026-11-21T10:00:00Z", "only_a": 1},
        {"tbl": "b", "when": "yesterday"},
    ])  # fmt: skip
    assert types["a"]["when"] is T
    assert types["b"]["when"] is S
    assert "only_a" in types["a"]
    assert "only_a" not in types["b"]


def test_timestamp_shaped_strings_that_do_not_parse_keep_the_column_a_string(
    typed: Any,
) -> None:
    types = typed([
        {"tbl": "a", "d": "2026-11-21T10:00:00Z"},
        {"tbl": "a", "d": "2026-02-30T10:00:00Z"},
    ])  # fmt: skip
    assert types["a"]["d"] is S


def test_timestamps_mixed_with_numbers_are_strings(typed: Any) -> None:
    types = typed([
        {"tbl": "a", "x": "2026-11-21T10:00:00Z"}, {"tbl": "a", "x": 5},
    ])  # fmt: skip
    assert types["a"]["x"] is S


def test_timestamps_between_the_bounds_decide_too(typed: Any) -> None:
    # The smallest and largest values are timestamps, one in between is not.
    types = typed([
        {"tbl": "a", "x": "2026-01-01T00:00:00Z"}, {"tbl": "a", "x": "2026-06-01 x"},
        {"tbl": "a", "x": "2026-12-31T00:00:00Z"},
    ])  # fmt: skip
    assert types["a"]["x"] is S


def test_values_too_long_for_footer_bounds_are_read(typed: Any) -> None:
    # Parquet writers leave out bounds longer than 4 KB; the values are then read.
    types = typed([
        {"tbl": "a", "x": "2026-11-21T10:00:00Z", "long": "y" * 5000},
        {"tbl": "b", "x": "text", "long": "2026-11-21T10:00:00Z"},
    ])  # fmt: skip
    assert types == {"a": {"long": S, "x": T}, "b": {"long": T, "x": S}}


def test_footers_name_the_text_columns_that_may_be_bools_mixed_with_numbers(
    spark: Any, tmp_path: Path
) -> None:
    path = tmp_path / "seg.log"
    events = [{"tbl": "a", "m": True, "ids": "12"}, {"tbl": "a", "m": 3, "ids": "13"},
              {"tbl": "b", "m": "x", "ids": "x"}]  # fmt: skip
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    frame = flatten(spark.read.json(str(path)))
    frame.write.partitionBy("tbl").parquet(str(tmp_path / "staged"))
    staged = spark.read.parquet(str(tmp_path / "staged"))
    typed = staged_column_types(tmp_path / "staged", staged, "tbl", ["m", "ids"])
    assert typed.types == {"a": {"m": S, "ids": S}, "b": {"m": S, "ids": S}}
    assert typed.mixed == {"a": {"m"}}  # "12" and "13" are numbers sent as text: not asked


def test_token_types_promote_bools_and_numbers_along_the_lattice(
    spark: Any, tmp_path: Path
) -> None:
    from pyspark.sql.types import StringType, StructField, StructType, VariantType

    path = tmp_path / "seg.log"
    events = [{"tbl": "a", "v": True}, {"tbl": "a", "v": 2}, {"tbl": "b", "v": 2},
              {"tbl": "b", "v": 2.5}, {"tbl": "c", "v": False}, {"tbl": "d", "v": "1"},
              {"tbl": "d", "v": 1}, {"tbl": "e", "v": {"o": 1}}, {"tbl": "e", "v": 1},
              {"tbl": "f", "v": None}]  # fmt: skip
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    schema = StructType([StructField("tbl", StringType()), StructField("v", VariantType())])
    found = token_types(spark.read.schema(schema).json(str(path)), "tbl", ["v"])
    assert found == {"a": {"v": N}, "b": {"v": F}, "c": {"v": B}, "d": {"v": S},
                     "e": {"v": S}, "f": {}}  # fmt: skip


def test_conversions_to_a_columns_type_are_exact_or_null(spark: Any) -> None:
    from datetime import datetime

    from pyspark.sql import functions as fn

    from eventpipe.processing.typing import cast_to

    frame = spark.createDataFrame(
        [(True, 5, 1.5, "x", datetime(2026, 11, 21, 10)),
         (False, 1, 2.0, "7", None),
         (None, 0, 1e30, "true", None),
         (None, None, None, "2026-11-21T10:00:00Z", None)],
        "b boolean, n long, f double, s string, t timestamp",
    )  # fmt: skip
    schema = {f.name: f.dataType for f in frame.schema.fields}

    def converted(column: str, to: DataType) -> list[Any]:
        out = frame.select(cast_to(fn.col(column), to, schema[column]).alias("v"))
        return [row["v"] for row in out.collect()]

    assert converted("b", N) == [1, 0, None, None]
    assert converted("b", S) == ["true", "false", None, None]
    assert converted("n", B) == [None, True, False, None]  # 5 is not a bool
    assert converted("n", F) == [5.0, 1.0, 0.0, None]
    assert converted("n", T) == [None, None, None, None]  # a number is not a timestamp
    assert converted("f", N) == [None, 2, None, None]  # no fraction dropped, no overflow
    assert converted("s", N) == [None, 7, 1, None]
    assert converted("s", B) == [None, None, True, None]
    assert converted("s", T)[3] == datetime(2026, 11, 21, 10)
    assert converted("s", T)[:3] == [None, None, None]
    assert converted("t", S)[0] == "2026-11-21T10:00:00.000000Z"
    assert converted("t", N) == [None, None, None, None]  # never epoch seconds
