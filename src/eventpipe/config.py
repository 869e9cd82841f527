"""Configuration: YAML loaded into typed, frozen models.

Unknown keys and wrong types are rejected with the key's full path and what was expected
(``server.port: expected an integer, got 'eighty'``). Each field's docstring is its
documentation; ``reference.yaml`` (written by ``eventpipe init``) repeats them as comments,
and a test keeps the two in step.

Strings may name environment variables as ``${NAME}`` or ``${NAME:-default}``, so that
secrets stay out of the file. A variable that is not set is a configuration error.

Relative paths (``data_dir``) are relative to the working directory, as with most CLIs.

Length (over 500 lines): every section's model is here, next to the sections it is
checked against (keys against destinations, the state store's DSN against theirs), so
that the whole surface of ``eventpipe.yaml`` reads in one file beside reference.yaml.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import os
import re
import secrets
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from eventpipe.errors import ConfigError
from eventpipe.files import write_file
from eventpipe.origins import parse_origin
from eventpipe.paths import DataLayout, check_safe_id, is_uri

DEFAULT_CONFIG_PATH = Path("eventpipe.yaml")


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, use_attribute_docstrings=True, validate_default=True
    )


def _safe_key_id(value: str) -> str:
    return check_safe_id(value, "key id")


def _origin_pattern(value: str) -> str:
    if value != "*" and parse_origin(value, pattern=True) is None:
        raise ValueError(
            f"origin {value!r} is not an origin pattern: scheme://host[:port], where the "
            "scheme may be left out, the host may start with *. and the port may be *"
        )
    return value.rstrip("/").lower()


def _network(value: str) -> str:
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError as exc:
        raise ValueError(f"{value!r} is not an IP address or CIDR network") from exc
    return value


SafeKeyId = Annotated[str, AfterValidator(_safe_key_id)]
OriginPattern = Annotated[str, AfterValidator(_origin_pattern)]
Network = Annotated[str, AfterValidator(_network)]


class ApiKey(_Model):
    """One source of events: a browser (``js``) secret, a server secret, or both."""

    id: SafeKeyId
    """Stable name of the key. Recorded in each event as ``api_key`` and used in file names."""
    js: SecretStr | None = None
    """Browser key: accepted by ``POST /api/v1/event`` (``?token=`` or ``X-Auth-Token``)."""
    server: SecretStr | None = None
    """Server key: accepted by ``POST /api/v1/s2s/event`` only. Keep it secret."""
    origins: tuple[OriginPattern, ...] = ()
    """Browser origins allowed to use the js key (``https://shop.example.com``,
    ``https://*.example.com``, ``*``). Empty: any origin."""

    @model_validator(mode="after")
    def _has_a_secret(self) -> ApiKey:
        if self.js is None and self.server is None:
            raise ValueError("a key needs a 'js' secret, a 'server' secret, or both")
        for secret in (self.js, self.server):
            if secret is not None and len(secret.get_secret_value()) < 8:
                raise ValueError("secrets must be at least 8 characters long")
        return self


class ServerConfig(_Model):
    """The HTTP collector."""

    host: str = "127.0.0.1"
    """Address to listen on. Use 0.0.0.0 to accept events from other machines."""
    port: int = Field(default=8001, ge=0, le=65535)
    """TCP port (0: any free port, printed at start-up)."""
    trusted_proxies: tuple[Network, ...] = ()
    """Networks (CIDR) of reverse proxies whose X-Forwarded-For is believed. Empty: none."""
    anonymize_ip: bool = False
    """Zero the last octet of IPv4 and the last 80 bits of IPv6 before anything is written."""
    max_header_bytes: int = Field(default=65_536, ge=4096)
    """Largest request line plus headers; larger gets 431 and the connection is closed."""
    max_body_bytes: int = Field(default=1_000_000, ge=1024)
    """Largest request body; larger gets 413 without the rest being read."""
    max_event_bytes: int = Field(default=51_200, ge=256)
    """Largest single event as stored (after enrichment); larger events are rejected alone."""
    # At most 200: orjson refuses to write documents nested deeper than 254 levels.
    max_json_depth: int = Field(default=64, ge=2, le=200)
    """Deepest nesting of objects and arrays in a body (the body itself is level 1)."""
    cors_max_age_seconds: int = Field(default=86_400, ge=0)
    """How long browsers may cache a CORS preflight answer."""
    shutdown_grace_seconds: float = Field(default=30.0, ge=0)
    """On SIGTERM/Ctrl-C, how long requests in flight may take to finish."""
    header_timeout_seconds: float = Field(default=10.0, gt=0)
    """How long a client may take to send a request's line and headers (from when it
    connects, or starts its next request); then 408 and the connection is closed."""
    body_timeout_seconds: float = Field(default=30.0, gt=0)
    """How long a client may take to send a request's whole body; then 408 and the
    connection is closed (a client that announces a body and sends it slowly, or never)."""
    max_connections: int = Field(default=2048, ge=1)
    """Open connections (and requests in progress) past which new requests get 503."""


class IncomingConfig(_Model):
    """The durable log of incoming events (``data/incoming``)."""

    rotate_seconds: float = Field(default=300.0, gt=0)
    """Seal the active segment of a key when it is this old (and not empty)."""
    max_segment_bytes: int = Field(default=100_000_000, ge=1024)
    """Seal the active segment of a key when it reaches this size."""
    max_backlog_bytes: int = Field(default=10_000_000_000, ge=0)
    """Above this many bytes of unprocessed segments and failed/ records, answer 503
    instead of accepting."""
    min_free_disk_bytes: int = Field(default=500_000_000, ge=0)
    """Below this much free disk under data_dir, answer 503 instead of accepting."""
    retry_after_seconds: int = Field(default=5, ge=1)
    """The Retry-After sent with 503 answers."""
    fsync: bool = True
    """Answer 200 only after fsync. Turn off only for throwaway benchmarks: 200 then no longer
    means the events survive a power cut."""


def _safe_destination_id(value: str) -> str:
    return check_safe_id(value, "destination id")


def _pointer(value: str) -> str:
    from eventpipe.schema.pointers import parse_pointer

    try:
        parse_pointer(value, where="pointer")
    except ConfigError as exc:
        raise ValueError(exc.message) from None
    return value


def _type_name(value: str) -> str:
    from eventpipe.schema.types import parse_type

    try:
        parse_type(value)
    except ConfigError as exc:
        raise ValueError(exc.message.removeprefix("type: ")) from None
    return value


Pointer = Annotated[str, AfterValidator(_pointer)]
TypeName = Annotated[str, AfterValidator(_type_name)]


class EnrichmentRule(_Model):
    """A lookup rule: ``{name: ip_lookup | user_agent_parse, from: /pointer, to: /pointer}``."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, use_attribute_docstrings=True, populate_by_name=True
    )

    name: Literal["ip_lookup", "user_agent_parse"]
    """``ip_lookup`` (geo of an IP address) or ``user_agent_parse``."""
    source: Pointer = Field(alias="from")
    """JSON pointer of the input string, e.g. ``/source_ip``."""
    to: Pointer
    """JSON pointer where the result object is written, e.g. ``/geo``."""


class FieldRule(_Model):
    """One mapping rule (seed 1): ``move``, ``remove``, ``cast`` or ``constant``."""

    action: Literal["move", "remove", "cast", "constant"]
    """What the rule does."""
    src: Pointer | None = None
    """JSON pointer of the field read (move, remove, cast)."""
    dst: Pointer | None = None
    """JSON pointer or column name written (move, constant)."""
    type: TypeName | None = None
    """Column type: BOOL, INT64, FLOAT64, TIMESTAMP, STRING or a SQL alias (required for
    cast, optional for move and constant)."""
    value: Any = None
    """The constant's value (constant)."""

    @model_validator(mode="after")
    def _fields_for_action(self) -> FieldRule:
        needs = {"move": ("src", "dst"), "remove": ("src",), "cast": ("src", "type"),
                 "constant": ("dst",)}[self.action]  # fmt: skip
        missing = [name for name in needs if getattr(self, name) is None]
        if missing:
            raise ValueError(f"action {self.action} needs {' and '.join(missing)}")
        return self


class MappingConfig(_Model):
    """Field rules applied before flattening (seed 1's mapping step)."""

    keep_unmapped: bool = True
    """Keep fields no rule names. ``false``: only moved, cast and constant fields (and
    ``_timestamp``) reach the table."""
    fields: tuple[FieldRule, ...] = ()
    """Rules, applied in order."""


_SQL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$")
_FIELD_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_PYTHON_FUNCTION = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")


def _field_path(value: str) -> str:
    if not _FIELD_PATH.match(value):
        raise ValueError(
            f"{value!r}: a field is a name or a dotted path of names (properties.usage_gb)"
        )
    return value


FieldPath = Annotated[str, AfterValidator(_field_path)]


class TransformStep(_Model):
    """One step of a destination's transforms (docs/transforms.md): exactly one of
    ``filter``, ``set``, ``drop`` or ``python``."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, use_attribute_docstrings=True, populate_by_name=True
    )

    filter: str | None = None
    """A Spark SQL boolean expression on the event (``properties.plan = 'pro'``): events
    for which it is not true are dropped for this destination (counted as filtered)."""
    assign: dict[FieldPath, str] | None = Field(default=None, alias="set")
    """Fields set to Spark SQL expressions: ``{usage_gb: "properties.usage_mb / 1024"}``;
    a dotted name sets a field of an object the event has."""
    drop: tuple[FieldPath, ...] | None = None
    """Fields removed (names or dotted paths)."""
    python: str | None = None
    """``package.module:function``: called with each Arrow record batch of events (or a
    pandas DataFrame, when its parameter is annotated so); returns the events to keep,
    changed or not. Its exceptions send the batch's events to failed/."""

    @model_validator(mode="after")
    def _one_kind(self) -> TransformStep:
        given = [k for k in ("filter", "assign", "drop", "python") if getattr(self, k)]
        if len(given) != 1:
            named = ", ".join("set" if k == "assign" else k for k in given) or "none"
            raise ValueError(
                f"a transform step takes exactly one of filter, set, drop, python (got {named})"
            )
        if self.python is not None and not _PYTHON_FUNCTION.match(self.python):
            raise ValueError(f"python {self.python!r}: write package.module:function")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in ("filter", "set", "drop", "python")
                    if getattr(self, "assign" if k == "set" else k))  # fmt: skip


