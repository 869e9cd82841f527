"""Fields of nested Spark frames at JSON pointers (schema/pointers.py): read a field, set
a field, and the fields that hold JSON text (arrays, read as the text they were sent as).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, StringType, StructField, StructType

from eventpipe.reserved import unguessable
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
    ``schema``: JSON-text fields as the values they hold, not as strings.

    Written as one SQL expression, parsed by the JVM in one call: built from Column
    objects it took three Py4J round trips per column (the column, its alias, its place
    in the list), which for an event of 300 keys was a tenth of a stream's micro-batch
    (docs/stream.md). Names are quoted as :func:`reference` quotes them."""

    def value(field: StructField, path: str) -> str:
        if is_json_text(field):
            return f"try_parse_json({path})"
        if isinstance(field.dataType, StructType) and has_json_text(field.dataType):
            children = ", ".join(
                f"{value(f, path + '.' + quoted(f.name))} AS {quoted(f.name)}"
                for f in field.dataType
            )
            return f"CASE WHEN {path} IS NOT NULL THEN struct({children}) END"
        return path

    fields = {f.name: f for f in schema.fields}
    members = ", ".join(
        f"{value(fields[c], quoted(c))} AS {quoted(key)}" for c, key in names.items()
    )
    return F.expr(f"to_json(struct({members}))")


SQL_FROM_COLUMNS = 24
"""Where a projection costs less as SQL text (:func:`projected`; this 2-core machine, 20
rounds each: 5 columns 15 ms as Column objects against 25 ms as SQL, 20 columns 17 ms
against 17 ms, 40 columns 23 ms against 10 ms, 80 columns 47 ms against 10 ms)."""


def projected(frame: DataFrame, columns: Sequence[tuple[str, Column | str]]) -> DataFrame:
    """``frame`` projected onto ``columns``: each a name and its value, a Column or SQL
    text (names in it quoted by :func:`quoted`).

    In a classic session, from :data:`SQL_FROM_COLUMNS` columns, one SQL projection over
    a temporary view (dropped at once: the query is analysed when made), the Column
    values made first beside the frame's under names no event can know: built from
    Column objects, a projection costs three Py4J round trips per column (300 columns:
    130-200 ms, against 35-60 ms for the SQL; a stream's events are read and flattened
    so every micro-batch). A Spark Connect client builds its plans locally, and a SQL
    query's views are read when it runs, so it gets Column objects (SQL text parsed one
    by one). A plain column keeps its type, nullability and metadata either way."""
    if len(columns) < SQL_FROM_COLUMNS or not hasattr(frame, "_jdf"):  # Connect: no JVM side
        return frame.select(*(
            (value if isinstance(value, Column) else F.expr(value)).alias(name)
            for name, value in columns
        ))  # fmt: skip
    texts: list[tuple[str, str]] = []
    made: dict[str, Column] = {}
    for name, value in columns:
        if isinstance(value, Column):
            hidden = unguessable("_eventpipe_value")
            made[hidden] = value
            value = quoted(hidden)
        texts.append((name, value))
    if made:
        frame = frame.withColumns(made)
    spark = frame.sparkSession
    view = unguessable("_eventpipe_columns")
    frame.createOrReplaceTempView(view)
    try:
        listed = ", ".join(f"{value} AS {quoted(name)}" for name, value in texts)
        return spark.sql(f"SELECT {listed} FROM {quoted(view)}")
    finally:
        spark.catalog.dropTempView(view)


def quoted(name: str) -> str:
    """``name`` as one identifier of Spark SQL, whatever it holds (backticks doubled)."""
    return "`" + name.replace("`", "``") + "`"


def has_json_text(schema: StructType) -> bool:
    return any(
        is_json_text(f) or (isinstance(f.dataType, StructType) and has_json_text(f.dataType))
        for f in schema.fields
    )


def reference(path: tuple[str, ...]) -> Column:
    """The column at ``path`` (keys quoted, so dots and backticks in keys are safe)."""
    return F.col(".".join(quoted(k) for k in path))


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
