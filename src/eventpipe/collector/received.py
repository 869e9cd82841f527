"""Events as received, for the console's live view.

The log keeps each event enriched (its id, times, address and key added; secrets and
``writeKey`` fields scrubbed). The live view shows an event also as its client sent it:
while a live view is open (the console touches ``received/watching`` as it polls, and a
worker looks at the mark at most once a second), each collector worker keeps a sample of
the items it receives, at most :data:`PER_SECOND` a second, as they were parsed (before
enrichment; a Segment API message as the event it became), scrubbed as the log is. With
``server.anonymize_ip``, a ``source_ip`` a client sent is kept as the log keeps it
(anonymized), never as sent.

Each is a line ``{"event_id": ..., "received": ...}`` in ``received/received.w=<writer>.jsonl``
under the data directory, which is moved aside to ``.old.jsonl`` when it passes
:data:`RING_BYTES`: two files per worker at most. Nothing is fsynced (it is a view, not
data), and nothing is written while no live view is open; a write that fails is logged
and forgotten: ingest never waits for it or fails by it."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import orjson

from eventpipe.events import stored_event_id
from eventpipe.paths import DataLayout

log = logging.getLogger("eventpipe.collector")

PER_SECOND = 20
"""Items a worker keeps as received per second at most."""
WATCH_SECONDS = 5.0
"""A live view is taken as open while its mark is younger than this."""
RING_BYTES = 1 << 20
"""Bytes of one worker's file before it is moved aside (the older one dropped)."""


class ReceivedSample:
    """One worker's sample of items as received (see the module's docstring)."""

    def __init__(
        self,
        layout: DataLayout,
        writer: str,
        scrub: Callable[[bytes], bytes],
        *,
        per_second: int = PER_SECOND,
        anonymize_ip: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.mark = layout.received_watching
        self.path = layout.received_file(writer)
        self.scrub = scrub
        self.per_second = per_second
        self.anonymize_ip = anonymize_ip
        self._clock = clock
        self._checked_at = float("-inf")
        self._watched = False
        self._left = 0

    def choose(self, count: int) -> list[int]:
        """Which of a request's ``count`` items to keep (none while no live view is
        open, or this second's share is taken), spread over them."""
        now = self._clock()
        if now - self._checked_at >= 1.0:
            self._checked_at = now
            self._left = self.per_second
            try:
                self._watched = time.time() - self.mark.stat().st_mtime < WATCH_SECONDS
            except OSError:
                self._watched = False
        if not self._watched or self._left <= 0 or count <= 0:
            return []
        taken = min(self._left, count)
        self._left -= taken
        step = count / taken
        return [int(i * step) for i in range(taken)]

    def keep(self, items: list[tuple[int, bytes]], enriched: list[Any]) -> None:
        """Write the chosen items (their index and their JSON as parsed) beside the id
        enrichment gave each (``enriched``: the request's items, enriched in place); an
        item that got none (not an object) is left out."""
        lines = []
        for index, raw in items:
            item = enriched[index]
            if (event_id := stored_event_id(item)) is not None:
                if self.anonymize_ip and b'"source_ip"' in raw:
                    raw = _stored_ip(raw, item)
                lines.append(b'{"event_id":' + orjson.dumps(event_id) + b',"received":' + raw
                             + b"}\n")  # fmt: skip
        if not lines:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("ab") as out:
                out.write(self.scrub(b"".join(lines)))
                full = out.tell() >= RING_BYTES
            if full:
                os.replace(self.path, self.path.with_name(self.path.name[:-6] + ".old.jsonl"))
        except OSError as exc:
            log.debug("could not keep events as received in %s: %s", self.path, exc)


def _stored_ip(raw: bytes, item: dict[str, Any]) -> bytes:
    """``raw`` with its ``source_ip`` as the enriched ``item`` stores it (anonymized)."""
    sent = orjson.loads(raw)
    if isinstance(sent, dict) and "source_ip" in sent:
        sent["source_ip"] = item.get("source_ip")
    return orjson.dumps(sent)


def as_parsed(item: Any) -> bytes | None:
    """``item`` as JSON, before enrichment changes it; None: not writable (a number
    eventpipe keeps as text until enrichment refuses it)."""
    try:
        return orjson.dumps(item)
    except (orjson.JSONEncodeError, TypeError):
        return None
