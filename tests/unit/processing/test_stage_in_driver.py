"""A micro-batch's rows staged by the driver (read.stage_in_driver, through
shape.stage_flat) are what Spark's own partitioned writer stages: the same tables, the
same rows and types read back by Spark, pyarrow and DuckDB, the same counts; a column
of a type they would not write alike leaves it to Spark."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq
from pyspark.sql import functions as F

from eventpipe.processing.batch.read import stage_in_driver
from eventpipe.processing.batch.shape import MAX_COUNTED_TEXTS, stage_flat
from eventpipe.reserved import ERROR, TABLE

ROWS = [
    ("page_view", None, "a", 1, 1.5, True, Decimal("12.50"), date(2026, 11, 29),
     datetime(2026, 11, 29, 10, 0, 0, 123456, tzinfo=UTC), b"\x00\xff",
     ["x", "y"], {"k": 1}, ("s", 2)),
    ("page_view", None, None, None, None, None, None, None, None, None, None, None, None),
    ("click", None, "ü😀", -(2**63), float("inf"), False, Decimal("-0.01"), date(1, 1, 1),
     datetime(1970, 1, 1, tzinfo=UTC), b"", [], {}, (None, None)),
    ("", None, "skipped", 0, 0.0, False, None, None, None, None, None, None, None),
    (None, "a template error", "failed", 0, 0.0, False, None, None, None, None, None, None,
     None),
]  # fmt: skip
SCHEMA = (
    f"{TABLE} string, {ERROR} string, text string, n bigint, x double, flag boolean, "
    "amount decimal(12,2), day date, at timestamp, raw binary, tags array<string>, "
    "counts map<string,bigint>, pair struct<a:string,b:int>"
)


def _staged(spark: Any, where: Path, in_driver: bool) -> tuple[list[Any], dict[str, Any]]:
    frame = spark.createDataFrame(ROWS, SCHEMA)
    staged, counts = stage_flat(frame, where, in_driver=in_driver)
    return sorted(staged.collect(), key=repr), counts


def test_rows_staged_by_the_driver_are_what_spark_stages(spark: Any, tmp_path: Path) -> None:
    by_spark, spark_counts = _staged(spark, tmp_path / "spark", in_driver=False)
    by_driver, driver_counts = _staged(spark, tmp_path / "driver", in_driver=True)

    written = list((tmp_path / "driver" / "flat").glob("*/part-00000.parquet"))
    assert written, "Spark wrote them, not the driver"
    assert by_driver == by_spark
    assert len(by_driver) == 3
    # The driver's write also counts each text column's values and timestamps, in every
    # row, staged or not (for the typing); the other counts are Spark's.
    assert driver_counts.pop("texts") == {"text": [4, 0]}
    assert driver_counts == spark_counts
    assert (driver_counts["skipped"], driver_counts["failed"]) == (1, 1)
    for table in ("page_view", "click"):
        [spark_file] = (tmp_path / "spark" / "flat" / f"{TABLE}={table}").glob("*.parquet")
        [driver_file] = (tmp_path / "driver" / "flat" / f"{TABLE}={table}").glob("*.parquet")
        assert pq.read_table(driver_file).schema.types == pq.read_table(spark_file).schema.types
        with duckdb.connect() as db:
            read = "SELECT * FROM read_parquet(?) ORDER BY ALL"
            assert (
                db.execute(read, [str(driver_file)]).fetchall()
                == db.execute(read, [str(spark_file)]).fetchall()
            )


def test_a_type_the_driver_would_write_otherwise_is_left_to_spark(
    spark: Any, tmp_path: Path
) -> None:
    rows = spark.createDataFrame([("events",)], f"{TABLE} string").withColumn(
        "payload", F.parse_json(F.lit('{"a": 1}'))
    )
    assert stage_in_driver(rows, tmp_path / "flat", TABLE) is False
    assert not (tmp_path / "flat").exists()

    staged, _ = stage_flat(rows.withColumn(ERROR, F.lit(None).cast("string")), tmp_path,
                           in_driver=True)  # fmt: skip
    assert [row.payload.toJson() for row in staged.collect()] == ['{"a":1}']


def test_rows_staged_by_the_driver_without_partitions_are_one_file_spark_reads_back(
    spark: Any, tmp_path: Path
) -> None:
    # A table's rows converted to their columns' types (load._load_table_as) are staged
    # so in a small batch.
    rows = spark.createDataFrame(ROWS, SCHEMA).drop(TABLE, ERROR)
    assert stage_in_driver(rows, tmp_path / "table", None) is True
    assert sorted(p.name for p in (tmp_path / "table").iterdir()) == [
        "_SUCCESS", "part-00000.parquet"
    ]  # fmt: skip
    back = spark.read.schema(rows.schema).parquet(str(tmp_path / "table"))
    assert sorted(back.collect(), key=repr) == sorted(rows.collect(), key=repr)


def test_a_batch_of_many_text_columns_is_typed_without_counts(spark: Any, tmp_path: Path) -> None:
    # Planning the counts of that many columns costs what the typing's read would.
    names = [f"t{i}" for i in range(MAX_COUNTED_TEXTS + 1)]
    schema = ", ".join([f"{TABLE} string", f"{ERROR} string", *(f"{n} string" for n in names)])
    rows = spark.createDataFrame([("events", None, *names)], schema)
    _, counts = stage_flat(rows, tmp_path / "many", in_driver=True)
    assert "texts" not in counts
    _, counts = stage_flat(rows.drop(names[0]), tmp_path / "few", in_driver=True)
    assert counts["texts"] == {n: [1, 0] for n in names[1:]}