class MeteringConfig(_Model):
    """Usage metering (seed 5, docs/metering.md): duplicates removed, corrections applied,
    each event attributed to its products."""

    products: Path | None = None
    """The product catalogue: a .csv (product_uid, event_name, filters as JSON) or a
    .yaml/.yml list of {product_uid, event_name, filters}."""
    products_table: str | None = None
    """Or a table of the destination with the same columns (``filters``: JSON text, or
    JSON/jsonb; a table without it has no filters), read at the start of each run."""
    key: FieldPath = "transaction_id"
    """The field that identifies an event: its duplicates and corrections share it."""
    order_by: FieldPath = "received_at"
    """Among events of one key, the newest by this field wins (``_timestamp`` for an event
    without it)."""
    window_by: FieldPath = "metered_at"
    """The time that places an event in the lookback window (``_timestamp`` without it)."""
    lookback_days: int = Field(default=90, ge=1)
    """Events are compared with those of the last this many days; older ones are loaded
    as they are, compared with nothing (seed 5's bound on the scan)."""
    table: str = "usage_events"
    """The table of classified events: one row per event x product."""
    unclassified_table: str = "unclassified"
    """The table of events no product matches (never dropped)."""

    def window_start(self, started: datetime) -> datetime:
        """The first moment of the lookback window of a run started at ``started``."""
        return started - timedelta(days=self.lookback_days)

    @model_validator(mode="after")
    def _consistent(self) -> MeteringConfig:
        if (self.products is None) == (self.products_table is None):
            raise ValueError("give the catalogue as products (a file) or products_table")
        if self.products_table is not None and not re.fullmatch(
            r"[A-Za-z_][A-Za-z0-9_$]{0,62}", self.products_table
        ):
            raise ValueError(f"products_table {self.products_table!r}: a table name is expected")
        for name in (self.table, self.unclassified_table):
            if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", name):
                raise ValueError(f"table {name!r}: use a-z, 0-9 and _ (at most 63)")
        if self.table == self.unclassified_table:
            raise ValueError("table and unclassified_table must differ")
        return self


