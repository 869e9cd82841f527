"""Destination settings: one model per ``type:``, each taking only its own keys.

Every destination takes the keys of :class:`DestinationConfig` (its mode, which events
it takes, how they are shaped); a type adds its own, and says what it can do in class
attributes that the checks here read (``modes``, ``upserts``, ``tables``) rather than
its name. ``destinations/registry.py`` maps the same ``type:`` to the code that opens
one. A destination of a new type is a model in one of this package's modules (with the
``type`` literal), a line in :data:`AnyDestination`, its module under
``eventpipe/destinations/`` and a line in the registry.

``base.py`` holds what every destination takes; ``databases.py`` (DuckDB, PostgreSQL),
``warehouses.py`` (ClickHouse, Snowflake, BigQuery, Redshift), ``lakes.py`` (Parquet,
Iceberg, Delta) and ``sinks.py`` (HTTP APIs, GA4) the types.
"""

from __future__ import annotations

from typing import Annotated, get_args

from pydantic import Field

from eventpipe.config.destinations.base import DestinationConfig, TableDestinationConfig
from eventpipe.config.destinations.databases import DatabaseConfig, DuckDBConfig, PostgresConfig
from eventpipe.config.destinations.lakes import (
    DeltaConfig,
    IcebergCatalogConfig,
    IcebergConfig,
    LakehouseConfig,
    ParquetConfig,
)
from eventpipe.config.destinations.sinks import MAX_GA4_PARAMS, Ga4Config, HttpConfig, SinkConfig
from eventpipe.config.destinations.warehouses import (
    BigQueryConfig,
    ClickHouseConfig,
    RedshiftConfig,
    SnowflakeConfig,
)

__all__ = [
    "MAX_GA4_PARAMS",
    "TYPES",
    "AnyDestination",
    "BigQueryConfig",
    "ClickHouseConfig",
    "DatabaseConfig",
    "DeltaConfig",
    "DestinationConfig",
    "DuckDBConfig",
    "Ga4Config",
    "HttpConfig",
    "IcebergCatalogConfig",
    "IcebergConfig",
    "LakehouseConfig",
    "ParquetConfig",
    "PostgresConfig",
    "RedshiftConfig",
    "SinkConfig",
    "SnowflakeConfig",
    "TableDestinationConfig",
]

AnyDestination = Annotated[
    DuckDBConfig
    | PostgresConfig
    | ClickHouseConfig
    | SnowflakeConfig
    | BigQueryConfig
    | RedshiftConfig
    | ParquetConfig
    | IcebergConfig
    | DeltaConfig
    | HttpConfig
    | Ga4Config,
    Field(discriminator="type"),
]
"""A destination's settings, the model chosen by its ``type:``."""

TYPES: dict[str, type[DestinationConfig]] = {
    get_args(model.model_fields["type"].annotation)[0]: model
    for model in get_args(get_args(AnyDestination)[0])
}
"""Each ``type:`` and its settings model."""
