"""The destination registry: every type the config accepts has an entry, its settings
model is the config's, and the pipeline's questions (tables, days, files, modes) are
answered from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eventpipe.config import (
    TYPES,
    Config,
    DuckDBConfig,
    HttpConfig,
    ParquetConfig,
    PostgresConfig,
)
from eventpipe.destinations.http import HttpSink
from eventpipe.destinations.registry import (
    KINDS,
    REPLACES_DAYS,
    Resources,
    kind,
    open_destination,
)
from eventpipe.locks import FileLocks


def _lent(config: Config) -> Resources:
    def no_spark() -> Any:
        raise AssertionError("a destination not written by Spark started a session")

    return Resources(locks=FileLocks(config.layout.locks), spark=no_spark)


def test_every_configurable_type_is_registered_with_its_settings_model() -> None:
    assert set(TYPES) == set(KINDS)
    for name, entry in KINDS.items():
        assert entry.settings is TYPES[name]
        assert entry.name == name


def test_what_each_type_can_do() -> None:
    sink = HttpConfig(url="https://api.example.com/events")
    lake = ParquetConfig(partition_by="day")
    remote = ParquetConfig(path="s3a://bucket/lake", partition_by="day")
    on_s3 = ParquetConfig(path="s3://bucket/lake", partition_by="day")
    assert not kind(sink).tables
    tables = ("duckdb", "postgres", "clickhouse", "snowflake", "bigquery", "redshift", "parquet",
              "iceberg", "delta")  # fmt: skip
    assert all(KINDS[t].tables for t in tables)
    assert kind(lake).can_replace_days(lake)
    assert not kind(remote).can_replace_days(remote)  # renames need a local file system
    assert not kind(on_s3).can_replace_days(on_s3)
    assert not kind(sink).can_replace_days(sink)
    assert set(REPLACES_DAYS) == set(tables)
    streams = {t for t, k in KINDS.items() if "stream" in k.modes}
    assert streams == {"duckdb", "postgres", "clickhouse", "snowflake", "bigquery", "redshift",
                       "http", "ga4"}  # fmt: skip
    upserts = {t for t, k in KINDS.items() if k.upserts}
    assert upserts == {"duckdb", "postgres", "clickhouse", "snowflake", "bigquery", "redshift",
                       "iceberg", "delta"}  # fmt: skip
    assert {t for t, k in KINDS.items() if k.meters} == {"duckdb", "postgres"}


def test_a_duckdb_destination_opens_on_its_file(tmp_path: Path) -> None:
    config = Config(data_dir=tmp_path)
    dest = DuckDBConfig()
    opened = open_destination("warehouse", dest, config, _lent(config))
    found = kind(dest).file
    assert found is not None
    assert found(dest, config) == config.layout.warehouse
    assert opened.describe("events") is None  # type: ignore[union-attr]  # a real, empty file


def test_a_sink_opens_as_a_sink_with_the_settings_its_tasks_take(tmp_path: Path) -> None:
    config = Config(data_dir=tmp_path)
    dest = HttpConfig(url="https://api.example.com/events", max_parallel_requests=8,
                      retry_max_elapsed_seconds=2.0)  # fmt: skip
    sink = open_destination("api", dest, config, _lent(config))
    assert isinstance(sink, HttpSink)
    settings = sink.settings(progress="p", run="r1", tasks=4, hold_seconds=5.0).settings
    assert (settings.destination, settings.url, settings.parallel) == ("api", dest.url, 2)
    assert settings.hold_seconds == 2.0  # never longer than the retries themselves
    postgres = PostgresConfig(dsn="postgresql://u@h/db")
    assert kind(postgres).tables
    assert kind(postgres).file is None
