"""The destination types: what ``type:`` names, how each is opened, and what it can do.

The pipeline asks this registry, never a type's name: whether a destination has tables
(or is a sink that sends events), whether reprocess can replace its days, which local file
holds its tables. Adding a destination type is its module, its tests and one entry here
(and, for now, its keys in ``config.DestinationConfig``, which validates each type's
settings).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from eventpipe.config import Config, DestinationConfig
from eventpipe.paths import is_uri

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from eventpipe.destinations.base import Destination

SparkFactory = Callable[[], "SparkSession"]
"""Starts (or returns) the Spark session, for destinations written by Spark."""


@dataclass(frozen=True)
class Kind:
    name: str
    open: Callable[[str, DestinationConfig, Config, SparkFactory], Destination] | None
    """Opens a destination of this type; None: a sink without tables (events are sent,
    destinations/http.py)."""
    replaces_days: Callable[[DestinationConfig], bool] | None
    """Whether reprocess can replace the rows of a day, as configured; None: never."""
    file: Callable[[DestinationConfig, Config], Path] | None = None
    """The local file that holds the tables (queried read-only), for single-file ones."""

    @property
    def tables(self) -> bool:
        return self.open is not None

    def can_replace_days(self, dest: DestinationConfig) -> bool:
        return self.replaces_days is not None and self.replaces_days(dest)


def _duckdb_file(dest: DestinationConfig, config: Config) -> Path:
    return Path(dest.path) if dest.path else config.layout.warehouse


def _open_duckdb(
    dest_id: str, dest: DestinationConfig, config: Config, spark: SparkFactory
) -> Destination:
    from eventpipe.destinations.duckdb import DuckDBDestination

    return DuckDBDestination(dest_id, _duckdb_file(dest, config), config.layout.locks)


def _open_postgres(
    dest_id: str, dest: DestinationConfig, config: Config, spark: SparkFactory
) -> Destination:
    from eventpipe.destinations.postgres import PostgresDestination

    assert dest.dsn is not None  # checked by the config model
    return PostgresDestination(dest_id, dest.dsn, dest.db_schema)


def _open_parquet(
    dest_id: str, dest: DestinationConfig, config: Config, spark: SparkFactory
) -> Destination:
    from eventpipe.destinations.parquet import ParquetDestination, SparkParquetDestination

    locks = config.layout.locks
    if dest.path is not None and is_uri(dest.path):  # written by Spark's Hadoop client
        return SparkParquetDestination(
            dest_id, dest.path, locks, spark, partition_by=dest.partition_by
        )
    root = Path(dest.path) if dest.path else config.layout.root / "parquet"
    return ParquetDestination(dest_id, root, locks, dest.partition_by)


def _always(dest: DestinationConfig) -> bool:
    return True


def _local_day_partitions(dest: DestinationConfig) -> bool:
    """Day partitions replaced by renaming directories: a local lake partitioned by day."""
    return dest.partition_by == "day" and not is_uri(dest.path or "")


KINDS: dict[str, Kind] = {
    "duckdb": Kind("duckdb", _open_duckdb, _always, _duckdb_file),
    "postgres": Kind("postgres", _open_postgres, _always),
    "parquet": Kind("parquet", _open_parquet, _local_day_partitions),
    "http": Kind("http", None, None),
}

REPLACES_DAYS = tuple(name for name, k in KINDS.items() if k.replaces_days is not None)
"""The types whose days reprocess can replace (some only as configured: parquet)."""


def kind(dest: DestinationConfig) -> Kind:
    return KINDS[dest.type]


def open_destination(
    dest_id: str, dest: DestinationConfig, config: Config, spark: SparkFactory
) -> Destination:
    """The destination ``dest_id`` of ``config``, opened (a sink has none to open)."""
    opener = kind(dest).open
    if opener is None:
        raise ValueError(f"{dest_id} is an {dest.type} sink: it has no tables")
    return opener(dest_id, dest, config, spark)