class DestinationConfig(_Model):
    """Where events go: ``type`` duckdb, postgres, parquet or http, in ``mode`` batch, or
    stream (duckdb, postgres, http)."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, use_attribute_docstrings=True, validate_default=True,
        populate_by_name=True,
    )  # fmt: skip

    type: Literal["duckdb", "postgres", "parquet", "http"]
    """Destination type: ``duckdb``, ``postgres``, ``parquet`` or ``http`` (an ingestion
    API such as DataSet's addEvents, docs/http.md)."""
    mode: Literal["batch", "stream"] = "batch"
    """``batch``: loaded from sealed segments, every ``batch_period_seconds``; ``stream``
    (duckdb, postgres, http): loaded within seconds, the log read as it is written."""
    stream_interval_seconds: float = Field(default=1.0, gt=0)
    """stream: how often a micro-batch starts (when there are new events)."""
    path: str | None = None
    """duckdb: the database file (default ``<data_dir>/warehouse.duckdb``); parquet: the
    directory of the tables (default ``<data_dir>/parquet``), or a Hadoop-compatible URI
    Spark writes (``s3a://bucket/lake``, ``hdfs://nn/lake``)."""
    partition_by: Literal["day", "none"] = "day"
    """parquet: ``day`` (of ``_timestamp``, Hive-style ``day=YYYY-MM-DD``) or ``none``."""
    dsn: str | None = Field(default=None, repr=False)
    """postgres: the connection string, ``postgresql://user:${PGPASSWORD}@host:5432/db``
    (put secrets in environment variables; the DSN is never logged)."""
    db_schema: str = Field(default="public", alias="schema")
    """postgres: the schema eventpipe creates its tables in (created if missing)."""
    only_keys: tuple[SafeKeyId, ...] | None = None
    """API key ids whose events go here. Absent: all keys."""
    namespace: str = ".*"
    """A regular expression matched against each event's table name (found anywhere in
    it; anchor with ``^...$``): events whose table does not match skip this destination,
    counted as filtered."""
    transforms: tuple[TransformStep, ...] = ()
    """Steps applied in order to the events of this destination, after lookups and
    before mapping: ``filter``, ``set``, ``drop``, ``python``."""
    metering: MeteringConfig | None = None
    """duckdb, postgres: usage metering instead of table_name_template (docs/metering.md)."""
    table_name_template: str = "events"
    """Table per event: text with ``{{ path.to.field }}`` and ``{{ _timestamp |
    date('%Y_%m') }}``; sanitised like a column name; empty means skip."""
    primary_key: tuple[str, ...] = ()
    """Columns of the primary key; loads then upsert, the newest ``_timestamp`` winning."""
    enrichment: tuple[EnrichmentRule, ...] = ()
    """Lookup rules for this destination, applied after the implicit browser rules."""
    mappings: MappingConfig = MappingConfig()
    """Field rules: move, remove, cast, constant; ``keep_unmapped``."""
    max_columns: int = Field(default=1000, ge=2)
    """Columns per table at most; further fields of an event go into its
    ``_unmapped_data`` JSON column, never dropped."""
    max_poison_events: int = Field(default=100, ge=1)
    """A load the database refuses is retried in smaller parts to find the events that
    cause it (they go to failed/); beyond this many in one table's batch the destination
    is taken as broken, not the events: it stops (the others go on) and tries later."""
    url: str | None = None
    """http: where events are POSTed (``https://app.scalyr.com/api/addEvents``)."""
    headers: dict[str, str] = Field(default_factory=dict, repr=False)
    """http: request headers; put secrets in environment variables
    (``Authorization: "Bearer ${DATASET_TOKEN}"``)."""
    format: Literal["dataset", "ndjson"] = "dataset"
    """http: ``dataset`` (addEvents: session, sessionInfo, events with ts and attrs) or
    ``ndjson`` (one JSON object per line)."""
    group_by: tuple[str, ...] = ()
    """http: the fields (flattened column names, or dotted paths) whose values make the
    session key; they move from the events into the session info."""
    max_payload_bytes: int = Field(default=6_000_000, ge=1024)
    """http: a request's payload at most, before compression."""
    max_lifetime_seconds: float = Field(default=5.0, gt=0)
    """http: a session's buffer is sent when this old, full or not."""
    max_parallel_requests: int = Field(default=8, ge=1)
    """http: requests in flight at once, in all (one per session at most)."""
    retry_initial_seconds: float = Field(default=1.0, gt=0)
    """http: the first wait before a retry (doubling, with jitter)."""
    retry_max_seconds: float = Field(default=30.0, gt=0)
    """http: the longest wait between two retries."""
    retry_max_elapsed_seconds: float = Field(default=300.0, gt=0)
    """http: how long a request is retried before its events go to failed/."""
    max_buffer_bytes: int = Field(default=64_000_000, ge=1024)
    """http: event bytes held in memory at most, buffered and in flight, per Spark task."""
    gzip: bool = True
    """http: compress request bodies (Content-Encoding: gzip)."""

    @field_validator("namespace")
    @classmethod
    def _namespace_compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"namespace {value!r} is not a regular expression: {exc}") from None
        return value

    @model_validator(mode="after")
    def _metering_where_rows_can_be_replaced(self) -> DestinationConfig:
        if self.metering is not None and (self.type not in ("duckdb", "postgres") or
                                          self.mode != "batch"):  # fmt: skip
            raise ValueError(
                "metering replaces rows in one transaction: a duckdb or postgres "
                "destination in mode batch"
            )
        return self

    @model_validator(mode="after")
    def _settings_for_type(self) -> DestinationConfig:
        if self.type == "postgres":
            if not self.dsn:
                raise ValueError("type postgres needs dsn: postgresql://user@host:5432/db")
            if self.path is not None:
                raise ValueError("path is for duckdb; postgres takes dsn")
            if not _SQL_NAME.match(self.db_schema):
                raise ValueError(
                    f"schema {self.db_schema!r}: use letters, digits and _ (at most 63)"
                )
        elif self.dsn is not None:
            raise ValueError(f"dsn is for postgres; {self.type} does not take it")
        if self.type == "http":
            if not self.url or not self.url.startswith(("http://", "https://")):
                raise ValueError("type http needs url: https://host/path")
            if self.primary_key:
                raise ValueError("primary_key: an http sink cannot upsert")
        elif self.url is not None:
            raise ValueError(f"url is for http; {self.type} does not take it")
        if self.type == "duckdb" and self.path is not None and is_uri(self.path):
            raise ValueError("path: duckdb takes a local file, not a URI")
        if self.type == "parquet" and self.mode == "stream":
            raise ValueError("mode stream: parquet takes batch (a file per second is no lake)")
        if self.type == "parquet" and self.primary_key:
            raise ValueError("primary_key: parquet files cannot upsert; use duckdb or postgres")
        return self


