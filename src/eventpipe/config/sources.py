"""Source settings: readers that feed the log beside the HTTP collector (docs/cdc.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from eventpipe.config.base import Section, regular_expression, sql_name


class PostgresSourceConfig(Section):
    """Change data capture from PostgreSQL: an initial copy of the chosen tables, then
    every change, through a logical replication slot (wal2json)."""

    type: Literal["postgres"] = "postgres"
    """The type: ``postgres``."""
    dsn: str = Field(repr=False)
    """The source database, ``postgresql://user:${PGPASSWORD}@host:5432/db`` (the server
    runs with ``wal_level = logical``; the user may replicate)."""
    tables: str = ".*"
    """A regular expression matched against each table's ``schema.table`` (found anywhere
    in it; anchor with ``^...$``): the tables copied and followed."""
    slot: str | None = None
    """The replication slot (default ``eventpipe_<source id>``), created on first use."""
    max_changes: int = Field(default=100_000, ge=1)
    """Changes read from the slot at a time (whole transactions: one may be larger). Each
    read decodes the WAL from the slot's restart point, which PostgreSQL moves only every
    few seconds: fewer, larger reads cost less (bench/cdc.py: 38,371 changes/s at
    100,000, 18,011 at 10,000), and hold that many changes in memory."""
    poll_seconds: float = Field(default=0.5, gt=0)
    """How long the reader waits when the slot has no new change."""
    compaction_bytes: int | None = Field(default=1_000_000_000, ge=1)
    """Compact the source's archived segments (each key's newest change remains, docs/
    cdc.md) when those archived since the last compaction reach this size (compressed);
    null: only ``eventpipe log compact``. Seed 3's default, 1 GB."""

    @field_validator("tables")
    @classmethod
    def _tables_compile(cls, value: str) -> str:
        return regular_expression(value, "tables")

    @field_validator("slot")
    @classmethod
    def _slot_name(cls, value: str | None) -> str | None:
        if value is not None:
            sql_name(value, "slot")
        return value


AnySource = PostgresSourceConfig
"""A source's settings (one type so far)."""
