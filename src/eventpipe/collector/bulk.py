"""``POST /api/v1/s2s/bulk``: one NDJSON upload (plain or gzip, server key), stored as
it streams.

Lines come from :func:`eventpipe.collector.imports.ndjson_lines` (inflated and split in a
bounded buffer, off the event loop), get an id derived from their content where they
have none (as ``eventpipe import`` does: a retried upload adds nothing to a destination
with a primary key on the event id), and are stored in chunks of ``imports.CHUNK`` lines,
each appended and fsynced before the next is read. Past ``max_bulk_events`` lines, or
when the body breaks off, the upload stops: what came whole before it is kept and said
so in the answer.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from eventpipe.collector import imports
from eventpipe.collector.body import BodyError
from eventpipe.collector.enrich import (
    MAX_RECORDED_REJECTIONS,
    EnrichedBatch,
    EnrichSettings,
    RequestContext,
)

Stop = TypeVar("Stop")
"""What storing a chunk returns instead of its count when the log cannot take it."""


@dataclass
class BulkResult:
    """What an upload stored: the events accepted, the lines refused by reason, the first
    of them with their line number, and what stopped the upload early (if anything)."""

    accepted: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    first: list[dict[str, Any]] = field(default_factory=list)
    stopped: BodyError | None = None


@dataclass
class BulkUpload(Generic[Stop]):
    ctx: RequestContext
    settings: EnrichSettings
    store: Callable[[EnrichedBatch], Awaitable[int | Stop]]
    """Appends one chunk's lines (fsynced): how many events it accepted, or a Stop."""
    max_events: int

    async def read(self, lines: AsyncIterator[tuple[int, bytes | imports.Oversized]]) -> (
        BulkResult | Stop
    ):  # fmt: skip
        """Store ``lines`` chunk by chunk; the result, or the first chunk's Stop."""
        result = BulkResult()
        seen: Counter[bytes] = Counter()
        chunk: list[tuple[int, Any]] = []
        records = 0
        key_id = self.ctx.key_id
        try:
            async for number, line in lines:
                records += 1
                if records > self.max_events:
                    where = f"line {number} is past max_bulk_events ({self.max_events})"
                    raise BodyError(413, "too_many_events", f"{where}: the lines before it "
                                    "are kept")  # fmt: skip
                chunk.append((number, imports.with_id(key_id, imports.parsed_line(line), seen)))
                if len(chunk) >= imports.CHUNK:
                    done = await self._chunk(chunk, result)
                    if not isinstance(done, int):
                        return done
                    chunk = []
        except BodyError as exc:  # what arrived whole before it is kept, and said so
            result.stopped = exc
        done = await self._chunk(chunk, result)
        if not isinstance(done, int):
            return done
        return result

    async def _chunk(self, chunk: list[tuple[int, Any]], result: BulkResult) -> int | Stop:
        """Store one chunk; its events accepted (added to ``result``), or the Stop."""
        if not chunk:
            return 0
        batch = imports.prepare_chunk(self.ctx.key_id, chunk, self.settings, self.ctx)
        stored = await self.store(batch)
        if not isinstance(stored, int):
            return stored
        result.accepted += stored
        result.rejected.update(batch.rejected)
        numbers = batch.numbers or []
        room = max(0, MAX_RECORDED_REJECTIONS - len(result.first))
        result.first += [{"line": numbers[r.index], "error": r.message}
                         for r in batch.rejections[:room]]  # fmt: skip
        return stored
