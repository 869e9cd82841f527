"""A fake table destination for fast tests of the load stage (as dlt's ``dummy``): rows
kept in memory, loads idempotent by batch id like the real ones, and failures on demand.
The real destinations have their own suite (tests/integration/destinations)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow.parquet as pq

from eventpipe.destinations.base import LoadRequest, LoadResult
from eventpipe.errors import TerminalError
from eventpipe.schema.dialects import DUCKDB
from eventpipe.schema.diff import Table, TablePatch


@dataclass
class MemoryDestination:
    id: str = "memory"
    refuses: Callable[[dict[str, Any]], str | None] = lambda row: None
    """A row's reason to refuse the whole load it is in (as a database refusing a batch),
    or None."""
    dialect = DUCKDB
    parallel_loads = 1
    tables: dict[str, Table] = field(default_factory=dict)
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    loaded: set[str] = field(default_factory=set)
    """Batch ids loaded (the idempotence record)."""
    loads: int = 0
    """Calls of load, refused ones included."""

    def describe(self, table: str) -> Table | None:
        return self.tables.get(table)

    def patch(self, patch: TablePatch) -> None:
        current = self.tables.get(patch.table)
        columns = {**(current.columns if current else {}), **dict(patch.add_columns)}
        key = patch.set_primary_key or (current.primary_key if current else ())
        self.tables[patch.table] = Table(patch.table, columns, tuple(key))

    def load(self, request: LoadRequest) -> LoadResult:
        self.loads += 1
        if request.batch_id in self.loaded:
            return LoadResult(0, already_loaded=True)
        rows = [r for f in request.files for r in pq.read_table(f).to_pylist()]
        for row in rows:
            reason = self.refuses(row)
            if reason is not None:
                raise TerminalError(f"refused: {reason}")
        self.rows.setdefault(request.table, []).extend(rows)
        self.loaded.add(request.batch_id)
        return LoadResult(len(rows))

    def query(self, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        raise NotImplementedError("the memory destination answers no SQL")
