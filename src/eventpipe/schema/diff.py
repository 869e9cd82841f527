"""Table diffs: what a batch needs from a destination table, as a patch to apply under a lock.

Seed 1, table patching: columns the batch has and the table lacks are added; columns the
table has and the batch lacks are ignored; primary keys are created when configured.
Columns are never narrowed and never dropped.

A column that exists with a type the batch's values do not fit (the table has INT64, the
batch brings STRING) is not altered. The patch lists it as a conflict, and the loader
converts each value to the column's type when the conversion is exact (``"5"`` into
BIGINT); an event whose value cannot be converted goes to ``failed/`` naming the column,
its type and the value. Widening the column instead would change the type under every
query and view that reads it; a failed event can be replayed after a mapping fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from eventpipe.schema.types import DataType, fits


@dataclass(frozen=True)
class Table:
    """A table as eventpipe sees it: column names and lattice types, and the primary key."""

    name: str
    columns: Mapping[str, DataType] = field(default_factory=lambda: MappingProxyType({}))
    primary_key: tuple[str, ...] = ()


@dataclass(frozen=True)
class Conflict:
    column: str
    table_type: DataType
    batch_type: DataType


@dataclass(frozen=True)
class TablePatch:
    table: str
    create: bool
    add_columns: tuple[tuple[str, DataType], ...]
    set_primary_key: tuple[str, ...]
    conflicts: tuple[Conflict, ...]

    @property
    def empty(self) -> bool:
        return not (self.create or self.add_columns or self.set_primary_key)


def diff(existing: Table | None, batch: Table) -> TablePatch:
    """The patch that makes ``existing`` (None: no such table) able to take ``batch``.

    Columns are added in name order so that two pipelines patching the same table add
    them in the same order.
    """
    if existing is None:
        return TablePatch(
            table=batch.name,
            create=True,
            add_columns=tuple(sorted(batch.columns.items())),
            set_primary_key=batch.primary_key,
            conflicts=(),
        )
    add = tuple(sorted((c, t) for c, t in batch.columns.items() if c not in existing.columns))
    conflicts = tuple(
        Conflict(c, existing.columns[c], t)
        for c, t in sorted(batch.columns.items())
        if c in existing.columns and not fits(t, existing.columns[c])
    )
    wants_key = batch.primary_key and not existing.primary_key
    return TablePatch(
        table=batch.name,
        create=False,
        add_columns=add,
        set_primary_key=batch.primary_key if wants_key else (),
        conflicts=conflicts,
    )
