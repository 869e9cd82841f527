"""The ``type: http`` and ``type: ga4`` destinations as the job sees them
(destinations/base.py, Sink): their session fields, their retries, the settings their
Spark tasks take, and the outcome of a run read from the progress records."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from eventpipe.destinations.base import SinkRetries
from eventpipe.destinations.http.delivery import deliver_batches
from eventpipe.destinations.http.payload import Ga4Fields
from eventpipe.destinations.http.progress import Progress, Totals
from eventpipe.destinations.http.settings import HttpSettings
from eventpipe.schema.naming import column_name

if TYPE_CHECKING:
    import pyarrow as pa

    from eventpipe.config import Ga4Config, HttpConfig, SinkConfig

GA4_MAX_EVENTS = 25
"""Events per Measurement Protocol request at most."""
GA4_MAX_PAYLOAD_BYTES = 130_000
"""A Measurement Protocol request's body at most (GA4: 130 kB)."""


@dataclass(frozen=True)
class HttpTasks:
    """What the send step's Spark tasks run (base.SinkSettings; picklable)."""

    settings: HttpSettings

    @property
    def hold_seconds(self) -> float | None:
        return self.settings.hold_seconds

    def deliver(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return deliver_batches(self.settings, batches)

    def until(self, give_up_at: float) -> HttpTasks:
        return HttpTasks(replace(self.settings, give_up_at=give_up_at))


def _common(dest: SinkConfig, *, progress: str, run: str, tasks: int,
            hold_seconds: float) -> dict[str, object]:  # fmt: skip
    """The settings every sink's tasks take from its config and the run."""
    return {
        "max_lifetime_seconds": dest.max_lifetime_seconds,
        "parallel": max(1, dest.max_parallel_requests // tasks),
        "retry_initial_seconds": dest.retry_initial_seconds,
        "retry_max_seconds": dest.retry_max_seconds,
        "retry_max_elapsed_seconds": dest.retry_max_elapsed_seconds,
        "max_buffer_bytes": dest.max_buffer_bytes, "progress": progress, "run": run,
        "hold_seconds": min(hold_seconds, dest.retry_max_elapsed_seconds),
    }  # fmt: skip


@dataclass(frozen=True)
class HttpSink:
    """The ``type: http`` destination, opened: a sink (no tables). The job's send step
    (processing/batch/send.py) runs its tasks' ``deliver`` (delivery.deliver_batches) in
    Spark tasks."""

    id: str
    config: HttpConfig

    @property
    def sessions(self) -> tuple[str, ...]:
        return tuple(self.config.group_by)

    @property
    def retries(self) -> SinkRetries:
        dest = self.config
        return SinkRetries(dest.retry_initial_seconds, dest.retry_max_seconds,
                           dest.retry_max_elapsed_seconds)  # fmt: skip

    def outcome(self, progress: str) -> Totals:
        return Progress(progress).totals()

    def settings(self, *, progress: str, run: str, tasks: int, hold_seconds: float) -> HttpTasks:
        """What each of ``tasks`` Spark tasks of run ``run`` needs, its progress records
        in the directory ``progress``; a request that fails for ``hold_seconds`` in a
        task is handed back to the driver."""
        dest = self.config
        return HttpTasks(HttpSettings(
            destination=self.id, url=dest.url, headers=dict(dest.headers), format=dest.format,
            max_payload_bytes=dest.max_payload_bytes, gzip=dest.gzip,
            **_common(dest, progress=progress, run=run, tasks=tasks,
                      hold_seconds=hold_seconds),  # type: ignore[arg-type]
        ))  # fmt: skip


@dataclass(frozen=True)
class Ga4Sink(HttpSink):
    """The ``type: ga4`` destination: GA4's Measurement Protocol through the same
    delivery. A session per client (``client_id`` and ``user_id`` make the key, and
    the request's ids); 25 events and 130 kB per request; each payload checked at
    ``/debug/mp/collect`` first when ``validate_events``."""

    config: Ga4Config  # type: ignore[assignment]

    @property
    def sessions(self) -> tuple[str, ...]:
        dest = self.config
        return (dest.client_id, dest.user_id) if dest.user_id else (dest.client_id,)

    def settings(self, *, progress: str, run: str, tasks: int, hold_seconds: float) -> HttpTasks:
        dest = self.config
        query = f"?measurement_id={dest.measurement_id}&api_secret={dest.api_secret}"
        fields = Ga4Fields(
            client_id=_column(dest.client_id),
            user_id=_column(dest.user_id) if dest.user_id else None,
            event_name=_column(dest.event_name),
            params=tuple(_column(p) for p in dest.params),
        )
        return HttpTasks(HttpSettings(
            destination=self.id, url=f"{dest.url}/mp/collect{query}", headers={},
            format="ga4", max_payload_bytes=GA4_MAX_PAYLOAD_BYTES, max_events=GA4_MAX_EVENTS,
            validate_url=f"{dest.url}/debug/mp/collect{query}" if dest.validate_events else None,
            ga4=fields, gzip=False,
            **_common(dest, progress=progress, run=run, tasks=tasks,
                      hold_seconds=hold_seconds),  # type: ignore[arg-type]
        ))  # fmt: skip


def _column(field: str) -> str:
    """A field's flattened column: ``user.anonymous_id`` -> ``user_anonymous_id``."""
    return column_name(tuple(field.split(".")))