_SPARK_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")


class SparkConfig(_Model):
    """Spark settings. ``master`` and any ``spark.*`` key pass through to the session
    (``spark.executor.memory: 4g``); a key without the ``spark.`` prefix gets it."""

    model_config = ConfigDict(extra="allow", frozen=True, use_attribute_docstrings=True)

    master: str = "local[*]"
    """Where the job runs: ``local[*]`` (this machine), ``spark://host:7077``, ``yarn``,
    ``k8s://...``."""

    @model_validator(mode="after")
    def _settings_are_scalars(self) -> SparkConfig:
        for key, value in (self.model_extra or {}).items():
            if not _SPARK_KEY.match(key):
                raise ValueError(f"{key!r} is not a Spark setting name")
            if not isinstance(value, str | int | float | bool):
                raise ValueError(f"{key}: expected a string, number or boolean")
        return self

    @property
    def settings(self) -> dict[str, str]:
        """Every configured setting as ``spark.*`` keys and string values."""
        settings = {"spark.master": self.master}
        for key, value in (self.model_extra or {}).items():
            name = key if key.startswith("spark.") else f"spark.{key}"
            settings[name] = str(value).lower() if isinstance(value, bool) else str(value)
        return settings


class ProcessingConfig(_Model):
    """The batch pipeline."""

    batch_period_seconds: float = Field(default=60.0, gt=0)
    """``eventpipe process`` (and ``run``) processes sealed segments this often."""
    shutdown_grace_seconds: float = Field(default=30.0, ge=0)
    """On SIGTERM, loads under way get this long to finish and record their progress
    (nothing new starts); then the process stops anyway (the next run resumes)."""


