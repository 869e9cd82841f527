"""DuckDB and PostgreSQL: databases with transactions, which can meter usage."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from eventpipe.config.base import sql_name
from eventpipe.config.destinations.base import TableDestinationConfig
from eventpipe.config.rules import MeteringConfig
from eventpipe.paths import is_uri


class DatabaseConfig(TableDestinationConfig):
    """A database destination: transactions, so rows can be replaced (metering)."""

    stream_interval_seconds: float = Field(default=0.5, gt=0)
    """stream: how often a micro-batch starts (when there are new events); a micro-batch
    that takes longer is followed at once. 0.5 s: a load is one transaction, and an
    event waits for the next micro-batch to start (docs/stream.md, Performance)."""
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
