"""``table_name_template`` compiled to one Spark column expression (never Python per row).

The syntax (:mod:`eventpipe.schema.templates`, parsed at config check): literal text
with ``{{ path.to.field }}`` placeholders, and a date filter for timestamps. A field that
is absent renders as the empty string. The rendered text is sanitised like a
column name (:func:`eventpipe.schema.naming.table_name`), natively, with the same result.

Result columns: the table name (empty: skip this destination for the event) and an error
(non-null when the template could not be evaluated for the event, which then goes to
failed/): a ``date`` filter on a value that is not a timestamp, or a placeholder that
names an object or array.

A value renders by the event alone, whatever type Spark inferred for the batch around it
(a field holding numbers beside texts is read as text, objects beside texts as JSON
text): a number (or a text that reads as a JSON number) renders as a float64 prints it,
whole numbers without a fraction (``5``, ``5.0`` and ``"5"`` all render ``5``; ``1e2``
renders ``100``); an object or array (or JSON text of one) is the event's error.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, NumericType, StringType, StructType

from eventpipe.processing.steps import lambdas
from eventpipe.processing.steps.fields import field_type, reference
from eventpipe.processing.steps.reused import Reused
from eventpipe.reserved import RESERVED_PATTERN
from eventpipe.schema.naming import MAX_NAME_LENGTH, table_name
from eventpipe.schema.templates import Template, java_date_pattern

_JSON_NUMBER = r"^-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?$"
_JSON_CONTAINER = r"^\s*[\[{]"


def _field(schema: StructType, path: tuple[str, ...]) -> tuple[Column | None, DataType | None]:
    """The column at ``path`` and its type; (None, None) when the batch has no such field.

    A path that runs into a text (an object some events sent as text, or one that Spark
    read as JSON text beside texts) reads on into it as JSON: the event's own value,
    whatever its neighbours in the batch made of the column."""
    depth, found = _place(schema, path)
    if found is None:
        return None, None
    if depth == len(path):
        return reference(path), found
    inner = "".join(f"['{key}']" for key in path[depth:])
    return F.get_json_object(reference(path[:depth]), "$" + inner), found


def _place(schema: StructType, path: tuple[str, ...]) -> tuple[int, DataType | None]:
    """How much of ``path`` the batch has (the depth) and the type :func:`_field` reads
    there: the field's own; a text on its way (read on as JSON); None for neither."""
    for depth in range(len(path), 0, -1):
        found = field_type(schema, path[:depth])
        if found is None:
            continue
        if depth == len(path) or isinstance(found, StringType):
            return depth, found
        return depth, None
    return 0, None


def _number_text(number: Column) -> Column:
    """A float64's text as a table name reads it: whole numbers without a fraction."""
    whole = (number % 1 == 0) & (F.abs(number) < F.lit(1e38))
    return F.when(whole, number.try_cast("decimal(38,0)").cast("string")).otherwise(
        number.cast("string")
    )


def _scalar_text(ref: Column, data_type: DataType) -> Column:
    """The text a scalar renders as, the same for one event whatever the batch's type."""
    if isinstance(data_type, NumericType):
        return _number_text(ref.cast("double"))
    if isinstance(data_type, StringType):
        number = _number_text(ref.try_cast("double"))
        return F.when(ref.rlike(_JSON_NUMBER), number).otherwise(ref)
    return ref.cast("string")


def _container(ref: Column, data_type: DataType) -> Column | None:
    """Whether the value is an object or array (by type, or JSON text of one); None where
    the type holds neither."""
    if isinstance(data_type, StructType | ArrayType):
        return ref.isNotNull()
    if isinstance(data_type, StringType):
        return ref.rlike(_JSON_CONTAINER) & F.try_parse_json(ref).isNotNull()
    return None


def table_names(frame: DataFrame, text: Column, *, limit: int = 1000) -> Column:
    """The table name of each row from its rendered ``text``, for ``frame``.

    Batches hold few distinct names, and sanitising is regex work: so the distinct texts
    are read first (a cheap query on the template's fields), named once each by
    :func:`eventpipe.schema.naming.table_name`, and looked up per row. With more than
    ``limit`` distinct texts (a template over a user id, say), the native expression.
    """
    distinct = frame.select(text.alias("t")).distinct().limit(limit + 1).collect()
    if len(distinct) > limit:
        return sanitize_table_name(text)
    names = {row["t"]: table_name(row["t"]) for row in distinct if row["t"] is not None}
    if not names:
        return F.lit(None).cast("string")
    entries = [F.lit(v) for pair in sorted(names.items()) for v in pair]
    return F.create_map(*entries)[text]


