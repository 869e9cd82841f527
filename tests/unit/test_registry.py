"""The destination registry: every type the config accepts has an entry, and the
pipeline's questions (tables, days, files) are answered from it."""

from __future__ import annotations

import typing
from pathlib import Path

from eventpipe.config import Config, DestinationConfig
from eventpipe.destinations.registry import KINDS, REPLACES_DAYS, kind, open_destination


def test_every_configurable_type_is_registered() -> None:
    types = typing.get_args(DestinationConfig.model_fields["type"].annotation)
    assert set(types) == set(KINDS)


def test_what_each_type_can_do() -> None:
    sink = DestinationConfig(type="http", url="https://api.example.com/events")
    lake = DestinationConfig(type="parquet", partition_by="day")
    remote = DestinationConfig(type="parquet", path="s3a://bucket/lake", partition_by="day")
    assert not kind(sink).tables
    assert all(KINDS[t].tables for t in ("duckdb", "postgres", "parquet"))
    assert kind(lake).can_replace_days(lake)
    assert not kind(remote).can_replace_days(remote)  # renames need a local file system
    assert not kind(sink).can_replace_days(sink)
    assert set(REPLACES_DAYS) == {"duckdb", "postgres", "parquet"}


def test_a_duckdb_destination_opens_on_its_file(tmp_path: Path) -> None:
    config = Config(data_dir=tmp_path)
    dest = DestinationConfig(type="duckdb")
    opened = open_destination("warehouse", dest, config, spark=lambda: None)  # type: ignore[arg-type,return-value]
    assert kind(dest).file is not None
    assert kind(dest).file(dest, config) == config.layout.warehouse
    assert opened.describe("events") is None  # a real DuckDB file, empty
