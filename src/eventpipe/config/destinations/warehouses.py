"""The warehouses: ClickHouse, Snowflake, BigQuery and Redshift."""

from __future__ import annotations

import re
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from eventpipe.config.base import S3Config, sql_name
from eventpipe.config.destinations.base import TableDestinationConfig
from eventpipe.objectstore import check_s3_uri, is_s3


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