class ArchiveConfig(_Model):
    """The raw archive: processed segments as LZ4 frames with an index and a manifest
    (docs/archive.md)."""

    retention_days: int | None = Field(default=None, ge=1)
    """Days ``archive/`` keeps (by the day segments were sealed), with the replayed
    failed files of those days; older days are deleted after each run. Absent: forever.
    Segments not yet handled by every destination are never in the archive."""
    max_bytes: int | None = Field(default=None, ge=1)
    """A bound on the archive's size on disk: after each run, the oldest days are
    deleted while it is larger (never the newest day). Absent: no bound."""
    frame_events: int = Field(default=1000, ge=1, le=1_000_000)
    """Events per LZ4 frame at most: reading one event decompresses one frame."""
    frame_max_bytes: int = Field(default=1 << 20, ge=1024)
    """A frame closes before it exceeds this many uncompressed bytes."""
    compression_level: int = Field(default=0, ge=0, le=16)
    """LZ4 level: 0-2 fast (as ``lz4 -1``), 3-16 smaller and slower (docs/archive.md
    has the measurements)."""


class StateConfig(_Model):
    """Where the run history and load statuses are kept (docs/archive.md, "State store")."""

    type: Literal["sqlite", "postgres"] = "sqlite"
    """``sqlite``: a file under ``data_dir`` (one machine); ``postgres``: a server, for
    several machines or to query the history with SQL."""
    dsn: str | None = Field(default=None, repr=False)
    """postgres: the connection string, ``postgresql://user:${PGPASSWORD}@host:5432/db``
    (never logged)."""
    db_schema: str = Field(default="eventpipe", alias="schema")
    """postgres: the schema of the state tables (created if missing)."""

    @model_validator(mode="after")
    def _settings_for_type(self) -> StateConfig:
        if self.type == "postgres":
            if not self.dsn:
                raise ValueError("type postgres needs dsn: postgresql://user@host:5432/db")
            if not _SQL_NAME.match(self.db_schema):
                raise ValueError(
                    f"schema {self.db_schema!r}: use letters, digits and _ (at most 63)"
                )
        elif self.dsn is not None:
            raise ValueError("dsn is for type postgres; sqlite keeps data_dir/state.sqlite")
        return self


