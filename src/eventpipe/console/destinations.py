"""The destinations page: each destination's tables as they are now (columns and types,
read from the destination), the history of the changes eventpipe made to them (which run
created a table or added a column: the state store's ``schema_changes``), and its recent
loads (run, table, rows).

Nothing here runs Spark: a destination is opened as the job opens it, without a session
(one that needs Spark to describe its tables says so on the page), and only asked to
describe its tables."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from eventpipe.config import Config
from eventpipe.state.records import SchemaChange
from eventpipe.state.store import StateStore


@dataclass(frozen=True)
class TableView:
    name: str
    columns: list[tuple[str, str]]
    """(column, eventpipe's type), in the destination's order."""
    primary_key: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class DestinationView:
    id: str
    type: str
    mode: str
    tables: list[TableView]
    changes: list[SchemaChange]
    loads: list[dict[str, Any]]
    error: str | None = None
    """Why its tables could not be read (they are still listed from the history)."""


def open_for_reading(config: Config, dest_id: str) -> Any:
    """The destination ``dest_id`` opened as the job opens it, without Spark."""
    from eventpipe.destinations import registry
    from eventpipe.state.locks import open_locks

    def no_spark() -> Any:
        raise RuntimeError("the console does not run Spark")

    lent = registry.Resources(locks=open_locks(config), spark=no_spark)
    return registry.open_destination(dest_id, config.destinations[dest_id], config, lent)


def destinations(
    config: Config, store: StateStore, only: str | None = None
) -> list[DestinationView]:
    """Every destination's view (``only``: that one's)."""
    views = []
    for dest_id, dest in config.destinations.items():
        if only is not None and dest_id != only:
            continue
        tables: list[TableView] = []
        error = None
        if dest.tables:
            try:
                tables = _tables(open_for_reading(config, dest_id))
            except Exception as exc:  # noqa: BLE001 - shown: the history stands
                error = f"{type(exc).__name__}: {exc}"[:300]
        loads = [{"run_id": run, "table": table, "rows": rows, "at": at}
                 for run, table, rows, at in store.recent_loads(dest_id)]  # fmt: skip
        views.append(DestinationView(dest_id, dest.type, dest.mode, tables,
                                     store.schema_changes(dest_id), loads, error))  # fmt: skip
    return views


def _tables(opened: Any) -> list[TableView]:
    from eventpipe.reserved import is_internal

    views = []
    for name in sorted(opened.tables()):
        if is_internal(name):  # eventpipe's own (loads ledger, shadow tables)
            continue
        described = opened.describe(name)
        if described is None:
            continue
        columns = [(c, str(t)) for c, t in described.columns.items()]
        views.append(TableView(name, columns, list(described.primary_key)))
    return views
