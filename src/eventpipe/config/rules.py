"""What a destination does to its events before they load: lookups, field rules,
transform steps and usage metering."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, model_validator

from eventpipe.config.base import SQL_NAME, FieldPath, Pointer, Section, TypeName

_PYTHON_FUNCTION = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")


class EnrichmentRule(Section):
    """A lookup rule: ``{name: ip_lookup | user_agent_parse, from: /pointer, to: /pointer}``."""

    name: Literal["ip_lookup", "user_agent_parse"]
    """``ip_lookup`` (geo of an IP address) or ``user_agent_parse``."""
    source: Pointer = Field(alias="from")
    """JSON pointer of the input string, e.g. ``/source_ip``."""
    to: Pointer
    """JSON pointer where the result object is written, e.g. ``/geo``."""


class FieldRule(Section):
    """One mapping rule (seed 1): ``move``, ``remove``, ``cast`` or ``constant``."""

    action: Literal["move", "remove", "cast", "constant"]
    """What the rule does."""
    src: Pointer | None = None
    """JSON pointer of the field read (move, remove, cast)."""
    dst: Pointer | None = None
    """JSON pointer or column name written (move, constant)."""
    type: TypeName | None = None
    """Column type: BOOL, INT64, FLOAT64, TIMESTAMP, STRING, a SQL alias, or a type of
    ClickHouse's own (``LowCardinality(String)``: the column's type as written on a
    ClickHouse destination; required for cast, optional for move and constant)."""
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


class MappingConfig(Section):
    """Field rules applied before flattening (seed 1's mapping step)."""

    keep_unmapped: bool = True
    """Keep fields no rule names. ``false``: only moved, cast and constant fields (and
    ``_timestamp``) reach the table."""
    fields: tuple[FieldRule, ...] = ()
    """Rules, applied in order."""


class TransformStep(Section):
    """One step of a destination's transforms (docs/transforms.md): exactly one of
    ``filter``, ``set``, ``drop``, ``hash`` or ``python``."""

    filter: str | None = None
    """A Spark SQL boolean expression on the event (``properties.plan = 'pro'``): events
    for which it is not true are dropped for this destination (counted as filtered)."""
    assign: dict[FieldPath, str] | None = Field(default=None, alias="set")
    """Fields set to Spark SQL expressions: ``{usage_gb: "properties.usage_mb / 1024"}``;
    a dotted name sets a field of an object the event has."""
    drop: tuple[FieldPath, ...] | None = None
    """Fields removed (names or dotted paths)."""
    hash: tuple[FieldPath, ...] | None = None
    """Fields replaced by their keyed hash (pseudonymisation): HMAC-SHA256 of the value's
    text with ``secret``, as 64 hex digits; null stays null, objects and arrays are hashed
    as their JSON. The same value hashes the same everywhere the secret is the same, so
    hashed ids still join."""
    secret: SecretStr | None = Field(default=None, repr=False)
    """hash: the key, ``${PII_HASH_KEY}`` from the environment (never logged; a new one
    changes the destination's code version, so reprocess rebuilds with it)."""
    python: str | None = None
    """``package.module:function``: called with each Arrow record batch of events (or a
    pandas DataFrame, when its parameter is annotated so); returns the events to keep,
    changed or not. Its exceptions send the batch's events to failed/."""

    @model_validator(mode="after")
    def _one_kind(self) -> TransformStep:
        given = [k for k in ("filter", "assign", "drop", "hash", "python") if getattr(self, k)]
        if len(given) != 1:
            named = ", ".join("set" if k == "assign" else k for k in given) or "none"
            raise ValueError(
                "a transform step takes exactly one of filter, set, drop, hash, python "
                f"(got {named})"
            )
        if self.python is not None and not _PYTHON_FUNCTION.match(self.python):
            raise ValueError(f"python {self.python!r}: write package.module:function")
        if (self.secret is not None) != bool(self.hash):
            raise ValueError("secret goes with hash, and hash needs a secret: "
                             "secret: ${PII_HASH_KEY}")  # fmt: skip
        if self.secret is not None and len(self.secret.get_secret_value()) < 16:
            raise ValueError("hash: the secret must be at least 16 characters")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in ("filter", "set", "drop", "hash", "python")
                    if getattr(self, "assign" if k == "set" else k))  # fmt: skip


class MeteringConfig(Section):
    """Usage metering (docs/metering.md): duplicates removed, corrections applied,
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
        if self.products_table is not None and not SQL_NAME.match(self.products_table):
            raise ValueError(f"products_table {self.products_table!r}: a table name is expected")
        for name in (self.table, self.unclassified_table):
            if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", name):
                raise ValueError(f"table {name!r}: use a-z, 0-9 and _ (at most 63)")
        if self.table == self.unclassified_table:
            raise ValueError("table and unclassified_table must differ")
        return self
