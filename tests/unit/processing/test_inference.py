"""Typing per table on Spark: the lattice where Spark agrees, timestamps that really parse.

Every case runs three times: over a frame (one aggregation), over the same frame staged as
Parquet partitioned by table, typed from the files' footers (the job's way), and staged
as a small batch is (shape.stage_flat in the driver, which counts each text column's
timestamps as it stages); all must give the same answer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.functions import expr, lit

from eventpipe.processing.batch.shape import stage_flat
from eventpipe.processing.steps import inference
from eventpipe.processing.steps.flatten import flatten
from eventpipe.processing.steps.inference import (
    StagedTypes,
    column_types,
    staged_column_types,
    token_types,
)
from eventpipe.reserved import ERROR, TABLE
from eventpipe.schema.types import TIMESTAMP_PATTERN, DataType

S, N, F, B, T = (DataType.STRING, DataType.INT64, DataType.FLOAT64, DataType.BOOL,
                 DataType.TIMESTAMP)  # fmt: skip
H = DataType.INT128


@pytest.fixture(params=["frame", "staged", "counted"])
def typed(request: pytest.FixtureRequest, spark: Any, tmp_path: Path) -> Any:
    def types(events: list[dict[str, Any]]) -> dict[str, dict[str, DataType]]:
        path = tmp_path / "seg.log"
        path.write_bytes("".join(json.dumps(e) + "\n" for e in events).encode())
        frame = flatten(spark.read.json(str(path)))
        columns = [c for c in frame.columns if c != "tbl"]
        if request.param == "frame":
            return column_types(frame, "tbl", columns).types
        if request.param == "counted":
            return _counted(frame, tmp_path / "dst", columns).types
        staged = tmp_path / "staged"
        frame.write.partitionBy("tbl").parquet(str(staged))
        return staged_column_types(staged, spark.read.parquet(str(staged)), "tbl", columns).types

    return types


def _counted(frame: Any, where: Path, columns: list[str]) -> StagedTypes:
    rows = frame.withColumnRenamed("tbl", TABLE).withColumn(ERROR, lit(None).cast("string"))
    staged, counts = stage_flat(rows, where, in_driver=True)
    return staged_column_types(where / "flat", staged, TABLE, columns, texts=counts["texts"])


def test_a_small_batchs_counts_spare_the_read_where_all_or_no_values_are_timestamps(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "seg.log"
    events = [
        {"tbl": "a", "at": "2026-11-29T10:00:00Z", "odd": "2026-02-30T10:00:00Z",
         "some": "2026-11-29T10:00:00Z", "word": "x"},
        {"tbl": "b", "at": "2026-11-29 11:00:00.5", "odd": "2026-13-01T10:00:00Z",
         "some": "2026-11-29 not a time", "word": "y"},
        {"tbl": "b", "at": "2026-11-30T00:00:00+01:00", "some": "2026-11-30T00:00:00Z"},
    ]  # fmt: skip
    path.write_bytes("".join(json.dumps(e) + "\n" for e in events).encode())
    frame = flatten(spark.read.json(str(path)))
    read: list[list[str]] = []
    real = inference.column_types

    def reading(frame: Any, table: str, names: Any, **kw: Any) -> Any:
        read.append(sorted(names))
        return real(frame, table, names, **kw)

    monkeypatch.setattr(inference, "column_types", reading)
    columns = ["at", "odd", "some", "word"]
    counted = _counted(frame, tmp_path / "dst", columns)
    counts = json.loads((tmp_path / "dst" / "counts.json").read_text())
    assert counts["texts"] == {"at": [3, 3], "odd": [2, 0], "some": [3, 2], "word": [2, 0]}
    # Every "at" is a timestamp and no "odd" is (their shape alone says otherwise): only
    # "some", whose values are both, is read, for table b (a's bounds say a timestamp).
    assert read == [["some"]]
    assert counted.types == {"a": {"at": T, "odd": S, "some": T, "word": S},
                             "b": {"at": T, "odd": S, "some": S, "word": S}}  # fmt: skip
    frame.write.partitionBy("tbl").parquet(str(tmp_path / "staged"))
    staged = spark.read.parquet(str(tmp_path / "staged"))
    assert staged_column_types(tmp_path / "staged", staged, "tbl", columns).types == counted.types


def test_the_timestamp_pattern_is_a_spark_sql_literal_as_it_stands(spark: Any) -> None:
    # No quote to end the literal, no backslash that Spark's parser would take for an
    # escape (or not, with spark.sql.parser.escapedStringLiterals): timestamp_text puts
    # it between quotes as it is.
    assert "'" not in TIMESTAMP_PATTERN
    assert "\\" not in TIMESTAMP_PATTERN
    values = ["2026-11-29T10:00:00Z", "2026-11-29 10:00:00.123+0100", "٢٠٢٦-11-29T10:00:00Z",
              "2026-11-29T10:00", "2026-02-30T10:00:00Z", "x" * 19, None]  # fmt: skip
    frame = spark.createDataFrame([(v,) for v in values], "v string")
    got = [row[0] for row in frame.select(expr(inference.timestamp_text("v"))).collect()]
    assert [bool(g) for g in got] == [True, True, False, False, False, False, False]


def test_each_json_type_and_promotions_spark_agrees_with(typed: Any) -> None:
    types = typed([
        {"tbl": "a", "b": True, "n": 1, "f": 1.5, "s": "x", "nf": 1, "ts": "2026-11-21T10:00:00Z",
         "arr": [1, 2], "o": {"k": 1}, "h": 2**64 + 1, "nh": 1},
        {"tbl": "a", "b": False, "n": 2, "f": 2, "s": "y", "nf": 2.5, "ts": "2026-11-21 10:00:00",
         "arr": [], "o": {"k": 2}, "h": -(10**38) + 1, "nh": 2**63},
    ])  # fmt: skip
    assert types == {"a": {"b": B, "n": N, "f": F, "s": S, "nf": F, "ts": T, "arr": S,
                           "o_k": N, "h": H, "nh": H}}  # fmt: skip


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
    path.write_bytes("".join(json.dumps(e) + "\n" for e in events).encode())
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
              {"tbl": "f", "v": None}, {"tbl": "g", "v": 2**70}, {"tbl": "g", "v": True},
              {"tbl": "h", "v": 2**70}, {"tbl": "h", "v": 1.5}]  # fmt: skip
    path.write_bytes("".join(json.dumps(e) + "\n" for e in events).encode())
    schema = StructType([StructField("tbl", StringType()), StructField("v", VariantType())])
    found = token_types(spark.read.schema(schema).json(str(path)), "tbl", ["v"])
    assert found == {"a": {"v": N}, "b": {"v": F}, "c": {"v": B}, "d": {"v": S},
                     "e": {"v": S}, "f": {}, "g": {"v": H}, "h": {"v": S}}  # fmt: skip


def _converter(frame: Any) -> Any:
    """``converted(column, type)``: the column's values through cast_to, in row order."""
    from pyspark.sql import functions as fn

    from eventpipe.schema.casts import cast_to

    schema = {f.name: f.dataType for f in frame.schema.fields}

    def converted(column: str, to: DataType) -> list[Any]:
        out = frame.select(cast_to(fn.col(column), to, schema[column]).alias("v"))
        return [row["v"] for row in out.collect()]

    return converted


