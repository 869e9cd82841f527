"""Destination settings: one model per ``type:``, each taking only its own keys.

Every destination takes the keys of :class:`DestinationConfig` (its mode, which events
it takes, how they are shaped); a type adds its own, and says what it can do in class
attributes that the checks here read (``modes``, ``upserts``, ``tables``) rather than
its name. ``destinations/registry.py`` maps the same ``type:`` to the code that opens
one. A destination of a new type is a model here (with the ``type`` literal), a line in
:data:`AnyDestination`, its module under ``destinations/`` and a line in the registry.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import Field, field_validator, model_validator

from eventpipe.config.base import (
    FieldPath,
    S3Config,
    SafeKeyId,
    Section,
    regular_expression,
    sql_name,
)
from eventpipe.config.contracts import SchemaContract
from eventpipe.config.rules import EnrichmentRule, MappingConfig, MeteringConfig, TransformStep
from eventpipe.errors import ConfigError
from eventpipe.objectstore import check_s3_uri, is_s3
from eventpipe.paths import is_uri


class DestinationConfig(Section):
    """What every destination takes: its mode, which events it takes and how they are
    shaped. Subclassed once per type."""

    modes: ClassVar[tuple[str, ...]] = ("batch", "stream")
    """The modes the type runs in."""
    tables: ClassVar[bool] = True
    """Whether events land in tables (loaded from staged files) or are sent (a sink)."""

    type: str
    """Destination type: ``duckdb``, ``postgres``, ``clickhouse``, ``snowflake``,
    ``bigquery``, ``redshift``, ``parquet``, ``iceberg``, ``delta``, ``http`` (an ingestion
    API such as DataSet's addEvents, docs/http.md) or ``ga4``."""
    mode: Literal["batch", "stream"] = "batch"
    """``batch``: loaded from sealed segments, every ``batch_period_seconds``; ``stream``
    (duckdb, postgres, clickhouse, http): loaded within seconds, the log read as it is written."""
    stream_interval_seconds: float = Field(default=1.0, gt=0)
    """stream: how often a micro-batch starts (when there are new events)."""
    only_keys: tuple[SafeKeyId, ...] | None = None
    """API key ids whose events go here. Absent: all keys."""
    namespace: str = ".*"
    """A regular expression matched against each event's table name (found anywhere in
    it; anchor with ``^...$``): events whose table does not match skip this destination,
    counted as filtered."""
    transforms: tuple[TransformStep, ...] = ()
    """Steps applied in order to the events of this destination, after lookups and
    before mapping: ``filter``, ``set``, ``drop``, ``python``."""
    table_name_template: str = "events"
    """Table per event: text with ``{{ path.to.field }}`` and ``{{ _timestamp |
    date('%Y_%m') }}``; sanitised like a column name; empty means skip."""
    enrichment: tuple[EnrichmentRule, ...] = ()
    """Lookup rules for this destination, applied after the implicit browser rules."""
    mappings: MappingConfig = MappingConfig()
    """Field rules: move, remove, cast, constant; ``keep_unmapped``."""
    max_columns: int = Field(default=1000, ge=2)
    """Columns per table at most; further fields of an event go into its
    ``_unmapped_data`` JSON column, never dropped."""
    on_violation: Literal["flag", "reject", "quarantine", "discard_value"] = "flag"
    """What an event that breaks its tracking plan does here (``contracts.plans``;
    docs/contracts.md): ``flag``, loaded with ``eventn_ctx_contract_violations``;
    ``reject``, to failed/ with its violations; ``quarantine``, loaded into its table's
    side table ``<table>_quarantine``, with its violations; ``discard_value``, loaded
    without the values that broke it, with its violations."""
    max_poison_events: int = Field(default=100, ge=1)
    """A load the database refuses (or a run that fails on its data) is retried in
    smaller parts to find the events that cause it (they go to failed/); beyond this many
    in one batch the destination is taken as broken, not the events: it stops (the
    others go on) and tries later."""

    @property
    def metered(self) -> MeteringConfig | None:
        """Usage metering's settings, for a destination that meters; None otherwise."""
        return None

    @field_validator("table_name_template")
    @classmethod
    def _template_compiles(cls, value: str) -> str:
        """Refused here, not when Spark first runs it."""
        from eventpipe.schema.templates import Template

        try:
            Template.parse(value)
        except ConfigError as exc:
            raise ValueError(exc.message) from None
        return value

    @field_validator("namespace")
    @classmethod
    def _namespace_compiles(cls, value: str) -> str:
        return regular_expression(value, "namespace")

    @model_validator(mode="after")
    def _mode_of_the_type(self) -> DestinationConfig:
        if self.mode not in self.modes:
            raise ValueError(f"mode {self.mode}: {self.type} takes {' or '.join(self.modes)}")
        return self


class TableDestinationConfig(DestinationConfig):
    """A destination with tables: rows loaded atomically, table by table."""

    upserts: ClassVar[bool] = True
    """Whether loads can upsert by a primary key."""

    primary_key: tuple[str, ...] = ()
    """Columns of the primary key; loads then upsert, the newest ``_timestamp`` winning."""
    query_timeout_seconds: float = Field(default=60.0, gt=0)
    """How long one ``eventpipe query`` on this destination may run before it is
    cancelled: a reader holds what loads need (DuckDB's file, a table's lock)."""
    changes: Literal["apply", "append"] = "apply"
    """A source's changes (docs/cdc.md): ``apply``: by key, the table the source's (each
    key's last change); ``append``: every change a row, the history (``_op``, ``_lsn``,
    ``_seq`` say what and in which order)."""
    schema_contract: SchemaContract = SchemaContract()
    """What may change in its tables as events arrive (dlt's vocabulary): ``tables``
    (``evolve|freeze|discard_row``), ``columns`` and ``data_type``
    (``evolve|freeze|discard_row|discard_value``), one word for all three, and
    ``per_table`` exceptions. Default: tables and columns evolve, types freeze (a value
    its column cannot take exactly fails its event). docs/contracts.md."""

    @model_validator(mode="after")
    def _key_where_rows_can_be_replaced(self) -> TableDestinationConfig:
        if self.primary_key and not self.upserts:
            raise ValueError(
                f"primary_key: {self.type} cannot upsert; duckdb, postgres, clickhouse, "
                "iceberg and delta can"
            )
        return self


class DatabaseConfig(TableDestinationConfig):
    """A database destination: transactions, so rows can be replaced (metering)."""

    metering: MeteringConfig | None = None
    """Usage metering instead of table_name_template (docs/metering.md)."""

    @property
    def metered(self) -> MeteringConfig | None:
        return self.metering

    @model_validator(mode="after")
    def _metering_in_batches(self) -> DatabaseConfig:
        if self.metering is not None and self.mode != "batch":
            raise ValueError("metering replaces rows of earlier batches: it takes mode batch")
        return self


class DuckDBConfig(DatabaseConfig):
    """An embedded DuckDB database file (the default destination)."""

    type: Literal["duckdb"] = "duckdb"
    """The type: ``duckdb``."""
    path: str | None = None
    """The database file (default ``<data_dir>/warehouse.duckdb``)."""

    @field_validator("path", mode="before")
    @classmethod
    def _local(cls, value: Any) -> Any:
        if isinstance(value, str) and is_uri(value):
            raise ValueError("duckdb takes a local file, not a URI")
        return value


class PostgresConfig(DatabaseConfig):
    """A PostgreSQL server."""

    type: Literal["postgres"] = "postgres"
    """The type: ``postgres``."""
    dsn: str = Field(repr=False)
    """The connection string, ``postgresql://user:${PGPASSWORD}@host:5432/db`` (put
    secrets in environment variables; the DSN is never logged)."""
    db_schema: str = Field(default="public", alias="schema")
    """The schema eventpipe creates its tables in (created if missing)."""
    query_dsn: str | None = Field(default=None, repr=False)
    """The connection ``eventpipe query`` uses: a user granted only ``SELECT`` on the
    schema (docs/destinations.md). Absent: ``dsn``'s user, in a read-only transaction
    and with statements refused that reach files, programs or other sessions."""
    lock_timeout_seconds: float = Field(default=5.0, gt=0)
    """How long one attempt to change a table waits for readers' locks; the change tries
    again for up to a minute, then the run ends to be retried."""

    MAX_COLUMNS: ClassVar[int] = 1600
    """PostgreSQL's limit of columns in a table (``MaxHeapAttributeNumber``)."""

    @model_validator(mode="after")
    def _schema_name(self) -> PostgresConfig:
        sql_name(self.db_schema, "schema")
        return self

    @model_validator(mode="after")
    def _columns_the_server_holds(self) -> PostgresConfig:
        if self.max_columns > self.MAX_COLUMNS:
            raise ValueError(
                f"max_columns {self.max_columns}: a PostgreSQL table holds at most "
                f"{self.MAX_COLUMNS} columns"
            )
        return self


class ClickHouseConfig(TableDestinationConfig):
    """A ClickHouse server, over its HTTP interface (docs/destinations.md)."""

    type: Literal["clickhouse"] = "clickhouse"
    """The type: ``clickhouse``."""
    url: str
    """The server's HTTP interface, ``http://host:8123`` (``https://`` for TLS)."""
    database: str = "default"
    """The database eventpipe creates its tables in (created if missing)."""
    user: str = "default"
    """The user eventpipe loads as."""
    password: str = Field(default="", repr=False)
    """Its password: ``${CLICKHOUSE_PASSWORD}`` (from the environment; never logged)."""
    query_user: str | None = None
    """The user ``eventpipe query`` reads as: one in a ``readonly`` profile
    (docs/destinations.md). Absent: ``user``, with ``readonly=1``."""
    query_password: str = Field(default="", repr=False)
    """``query_user``'s password, from the environment like ``password``."""
    merge_after_load: bool = True
    """With ``primary_key``: after each load, merge the partitions it touched
    (``OPTIMIZE ... FINAL``) so that every reader sees one row per key at once.
    ``false``: ClickHouse merges them in its own time; read with ``FINAL``."""
    timeout_seconds: float = Field(default=300.0, gt=0)
    """How long one statement (a load's insert, say) may take before it is retried."""
    cluster: str | None = Field(default=None, min_length=1)
    """A cluster of the server's ``remote_servers`` (one shard and its replicas): tables
    made ``ON CLUSTER``, replicated (docs/destinations.md). ``url`` names one replica."""

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")) or "@" in value.split("/")[2]:
            raise ValueError(
                f"url {value!r}: write http(s)://host:8123, the credentials in user and password"
            )
        return value

    @model_validator(mode="after")
    def _database_name(self) -> ClickHouseConfig:
        sql_name(self.database, "database")
        return self


class SnowflakeConfig(TableDestinationConfig):
    """A Snowflake account, through Snowflake's own connector (docs/destinations.md)."""

    type: Literal["snowflake"] = "snowflake"
    """The type: ``snowflake``."""
    account: str = Field(min_length=1)
    """The account identifier (``myorg-myaccount``)."""
    user: str = Field(min_length=1)
    """The user eventpipe loads as."""
    password: str = Field(default="", repr=False)
    """Its password: ``${SNOWFLAKE_PASSWORD}`` (from the environment; never logged)."""
    database: str = Field(min_length=1)
    """The database (it must exist: eventpipe creates schemas, not databases)."""
    db_schema: str = Field(default="EVENTS", alias="schema")
    """The schema eventpipe creates its tables in (created if missing)."""
    warehouse: str | None = None
    """The virtual warehouse loads and queries run on; absent: the user's default."""
    role: str | None = None
    """The role eventpipe loads as; absent: the user's default."""
    query_role: str | None = None
    """The role ``eventpipe query`` runs as: one granted only ``SELECT`` on the schema
    (docs/destinations.md). Absent: ``role``, with statements other than reads refused."""
    host: str | None = None
    """The host to connect to, when not the account's own (a private link, or a server
    that speaks Snowflake's protocol in tests)."""
    port: int | None = Field(default=None, ge=1, le=65535)
    """The port, with ``host``."""
    protocol: Literal["https", "http"] = "https"
    """``http`` only for a local stand-in: Snowflake itself takes https."""
    timeout_seconds: float = Field(default=300.0, gt=0)
    """How long one statement (a load's COPY, say) may run before it is cancelled."""

    @model_validator(mode="after")
    def _names(self) -> SnowflakeConfig:
        sql_name(self.database, "database")
        sql_name(self.db_schema, "schema")
        return self


class BigQueryConfig(TableDestinationConfig):
    """A BigQuery dataset, through Google's own client (docs/destinations.md)."""

    type: Literal["bigquery"] = "bigquery"
    """The type: ``bigquery``."""
    project: str = Field(min_length=1, max_length=64)
    """The Google Cloud project the dataset and the jobs belong to."""
    dataset: str = Field(min_length=1, max_length=1024, pattern=r"^[A-Za-z0-9_]+$")
    """The dataset eventpipe creates its tables in (created if missing)."""
    location: str = "US"
    """Where the dataset is made (``US``, ``EU``, ``europe-west3``...), and its jobs run."""
    credentials_file: str | None = None
    """A service account's JSON key file. Absent: Google's application default
    credentials (``GOOGLE_APPLICATION_CREDENTIALS``, the metadata server)."""
    query_credentials_file: str | None = None
    """The service account ``eventpipe query`` runs as: one granted only
    ``roles/bigquery.dataViewer`` and ``jobUser`` (docs/destinations.md). Absent: the
    loads' credentials, with statements other than reads refused."""
    endpoint: str | None = None
    """BigQuery's API at another address (a private endpoint, or a stand-in in tests:
    without credentials it is then called anonymously)."""
    storage_endpoint: str | None = None
    """The Storage Write API at another address, ``host:port`` (a stand-in in tests:
    without credentials it is then reached in plaintext)."""
    appends: Literal["load_job", "storage_write"] | None = None
    """How rows without a key are appended: ``load_job`` (free; BigQuery allows 1,500 a
    table a day) or ``storage_write`` (the Storage Write API's pending streams: billed
    by the GiB, no such quota). Absent: load jobs in batch mode, the Storage Write API
    in stream mode."""
    timeout_seconds: float = Field(default=300.0, gt=0)
    """How long one job (a load, a merge) may take before the run stops to retry it."""


class RedshiftConfig(TableDestinationConfig):
    """An Amazon Redshift cluster or Serverless workgroup, over PostgreSQL's protocol,
    loaded by ``COPY`` from files staged on S3 (docs/destinations.md)."""

    type: Literal["redshift"] = "redshift"
    """The type: ``redshift``."""
    dsn: str = Field(repr=False)
    """The connection string,
    ``postgresql://user:${REDSHIFT_PASSWORD}@cluster.region.redshift.amazonaws.com:5439/dev``
    (put secrets in environment variables; the DSN is never logged)."""
    db_schema: str = Field(default="public", alias="schema")
    """The schema eventpipe creates its tables in (created if missing)."""
    query_dsn: str | None = Field(default=None, repr=False)
    """The connection ``eventpipe query`` uses: a user granted only ``SELECT`` on the
    schema (docs/destinations.md). Absent: ``dsn``'s user, in a read-only transaction
    and with statements other than reads refused."""
    staging: str
    """``s3://bucket/prefix`` the batches' files are put under for ``COPY`` (each load's
    deleted once it is in): a bucket the cluster's role can read, reached by eventpipe as
    ``s3`` says."""
    iam_role: str
    """The role the cluster reads ``staging`` as: its ARN, or ``default`` (the
    cluster's default role)."""
    region: str | None = None
    """The staging bucket's region, when it is not the cluster's (``COPY ... REGION``)."""
    s3: S3Config | None = None
    """How eventpipe reaches ``staging``: endpoint, region and credentials (absent: the
    environment's AWS variables)."""
    timeout_seconds: float = Field(default=300.0, gt=0)
    """How long one statement (a load's COPY, say) may run before it is cancelled."""

    MAX_COLUMNS: ClassVar[int] = 1600
    """Redshift's limit of columns in a table."""

    @field_validator("iam_role")
    @classmethod
    def _role_arn(cls, value: str) -> str:
        if not re.fullmatch(r"arn:aws[\w-]*:iam::\d{12}:role/[\w+=,.@/-]+|default", value):
            raise ValueError(
                f"iam_role {value!r}: the role's ARN (arn:aws:iam::123456789012:role/name) "
                "or default (the cluster's default role)"
            )
        return value

    @field_validator("staging")
    @classmethod
    def _staging_on_s3(cls, value: str) -> str:
        if not is_s3(value):
            raise ValueError(f"staging {value!r}: Redshift copies from S3: s3://bucket/prefix")
        return check_s3_uri(value)

    @model_validator(mode="after")
    def _names_and_columns(self) -> RedshiftConfig:
        sql_name(self.db_schema, "schema")
        if self.max_columns > self.MAX_COLUMNS:
            raise ValueError(
                f"max_columns {self.max_columns}: a Redshift table holds at most "
                f"{self.MAX_COLUMNS} columns"
            )
        return self


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


class SinkConfig(DestinationConfig):
    """A destination that takes events in HTTP requests (docs/http.md): a sink, no tables;
    how its requests are retried and bounded."""

    tables = False

    max_lifetime_seconds: float = Field(default=5.0, gt=0)
    """A session's buffer is sent when this old, full or not."""
    max_parallel_requests: int = Field(default=8, ge=1)
    """Requests in flight at once, in all (one per session at most)."""
    retry_initial_seconds: float = Field(default=1.0, gt=0)
    """The first wait before a retry (doubling, with jitter)."""
    retry_max_seconds: float = Field(default=30.0, gt=0)
    """The longest wait between two retries."""
    retry_max_elapsed_seconds: float = Field(default=300.0, gt=0)
    """How long a request is retried before its events go to failed/."""
    max_buffer_bytes: int = Field(default=64_000_000, ge=1024)
    """Event bytes held in memory at most, buffered and in flight, per Spark task."""


class HttpConfig(SinkConfig):
    """An ingestion API that takes events in HTTP requests (docs/http.md): a sink."""

    type: Literal["http"] = "http"
    """The type: ``http``."""
    url: str
    """Where events are POSTed (``https://app.scalyr.com/api/addEvents``)."""
    headers: dict[str, str] = Field(default_factory=dict, repr=False)
    """Request headers; put secrets in environment variables
    (``Authorization: "Bearer ${DATASET_TOKEN}"``)."""
    format: Literal["dataset", "ndjson"] = "dataset"
    """``dataset`` (addEvents: session, sessionInfo, events with ts and attrs) or
    ``ndjson`` (one JSON object per line)."""
    group_by: tuple[str, ...] = ()
    """The fields (flattened column names, or dotted paths) whose values make the
    session key; they move from the events into the session info."""
    max_payload_bytes: int = Field(default=6_000_000, ge=1024)
    """A request's payload at most, before compression."""
    gzip: bool = True
    """Compress request bodies (Content-Encoding: gzip)."""

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"url {value!r}: write http:// or https://host/path")
        return value


