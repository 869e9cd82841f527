"""Staging a destination's flattened rows (shape.stage_flat) on a real Spark session:
the counts and the days of the loaded rows are observed during the one write."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyspark.sql import functions as F

from eventpipe.processing.batch.shape import stage_flat
from eventpipe.reserved import ERROR, FILTERED, TABLE


def test_the_write_counts_rows_and_finds_the_days_of_those_it_keeps(
    spark: Any, tmp_path: Path
) -> None:
    rows = [
        ("page", None, "2026-11-21T10:00:00Z"),
        ("page", None, "2026-11-21T23:59:59Z"),
        ("click", None, "2026-11-22T00:00:00Z"),
        ("click", None, "0000-01-01T00:00:00Z"),  # a year Python's dates do not have
        ("", None, "2026-01-01T00:00:00Z"),  # no table: skipped, its day not kept
        (FILTERED, None, "2026-01-02T00:00:00Z"),
        (None, "template: no event_type", "2026-01-03T00:00:00Z"),  # failed
    ]
    frame = spark.createDataFrame(rows, f"`{TABLE}` string, `{ERROR}` string, ts string")
    flat = frame.select(
        TABLE, ERROR, F.try_to_timestamp("ts").alias("_timestamp"), F.lit(1).alias("n")
    )
    staged, counts = stage_flat(flat, tmp_path / "dst=warehouse")
    assert (counts["skipped"], counts["filtered"], counts["failed"]) == (1, 1, 1)
    assert sorted(counts["days"]) == ["0000-01-01", "2026-11-21", "2026-11-22"]
    assert staged.count() == 4