def test_conversions_to_a_columns_type_are_exact_or_null(spark: Any) -> None:
    from datetime import datetime

    frame = spark.createDataFrame(
        [(True, 5, 1.5, "x", datetime(2026, 11, 21, 10)),
         (False, 1, 2.0, "7", None),
         (None, 0, 1e30, "true", None),
         (None, None, None, "2026-11-21T10:00:00Z", None)],
        "b boolean, n long, f double, s string, t timestamp",
    )  # fmt: skip
    converted = _converter(frame)

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


def test_conversions_to_and_from_int128_keep_every_digit(spark: Any) -> None:
    from decimal import Decimal

    big = Decimal(2**64 + 1)
    frame = spark.createDataFrame(
        [(big, 5, 2.0, "18446744073709551617", True),
         (Decimal(7), None, 1.5, "1.5", False),
         (None, None, 1e300, "true", None),
         (None, None, None, " -99999999999999999999999999999999999999 ", None)],
        "h decimal(22,0), n long, f double, s string, b boolean",
    )  # fmt: skip
    converted = _converter(frame)

    assert converted("h", H) == [big, 7, None, None]
    assert converted("h", S) == ["18446744073709551617", "7", None, None]
    assert converted("h", N) == [None, 7, None, None]  # beyond int64: not taken
    assert converted("h", F) == [None, 7.0, None, None]  # a double would round it
    assert converted("n", H) == [5, None, None, None]
    assert converted("f", H) == [2, None, None, None]  # no fraction, no overflow
    assert converted("s", H) == [big, None, 1, -(10**38) + 1]  # "1.5" is not rounded
    assert converted("b", H) == [1, 0, None, None]


def test_text_is_a_float_only_with_the_digits_a_float_holds(spark: Any) -> None:
    """PostgreSQL numerics beyond float64's digits reach the log as text (the source
    keeps them exact): into a DOUBLE column they do not convert, rather than round."""
    texts = [
        "1.5",
        " 0.1 ",
        "24.571428571428573",
        "1234567890228.4568",
        "1e9",
        "-0.00120",
        "100",
        "24.57142857142857142857142857",
        "1234567890228.456789",
        "1e400",
        "abc",
        "5e-324",  # the smallest float64 (Java prints it 4.9E-324)
        "1.23456789012345e-320",  # a subnormal keeps 5 of these digits
        "0",
    ]
    frame = spark.createDataFrame([(t,) for t in texts], "s string")
    assert _converter(frame)("s", F) == [
        1.5,
        0.1,
        24.571428571428573,
        1234567890228.4568,
        1e9,
        -0.0012,
        100.0,
        None,
        None,
        None,
        None,
        5e-324,
        None,
        0.0,
    ]


def test_the_source_and_the_lattice_agree_on_exact_floats() -> None:
    from eventpipe.sources.postgres import exact_number

    assert exact_number("24.571428571428573") == 24.571428571428573
    assert exact_number("1000000000.00") == 1e9
    assert exact_number("1.5e-19") == 1.5e-19
    assert exact_number("24.57142857142857142857142857") == "24.57142857142857142857142857"
    assert exact_number("1234567890228.456789") == "1234567890228.456789"
