"""The pipeline's sections: Spark, the batch schedule, the archive, the state store,
shared lookups and operator logs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from eventpipe.config.base import S3Config, Section, sql_name
from eventpipe.objectstore import check_s3_uri, is_s3
from eventpipe.paths import is_uri

_SPARK_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")


class SparkConfig(Section):
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
        """Every configured setting as ``spark.*`` keys and string values; ``master``
        only if set (unset, ``spark-submit --master`` decides, or the default)."""
        settings = {"spark.master": self.master} if "master" in self.model_fields_set else {}
        for key, value in (self.model_extra or {}).items():
            name = key if key.startswith("spark.") else f"spark.{key}"
            settings[name] = str(value).lower() if isinstance(value, bool) else str(value)
        return settings


class ProcessingConfig(Section):
    """The batch pipeline."""

    batch_period_seconds: float = Field(default=60.0, gt=0)
    """``eventpipe process`` (and ``run``) processes sealed segments this often."""
    shutdown_grace_seconds: float = Field(default=30.0, ge=0)
    """On SIGTERM, loads under way get this long to finish and record their progress
    (nothing new starts); then the process stops anyway (the next run resumes)."""
    release_idle_seconds: float | None = Field(default=300.0, gt=0)
    """``eventpipe run``: after this long with nothing to process, the pipeline stops, and
    its Spark driver with it (some 500 MB); it starts again, cold, when a segment is
    sealed. Not with stream destinations, whose queries run all the time. Absent
    (``null``): Spark stays up."""
    work_dir: Path | None = None
    """Where runs stage their files (Spark writes, the driver reads them back). Absent:
    ``<data_dir>/tmp``. On a cluster, a directory every node mounts at this path, like
    the data directory: e.g. a faster shared disk than the one that keeps the log. A
    URI (``s3a://``) is not accepted: the driver reads staged files as local files."""

    @field_validator("work_dir", mode="before")
    @classmethod
    def _a_path(cls, value: object) -> object:
        if isinstance(value, str) and is_uri(value):
            raise ValueError(
                "work_dir is a directory every node mounts; URIs are not supported yet"
            )
        return value


class ArchiveConfig(Section):
    """The raw archive: processed segments as LZ4 frames with an index and a manifest
    (docs/archive.md)."""

    retention_days: int | None = Field(default=None, ge=1)
    """Days ``archive/`` keeps (by the day segments were sealed), with the replayed
    failed files of those days; older days are deleted after each run (from ``remote``
    too). Absent: forever. Segments not yet handled by every destination are never in
    the archive."""
    max_bytes: int | None = Field(default=None, ge=1)
    """A bound on the archive's size on disk: after each run, the oldest days are
    deleted while it is larger (never the newest day; with ``remote``, only days
    already there, which keeps them). Absent: no bound."""
    remote: str | None = None
    """``s3://bucket/prefix``: a copy of the archive on an S3-compatible store, each
    segment uploaded after the run that archived it (docs/archive.md); ``eventpipe
    archive restore`` brings days back. Absent: the archive is on this disk only."""
    s3: S3Config | None = None
    """How ``remote`` is reached: endpoint, region, credentials (absent: the
    environment's AWS variables), as for a lake on S3."""

    @field_validator("remote")
    @classmethod
    def _s3_uri(cls, value: str | None) -> str | None:
        if value is not None and not is_s3(value):
            raise ValueError(f"remote {value!r}: write s3://bucket/prefix")
        return None if value is None else check_s3_uri(value)

    @model_validator(mode="after")
    def _s3_for_remote(self) -> ArchiveConfig:
        if self.s3 is not None and self.remote is None:
            raise ValueError("s3: says how the archive's remote is reached; there is none")
        return self

    frame_events: int = Field(default=1000, ge=1, le=1_000_000)
    """Events per LZ4 frame at most: reading one event decompresses one frame."""
    frame_max_bytes: int = Field(default=1 << 20, ge=1024)
    """A frame closes before it exceeds this many uncompressed bytes."""
    compression_level: int = Field(default=0, ge=0, le=16)
    """LZ4 level: 0-2 fast (as ``lz4 -1``), 3-16 smaller and slower (docs/archive.md
    has the measurements)."""


class StateConfig(Section):
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
            sql_name(self.db_schema, "schema")
        elif self.dsn is not None:
            raise ValueError("dsn is for type postgres; sqlite keeps data_dir/state.sqlite")
        return self


class EnrichmentConfig(Section):
    """Lookup enrichment shared by all destinations."""

    ip_database: Path | None = None
    """A MaxMind-format ``.mmdb`` for ``ip_lookup``. Absent: the GeoLite2 City snapshot
    (2018) packaged by maxminddb-geolite2, so lookups work offline out of the box."""
    browser_rules: bool = True
    """Seed 1's implicit rules for browser events: ``/source_ip`` to
    ``/eventn_ctx/location`` and ``/eventn_ctx/user_agent`` to ``/eventn_ctx/parsed_ua``."""


class LoggingConfig(Section):
    """Operator logs on stderr: one line per event of note."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    """Least severe level printed."""
    format: Literal["text", "json"] = "text"
    """``text`` for people, ``json`` (one object per line) for log collectors."""
