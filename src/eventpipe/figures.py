"""The figures an operator watches, sampled: per destination what it loads per second,
its backlog and the lag of its oldest waiting event, its failures and last load; and
what the log takes in. ``eventpipe status --watch`` draws them on a terminal, the console
(eventpipe.console) as JSON and charts: one computation for both.

A rate is the change since the previous sample, so a :class:`Watch` is kept and sampled
again and again. Nothing here imports Spark: the console runs in a small process."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eventpipe.config import Config
    from eventpipe.log.tail import Lag
    from eventpipe.state.store import StateStore


@dataclass(frozen=True)
class DestinationFigures:
    id: str
    type: str
    mode: str
    rate: float
    """Events loaded per second since the previous sample (0 at the first)."""
    loaded: int
    """Events loaded, over the runs the state store keeps."""
    failed: int
    """Events in its failed/ file now."""
    backlog: str
    """What it has still to load, in words (``3 segment(s), 1.2 MB``; a stream's lag)."""
    waiting_segments: int
    waiting_bytes: int
    lag_seconds: float | None
    """Since its oldest waiting event was sealed (a batch destination); None: none waits."""
    last_load: str | None


@dataclass(frozen=True)
class Sample:
    at: str
    """When (UTC, ISO 8601)."""
    incoming_bytes_per_second: float | None
    """What the log took in per second since the previous sample (None at the first)."""
    destinations: tuple[DestinationFigures, ...]

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


class Watch:
    """Samples the figures of ``config``'s destinations and log (:meth:`sample`)."""

    def __init__(self, config: Config, store: StateStore) -> None:
        self.config = config
        self.store = store
        self._loaded: dict[str, tuple[float, int]] = {}
        self._written: tuple[float, int] | None = None

    def sample(self) -> Sample:
        from eventpipe.log.tail import lag
        from eventpipe.paths import SegmentName, sealed_at

        config, layout = self.config, self.config.layout
        now, wall = time.monotonic(), datetime.now(UTC)
        sealed = layout.sealed_segments()
        found = []
        for dest_id, dest in config.destinations.items():
            summary = self.store.summary(dest_id)
            before = self._loaded.get(dest_id)
            rate = (summary.rows_loaded - before[1]) / (now - before[0]) if before else 0.0
            self._loaded[dest_id] = (now, summary.rows_loaded)
            pending = [p for p in sealed if p.name not in summary.done_segments]
            size = sum(_size(p) for p in pending)
            waiting = None
            if dest.mode == "stream":  # the log read as it is written
                behind = lag(layout, dest_id)
                backlog = stream_backlog(behind)
                waiting = behind.seconds if behind.events else None
            else:
                backlog = batch_backlog(len(pending), size)
                oldest = SegmentName.parse(pending[0].name) if pending else None
                if oldest is not None and oldest.sealed is not None:
                    waiting = (wall - sealed_at(oldest.sealed)).total_seconds()
            found.append(DestinationFigures(
                dest_id, dest.type, dest.mode, max(rate, 0.0), summary.rows_loaded,
                failed_events(layout.failed_destination(dest_id)), backlog, len(pending),
                size, waiting, summary.last_load,
            ))  # fmt: skip
        written = sum(_size(p) for p in (*sealed, *layout.active_segments()))
        speed = None
        if self._written is not None:
            speed = max((written - self._written[1]) / (now - self._written[0]), 0.0)
        self._written = (now, written)
        return Sample(wall.isoformat(timespec="seconds"), speed, tuple(found))


def backlog(
    config: Config, dest_id: str, done: frozenset[str], sealed: list[Path], unsealed: int = 0
) -> str:
    """What a destination has still to load: a stream's lag in events and time, or the
    sealed segments it has not finished (``done``: those it has) and the ``unsealed``
    events in segments being written, which a batch destination loads once sealed."""
    from eventpipe.log.tail import lag

    if config.destinations[dest_id].mode == "stream":
        return stream_backlog(lag(config.layout, dest_id))
    pending = [p for p in sealed if p.name not in done]
    return batch_backlog(len(pending), sum(_size(p) for p in pending), unsealed)


def stream_backlog(behind: Lag) -> str:
    return f"stream: {behind.events:,} event(s), {behind.seconds:.0f} s behind"


def batch_backlog(segments: int, size: int, unsealed: int = 0) -> str:
    waiting = f" + {unsealed:,} event(s) not sealed yet" if unsealed else ""
    return f"{segments} segment(s), {size / 1e6:.1f} MB{waiting}"


def failed_events(path: Path) -> int:
    """The records of a failed/ file now (a replay takes events out)."""
    return failed_records([path])[0] if path.exists() else 0


def failed_records(paths: Sequence[Path]) -> tuple[int, int]:
    """The records of failed/ files, and their damaged lines: a line that is no JSON
    object (a crash cut it short; the next record starts on a line of its own)."""
    import orjson

    records = damaged = 0
    for path in paths:
        with path.open("rb") as lines:
            for line in lines:
                try:
                    whole = isinstance(orjson.loads(line), dict)
                except orjson.JSONDecodeError:
                    whole = False
                records += whole
                damaged += not whole and bool(line.strip())
    return records, damaged


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:  # sealed or archived meanwhile
        return 0
