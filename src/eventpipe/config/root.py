"""The whole configuration, one section per part of eventpipe."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from eventpipe.config.base import DestinationId, Section
from eventpipe.config.collector import ApiKey, IncomingConfig, ServerConfig
from eventpipe.config.console import ConsoleConfig
from eventpipe.config.contracts import ContractsConfig
from eventpipe.config.destinations import (
    AnyDestination,
    ClickHouseConfig,
    DeltaConfig,
    DestinationConfig,
    DuckDBConfig,
    IcebergConfig,
    ParquetConfig,
    PostgresConfig,
)
from eventpipe.config.pipeline import (
    ArchiveConfig,
    EnrichmentConfig,
    LoggingConfig,
    ProcessingConfig,
    SparkConfig,
    StateConfig,
)
from eventpipe.config.sources import AnySource
from eventpipe.errors import ConfigError, redacted
from eventpipe.objectstore import is_s3
from eventpipe.paths import DataLayout, is_uri

GLOB_CHARACTERS = "*?[]{}\\"
"""What Hadoop's file system globs treat as patterns in a path."""


def _warehouse() -> dict[str, AnyDestination]:
    return {"warehouse": DuckDBConfig()}


class Config(Section):
    """The whole eventpipe configuration."""

    data_dir: Path = Path("data")
    """Where eventpipe keeps everything: incoming/, failed/, archive/, the state store.
    Without * ? [ ] { } or \\ in it: Spark reads paths as patterns."""
    server: ServerConfig = ServerConfig()
    """The HTTP collector."""
    incoming: IncomingConfig = IncomingConfig()
    """The durable log of incoming events."""
    api_keys: tuple[ApiKey, ...] = ()
    """Keys that may send events. With no config file, a development pair is generated."""
    logging: LoggingConfig = LoggingConfig()
    """Operator logs."""
    processing: ProcessingConfig = ProcessingConfig()
    """The batch pipeline."""
    archive: ArchiveConfig = ArchiveConfig()
    """The raw archive of processed segments."""
    spark: SparkConfig = SparkConfig()
    """Spark settings for the pipeline."""
    enrichment: EnrichmentConfig = EnrichmentConfig()
    """Lookup enrichment (ip_lookup database, implicit browser rules)."""
    state: StateConfig = StateConfig()
    """The state store: run history, load statuses, code versions per day."""
    destinations: dict[DestinationId, AnyDestination] = Field(default_factory=_warehouse)
    """Destinations by id. Absent: one DuckDB warehouse at ``<data_dir>/warehouse.duckdb``."""
    sources: dict[DestinationId, AnySource] = Field(default_factory=dict)
    """Readers beside the HTTP collector, by id (``eventpipe read ID``): a source's events
    are logged under its id as their key id (``only_keys: [ID]`` routes them)."""
    contracts: ContractsConfig = ContractsConfig()
    """Tracking plans, and whether the collector checks events against them."""
    console: ConsoleConfig = ConsoleConfig()
    """The web console: what arrives, where it went, what failed (docs/console.md)."""

    @model_validator(mode="after")
    def _console_token_is_no_event_key(self) -> Config:
        token = self.console.token
        secrets = {s.get_secret_value() for k in self.api_keys for s in (k.js, k.server) if s}
        if token is not None and token.get_secret_value() in secrets:
            raise ValueError(
                "console.token is one of the api keys' secrets: the console's token must "
                "be its own (an event key is public in every browser that sends events)"
            )
        return self

    @model_validator(mode="after")
    def _sources_apart_from_keys(self) -> Config:
        for source_id in self.sources:
            if source_id in {key.id for key in self.api_keys}:
                raise ValueError(
                    f"source {source_id!r} has the id of an api key: a source's events are "
                    "logged under its id, so the two must differ"
                )
        return self

    def source(self, source_id: str) -> AnySource:
        if source_id not in self.sources:
            known = ", ".join(self.sources) or "none"
            raise ConfigError(f"no source {source_id!r} (configured: {known})")
        return self.sources[source_id]

    @model_validator(mode="after")
    def _paths_spark_reads_as_written(self) -> Config:
        """Spark reads the paths it is given as glob patterns: a data directory named
        ``runs[2]`` would match ``runs2``, and its segments would not be found."""
        for name, path in (("data_dir", self.data_dir), ("processing.work_dir",
                                                          self.processing.work_dir)):  # fmt: skip
            if path is not None and (found := set(str(path)) & set(GLOB_CHARACTERS)):
                raise ValueError(
                    f"{name} {str(path)!r} has {' '.join(sorted(found))} in it, which Spark "
                    "reads as a pattern: choose a path without * ? [ ] { } \\"
                )
        return self

    @model_validator(mode="after")
    def _keys_are_distinct(self) -> Config:
        seen_ids: set[str] = set()
        seen_secrets: set[str] = set()
        for key in self.api_keys:
            if key.id in seen_ids:
                raise ValueError(f"api key id {key.id!r} is used twice")
            seen_ids.add(key.id)
            for secret in (key.js, key.server):
                if secret is None:
                    continue
                value = secret.get_secret_value()
                if value in seen_secrets:
                    raise ValueError(f"key {key.id!r} reuses a secret of another key or kind")
                seen_secrets.add(value)
        return self

    @model_validator(mode="after")
    def _what_spark_connect_runs(self) -> Config:
        """With ``spark.remote`` this process is a Spark Connect client: it has no JVM of
        its own, and no driver to run a stream's micro-batches in."""
        if "spark.remote" not in self.spark.settings:
            return self
        if "master" in self.spark.model_fields_set:
            raise ValueError(
                "spark: master and remote exclude each other (a Spark Connect server "
                "has its own master)"
            )
        for dest_id, dest in self.destinations.items():
            if dest.mode == "stream":
                raise ValueError(
                    f"destination {dest_id!r}: mode stream needs a classic Spark session "
                    "(its micro-batches run in this process's driver), not spark.remote"
                )
            if (isinstance(dest, ParquetConfig) and dest.path and is_uri(dest.path)
                    and not is_s3(dest.path)):  # fmt: skip
                raise ValueError(
                    f"destination {dest_id!r}: a parquet path that is a URI is written "
                    "through this process's JVM, which a Spark Connect client has not"
                )
        return self

    @model_validator(mode="after")
    def _destinations_apart(self) -> Config:
        """Two destinations that would write the same tables with the same events: a
        batch and a stream DuckDB destination without a path each loaded every event
        into ``warehouse.duckdb``'s ``events`` (6 rows for 3 events), and status showed
        nothing wrong."""
        seen: dict[tuple[str, ...], str] = {}
        for dest_id, dest in self.destinations.items():
            place = self._place(dest_id, dest)
            if place is None:
                continue
            for other_id in (o for p, o in seen.items() if p[:-1] == place):
                other = self.destinations[other_id]
                same_keys = (dest.only_keys is None or other.only_keys is None
                             or set(dest.only_keys) & set(other.only_keys))  # fmt: skip
                if (
                    same_keys
                    and dest.table_name_template == other.table_name_template
                    and dest.namespace == other.namespace
                ):
                    raise ValueError(
                        f"destinations {other_id!r} and {dest_id!r} write the same tables "
                        f"({place[1]}) from the same events: each would load every event; "
                        "give one a path (or schema) of its own, or other only_keys, "
                        "namespace or table_name_template"
                    )
            seen[(*place, dest_id)] = dest_id
        return self

    def _place(self, dest_id: str, dest: AnyDestination) -> tuple[str, ...] | None:
        """Where a destination's tables are: its kind and file, directory, schema or
        Iceberg namespace (the destination's id unless configured)."""
        if isinstance(dest, PostgresConfig):
            return ("postgres", f"{redacted(dest.dsn)} schema {dest.db_schema}")
        if isinstance(dest, ClickHouseConfig):
            return ("clickhouse", f"{dest.url.rstrip('/')} database {dest.database}")
        if isinstance(dest, DuckDBConfig | ParquetConfig | IcebergConfig | DeltaConfig):
            default = "warehouse.duckdb" if isinstance(dest, DuckDBConfig) else dest.type
            if dest.path is not None and is_uri(dest.path):
                return (dest.type, dest.path)
            path = Path(dest.path) if dest.path else self.data_dir / default
            if isinstance(dest, IcebergConfig):  # tables by catalog namespace
                namespace = dest.catalog.namespace or dest_id
                return (dest.type, f"{path.absolute()} namespace {namespace}")
            return (dest.type, str(path.absolute()))
        return None

    @model_validator(mode="after")
    def _state_apart_from_destinations(self) -> Config:
        """The state tables (``runs``...) and a destination's tables (any name a template
        makes) must not share a schema."""
        if self.state.type != "postgres" or self.state.dsn is None:
            return self
        where = redacted(self.state.dsn)
        for dest_id, dest in self.destinations.items():
            if not isinstance(dest, PostgresConfig) or dest.db_schema != self.state.db_schema:
                continue
            if redacted(dest.dsn) == where:
                raise ValueError(
                    f"state.schema {self.state.db_schema!r} is destination {dest_id!r}'s "
                    "schema too: give the state store a schema of its own"
                )
        return self

    @property
    def layout(self) -> DataLayout:
        return DataLayout(self.data_dir, self.processing.work_dir)

    def destination(self, destination_id: str) -> DestinationConfig:
        """The destination ``destination_id``; ConfigError naming the configured ones."""
        if destination_id not in self.destinations:
            known = ", ".join(sorted(self.destinations))
            raise ConfigError(f"no destination {destination_id!r} (configured: {known})")
        return self.destinations[destination_id]


class LoadedConfig(Section):
    """A config and where it came from (for start-up messages)."""

    config: Config
    source: str
    """The file it was read from, or ``built-in defaults``."""
    embedded: bool
    """True when no file was found and built-in defaults apply."""
