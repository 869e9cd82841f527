"""Sinks: events sent to an API (HTTP ingestion APIs, GA4) instead of loaded into tables."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from eventpipe.config.base import FieldPath
from eventpipe.config.destinations.base import DestinationConfig


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
