"""From an HTTP post to Parquet files that other readers (pyarrow, DuckDB) read."""

from __future__ import annotations

from typing import Any

import duckdb
import pyarrow.dataset as ds

from eventpipe.processing.batch.job import process_once
from eventpipe.processing.runtime.pipeline import Runtime
from tests.e2e.test_batch_pipeline import _post, _seal


def test_batches_become_day_partitioned_files_with_new_columns_in_new_files(
    start_collector: Any, spark: Any
) -> None:
    c = start_collector(destinations={"lake": {
        "type": "parquet", "table_name_template": "{{ event_type }}"}})  # fmt: skip
    _post(c, [
        {"event_type": "click", "n": 1, "_timestamp": "2026-11-20T23:59:00Z"},
        {"event_type": "click", "n": 2, "_timestamp": "2026-11-21T00:01:00Z"},
        {"event_type": "view", "url": "/a", "_timestamp": "2026-11-21T10:00:00Z"},
    ], server=True)  # fmt: skip
    _seal(c)
    report = process_once(c.config, spark)
    assert report is not None
    assert report.loaded == {("lake", "click"): 2, ("lake", "view"): 1}
    root = c.layout.root / "parquet"
    days = sorted(p.name for p in (root / "click").glob("day=*"))
    assert days == ["day=2026-11-20", "day=2026-11-21"]
    # A second batch brings a new column: it appears in the new files only.
    _post(c, [{"event_type": "click", "n": 3, "color": "red",
               "_timestamp": "2026-11-21T12:00:00Z"}], server=True)  # fmt: skip
    _seal(c)
    process_once(c.config, spark)
    merged = duckdb.sql(
        f"SELECT n, color, day FROM read_parquet('{root}/click/**/*.parquet', "
        "hive_partitioning = true, union_by_name = true) ORDER BY n"
    ).fetchall()
    assert [(n, color, str(day)) for n, color, day in merged] == [
        (1, None, "2026-11-20"), (2, None, "2026-11-21"), (3, "red", "2026-11-21")
    ]  # fmt: skip
    dataset = ds.dataset(str(root / "view"), format="parquet", partitioning="hive")
    assert dataset.to_table(columns=["url"]).column("url").to_pylist() == ["/a"]
    lake = Runtime(c.config).open_destination("lake")
    assert lake.query("SELECT count(*) FROM click")[1] == [(3,)]
    assert not any((root / ".staging").glob("*"))  # nothing half-written left behind


def test_a_lake_at_a_hadoop_uri_is_written_by_spark_and_queried_with_spark_sql(
    start_collector: Any, spark: Any, tmp_path: Any
) -> None:
    lake_uri = (tmp_path / "lake").as_uri()  # file://: Hadoop's local file system
    lake = {"type": "parquet", "path": lake_uri, "table_name_template": "{{ event_type }}"}
    c = start_collector(destinations={"lake": lake})
    _post(c, [
        {"event_type": "click", "n": 1, "_timestamp": "2026-11-20T23:59:00Z"},
        {"event_type": "click", "n": 2.5, "_timestamp": "2026-11-21T00:01:00Z"},
    ], server=True)  # fmt: skip
    _seal(c)
    report = process_once(c.config, spark)
    assert report is not None
    assert report.loaded == {("lake", "click"): 2}
    days = sorted(p.name for p in (tmp_path / "lake" / "click").glob("day=*"))
    assert days == ["day=2026-11-20", "day=2026-11-21"]
    opened = Runtime(c.config).open_destination("lake")
    names, rows = opened.query("SELECT n, day FROM click ORDER BY n")
    assert (names, rows) == (["n", "day"], [(1.0, "2026-11-20"), (2.5, "2026-11-21")])
    # The same files, read by another reader: pyarrow's dataset with Hive partitions.
    dataset = ds.dataset(str(tmp_path / "lake" / "click"), format="parquet", partitioning="hive")
    assert sorted(dataset.to_table(columns=["n"]).column("n").to_pylist()) == [1.0, 2.5]
    assert opened.query("SELECT count(*) FROM _eventpipe_loads")[1] == [(1,)]
