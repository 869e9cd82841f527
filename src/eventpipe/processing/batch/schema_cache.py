"""Table schemas of one destination, kept in memory between the micro-batches of a stream.

A stream loads every second; reading each table's columns from the destination before
each load (a connection and a catalogue query) is work whose answer almost never changes.
So a stream keeps what it read, and what it patched, here:

* ``describe`` answers from memory, and reads the destination for a table it does not
  know yet (or a table it was told to forget);
* a patch that added columns makes the table unknown again: the next ``describe`` reads
  what the destination really has (another writer may have added more);
* a load that fails although the schema came from memory forgets the table, so that the
  job reads it again and retries the load once (the seed's rule: the table may have been
  changed behind eventpipe's back). What fails with a fresh schema goes to failed/.

It also keeps which text columns the loads converted to timestamps, which a stream's
next micro-batches convert while they stage (stamps.py).

A batch run starts with an empty cache: it reads every table it loads once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

from eventpipe.destinations.base import Destination
from eventpipe.schema.diff import Table


@dataclass(frozen=True)
class Described:
    table: Table | None
    """The table as the destination has it; None: it does not exist yet."""
    cached: bool
    """Answered from memory (possibly stale), not read just now."""


class SchemaCache:
    def __init__(self) -> None:
        self._tables: dict[str, Table] = {}
        self._stamped: set[str] = set()
        self._lock = threading.Lock()  # tables of one destination load on several threads

    def describe(self, destination: Destination, table: str) -> Described:
        with self._lock:
            known = self._tables.get(table)
        if known is not None:
            return Described(known, cached=True)
        found = destination.describe(table)
        if found is not None:
            with self._lock:
                self._tables[table] = found
        return Described(found, cached=False)

    def forget(self, table: str) -> None:
        with self._lock:
            self._tables.pop(table, None)

    @property
    def stamped(self) -> frozenset[str]:
        """The text columns this destination's loads have converted to timestamps: a
        stream's next micro-batches convert them while they are staged (stamps.py)."""
        with self._lock:
            return frozenset(self._stamped)

    def note_stamped(self, columns: Iterable[str]) -> None:
        with self._lock:
            self._stamped.update(columns)
