"""Fields of nested Spark frames at JSON pointers (schema/pointers.py): read a field, set
a field, and the fields that hold JSON text (arrays, read as the text they were sent as).
"""

from __future__ import annotations

import logging

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, StringType, StructField, StructType

from eventpipe.schema.pointers import pointer

log = logging.getLogger("eventpipe.processing")


JSON_TEXT = "eventpipe.json_text"
"""Metadata of a string field that holds JSON text: an array, read as the text it was
sent as (processing/batch/read.py, read_events), so that its values are never rewritten."""


def is_json_text(field: StructField) -> bool:
    return bool(field.metadata.get(JSON_TEXT))


def json_text_arrays(data_type: DataType) -> DataType:
    """``data_type`` with every array in it read as JSON text (a string marked
    :data:`JSON_TEXT`), to give Spark's JSON reader: an array of mixed values would
    otherwise be read as an array of strings (``[1, "a"]`` as ``["1","a"]``)."""
    if not isinstance(data_type, StructType):
        return data_type
    fields = []
    for field in data_type.fields:
        if isinstance(field.dataType, ArrayType):
            field = StructField(field.name, StringType(), field.nullable, {JSON_TEXT: True})
        else:
            field = StructField(
                field.name, json_text_arrays(field.dataType), field.nullable, field.metadata
            )
        fields.append(field)
    return StructType(fields)


def has_arrays(data_type: DataType) -> bool:
    if isinstance(data_type, ArrayType):
        return True
    return isinstance(data_type, StructType) and any(has_arrays(f.dataType) for f in data_type)


def json_object(schema: StructType, names: dict[str, str]) -> Column:
    """The JSON text of an object of the columns ``names`` (column -> key) of a frame with
    ``schema``: JSON-text fields as the values they hold, not as strings."""

    def value(field: StructField, column: Column) -> Column:
        if is_json_text(field):
            return F.try_parse_json(column)
        if isinstance(field.dataType, StructType) and has_json_text(field.dataType):
            children = (value(f, column.getField(f.name)).alias(f.name) for f in field.dataType)
            return F.when(column.isNotNull(), F.struct(*children))
        return column

    fields = {f.name: f for f in schema.fields}
    return F.to_json(
        F.struct(*(value(fields[c], reference((c,))).alias(key) for c, key in names.items()))
    )


def has_json_text(schema: StructType) -> bool:
    return any(
        is_json_text(f) or (isinstance(f.dataType, StructType) and has_json_text(f.dataType))
        for f in schema.fields
    )


def reference(path: tuple[str, ...]) -> Column:
    """The column at ``path`` (keys quoted, so dots and backticks in keys are safe)."""
    return F.col(".".join("`" + k.replace("`", "``") + "`" for k in path))


def field_type(schema: StructType, path: tuple[str, ...]) -> DataType | None:
    """The Spark type at ``path``, or None when the batch has no such field."""
    node: DataType = schema
    for key in path:
        if not isinstance(node, StructType):
            return None
        field = next((f for f in node.fields if f.name == key), None)
        if field is None:
            return None
        node = field.dataType
    return node


def with_type_at(schema: StructType, path: tuple[str, ...], data_type: DataType) -> StructType:
    """``schema`` with the field at ``path`` (which exists) declared as ``data_type``."""
    fields = []
    for field in schema.fields:
        if field.name == path[0]:
            inner = field.dataType
            new = (
                data_type
                if len(path) == 1 or not isinstance(inner, StructType)
                else with_type_at(inner, path[1:], data_type)
            )
            field = StructField(field.name, new, field.nullable)
        fields.append(field)
    return StructType(fields)


def column_at(schema: StructType, path: tuple[str, ...]) -> Column | None:
    """The column at ``path``, or None when the batch has no such field."""
    return None if field_type(schema, path) is None else reference(path)


def set_path(
    frame: DataFrame, path: tuple[str, ...], value: Column, condition: Column | None = None
) -> DataFrame:
    """``frame`` with ``value`` at ``path`` (where ``condition`` holds; elsewhere the field
    keeps what it had). Missing parent objects are created.

    When the batch already has something else at ``path`` (a scalar where an object would
    go, or a value of another type), the frame is returned unchanged and a warning names
    the field: overwriting would lose the event's own data.
    """
    value_type = frame.select(value).schema.fields[0].dataType
    for depth in range(1, len(path) + 1):
        existing = field_type(frame.schema, path[:depth])
        if existing is None:
            break
        last = depth == len(path)
        if (last and existing != value_type) or (not last and not isinstance(existing, StructType)):
            log.warning(
                "%s already holds %s in this batch; enrichment into it skipped",
                pointer(path[:depth]), existing.simpleString(),
            )  # fmt: skip
            return frame
    return assign(frame, path, value, condition)


def assign(
    frame: DataFrame, path: tuple[str, ...], value: Column, condition: Column | None = None
) -> DataFrame:
    """``frame`` with ``value`` at ``path`` whatever the batch has there: missing or null
    objects on the way are made, a scalar on the way is replaced by an object (where
    ``condition`` holds; elsewhere the field keeps what it had)."""
    top = path[0]
    schema_top = field_type(frame.schema, (top,))
    base = reference((top,)) if schema_top is not None else None
    return frame.withColumn(top, _set(base, schema_top, path[1:], value, condition))


def _set(
    base: Column | None,
    base_type: DataType | None,
    rest: tuple[str, ...],
    value: Column,
    condition: Column | None,
) -> Column:
    if not rest:
        if condition is None:
            return value
        return (
            F.when(condition, value).otherwise(base)
            if base is not None
            else F.when(condition, value)
        )
    key = rest[0]
    if base is None or not isinstance(base_type, StructType):
        return F.struct(_set(None, None, rest[1:], value, condition).alias(key))
    fields: list[Column] = []
    found = False
    for field in base_type.fields:
        child = base.getField(field.name)
        if field.name == key:
            found = True
            child = _set(child, field.dataType, rest[1:], value, condition)
        fields.append(child.alias(field.name))
    if not found:
        fields.append(_set(None, None, rest[1:], value, condition).alias(key))
    return F.struct(*fields)
