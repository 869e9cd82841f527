"""The data directory: where every file of eventpipe lives, and how it is named.

File names follow seed 1's ``${file_type}.${var}=${val}.${ext}`` convention. Every id that
becomes part of a name (API key ids, destination ids) must match :data:`SAFE_ID_PATTERN`,
which admits no path separator, dot, ``=`` or ``|``, so that no configured value can make
eventpipe write outside the data directory or produce a name that parses two ways.

Several collectors (processes of one host, and hosts sharing the directory) write one
log, each as a *writer* with an id of its own that is part of every file it writes, so
that no two processes ever write one file.

Layout (``data_dir`` defaults to ``./data``)::

    incoming/incoming.tok=<key>|w=<writer>.log                  active segment (appended to)
    incoming/incoming.tok=<key>|w=<writer>-<seal time>.log      sealed segment (read-only);
                                    seal time YYYY-MM-DDTHH-MM-SS.mmm, UTC
    incoming/writer.w=<writer>.lock                             held by the writer; its
                                    pid and host; its mtime is the writer's heartbeat
    incoming/rotate.request                                     touched by eventpipe rotate
    failed/failed.tok=<key>|w=<writer>.log                      events rejected while receiving
    failed/failed.dst=<destination id>.log                      events a destination refused
    archive/YYYY-MM-DD/<sealed segment>.lz4 (+ .index.json, .ids,  processed segments
                       .manifest.json; eventpipe.archive)
    state.sqlite                                                runs and statuses
    tmp/<run id>/                                               a run's staging files
                                    (processing.work_dir, if set, holds them instead)
    locks/                                                      per destination x table locks
    warehouse.duckdb                                            the embedded warehouse
    dev_keys.json                                               generated keys (no config file)
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

SAFE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
_SAFE_ID = re.compile(SAFE_ID_PATTERN)

# Seal time in the name, UTC, millisecond precision: names sort in the order segments were sealed.
_SEAL_TIME_FORMAT = "%Y-%m-%dT%H-%M-%S"
_ID = r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}"
# An id has no '.', a seal time has one: where the writer's id ends is never ambiguous.
# Names without a writer are those of data directories written before writers had ids.
_SEGMENT = re.compile(
    rf"^incoming\.tok=(?P<key>{_ID})(?:\|w=(?P<writer>{_ID}))?"
    r"(?:-(?P<sealed>\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}\.\d{3}))?\.log$"
)
_WRITER_LOCK = re.compile(rf"^writer\.w=(?P<writer>{_ID})\.lock$")


def is_safe_id(value: str) -> bool:
    return bool(_SAFE_ID.match(value))


def check_safe_id(value: str, what: str) -> str:
    """Return ``value`` if it may be part of a file name, else raise ValueError naming it."""
    if not is_safe_id(value):
        raise ValueError(
            f"{what} {value!r} is not a safe id: use 1-64 letters, digits, '_' or '-', "
            "starting with a letter or digit"
        )
    return value


def seal_stamp(when: datetime) -> str:
    """The ``YYYY-MM-DDTHH-MM-SS.mmm`` part of a sealed segment's name (UTC)."""
    when = when.astimezone(UTC)
    return f"{when.strftime(_SEAL_TIME_FORMAT)}.{when.microsecond // 1000:03d}"


def sealed_at(stamp: str) -> datetime:
    """The time :func:`seal_stamp` wrote (UTC)."""
    when, _, millis = stamp.partition(".")
    parsed = datetime.strptime(when, _SEAL_TIME_FORMAT).replace(tzinfo=UTC)
    return parsed + timedelta(milliseconds=int(millis or 0))


@dataclass(frozen=True)
class SegmentName:
    """A parsed segment file name: the key id, the writer, the seal stamp when sealed."""

    key_id: str
    writer: str | None
    """None: a segment of a data directory from before writers had ids (one writer)."""
    sealed: str | None

    @classmethod
    def parse(cls, name: str) -> SegmentName | None:
        if m := _SEGMENT.match(name):
            return cls(key_id=m["key"], writer=m["writer"], sealed=m["sealed"])
        return None

    @property
    def file_name(self) -> str:
        return f"incoming.tok={self.id}.log"

    @property
    def id(self) -> str:
        """What a log position names it by (``eventpipe log show --from <id>:<line>``)."""
        writer = "" if self.writer is None else f"|w={self.writer}"
        sealed = "" if self.sealed is None else f"-{self.sealed}"
        return f"{self.key_id}{writer}{sealed}"


def _checked_writer(writer: str | None) -> str:
    return "" if writer is None else f"|w={check_safe_id(writer, 'writer id')}"


