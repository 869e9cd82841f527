"""Flatten: nested JSON columns become flat columns named by :mod:`eventpipe.schema.naming`.

* Structs are walked; each leaf (a scalar or an array) becomes one column.
* Arrays become their JSON text (seed 1: arrays are stored as JSON strings).
* Leaves whose names collide (``A`` and ``a``; ``a_b`` and ``a.b``) share the column:
  in each event, the first present one in ``naming.winner`` order keeps it, and every
  other present one is kept in ``_unmapped_data``, a JSON object keyed by JSON pointer.
  Colliding leaves of different Spark types are compared as strings.
* An empty object has no leaf and leaves no column.
* A top-level field is named by the event's own key (:func:`eventpipe.reserved.unescape`
  of the frame's column), and the naming rules escape it again if it looks like
  eventpipe's own; eventpipe's own top-level columns (metering's) keep their names.

Everything is a native column expression: no Python runs per row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructType

from eventpipe import reserved
from eventpipe.processing.steps.fields import projected, quoted
from eventpipe.processing.steps.mapping import Leaf, Mapping
from eventpipe.schema.naming import UNMAPPED_COLUMN, column_name
from eventpipe.schema.pointers import pointer
from eventpipe.schema.types import DataType as SchemaType


def leaves(schema: StructType) -> list[Leaf]:
    """Every leaf of ``schema``: its path in the event's own keys, its ``source`` in the
    frame's columns (a top-level key may be escaped there)."""
    found: list[Leaf] = []

    def walk(fields: StructType, path: tuple[str, ...], source: tuple[str, ...]) -> None:
        for field in fields.fields:
            key = field.name if source else reserved.unescape(field.name)
            here, there = (*path, key), (*source, field.name)
            if isinstance(field.dataType, StructType):
                walk(field.dataType, here, there)
            else:
                found.append(Leaf(here, field.dataType, source=there))

    walk(schema, (), ())
    return found


def _name(leaf: Leaf) -> str:
    """A leaf's column: eventpipe's own top-level columns keep their names."""
    if len(leaf.path) == 1 and leaf.source == leaf.path and reserved.is_internal(leaf.path[0]):
        return leaf.path[0]
    return column_name(leaf.path)


@dataclass(frozen=True)
class Flat:
    frame: DataFrame
    explicit: dict[str, SchemaType]
    """Columns with a type set by a mapping rule or seed 1's implicit casts."""
    pointers: dict[str, str]
    """Each column's JSON pointer (of the winning path): its key in ``_unmapped_data``."""
    sources: dict[str, str]
    """Each column's JSON pointer in the event as it came (a mapping may have moved it;
    absent for a constant)."""


def flatten(frame: DataFrame, *, passthrough: Sequence[str] = (reserved.CORRUPT,)) -> DataFrame:
    """One column per leaf, named by the naming rules; ``passthrough`` columns kept as is."""
    return flatten_mapped(frame, passthrough=passthrough).frame


def flatten_mapped(
    frame: DataFrame,
    *,
    passthrough: Sequence[str] = (reserved.CORRUPT,),
    mapping: Mapping | None = None,
) -> Flat:
    """:func:`flatten` after the mapping rules (processing.mapping) moved, removed, cast
    and added leaves."""
    found = [
        leaf
        for leaf in leaves(frame.schema)
        if not (leaf.source is not None and len(leaf.source) == 1 and leaf.source[0] in passthrough)
    ]
    mapped, explicit = (mapping or Mapping()).apply(found)
    groups: dict[str, list[Leaf]] = {}
    for leaf in mapped:
        groups.setdefault(_name(leaf), []).append(leaf)

    # Each column: SQL text where it is a leaf read as it is (most of them), else a
    # Column; one projection (fields.projected) makes them all.
    columns: list[tuple[str, Column | str]] = [
        (c, quoted(c)) for c in passthrough if c in frame.columns
    ]
    losers: list[Column] = []
    pointers: dict[str, str] = {}
    sources: dict[str, str] = {}
    for name, group in sorted(groups.items()):
        ordered = sorted(group, key=lambda leaf: (len(leaf.path), leaf.path))
        pointers[name] = pointer(ordered[0].path)
        if source := ordered[0].source:  # Spark's names: the top-level one escaped
            sources[name] = pointer((reserved.unescape(source[0]), *source[1:]))
        if len(ordered) == 1:
            columns.append((name, ordered[0].sql or ordered[0].column))
            continue
        same_type = len({type(leaf.spark_type) for leaf in ordered}) == 1
        values = [leaf.column if same_type else leaf.column.cast(StringType()) for leaf in ordered]
        columns.append((name, F.coalesce(*values)))
        for i, leaf in enumerate(ordered[1:], start=1):
            earlier_present = F.coalesce(*values[:i]).isNotNull()
            losers.append(F.when(earlier_present, values[i]).alias(pointer(leaf.path)))
    if losers:
        unmapped = F.to_json(F.struct(*losers))
        columns.append((UNMAPPED_COLUMN, F.when(unmapped != F.lit("{}"), unmapped)))
        pointers[UNMAPPED_COLUMN] = pointer((UNMAPPED_COLUMN,))
    return Flat(projected(frame, columns), explicit, pointers, sources)