class Ga4Config(SinkConfig):
    """Google Analytics 4's Measurement Protocol (docs/http.md, GA4): each event one of
    GA4's, a request per client of at most 25 events."""

    type: Literal["ga4"] = "ga4"
    """The type: ``ga4``."""
    measurement_id: str = Field(pattern=r"^G-[A-Z0-9]+$")
    """The web stream's measurement id (``G-XXXXXXXXXX``)."""
    api_secret: str = Field(repr=False, min_length=1)
    """The stream's Measurement Protocol API secret: ``${GA4_API_SECRET}`` (never logged)."""
    url: str = "https://www.google-analytics.com"
    """GA4's collection host (``https://region1.google-analytics.com``: EU only)."""
    client_id: FieldPath = "user.anonymous_id"
    """The field holding the browser's client id (``_ga`` cookie's id): GA4's
    ``client_id``, required; an event without one fails with the reason."""
    user_id: FieldPath | None = "user.id"
    """The field holding the signed-in user's id (GA4's ``user_id``); none: not sent."""
    event_name: FieldPath = "event_type"
    """The field holding the event's name in GA4 (letters, digits, ``_``, 40 at most)."""
    params: tuple[FieldPath, ...] = ()
    """The fields sent as the event's parameters (25 at most, as GA4 takes). Empty: the
    event's fields but the three above and what the collector adds to each event
    (``eventn_ctx``, ``source_ip``, ``src``, ``api_key``, ``_timestamp``)."""
    validate_events: bool = True
    """Check each request at GA4's validation endpoint (``/debug/mp/collect``) first:
    the events it refuses go to failed/ with its message (``/mp/collect`` itself answers
    2xx and drops them silently). Costs one more request per payload."""

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"url {value!r}: write https://host (GA4's collection host)")
        return value.rstrip("/")

    @field_validator("params")
    @classmethod
    def _at_most_25(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if len(value) > MAX_GA4_PARAMS:
            raise ValueError(f"params: GA4 takes {MAX_GA4_PARAMS} per event, not {len(value)}")
        return value


MAX_GA4_PARAMS = 25
"""Parameters per GA4 event at most."""


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