class EnrichmentConfig(_Model):
    """Lookup enrichment shared by all destinations."""

    ip_database: Path | None = None
    """A MaxMind-format ``.mmdb`` for ``ip_lookup``. Absent: the GeoLite2 City snapshot
    (2018) packaged by maxminddb-geolite2, so lookups work offline out of the box."""
    browser_rules: bool = True
    """Seed 1's implicit rules for browser events: ``/source_ip`` to
    ``/eventn_ctx/location`` and ``/eventn_ctx/user_agent`` to ``/eventn_ctx/parsed_ua``."""


class LoggingConfig(_Model):
    """Operator logs on stderr: one line per event of note."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    """Least severe level printed."""
    format: Literal["text", "json"] = "text"
    """``text`` for people, ``json`` (one object per line) for log collectors."""


class Config(_Model):
    """The whole eventpipe configuration."""

    data_dir: Path = Path("data")
    """Where eventpipe keeps everything: incoming/, failed/, archive/, the state store."""
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
    destinations: dict[Annotated[str, AfterValidator(_safe_destination_id)], DestinationConfig] = (
        Field(default_factory=lambda: {"warehouse": DestinationConfig(type="duckdb")})
    )
    """Destinations by id. Absent: one DuckDB warehouse at ``<data_dir>/warehouse.duckdb``."""

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
    def _state_apart_from_destinations(self) -> Config:
        """The state tables (``runs``...) and a destination's tables (any name a template
        makes) must not share a schema."""
        if self.state.type != "postgres" or self.state.dsn is None:
            return self
        from eventpipe.errors import redacted

        where = redacted(self.state.dsn)
        for dest_id, dest in self.destinations.items():
            same = dest.db_schema == self.state.db_schema
            if dest.type == "postgres" and dest.dsn and same and redacted(dest.dsn) == where:
                raise ValueError(
                    f"state.schema {self.state.db_schema!r} is destination {dest_id!r}'s "
                    "schema too: give the state store a schema of its own"
                )
        return self

    @property
    def layout(self) -> DataLayout:
        return DataLayout(self.data_dir)

    def destination(self, destination_id: str) -> DestinationConfig:
        """The destination ``destination_id``; ConfigError naming the configured ones."""
        if destination_id not in self.destinations:
            known = ", ".join(sorted(self.destinations))
            raise ConfigError(f"no destination {destination_id!r} (configured: {known})")
        return self.destinations[destination_id]


class LoadedConfig(_Model):
    """A config and where it came from (for start-up messages)."""

    config: Config
    source: str
    """The file it was read from, or ``built-in defaults``."""
    embedded: bool
    """True when no file was found and built-in defaults apply."""


_ENV_REF = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}")


def _expand_env(node: Any, path: str, env: dict[str, str]) -> Any:
    if isinstance(node, dict):
        return {k: _expand_env(v, _join(path, str(k)), env) for k, v in node.items()}
    if isinstance(node, list):
        return [_expand_env(v, f"{path}[{i}]", env) for i, v in enumerate(node)]
    if isinstance(node, str):

        def substitute(match: re.Match[str]) -> str:
            name, default = match["name"], match["default"]
            if name in env:
                return env[name]
            if default is not None:
                return default
            raise ConfigError(
                f"{path}: environment variable {name} is not set",
                fix=f"export {name}=... or write ${{{name}:-default}}",
            )

        return _ENV_REF.sub(substitute, node)
    return node


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _loc_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        path = f"{path}[{part}]" if isinstance(part, int) else _join(path, part)
    return path or "(top level)"


def _known_fields(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """Field names of the model at ``loc`` (for 'did you mean' hints)."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return []
        current = _nested_model(field.annotation)
        if current is None:
            return []
    return list(getattr(current, "model_fields", {}))


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    """The model inside ``X``, ``X | None`` or ``tuple[X, ...]``, if there is one."""
    for candidate in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _describe(error: Any) -> str:
    kind, msg, value = error["type"], error["msg"], error.get("input")
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    if kind.startswith("value_error"):
        return str(msg).removeprefix("Value error, ")
    text = str(msg).replace("Input should be", "expected").replace("Input", "value")
    if not isinstance(value, dict | list):
        text += f", got {value!r}"
    return text


