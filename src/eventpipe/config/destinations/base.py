"""What every destination takes (:class:`DestinationConfig`) and what every destination
with tables takes (:class:`TableDestinationConfig`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from eventpipe.config.base import (
    SafeKeyId,
    Section,
    regular_expression,
)
from eventpipe.config.contracts import SchemaContract
from eventpipe.config.rules import EnrichmentRule, MappingConfig, MeteringConfig, TransformStep
from eventpipe.errors import ConfigError


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
    """stream: how often a micro-batch starts (when there are new events); a micro-batch
    that takes longer is followed at once. 1 s, and 0.5 s for duckdb and postgres, whose
    loads are transactions that cost little (docs/stream.md, Performance)."""
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
