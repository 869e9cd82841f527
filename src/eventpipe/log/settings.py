"""How the log is written: when a segment is sealed, whether answers wait for fsync, when a
writer on another host is taken as dead (the ``incoming`` section of the config). Its own
module: the writers, recovery and the segment log all read it."""

from __future__ import annotations

from dataclasses import dataclass

from eventpipe.config import Config


@dataclass(frozen=True)
class LogSettings:
    rotate_seconds: float = 300.0
    max_segment_bytes: int = 100_000_000
    fsync: bool = True
    writer_timeout_seconds: float = 600.0
    """A writer whose heartbeat is older than this, on another host, is taken as dead."""

    @classmethod
    def of(cls, config: Config) -> LogSettings:
        incoming = config.incoming
        return cls(incoming.rotate_seconds, incoming.max_segment_bytes, incoming.fsync,
                   incoming.writer_timeout_seconds)  # fmt: skip
