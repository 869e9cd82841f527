"""The destination types: what ``type:`` names, its settings, how one is opened, and
what it can do.

The pipeline asks this registry, never a type's name: whether a destination has tables
(or is a sink that sends events), whether reprocess can replace its days, which local
file holds its tables. The settings model (config/destinations/) says which modes a
type runs in, whether it upserts and whether it meters; the checks of eventpipe.yaml
read the same. Adding a destination type is its settings model, its module and tests,
and one entry here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eventpipe.config import (
    TYPES,
    BigQueryConfig,
    ClickHouseConfig,
    Config,
    DatabaseConfig,
    DeltaConfig,
    DestinationConfig,
    DuckDBConfig,
    Ga4Config,
    HttpConfig,
    IcebergConfig,
    ParquetConfig,
    PostgresConfig,
    RedshiftConfig,
    S3Config,
    SnowflakeConfig,
    TableDestinationConfig,
)
from eventpipe.locks import Locks
from eventpipe.objectstore import Location, is_s3
from eventpipe.paths import is_uri

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from eventpipe.destinations.base import Opened

SparkFactory = Callable[[], "SparkSession"]
"""Starts (or returns) the Spark session, for destinations written by Spark."""


@dataclass(frozen=True)
class Resources:
    """What the pipeline lends a destination it opens."""

    locks: Locks
    """The data directory's locks (eventpipe.state.locks), for types without locks of
    their own: one patch of a table at a time."""
    spark: SparkFactory
    """The Spark session, for types written by Spark."""


@dataclass(frozen=True)
class Kind:
    settings: type[DestinationConfig]
    """The model of its keys in eventpipe.yaml."""
    open: Callable[[str, Any, Config, Resources], Opened]
    """Opens one, given its id, its settings (of the model above), the config and what
    the pipeline lends it."""
    replaces_days: Callable[[Any], bool] | None = None
    """Whether reprocess can replace the rows of a day, as configured; None: never."""
    file: Callable[[Any, Config], Path] | None = None
    """The local file that holds the tables (queried read-only), for single-file ones."""

    @property
    def name(self) -> str:
        return next(t for t, model in TYPES.items() if model is self.settings)

    @property
    def tables(self) -> bool:
        """Events land in tables; otherwise the type is a sink: they are sent."""
        return self.settings.tables

    @property
    def modes(self) -> tuple[str, ...]:
        return self.settings.modes

    @property
    def upserts(self) -> bool:
        return issubclass(self.settings, TableDestinationConfig) and self.settings.upserts

    @property
    def meters(self) -> bool:
        return issubclass(self.settings, DatabaseConfig)

    def can_replace_days(self, dest: DestinationConfig) -> bool:
        return self.replaces_days is not None and self.replaces_days(dest)


def _duckdb_file(dest: DuckDBConfig, config: Config) -> Path:
    return Path(dest.path) if dest.path else config.layout.warehouse


def _open_duckdb(dest_id: str, dest: DuckDBConfig, config: Config, lent: Resources) -> Opened:
    from eventpipe.destinations.duckdb import DuckDBDestination

    return DuckDBDestination(
        dest_id, _duckdb_file(dest, config), lent.locks, dest.query_timeout_seconds
    )


def _open_postgres(dest_id: str, dest: PostgresConfig, config: Config, lent: Resources) -> Opened:
    from eventpipe.destinations.postgres import PostgresDestination

    return PostgresDestination(
        dest_id,
        dest.dsn,
        dest.db_schema,
        query_dsn=dest.query_dsn,
        lock_timeout_seconds=dest.lock_timeout_seconds,
    )


def _open_clickhouse(
    dest_id: str, dest: ClickHouseConfig, config: Config, lent: Resources
) -> Opened:
    from eventpipe.destinations.clickhouse import ClickHouseDestination
    from eventpipe.destinations.clickhouse.types import mapped_types

    return ClickHouseDestination(
        dest_id,
        dest.url,
        lent.locks,
        database=dest.database,
        user=dest.user,
        password=dest.password,
        query_user=dest.query_user,
        query_password=dest.query_password,
        merge_after_load=dest.merge_after_load,
        timeout_seconds=dest.timeout_seconds,
        column_types=mapped_types(dest.mappings),
        cluster=dest.cluster,
    )


def _open_snowflake(dest_id: str, dest: SnowflakeConfig, config: Config, lent: Resources) -> Opened:
    from eventpipe.destinations.snowflake import SnowflakeDestination

    return SnowflakeDestination(
        dest_id, lent.locks, account=dest.account, user=dest.user, password=dest.password,
        database=dest.database, schema=dest.db_schema, warehouse=dest.warehouse,
        role=dest.role, query_role=dest.query_role, host=dest.host, port=dest.port,
        protocol=dest.protocol, timeout_seconds=dest.timeout_seconds,
    )  # fmt: skip


def _open_bigquery(dest_id: str, dest: BigQueryConfig, config: Config, lent: Resources) -> Opened:
    from eventpipe.destinations.bigquery import BigQueryDestination

    return BigQueryDestination(
        dest_id, lent.locks, project=dest.project, dataset=dest.dataset,
        location=dest.location, credentials_file=dest.credentials_file,
        query_credentials_file=dest.query_credentials_file, endpoint=dest.endpoint,
        storage_endpoint=dest.storage_endpoint, timeout_seconds=dest.timeout_seconds,
        appends=dest.appends or ("storage_write" if dest.mode == "stream" else "load_job"),
    )  # fmt: skip


def _open_redshift(dest_id: str, dest: RedshiftConfig, config: Config, lent: Resources) -> Opened:
    from eventpipe.destinations.redshift import RedshiftDestination

    return RedshiftDestination(
        dest_id, lent.locks, dsn=dest.dsn, staging=_location(dest.staging, dest.s3),
        iam_role=dest.iam_role, schema=dest.db_schema, region=dest.region,
        query_dsn=dest.query_dsn, timeout_seconds=dest.timeout_seconds,
    )  # fmt: skip


def _open_parquet(dest_id: str, dest: ParquetConfig, config: Config, lent: Resources) -> Opened:
    from eventpipe.destinations.parquet import ParquetDestination, SparkParquetDestination

    if dest.path is not None and is_s3(dest.path):  # eventpipe's own S3 client
        from eventpipe.destinations.parquet_s3 import S3ParquetDestination

        return S3ParquetDestination(
            dest_id, _location(dest.path, dest.s3), lent.locks, config.layout.tmp,
            partition_by=dest.partition_by,
        )  # fmt: skip
    if dest.path is not None and is_uri(dest.path):  # written by Spark's Hadoop client
        return SparkParquetDestination(
            dest_id, dest.path, lent.locks, lent.spark, partition_by=dest.partition_by
        )
    root = Path(dest.path) if dest.path else config.layout.root / "parquet"
    return ParquetDestination(dest_id, root, lent.locks, dest.partition_by)


def _location(path: str, s3: S3Config | None) -> Location:
    return Location.of(path, (s3 or S3Config()).settings())


def _lake_root(dest: IcebergConfig | DeltaConfig, config: Config) -> Location:
    """Absolute: Iceberg records its tables' locations as URIs in the catalog."""
    if dest.path is not None and is_s3(dest.path):
        return _location(dest.path, dest.s3)
    return Location.of(Path(dest.path) if dest.path else config.layout.root / dest.type)


