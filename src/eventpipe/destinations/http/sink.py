"""The ``type: http`` destination as the job sees it (destinations/base.py, Sink): its
session fields, its retries, the settings its Spark tasks take, and the outcome of a run
read from the progress records."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from eventpipe.destinations.base import SinkRetries
from eventpipe.destinations.http.delivery import deliver_batches
from eventpipe.destinations.http.progress import Progress, Totals
from eventpipe.destinations.http.settings import HttpSettings

if TYPE_CHECKING:
    import pyarrow as pa

    from eventpipe.config import HttpConfig


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
            max_payload_bytes=dest.max_payload_bytes,
            max_lifetime_seconds=dest.max_lifetime_seconds,
            parallel=max(1, dest.max_parallel_requests // tasks),
            retry_initial_seconds=dest.retry_initial_seconds,
            retry_max_seconds=dest.retry_max_seconds,
            retry_max_elapsed_seconds=dest.retry_max_elapsed_seconds,
            max_buffer_bytes=dest.max_buffer_bytes, gzip=dest.gzip, progress=progress, run=run,
            hold_seconds=min(hold_seconds, dest.retry_max_elapsed_seconds),
        ))  # fmt: skip
