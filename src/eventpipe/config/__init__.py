"""Configuration: eventpipe.yaml loaded into typed, frozen models.

Unknown keys and wrong types are rejected with the key's full path and what was expected
(``server.port: expected an integer, got 'eighty'``). Each field's docstring is its
documentation; ``reference.yaml`` (written by ``eventpipe init``) repeats them as
comments, and a test keeps the two in step.

Strings may name environment variables as ``${NAME}`` or ``${NAME:-default}``, so that
secrets stay out of the file. A variable that is not set is a configuration error.
Relative paths (``data_dir``) are relative to the working directory, as with most CLIs.

    base            what every section shares; checked ids, names, pointers
    collector       api_keys, server, incoming
    rules           a destination's lookups, field rules, transforms, metering
    destinations    a settings model per destination type (a discriminated union)
    pipeline        spark, processing, archive, state, enrichment, logging
    root            Config: the whole file
    loading         reading the file, environment variables, error messages

Nothing here imports Spark or a destination's driver: the collector validates the same
file (a test keeps it so).
"""

from eventpipe.config.base import S3Config
from eventpipe.config.collector import ApiKey, IncomingConfig, ServerConfig
from eventpipe.config.destinations import (
    TYPES,
    AnyDestination,
    BigQueryConfig,
    ClickHouseConfig,
    DatabaseConfig,
    DeltaConfig,
    DestinationConfig,
    DuckDBConfig,
    Ga4Config,
    HttpConfig,
    IcebergCatalogConfig,
    IcebergConfig,
    LakehouseConfig,
    ParquetConfig,
    PostgresConfig,
    RedshiftConfig,
    SinkConfig,
    SnowflakeConfig,
    TableDestinationConfig,
)
from eventpipe.config.loading import (
    DEFAULT_CONFIG_PATH,
    format_validation_error,
    iter_fields,
    load_config,
    parse_config,
    with_dev_keys,
)
from eventpipe.config.pipeline import (
    ArchiveConfig,
    EnrichmentConfig,
    LoggingConfig,
    ProcessingConfig,
    SparkConfig,
    StateConfig,
)
from eventpipe.config.root import Config, LoadedConfig
from eventpipe.config.rules import (
    EnrichmentRule,
    FieldRule,
    MappingConfig,
    MeteringConfig,
    TransformStep,
)
from eventpipe.config.sources import AnySource, PostgresSourceConfig

__all__ = [
    "DEFAULT_CONFIG_PATH",
    "TYPES",
    "AnyDestination",
    "AnySource",
    "ApiKey",
    "ArchiveConfig",
    "BigQueryConfig",
    "ClickHouseConfig",
    "Config",
    "DatabaseConfig",
    "DeltaConfig",
    "DestinationConfig",
    "DuckDBConfig",
    "EnrichmentConfig",
    "EnrichmentRule",
    "FieldRule",
    "Ga4Config",
    "HttpConfig",
    "IcebergCatalogConfig",
    "IcebergConfig",
    "IncomingConfig",
    "LakehouseConfig",
    "LoadedConfig",
    "LoggingConfig",
    "MappingConfig",
    "MeteringConfig",
    "ParquetConfig",
    "PostgresConfig",
    "PostgresSourceConfig",
    "ProcessingConfig",
    "RedshiftConfig",
    "S3Config",
    "ServerConfig",
    "SinkConfig",
    "SnowflakeConfig",
    "SparkConfig",
    "StateConfig",
    "TableDestinationConfig",
    "TransformStep",
    "format_validation_error",
    "iter_fields",
    "load_config",
    "parse_config",
    "with_dev_keys",
]
