"""The lakes: Parquet files, and Iceberg and Delta tables, local or on S3."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from eventpipe.config.base import (
    S3Config,
    Section,
    sql_name,
)
from eventpipe.config.destinations.base import TableDestinationConfig
from eventpipe.objectstore import check_s3_uri, is_s3
from eventpipe.paths import is_uri


class ParquetConfig(TableDestinationConfig):
    """A lake of Parquet files, a directory per table."""

    modes = ("batch",)  # a file per second is no lake
    upserts = False  # files are written, never updated

    type: Literal["parquet"] = "parquet"
    """The type: ``parquet``."""
    changes: Literal["append"] = "append"  # files are written, never updated
    """A source's changes: every change a row (``append`` only)."""
    path: str | None = None
    """The directory of the tables (default ``<data_dir>/parquet``); ``s3://bucket/prefix``
    (an S3-compatible store, reached as ``s3`` says); or another Hadoop-compatible URI
    Spark writes (``hdfs://nn/lake``, ``s3a://bucket/lake`` with Spark's S3 jars)."""
    partition_by: Literal["day", "none"] = "day"
    """``day`` (of ``_timestamp``, Hive-style ``day=YYYY-MM-DD``) or ``none``."""
    s3: S3Config | None = None
    """An ``s3://`` path: the store's endpoint, region and credentials (absent: the
    environment's AWS variables)."""

    @field_validator("path")
    @classmethod
    def _bucket_named(cls, value: str | None) -> str | None:
        return check_s3_uri(value) if value is not None and is_s3(value) else value

    @model_validator(mode="after")
    def _s3_for_s3(self) -> ParquetConfig:
        _s3_only_for_s3(self.path, self.s3)
        return self


class LakehouseConfig(TableDestinationConfig):
    """An open table format: tables of Parquet files with a transaction log
    (destinations/lakehouse.py)."""

    modes = ("batch",)  # a commit per second would make a table of tiny files

    path: str | None = None
    """The directory the tables live under, a table per ``table_name_template`` result
    (default ``<data_dir>/<type>``), or ``s3://bucket/prefix`` (an S3-compatible store,
    reached as ``s3`` says)."""
    partition_by: Literal["day", "none"] = "day"
    """``day``: partitioned by the day of ``_timestamp`` (UTC); ``none``: not partitioned."""
    s3: S3Config | None = None
    """An ``s3://`` path: the store's endpoint, region and credentials (absent: the
    environment's AWS variables)."""

    @model_validator(mode="before")
    @classmethod
    def _no_metering(cls, data: Any) -> Any:
        if isinstance(data, dict) and "metering" in data:
            raise ValueError(
                "metering keeps each key's newest version by deleting older rows across "
                "two tables in one transaction, which table formats cannot; meter into a "
                "duckdb or postgres destination"
            )
        return data

    @field_validator("path", mode="before")
    @classmethod
    def _local_or_s3(cls, value: Any) -> Any:
        if isinstance(value, str) and is_s3(value):
            return check_s3_uri(value)
        if isinstance(value, str) and is_uri(value):
            raise ValueError(
                "a local directory or s3://bucket/prefix (the formats' libraries write "
                "the tables; other URIs would need Spark's connector jars)"
            )
        return value

    @model_validator(mode="after")
    def _s3_for_s3(self) -> LakehouseConfig:
        _s3_only_for_s3(self.path, self.s3)
        return self


def _s3_only_for_s3(path: str | None, s3: S3Config | None) -> None:
    if s3 is not None and not (path and is_s3(path)):
        raise ValueError("s3: says how an s3:// path is reached; path is not one")


class IcebergCatalogConfig(Section):
    """Where an Iceberg destination's tables are registered (pyiceberg's catalogs)."""

    type: Literal["sql", "rest"] = "sql"
    """``sql``: pyiceberg's SQL catalog, on SQLite (the default) or PostgreSQL; ``rest``:
    an Iceberg REST catalog (Polaris, Nessie, Gravitino, Lakekeeper, Unity...)."""
    uri: str | None = Field(default=None, repr=False)
    """sql: ``sqlite:////path/catalog.db`` (default ``<data_dir>/iceberg_catalog.db``) or
    ``postgresql://user:${PGPASSWORD}@host/db``; rest: the catalog's URL."""
    properties: dict[str, str] = Field(default_factory=dict, repr=False)
    """More of pyiceberg's catalog properties (rest: ``credential``, ``token``,
    ``warehouse``...); put secrets in environment variables."""
    namespace: str | None = None
    """The catalog namespace of the tables (default: the destination's id)."""

    @field_validator("namespace")
    @classmethod
    def _namespace_name(cls, value: str | None) -> str | None:
        if value is not None:
            sql_name(value, "namespace")
        return value

    @model_validator(mode="after")
    def _rest_needs_uri(self) -> IcebergCatalogConfig:
        if self.type == "rest" and not self.uri:
            raise ValueError("catalog type rest needs uri: the catalog's URL")
        return self


class IcebergConfig(LakehouseConfig):
    """Apache Iceberg tables, committed through pyiceberg."""

    type: Literal["iceberg"] = "iceberg"
    """The type: ``iceberg``."""
    catalog: IcebergCatalogConfig = IcebergCatalogConfig()
    """The catalog the tables are registered in."""


class DeltaConfig(LakehouseConfig):
    """Delta Lake tables, committed through delta-rs (``deltalake``)."""

    type: Literal["delta"] = "delta"
    """The type: ``delta``."""
