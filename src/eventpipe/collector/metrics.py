"""Prometheus metrics of the collector, on a registry of its own (one per app instance).

With several workers (``PROMETHEUS_MULTIPROC_DIR`` set by the supervisor), every worker's
values are kept in that directory and a scrape of any worker gets the host's sums
(prometheus_client's multiprocess mode); gauges that every worker measures alike (the
backlog, free disk, backpressure) are the largest of the live workers'.

Rejected events are counted by key id and reason. A body rejected whole (malformed JSON,
too large, too deep) counts once under its reason, since its events cannot be counted;
requests refused before the key is known (401) count under ``api_key="-"``. Events
that broke their tracking plan are counted by plan, rule and action: the plans are the
configured ones and the rules JSON Schema's keywords, so the series stay few.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

if TYPE_CHECKING:
    from eventpipe.log.segments import SyncedRound

# The `_created` series double the output for no use here (counters reset with the process).
disable_created_metrics()  # type: ignore[no-untyped-call]


class CollectorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.events_accepted = Counter(
            "eventpipe_events_accepted",
            "Events durably appended to the log.",
            ["api_key"],
            registry=r,
        )
        self.events_rejected = Counter(
            "eventpipe_events_rejected",
            "Events (or whole bodies) refused, by reason.",
            ["api_key", "reason"],
            registry=r,
        )
        self.contract_violations = Counter(
            "eventpipe_contract_violations",
            "Events that broke their tracking plan at the collector, by plan, rule "
            "(the schema keyword) and what was done (refused or flagged).",
            ["plan", "rule", "action"],
            registry=r,
        )
        self.requests = Counter(
            "eventpipe_http_requests",
            "HTTP requests by endpoint and status.",
            ["endpoint", "status"],
            registry=r,
        )
        self.request_bytes = Counter(
            "eventpipe_http_request_bytes",
            "Bytes of request bodies read.",
            ["endpoint"],
            registry=r,
        )
        round_buckets = (
            0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
        )  # fmt: skip
        self.fsync_seconds = Histogram(
            "eventpipe_log_fsync_seconds",
            "Time of one group-commit round's syncs, as the fsync process timed them.",
            buckets=round_buckets,
            registry=r,
        )
        self.round_wait_seconds = Histogram(
            "eventpipe_log_round_wait_seconds",
            "Time one group-commit round waited for its syncs: the syncs and the hand-off "
            "to the fsync process and back.",
            buckets=round_buckets,
            registry=r,
        )
        self.round_appends = Counter(
            "eventpipe_log_round_appends",
            "Appends (requests) made durable by group-commit rounds; divided by "
            "eventpipe_log_fsync_seconds_count, the appends one round carries.",
            registry=r,
        )
        self.backlog_bytes = Gauge(
            "eventpipe_backlog_bytes",
            "Bytes of segments not yet processed (sealed and active).",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.free_disk_bytes = Gauge(
            "eventpipe_free_disk_bytes",
            "Free bytes on the data directory's filesystem.",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.backpressure = Gauge(
            "eventpipe_backpressure",
            "1 while the collector answers 503 to new events.",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.segments_sealed = Counter(
            "eventpipe_segments_sealed", "Segments sealed, by reason.", ["reason"], registry=r
        )
        self.torn_lines = Counter(
            "eventpipe_torn_lines",
            "Torn lines found at start-up and moved to failed/.",
            registry=r,
        )
        # The series every request counts in, by their label values (a handful each):
        # prometheus_client's labels() checks its arguments on every call, which was 7% of
        # a single-event request's time (bench/ingest.py, py-spy).
        self._series: dict[tuple[Any, ...], Any] = {}

    def _one(self, metric: Any, *values: str) -> Any:
        series = self._series.get((metric, *values))
        if series is None:
            series = self._series[(metric, *values)] = metric.labels(*values)
        return series

    def request(self, endpoint: str, status: int) -> None:
        """One HTTP request answered."""
        self._one(self.requests, endpoint, str(status)).inc()

    def body_read(self, endpoint: str, size: int) -> None:
        self._one(self.request_bytes, endpoint).inc(size)

    def accepted(self, key_id: str, events: int) -> None:
        self._one(self.events_accepted, key_id).inc(events)

    def exposition(self) -> bytes:
        """The metrics page: this process's, or with workers the host's."""
        directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if directory is None:
            return generate_latest(self.registry)
        from prometheus_client.multiprocess import MultiProcessCollector

        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
        return generate_latest(registry)

    def on_round(self, synced: SyncedRound) -> None:
        self.fsync_seconds.observe(synced.sync_seconds)
        self.round_wait_seconds.observe(synced.wait_seconds)
        self.round_appends.inc(synced.appends)

    def on_sealed(self, path: Path, size: int, reason: str) -> None:
        for part in reason.split(","):
            self.segments_sealed.labels(reason=part).inc()
