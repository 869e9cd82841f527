"""Failed events for the console: a destination's failed/ file (what its loads refused,
replayable with ``eventpipe replay failed``) and what the collector refused, read from
the end: the newest records, grouped by reason.

A file may be large: at most :data:`MOST_BYTES` of its end are read (the page says how
many records it looked at); a line cut short by a crash is skipped."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

MOST_BYTES = 16 * 1024 * 1024
"""Bytes of a failed/ file read at most, from its end."""


@dataclass(frozen=True)
class FailedPage:
    records: list[dict[str, Any]]
    """The newest first (at most the limit asked for, of the reason asked for)."""
    reasons: list[tuple[str, int]]
    """Each reason among the records looked at, with its count, most frequent first."""
    looked_at: int
    whole_file: bool
    """Whether every record of the file was looked at (else the newest MOST_BYTES)."""
    sources: list[str] = field(default_factory=list)


def newest_records(paths: list[Path], limit: int, reason: str | None = None) -> FailedPage:
    """The newest records of ``paths`` (``reason``: of that reason only), their reasons."""
    found: list[dict[str, Any]] = []
    whole = True
    for path in paths:
        lines, complete = _tail_lines(path)
        whole = whole and complete
        for line in lines:
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(record, dict):
                found.append(record)
    found.sort(key=lambda r: str(r.get("failed_at", "")), reverse=True)
    reasons = Counter(_reason(r) for r in found)
    chosen = [r for r in found if reason is None or _reason(r) == reason]
    return FailedPage(chosen[:limit], reasons.most_common(), len(found), whole,
                      [p.name for p in paths])  # fmt: skip


def _reason(record: dict[str, Any]) -> str:
    return str(record.get("error") or "")


def _tail_lines(path: Path) -> tuple[list[bytes], bool]:
    """The whole lines of the file's last MOST_BYTES, and whether that is all of it."""
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            start = max(0, size - MOST_BYTES)
            f.seek(start)
            data = f.read(size - start)
    except FileNotFoundError:
        return [], True
    lines = data.split(b"\n")
    if start > 0:
        lines = lines[1:]  # the first is a part of a line
    return [line for line in lines if line.strip()], start == 0