@dataclass(frozen=True)
class DataLayout:
    """Paths under one data directory. Creating the object touches nothing on disk."""

    root: Path
    work: Path | None = None
    """Where runs stage their files, if not ``<root>/tmp`` (``processing.work_dir``)."""

    @property
    def incoming(self) -> Path:
        return self.root / "incoming"

    @property
    def failed(self) -> Path:
        return self.root / "failed"

    def writer_lock(self, writer: str) -> Path:
        """Held by the writer ``writer`` while it runs; its pid and host inside."""
        return self.incoming / f"writer.w={check_safe_id(writer, 'writer id')}.lock"

    @property
    def rotate_request(self) -> Path:
        """Touched by ``eventpipe rotate``: every writer seals when its mtime changes."""
        return self.incoming / "rotate.request"

    def writers(self) -> list[str]:
        """The ids of the writers that have written here (their lock files)."""
        if not self.incoming.is_dir():
            return []
        return sorted(
            m["writer"] for p in self.incoming.iterdir() if (m := _WRITER_LOCK.match(p.name))
        )

    @property
    def dev_keys(self) -> Path:
        return self.root / "dev_keys.json"

    @property
    def state(self) -> Path:
        return self.root / "state.sqlite"

    @property
    def archive(self) -> Path:
        return self.root / "archive"

    @property
    def received(self) -> Path:
        """The live view's sample of events as received (collector/received.py)."""
        return self.root / "received"

    @property
    def received_watching(self) -> Path:
        """Touched by the console while a live view is open: the collector keeps its
        sample of events as received only then."""
        return self.received / "watching"

    def received_file(self, writer: str) -> Path:
        """A collector worker's sample of events as received (moved aside to
        ``.old.jsonl`` when full)."""
        return self.received / f"received.w={check_safe_id(writer, 'writer id')}.jsonl"

    def received_files(self) -> list[Path]:
        """Every worker's sample files, the older one of each worker first."""
        if not self.received.is_dir():
            return []
        found = [p for p in self.received.iterdir() if p.name.startswith("received.w=")]
        return sorted(found, key=lambda p: (p.name.removesuffix(".old.jsonl").removesuffix(
            ".jsonl"), not p.name.endswith(".old.jsonl")))  # fmt: skip

    @property
    def tmp(self) -> Path:
        """Runs' staging files: the Spark executors write here and the driver reads, so
        on a cluster every node sees it (docs/deploy.md)."""
        return self.work if self.work is not None else self.root / "tmp"

    @property
    def spark_log(self) -> Path:
        """The standard error of the Spark driver JVMs that the service and the pipeline's
        commands start (processing/runtime/spark.py, stderr_to)."""
        return self.root / "logs" / "spark.log"

    @property
    def locks(self) -> Path:
        return self.root / "locks"

    @property
    def warehouse(self) -> Path:
        return self.root / "warehouse.duckdb"

    def failed_destination(self, destination_id: str) -> Path:
        return self.failed / f"failed.dst={check_safe_id(destination_id, 'destination id')}.log"

    def active_segment(self, key_id: str, writer: str | None) -> Path:
        """The segment ``writer`` appends to for key ``key_id`` (None: a single-writer
        directory's name, from before writers had ids)."""
        key = check_safe_id(key_id, "key id")
        return self.incoming / f"incoming.tok={key}{_checked_writer(writer)}.log"

    def sealed_segment(self, key_id: str, writer: str | None, stamp: str) -> Path:
        key = check_safe_id(key_id, "key id")
        return self.incoming / f"incoming.tok={key}{_checked_writer(writer)}-{stamp}.log"

    def failed_receiving(self, key_id: str, writer: str | None) -> Path:
        """Events of key ``key_id`` that ``writer`` rejected while receiving (the pipeline
        writes as the writer ``pipeline``: lines of a segment that are not JSON)."""
        key = check_safe_id(key_id, "key id")
        return self.failed / f"failed.tok={key}{_checked_writer(writer)}.log"

    def failed_received(self, key_id: str) -> list[Path]:
        """Every writer's file of events of ``key_id`` rejected while receiving."""
        if not self.failed.is_dir():
            return []
        return sorted(self.failed.glob(f"failed.tok={check_safe_id(key_id, 'key id')}[.|]*log"))

    def sealed_segments(self) -> list[Path]:
        """Sealed segments in seal order (oldest first), across all keys."""
        if not self.incoming.is_dir():
            return []
        found = []
        for path in self.incoming.iterdir():
            parsed = SegmentName.parse(path.name)
            if parsed is not None and parsed.sealed is not None:
                found.append((parsed.sealed, path.name, path))
        return [path for _, _, path in sorted(found)]

    def active_segments(self) -> list[Path]:
        """Every writer's active segments."""
        return self._active(lambda parsed: True)

    def writer_segments(self, writer: str | None) -> list[Path]:
        """The active segments of ``writer`` (None: names from before writer ids)."""
        return self._active(lambda parsed: parsed.writer == writer)

    def _active(self, wanted: Callable[[SegmentName], bool]) -> list[Path]:
        if not self.incoming.is_dir():
            return []
        return sorted(
            p
            for p in self.incoming.iterdir()
            if (parsed := SegmentName.parse(p.name)) is not None
            and parsed.sealed is None
            and wanted(parsed)
        )


_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_uri(location: str | Path) -> bool:
    """``scheme://...`` (a Hadoop FileSystem URI), as opposed to a local path."""
    return bool(_URI.match(str(location)))


def count_lines(path: Path) -> int:
    """The lines of a file (a last line without its newline counts)."""
    with path.open("rb") as lines:
        return sum(1 for _ in lines)
