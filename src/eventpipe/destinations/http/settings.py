"""What a task of the HTTP sink needs to deliver: the destination's settings, narrowed
for one Spark task of one run."""

from __future__ import annotations

from dataclasses import dataclass

from eventpipe.destinations.http.payload import Format, Ga4Fields


@dataclass(frozen=True)
class HttpSettings:
    """What a task needs to deliver (picklable: it travels to Spark's executors)."""

    destination: str
    url: str
    headers: dict[str, str]
    format: Format = "dataset"
    max_payload_bytes: int = 6_000_000
    max_events: int | None = None
    """Events per request at most (GA4: 25); None: as many as fit."""
    validate_url: str | None = None
    """Where each payload is checked first (GA4's ``/debug/mp/collect``): the events its
    answer names fail with its message, the rest is sent."""
    ga4: Ga4Fields | None = None
    """``format: ga4``: the columns of the ids, the name and the parameters."""
    max_lifetime_seconds: float = 5.0
    parallel: int = 4
    """Requests in flight at once, in this task."""
    retry_initial_seconds: float = 1.0
    retry_max_seconds: float = 30.0
    retry_max_elapsed_seconds: float = 300.0
    max_buffer_bytes: int = 64_000_000
    gzip: bool = True
    timeout_seconds: float = 30.0
    progress: str | None = None
    """The run's progress directory (progress.py; shared by its tasks); None: not
    recorded."""
    hold_seconds: float | None = None
    """How long a request is retried in the task before the task hands its session back
    (``Stats.unsent``): the job waits without holding a Spark slot and runs the send
    again. None: retried in the task for ``retry_max_elapsed_seconds``."""
    give_up_at: float | None = None
    """Wall-clock time (``time.time()``) after which a transient failure is final; None:
    ``retry_max_elapsed_seconds`` after the request's first try."""
    run: str = ""
    """The run id: with the rows of a payload, its ``Idempotency-Key``."""
