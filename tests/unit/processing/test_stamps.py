"""Timestamp text converted while a stream's micro-batch is staged (processing/batch/
stamps.py): the staged twins are the load's own conversion, a table whose only
conversions they hold loads without the conversion pass, and anything else still takes
the pass."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

from eventpipe.collector.enrich import EnrichSettings, RequestContext, enrich_batch
from eventpipe.config import parse_config
from eventpipe.processing.batch.job import process_stream_batch
from eventpipe.processing.batch.schema_cache import SchemaCache
from eventpipe.processing.batch.shape import stage_flat, staged_table
from eventpipe.processing.batch.stamps import ASIDE, with_stamps
from eventpipe.processing.runtime.pipeline import Runtime
from eventpipe.reserved import ERROR, ROW, STAMPED, TABLE
from eventpipe.schema.casts import cast_to
from eventpipe.schema.types import DataType
from tests.conftest import read_lines

TEXTS = ["2026-11-30T10:00:00.123456Z", "2026-11-30 11:00:00+02:00", None, "2026-11-30"]


def _staged(spark: Any, where: Path, texts: list[str | None]) -> tuple[Any, dict[str, Any]]:
    rows = [("ticks", None, i, text, i * 10) for i, text in enumerate(texts)]
    frame = spark.createDataFrame(
        rows, f"{TABLE} string, {ERROR} string, {ROW} long, at string, n long"
    )
    return stage_flat(frame, where, in_driver=True, to_stamp=["at", "n", "absent"])


def test_the_staged_twins_are_the_loads_own_conversion(spark: Any, tmp_path: Path) -> None:
    staged, counts = _staged(spark, tmp_path, TEXTS)

    # Only a text column has a twin (``n`` is a number, ``absent`` not in the batch).
    assert counts["stamps"] == {"at": [f"{STAMPED}0", 0]}
    [main] = (tmp_path / "flat" / f"{TABLE}=ticks").glob("*.parquet")
    assert f"{STAMPED}0" not in pq.read_schema(main).names  # the staged rows are as before
    assert f"{STAMPED}0" not in staged.columns
    table = staged_table(staged, tmp_path, "ticks", counts)
    assert table.stamps is not None
    assert table.stamps.twins == {"at": f"{STAMPED}0"}

    spark_types = {f.name: f.dataType for f in table.frame.schema.fields}
    targets = {"at": DataType.TIMESTAMP, "n": DataType.INT64, ROW: DataType.INT64}
    out = tmp_path / "table=ticks"
    files = with_stamps(table.files, table.stamps, targets, targets, spark_types, out)

    assert files is not None
    assert all(path.parent == out for path in files)
    converted = table.frame.select(ROW, cast_to(F.col("at"), DataType.TIMESTAMP,
                                                spark_types["at"]).alias("at"))  # fmt: skip
    expected = {row[ROW]: row.at for row in converted.collect()}
    loaded = spark.read.parquet(*map(str, files))
    assert {row[ROW]: row.at for row in loaded.collect()} == expected
    assert sorted(loaded.columns) == sorted(table.frame.columns)
    assert expected[0] is not None
    assert expected[2] is None


def test_a_value_that_does_not_convert_leaves_the_column_to_the_pass(
    spark: Any, tmp_path: Path
) -> None:
    staged, counts = _staged(spark, tmp_path, [*TEXTS, "not a time"])

    assert counts["stamps"] == {"at": [f"{STAMPED}0", 1]}
    table = staged_table(staged, tmp_path, "ticks", counts)
    assert table.stamps is not None
    assert table.stamps.twins == {}
    spark_types = {f.name: f.dataType for f in table.frame.schema.fields}
    targets = {"at": DataType.TIMESTAMP}
    assert with_stamps(table.files, table.stamps, targets, targets, spark_types,
                       tmp_path / "out") is None  # fmt: skip
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("targets", "batch"),
    [
        # The batch typed it as text (some values are not timestamp text): the contract
        # decides in the pass what becomes of them.
        ({"at": DataType.TIMESTAMP}, {"at": DataType.STRING}),
        # Another conversion beside it.
        ({"at": DataType.TIMESTAMP, "n": DataType.STRING},
         {"at": DataType.TIMESTAMP, "n": DataType.INT64}),
    ],
)  # fmt: skip
def test_a_conversion_the_twins_do_not_hold_is_left_to_the_pass(
    spark: Any, tmp_path: Path, targets: dict[str, DataType], batch: dict[str, DataType]
) -> None:
    staged, counts = _staged(spark, tmp_path, TEXTS)
    table = staged_table(staged, tmp_path, "ticks", counts)
    spark_types = {f.name: f.dataType for f in table.frame.schema.fields}
    assert with_stamps(table.files, table.stamps, targets, batch, spark_types,
                       tmp_path / "out") is None  # fmt: skip


def test_twins_staged_beside_rows_of_other_tables_stay_with_their_rows(
    spark: Any, tmp_path: Path
) -> None:
    rows = [("a", None, 1, "2026-11-30T10:00:00Z"), ("b", None, 2, "2026-11-30T11:00:00Z"),
            ("a", None, 3, "2026-11-30T12:00:00Z")]  # fmt: skip
    frame = spark.createDataFrame(rows, f"{TABLE} string, {ERROR} string, {ROW} long, at string")
    stage_flat(frame, tmp_path, in_driver=True, to_stamp=["at"])
    for table, ids in (("a", [1, 3]), ("b", [2])):
        [aside] = (tmp_path / ASIDE / f"{TABLE}={table}").glob("*.parquet")
        assert pq.read_table(aside).column(ROW).to_pylist() == ids


def _events(path: Path, stamps: list[str]) -> Path:
    """Server events of type ``tick`` with ``sent_at`` text, as the collector logs them."""
    ctx = RequestContext(key_id="web", browser=False, source_ip="127.0.0.1", user_agent=None,
                         received_at=datetime.now(UTC),
                         timestamp="2026-11-30T10:00:00Z")  # fmt: skip
    items = [{"event_type": "tick", "n": i, "sent_at": s} for i, s in enumerate(stamps)]
    batch = enrich_batch(items, ctx, EnrichSettings(max_event_bytes=1 << 20, anonymize_ip=False))
    path.write_bytes(b"".join(batch.lines))
    return path


def test_a_streams_micro_batches_convert_its_timestamp_text_as_they_stage(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = parse_config({"data_dir": str(tmp_path / "data"), "destinations": {"live": {
        "type": "duckdb", "mode": "stream", "path": str(tmp_path / "live.duckdb"),
        "table_name_template": "{{ event_type }}"}}}, source="test", env={})  # fmt: skip
    runtime = Runtime(config, spark).only(["live"])
    schemas = SchemaCache()
    batches = [
        ["2026-11-30T10:00:00Z", "2026-11-30T10:00:01.5Z"],
        ["2026-11-30T10:00:02Z", "2026-11-30T12:00:03+02:00"],
        ["2026-11-30T10:00:04Z", "soon"],  # not a time: the pass, as without twins
    ]
    passes = []
    for epoch, stamps in enumerate(batches):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="eventpipe.processing"):
            process_stream_batch(runtime, epoch, [_events(tmp_path / f"{epoch}.jsonl", stamps)],
                                 schemas)  # fmt: skip
        passes.append(any("live.tick: convert and stage" in r.getMessage()
                          for r in caplog.records))  # fmt: skip
        assert schemas.stamped == {"sent_at"}

    # The first converts in the pass (nothing known yet); the second as it stages; the
    # third has a value that does not convert, which its pass sends to failed/ as ever.
    assert passes == [True, False, True]
    with duckdb.connect(str(tmp_path / "live.duckdb"), read_only=True) as db:
        loaded = db.execute("SELECT n, sent_at FROM tick ORDER BY sent_at").fetchall()
    at = datetime(2026, 11, 30, 10, tzinfo=UTC)
    assert [(n, when.astimezone(UTC)) for n, when in loaded] == [
        (0, at), (1, at + timedelta(seconds=1.5)), (0, at + timedelta(seconds=2)),
        (1, at + timedelta(seconds=3)), (0, at + timedelta(seconds=4)),
    ]  # fmt: skip
    failed = [e for e in read_lines(sorted((tmp_path / "data" / "failed").rglob("*.log")))
              if e.get("event", {}).get("sent_at") == "soon"]  # fmt: skip
    assert len(failed) == 1
    assert "column sent_at (TIMESTAMP) cannot take soon" in failed[0]["error"]