def iceberg_catalog(dest: IcebergConfig, config: Config) -> dict[str, str]:
    """pyiceberg's catalog properties for ``dest``: its SQL catalog on SQLite under the
    data directory unless configured; PostgreSQL through psycopg 3 (eventpipe's driver)."""
    uri = dest.catalog.uri
    if dest.catalog.type == "sql":
        uri = uri or f"sqlite:///{(config.layout.root / 'iceberg_catalog.db').absolute()}"
        for plain in ("postgresql://", "postgres://"):
            if uri.startswith(plain):
                uri = "postgresql+psycopg://" + uri.removeprefix(plain)
    assert uri is not None  # a rest catalog's is required
    return {"type": dest.catalog.type, "uri": uri, **dest.catalog.properties}


def _open_iceberg(dest_id: str, dest: IcebergConfig, config: Config, lent: Resources) -> Opened:
    from eventpipe.destinations.iceberg import IcebergDestination

    return IcebergDestination(dest_id, _lake_root(dest, config), lent.locks,
                              iceberg_catalog(dest, config), dest.catalog.namespace or dest_id,
                              dest.partition_by)  # fmt: skip


def _open_delta(dest_id: str, dest: DeltaConfig, config: Config, lent: Resources) -> Opened:
    from eventpipe.destinations.delta import DeltaDestination

    return DeltaDestination(dest_id, _lake_root(dest, config), lent.locks, dest.partition_by)


def _open_http(dest_id: str, dest: HttpConfig, config: Config, lent: Resources) -> Opened:
    from eventpipe.destinations.http import HttpSink

    return HttpSink(dest_id, dest)


def _open_ga4(dest_id: str, dest: Ga4Config, config: Config, lent: Resources) -> Opened:
    from eventpipe.destinations.http import Ga4Sink

    return Ga4Sink(dest_id, dest)


def _always(dest: DestinationConfig) -> bool:
    return True


def _local_day_partitions(dest: ParquetConfig) -> bool:
    """Day partitions replaced by renaming directories: a local lake partitioned by day
    (an object store has no rename, Spark's Hadoop client no journal of its moves)."""
    return dest.partition_by == "day" and not is_uri(dest.path or "")


KINDS: dict[str, Kind] = {
    "duckdb": Kind(DuckDBConfig, _open_duckdb, _always, _duckdb_file),
    "postgres": Kind(PostgresConfig, _open_postgres, _always),
    "clickhouse": Kind(ClickHouseConfig, _open_clickhouse, _always),
    "snowflake": Kind(SnowflakeConfig, _open_snowflake, _always),
    "bigquery": Kind(BigQueryConfig, _open_bigquery, _always),
    "redshift": Kind(RedshiftConfig, _open_redshift, _always),
    "parquet": Kind(ParquetConfig, _open_parquet, _local_day_partitions),
    "iceberg": Kind(IcebergConfig, _open_iceberg, _always),
    "delta": Kind(DeltaConfig, _open_delta, _always),
    "http": Kind(HttpConfig, _open_http),
    "ga4": Kind(Ga4Config, _open_ga4),
}

REPLACES_DAYS = tuple(name for name, k in KINDS.items() if k.replaces_days is not None)
"""The types whose days reprocess can replace (some only as configured: parquet)."""


def kind(dest: DestinationConfig) -> Kind:
    return KINDS[dest.type]


def open_destination(
    dest_id: str, dest: DestinationConfig, config: Config, lent: Resources
) -> Opened:
    """The destination ``dest_id`` of ``config``, opened: its tables, or a sink."""
    return kind(dest).open(dest_id, dest, config, lent)
