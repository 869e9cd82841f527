"""Flatten: nested JSON columns become flat columns named by :mod:`eventpipe.schema.naming`.

* Structs are walked; each leaf (a scalar or an array) becomes one column.
* Arrays become their JSON text (seed 1: arrays are stored as JSON strings).
* Leaves whose names collide (``A`` and ``a``; ``a_b`` and ``a.b``) share the column:
  in each event, the first present one in ``naming.winner`` order keeps it, and every
  other present one is kept in ``_unmapped_data``, a JSON object keyed by JSON pointer.
  Colliding leaves of different Spark types are compared as strings.
* An empty object has no leaf and leaves no column.

Everything is a native column expression: no Python runs per row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, StringType, StructType

from eventpipe.processing.mapping import Leaf, Mapping
from eventpipe.processing.paths import pointer, reference
from eventpipe.schema.naming import UNMAPPED_COLUMN, column_name
from eventpipe.schema.types import DataType as SchemaType

CORRUPT_COLUMN = "_corrupt_record"


def _reference(path: tuple[str, ...], spark_type: DataType) -> Column:
    ref = reference(path)
    return F.to_json(ref) if isinstance(spark_type, ArrayType) else ref


def leaves(schema: StructType, prefix: tuple[str, ...] = ()) -> list[Leaf]:
    found: list[Leaf] = []
    for field in schema.fields:
        path = (*prefix, field.name)
        if isinstance(field.dataType, StructType):
            found.extend(leaves(field.dataType, path))
        else:
            found.append(Leaf(path, field.dataType, _reference(path, field.dataType), source=path))
    return found


@dataclass(frozen=True)
class Flat:
    frame: DataFrame
    explicit: dict[str, SchemaType]
    """Columns with a type set by a mapping rule or seed 1's implicit casts."""
    pointers: dict[str, str]
    """Each column's JSON pointer (of the winning path): its key in ``_unmapped_data``."""


def flatten(frame: DataFrame, *, passthrough: Sequence[str] = (CORRUPT_COLUMN,)) -> DataFrame:
    """One column per leaf, named by the naming rules; ``passthrough`` columns kept as is."""
    return flatten_mapped(frame, passthrough=passthrough).frame


def flatten_mapped(
    frame: DataFrame,
    *,
    passthrough: Sequence[str] = (CORRUPT_COLUMN,),
    mapping: Mapping | None = None,
) -> Flat:
    """:func:`flatten` after the mapping rules (processing.mapping) moved, removed, cast
    and added leaves."""
    found = [
        leaf
        for leaf in leaves(frame.schema)
        if not (leaf.path[0] in passthrough and len(leaf.path) == 1)
    ]
    mapped, explicit = (mapping or Mapping()).apply(found)
    groups: dict[str, list[Leaf]] = {}
    for leaf in mapped:
        groups.setdefault(column_name(leaf.path), []).append(leaf)

    columns: list[Column] = [F.col(f"`{c}`") for c in passthrough if c in frame.columns]
    losers: list[Column] = []
    pointers: dict[str, str] = {}
    for name, group in sorted(groups.items()):
        ordered = sorted(group, key=lambda leaf: (len(leaf.path), leaf.path))
        pointers[name] = pointer(ordered[0].path)
        if len(ordered) == 1:
            columns.append(ordered[0].column.alias(name))
            continue
        same_type = len({type(leaf.spark_type) for leaf in ordered}) == 1
        values = [leaf.column if same_type else leaf.column.cast(StringType()) for leaf in ordered]
        columns.append(F.coalesce(*values).alias(name))
        for i, leaf in enumerate(ordered[1:], start=1):
            earlier_present = F.coalesce(*values[:i]).isNotNull()
            losers.append(F.when(earlier_present, values[i]).alias(pointer(leaf.path)))
    if losers:
        unmapped = F.to_json(F.struct(*losers))
        columns.append(F.when(unmapped != F.lit("{}"), unmapped).alias(UNMAPPED_COLUMN))
        pointers[UNMAPPED_COLUMN] = pointer((UNMAPPED_COLUMN,))
    return Flat(frame.select(*columns), explicit, pointers)