def format_validation_error(exc: ValidationError, model: type[BaseModel] = Config) -> str:
    """One line per problem: ``path: what was expected``, with a hint for misspelt keys."""
    lines = []
    for error in exc.errors():
        loc = tuple(error["loc"])
        line = f"{_loc_path(loc)}: {_describe(error)}"
        if error["type"] == "extra_forbidden":
            known = _known_fields(model, loc[:-1])
            close = difflib.get_close_matches(str(loc[-1]), known, n=1)
            if close:
                line += f" (did you mean {close[0]!r}?)"
            elif known:
                line += f" (known keys: {', '.join(known)})"
        lines.append(line)
    return "\n".join(lines)


def parse_config(data: Any, *, source: str, env: dict[str, str] | None = None) -> Config:
    """Validate already-parsed YAML. Raises ConfigError listing every problem."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of keys at the top level")
    data = _expand_env(data, "", dict(os.environ) if env is None else env)
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source} is not valid:\n{format_validation_error(exc)}") from None


def load_config(path: Path | None = None) -> LoadedConfig:
    """Read ``path`` (default ``./eventpipe.yaml``); built-in defaults when it does not exist.

    An explicitly named file that does not exist is an error; the default one is optional.
    """
    explicit = path is not None
    path = path or DEFAULT_CONFIG_PATH
    if not path.exists():
        if explicit:
            raise ConfigError(
                f"config file {path} does not exist", fix="run `eventpipe init` to write one"
            )
        return LoadedConfig(config=Config(), source="built-in defaults", embedded=True)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    return LoadedConfig(
        config=parse_config(data, source=str(path)), source=str(path), embedded=False
    )


def with_dev_keys(config: Config) -> tuple[Config, ApiKey]:
    """Give an embedded-defaults config one development key pair, kept in ``dev_keys.json``.

    The pair is generated once per data directory (random, not a well-known value, because
    ``server.host`` may be opened to the network) and reused, so a curl line keeps working.
    """
    path = config.layout.dev_keys
    if path.exists():
        stored = json.loads(path.read_text(encoding="utf-8"))
    else:
        stored = {
            "id": "dev",
            "js": "js." + secrets.token_urlsafe(18),
            "server": "s2s." + secrets.token_urlsafe(18),
        }
        write_file(path, json.dumps(stored), private=True)
    key = ApiKey.model_validate(stored)
    return config.model_copy(update={"api_keys": (key,)}), key


def iter_fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every leaf field path of a model (``server.port``, ``api_keys[].id``) with its info."""
    for name, field in model.model_fields.items():
        path = _join(prefix, field.alias or name)
        nested = _nested_model(field.annotation)
        if nested is not None:
            is_list = nested is not field.annotation
            yield from iter_fields(nested, path + ("[]" if is_list else ""))
        else:
            yield path, field
