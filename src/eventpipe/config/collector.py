"""The collector's sections: the API keys, the HTTP server and the durable log it writes."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, model_validator

from eventpipe.config.base import Network, OriginPattern, SafeKeyId, Section


class ApiKey(Section):
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


class ServerConfig(Section):
    """The HTTP collector."""

    host: str = "127.0.0.1"
    """Address to listen on. Use 0.0.0.0 to accept events from other machines."""
    port: int = Field(default=8001, ge=0, le=65535)
    """TCP port (0: any free port, printed at start-up)."""
    workers: int | None = Field(default=None, ge=1, le=256)
    """Collector processes sharing the port (the kernel spreads connections over them);
    each is a writer of the log with an id of its own. Absent: one per core."""
    writer_id: SafeKeyId | None = None
    """The start of this collector's writer ids (its workers are ``<writer_id>-0``,
    ``-1``...). Absent: this host's name. Collectors on several hosts sharing a data
    directory need ids that differ (host names do); keep it stable across restarts, so
    that a restarted collector recovers what it left."""
    trusted_proxies: tuple[Network, ...] = ()
    """Networks (CIDR) of reverse proxies whose X-Forwarded-For is believed. Empty: none."""
    anonymize_ip: bool = False
    """Zero the last octet of IPv4 and the last 80 bits of IPv6 before anything is written."""
    max_header_bytes: int = Field(default=65_536, ge=4096)
    """Largest request line plus headers; larger gets 431 and the connection is closed."""
    max_body_bytes: int = Field(default=1_000_000, ge=1024)
    """Largest request body; larger gets 413 without the rest being read."""
    max_bulk_bytes: int = Field(default=1_000_000_000, ge=1024)
    """Largest body of ``POST /api/v1/s2s/bulk`` (NDJSON, read and stored as it streams;
    counted unzipped); past it the upload stops with 413, what came before kept."""
    max_event_bytes: int = Field(default=51_200, ge=256)
    """Largest single event as stored (after enrichment); larger events are rejected alone."""
    # At most 200: orjson refuses to write documents nested deeper than 254 levels.
    max_json_depth: int = Field(default=64, ge=2, le=200)
    """Deepest nesting of objects and arrays in a body (the body itself is level 1)."""
    max_events_per_request: int = Field(default=10_000, ge=1)
    """Events one request may carry (``/api/v1/event``, ``/api/v1/s2s/event``, the
    Segment API); the items past it are refused, counted, and the body recorded once.
    Each event costs some 150 bytes of enrichment whatever its size: without a cap a
    900 KB body of ``{}`` stored 55 MB."""
    max_amplification: int = Field(default=100, ge=1)
    """Bytes a request may store per byte it sent (its body and the User-Agent that every
    browser event gets a copy of), past 4 MiB that any request may store; more is refused
    whole with 413. A browser's batch stores 2-12x; 10,000 ``{}`` under a 40 KB
    User-Agent would store 400 MB from 70 KB (5,700x)."""
    max_bulk_events: int = Field(default=2_000_000, ge=1)
    """Lines one bulk upload may carry; past it the upload stops with 413, what came
    before kept (a 3 KB gzip of ``{}`` lines made a million events)."""
    max_future_skew_seconds: float = Field(default=3600.0, ge=0)
    """How far past its time of receipt a browser event's ``_timestamp`` may be. A later
    one is the browser's clock, or a row trying to win an upsert: ``_timestamp`` becomes
    the time of receipt, and the client's value is kept in
    ``eventn_ctx.client_timestamp``."""
    cors_max_age_seconds: int = Field(default=86_400, ge=0)
    """How long browsers may cache a CORS preflight answer."""
    jitsu_script: Path | None = None
    """Jitsu 2's browser script (``@jitsu/js``'s ``dist/web/p.js.txt``), served at
    ``GET /p.js``: it sends to the origin it was loaded from, so pages that load it from
    the collector work unchanged. eventpipe ships no copy of it."""
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


class IncomingConfig(Section):
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
    writer_timeout_seconds: float = Field(default=600.0, ge=10)
    """A writer on another host whose heartbeat is older than this is taken as dead: the
    pipeline seals what it left (one on this host is known dead at once). Longer than
    any pause a live collector may have."""
    fsync: bool = True
    """Answer 200 only after fsync. Turn off only for throwaway benchmarks: 200 then no longer
    means the events survive a power cut."""