def render(template: Template, schema: StructType) -> tuple[Column, Column]:
    """(rendered text before sanitising, error) columns for frames with ``schema``."""
    rendered: list[Column] = []
    errors: list[Column] = []
    for part in template.parts:
        if isinstance(part, str):
            rendered.append(F.lit(part))
            continue
        ref, data_type = _field(schema, part.path)
        name = ".".join(part.path)
        if ref is None or data_type is None:
            rendered.append(F.lit(""))
            continue
        container = _container(ref, data_type)
        if container is not None:
            errors.append(F.when(container, F.lit(f"{name} is an object or array")))
        if isinstance(data_type, StructType | ArrayType):
            rendered.append(F.lit(""))
            continue
        if part.date_format is None:
            rendered.append(F.coalesce(_scalar_text(ref, data_type), F.lit("")))
            continue
        # Spark 4 runs ANSI SQL: a bad value raises in to_timestamp, so try_ it and report.
        stamp = F.try_to_timestamp(ref.cast("string"))
        errors.append(F.when(ref.isNotNull() & stamp.isNull(), F.lit(f"{name} is not a timestamp")))
        rendered.append(
            F.coalesce(F.date_format(stamp, java_date_pattern(part.date_format)), F.lit(""))
        )
    text = F.concat(*rendered) if rendered else F.lit("")
    error = F.coalesce(*errors) if errors else F.lit(None).cast("string")
    return text, error


_REUSED = Reused()


def rendered(template: Template, schema: StructType) -> tuple[Column, Column]:
    """:func:`render`'s columns, built once per template and types of the fields it
    reads (steps/reused.py: each micro-batch of a stream would build them again)."""
    return _REUSED.get(("render", _shape(template, schema)), lambda: render(template, schema))


def sanitized(template: Template, schema: StructType) -> Column:
    """:func:`sanitize_table_name` of :func:`rendered`'s text, built once as it is."""
    return _REUSED.get(("sanitize", _shape(template, schema)),
                       lambda: sanitize_table_name(rendered(template, schema)[0]))  # fmt: skip


def _shape(template: Template, schema: StructType) -> tuple[object, ...]:
    """What :func:`render` reads of ``schema`` for ``template``: where each placeholder's
    value is, and its type (:func:`_place`)."""
    places = tuple(_place(schema, p.path) for p in template.parts if not isinstance(p, str))
    return template, places


def sanitize_table_name(text: Column) -> Column:
    """:func:`eventpipe.schema.naming.table_name`, as a Spark expression.

    Each step's value is bound once (a lambda over a one-element array), not written
    again at each use: as nested expressions, the steps' references to each other made
    some 70 regular-expression calls per row (3M rows: 35 s, against 3 s bound). The
    lambdas' variables are named in the order they are made (steps/lambdas.py)."""
    made = itertools.count()

    def let(value: Column, body: Callable[[Column], Column]) -> Column:
        return lambdas.transform(F.array(value), body, f"name_{next(made)}")[0]

    def named(text: Column) -> Column:
        def keyed(cleaned: Column) -> Column:
            key = F.concat(F.lit("_k"), F.substring(F.sha1(text), 1, 8))
            return F.when(~cleaned.rlike("[a-z0-9]"), key).otherwise(cleaned)

        cleaned = F.regexp_replace(F.lower(text), "[^a-z0-9_]", "_")
        name = let(let(let(let(cleaned, keyed), digit_escaped), escaped), shortened)
        return F.when(text == F.lit(""), F.lit("")).otherwise(name)

    def digit_escaped(name: Column) -> Column:
        return F.when(name.rlike("^[0-9]"), F.concat(F.lit("_"), name)).otherwise(name)

    def escaped(name: Column) -> Column:  # eventpipe.reserved.escape, on lower-case names
        return F.when(name.rlike(RESERVED_PATTERN), F.concat(F.lit("_"), name)).otherwise(name)

    def shortened(name: Column) -> Column:
        return F.when(
            F.length(name) > MAX_NAME_LENGTH,
            F.concat(F.substring(name, 1, 54), F.lit("_"), F.substring(F.sha1(name), 1, 8)),
        ).otherwise(name)

    # Most texts are names already (``page_view``): those skip the steps.
    valid = (
        text.rlike(VALID_NAME) & (F.length(text) <= MAX_NAME_LENGTH) & ~text.rlike(RESERVED_PATTERN)
    )
    return F.when(valid, text).otherwise(let(text, named))


VALID_NAME = r"^(?:[a-z]|_+[a-z0-9])[a-z0-9_]*\z"
"""A text that :func:`eventpipe.schema.naming.table_name` leaves as it is (with at most
MAX_NAME_LENGTH characters, and not reserved)."""
