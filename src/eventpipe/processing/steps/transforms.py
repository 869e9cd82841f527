"""A destination's namespace and transforms (seed 3's namespace filtering and transform
functions): between the log and each writer, user logic that may change events or drop
them for that destination alone.

They run per destination, on the events with their table name, after the lookups and
before the mapping (docs/transforms.md):

* ``namespace``: a regular expression found in the table name, or the event is filtered;
* ``filter``: a Spark SQL boolean expression; events for which it is not true are
  filtered (counted as such, not failed);
* ``set`` and ``drop``: fields set to Spark SQL expressions, fields removed;
* ``python``: a user function on Arrow record batches (or pandas frames), run with
  ``mapInArrow``; what it returns is kept. An exception sends the batch's events to
  failed/ with a summary of the traceback; the pipeline goes on.

An event filtered gets the table :data:`FILTERED`; a failed one a null table and an error,
like the pipeline's own failures, so the counts and failed/ work as for any event.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import logging
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, MapType, StructType

from eventpipe.config import Config, DestinationConfig, TransformStep
from eventpipe.errors import ConfigError, first_line
from eventpipe.processing.steps.fields import assign, field_type, reference
from eventpipe.reserved import ERROR, FILTERED, ROW, TABLE

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType

log = logging.getLogger("eventpipe.processing")

SAMPLE_ROWS = 100
"""Events a python transform is first called with, on the driver, to learn the columns
it returns (mapInArrow needs them before it runs)."""

_LENIENT = threading.Lock()


def check(spark: SparkSession, config: Config) -> None:
    """ConfigError naming the step of any filter or set expression Spark cannot parse,
    or python function that cannot be imported: before anything is loaded."""
    from pyspark.errors import AnalysisException, ParseException

    nothing = spark.range(0)
    for dest_id, dest in config.destinations.items():
        for index, step in enumerate(dest.transforms):
            where = _where(dest_id, index, step)
            texts = [step.filter] if step.filter else list((step.assign or {}).values())
            for text in texts:
                try:  # the syntax alone: the fields are the batch's, unknown here
                    _ = nothing.select(F.expr(text)).schema
                except ParseException as exc:
                    raise ConfigError(f"{where}: {text!r}: {first_line(exc)}") from None
                except AnalysisException:
                    pass
            if step.python:
                user_function(step.python)


def apply(frame: DataFrame, dest_id: str, dest: DestinationConfig) -> DataFrame:
    """``frame`` (the events' fields and TABLE, ERROR, ROW) through the destination's
    namespace and transforms, in order."""
    if dest.namespace != ".*":
        frame = _drop_where(frame, ~F.col(TABLE).rlike(dest.namespace))
    for index, step in enumerate(dest.transforms):
        where = _where(dest_id, index, step)
        if step.filter:
            frame = _filter(frame, step.filter, where)
        elif step.assign:
            frame = _assign(frame, step.assign, where)
        elif step.drop:
            frame = _drop(frame, step.drop)
        elif step.hash:
            assert step.secret is not None  # the config checked it
            frame = _hash(frame, step.hash, step.secret.get_secret_value().encode())
        elif step.python:
            frame = _python(frame, step.python, where)
    return frame


def _where(dest_id: str, index: int, step: TransformStep) -> str:
    return f"destination {dest_id!r} transforms[{index}] ({step.kind})"


def live() -> Column:
    """Events still bound for a table (not failed, skipped or filtered)."""
    table = F.col(TABLE)
    return table.isNotNull() & (table != F.lit("")) & (table != F.lit(FILTERED))


def _drop_where(frame: DataFrame, condition: Column) -> DataFrame:
    """Live events for which ``condition`` holds are filtered."""
    return frame.withColumn(
        TABLE, F.when(live() & condition, F.lit(FILTERED)).otherwise(F.col(TABLE))
    )


@contextmanager
def _lenient(spark: SparkSession) -> Iterator[None]:
    """User expressions are built with Spark's non-ANSI semantics: a value that does not
    convert, a division by zero or an overflow gives null for that event instead of
    failing the batch (the expressions keep these semantics when the plan runs)."""
    key = "spark.sql.ansi.enabled"
    with _LENIENT:
        before = spark.conf.get(key)
        spark.conf.set(key, "false")
        try:
            yield
        finally:
            spark.conf.set(key, before or "true")


_MISSING = ("UNRESOLVED_COLUMN.WITH_SUGGESTION", "UNRESOLVED_COLUMN.WITHOUT_SUGGESTION",
            "FIELD_NOT_FOUND")  # fmt: skip


def _with_expression(
    frame: DataFrame, text: str, where: str, use: Callable[[Column], DataFrame]
) -> DataFrame:
    """``use(expression)``, built and analysed lenient. A field the expression names that
    no event of the batch has makes it null for every event (as it is for one event
    without it), with a warning: the batch's events do not fail for it."""
    from pyspark.errors import AnalysisException

    try:
        with _lenient(frame.sparkSession), _quiet():
            return use(F.expr(text))
    except AnalysisException as exc:
        if exc.getCondition() not in _MISSING:
            raise ConfigError(f"{where}: {text!r}: {first_line(exc)}") from None
        log.warning("%s: no event of this batch has a field it names (%s): null for all",
                    where, first_line(exc))  # fmt: skip
        return use(F.lit(None))


@contextmanager
def _quiet() -> Iterator[None]:
    """Without PySpark's error log of each analysis exception: an expression naming a
    field the batch lacks is expected, and handled."""
    loggers = [logging.getLogger(n) for n in ("SQLQueryContextLogger",
                                              "DataFrameQueryContextLogger")]  # fmt: skip
    before = [logger.disabled for logger in loggers]
    for logger in loggers:
        logger.disabled = True
    try:
        yield
    finally:
        for logger, was in zip(loggers, before, strict=True):
            logger.disabled = was


def _filter(frame: DataFrame, text: str, where: str) -> DataFrame:
    def use(value: Column) -> DataFrame:
        return _drop_where(frame, ~F.coalesce(value.cast("boolean"), F.lit(False)))

    return _with_expression(frame, text, where, use)


def _assign(frame: DataFrame, fields: dict[str, str], where: str) -> DataFrame:
    for name, text in fields.items():
        parts = name.split(".")

        def use(value: Column, frame: DataFrame = frame, parts: list[str] = parts) -> DataFrame:
            return assign(frame, tuple(parts), value)

        frame = _with_expression(frame, text, f"{where} {name}", use)
    return frame


def _hash(frame: DataFrame, fields: tuple[str, ...], secret: bytes) -> DataFrame:
    """Each field the batch has replaced by its keyed hash (TransformStep.hash)."""
    for name in fields:
        path = tuple(name.split("."))
        kind = field_type(frame.schema, path)
        if kind is None or path[0] in (TABLE, ERROR, ROW):
            continue
        value = reference(path)
        text = F.to_json(value) if isinstance(kind, StructType | ArrayType | MapType) else (
            value.cast("string"))  # fmt: skip
        frame = assign(frame, path, F.when(value.isNotNull(), hmac_sha256(text, secret)))
    return frame


def hmac_sha256(text: Column, key: bytes) -> Column:
    """HMAC-SHA256 (RFC 2104) of ``text``'s UTF-8 bytes with ``key``, as lowercase hex:
    built from Spark's own ``sha2``, with the padded keys as constants, so it runs in
    the JVM on every executor (no Python worker)."""
    block = 64
    if len(key) > block:
        key = hashlib.sha256(key).digest()
    key = key.ljust(block, b"\0")
    inner = F.lit(bytes(b ^ 0x36 for b in key))
    outer = F.lit(bytes(b ^ 0x5C for b in key))
    inner_hash = F.unhex(F.sha2(F.concat(inner, F.encode(text, "UTF-8")), 256))
    return F.sha2(F.concat(outer, inner_hash), 256)


def _drop(frame: DataFrame, fields: tuple[str, ...]) -> DataFrame:
    for name in fields:
        top, *rest = name.split(".")
        if top not in frame.columns or top in (TABLE, ERROR, ROW):
            continue
        if not rest:
            frame = frame.drop(top)
            continue
        kept = _without(F.col(top), frame.schema[top].dataType, rest)
        frame = frame.drop(top) if kept is None else frame.withColumn(top, kept)
    return frame


def _without(column: Column, struct_type: DataType, parts: list[str]) -> Column | None:
    """``column`` without the field at ``parts`` (unchanged if it has none); None when
    nothing would be left of it (Spark has no empty objects: the object goes too)."""
    if not isinstance(struct_type, StructType):
        return column
    fields = {f.name: f.dataType for f in struct_type.fields}
    head, rest = parts[0], parts[1:]
    if head not in fields:
        return column
    kept = None if not rest else _without(column.getField(head), fields[head], rest)
    if kept is not None:
        return column.withField(head, kept)
    if len(fields) == 1:
        return None
    return column.dropFields(head)


def user_function(spec: str) -> Callable[[Any], Any]:
    """The function ``package.module:function``, its module pickled by value, so that
    Spark's workers (on a cluster too) run it without the module installed there."""
    from pyspark import cloudpickle  # the copy Spark pickles functions with

    module_name, _, name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
        function = getattr(module, name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"python transform {spec}: {exc}",
            fix="make the module importable (on the PYTHONPATH of eventpipe)",
        ) from None
    if not callable(function):
        raise ConfigError(f"python transform {spec}: {name} is not a function")
    if not module_name.startswith("eventpipe."):
        cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]
    return function  # type: ignore[no-any-return]


def _wants_pandas(function: Callable[[Any], Any]) -> bool:
    """A function whose first parameter is annotated as a pandas DataFrame gets one."""
    try:
        first = next(iter(inspect.signature(function).parameters.values()))
    except (StopIteration, TypeError, ValueError):
        return False
    annotation = first.annotation
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    return "DataFrame" in str(text)


def _python(frame: DataFrame, spec: str, where: str) -> DataFrame:
    import pyarrow as pa
    from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

    function = user_function(spec)
    pandas = _wants_pandas(function)
    inputs = [c for c in frame.columns if c not in (TABLE, ERROR)]  # ROW included
    bound = frame.filter(live())
    rest = frame.filter(~live()).select(ROW, TABLE, ERROR)
    sample = bound.select(*inputs).limit(SAMPLE_ROWS).toArrow()
    if sample.num_rows == 0:
        return frame
    given = to_arrow_schema(bound.select(*inputs).schema)
    try:
        returned = _arrow(function(_as_given(sample.combine_chunks().to_batches()[0], pandas)))
        fields = [f for f in returned.schema if f.name != ROW]
    except Exception as exc:  # noqa: BLE001 - the batches will report it, event by event
        log.warning("%s: on a sample of %d events: %s; its input columns are assumed",
                    where, sample.num_rows, _summary(spec, exc))  # fmt: skip
        fields = [f for f in given if f.name != ROW]
    # Every field nullable, nested ones too: a non-nullable struct field the sample
    # showed (a lookup's result) may be null in other batches, and Spark would write the
    # null into a field it was told never holds one (a NullPointerException in a task).
    fields = [_nullable(f) for f in fields]
    schema = pa.schema([*fields, pa.field(ROW, pa.int64()), pa.field(TABLE, pa.string()),
                        pa.field(ERROR, pa.string())])  # fmt: skip
    run = functools.partial(_run_batches, function=function, pandas=pandas, spec=spec,
                            schema=schema)  # fmt: skip
    out = bound.select(*inputs, TABLE).mapInArrow(run, from_arrow_schema(schema))
    return out.unionByName(rest, allowMissingColumns=True)


def _nullable(field: pa.Field) -> pa.Field:
    """``field`` nullable, and every field nested in it."""
    import pyarrow as pa

    kind = field.type
    if pa.types.is_struct(kind):
        kind = pa.struct([_nullable(kind.field(i)) for i in range(kind.num_fields)])
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
        item = _nullable(kind.value_field)
        kind = pa.list_(item) if pa.types.is_list(kind) else pa.large_list(item)
    elif pa.types.is_map(kind):
        kind = pa.map_(kind.key_field, _nullable(kind.item_field))
    return pa.field(field.name, kind, nullable=True, metadata=field.metadata)


def _as_given(batch: pa.RecordBatch, pandas: bool) -> Any:
    return batch.to_pandas() if pandas else batch


def _arrow(value: Any) -> pa.RecordBatch:
    """What a user function returned, as one record batch."""
    import pyarrow as pa

    if isinstance(value, pa.RecordBatch):
        return value
    if isinstance(value, pa.Table):
        batches = value.combine_chunks().to_batches()
        return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=value.schema)
    if value is not None and type(value).__name__ == "DataFrame":  # pandas
        return pa.RecordBatch.from_pandas(value, preserve_index=False)
    raise TypeError(
        f"returned {type(value).__name__}, not a pyarrow RecordBatch or Table or a pandas DataFrame"
    )


def _run_batches(
    batches: Iterator[pa.RecordBatch],
    *,
    function: Callable[[Any], Any],
    pandas: bool,
    spec: str,
    schema: pa.Schema,
) -> Iterator[pa.RecordBatch]:
    """On a Spark worker: each batch through the user function."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for batch in batches:
        rows, tables = batch.column(ROW), batch.column(TABLE)
        given = batch.drop_columns([TABLE])
        try:
            returned = _arrow(function(_as_given(given, pandas)))
            kept, problem = _conformed(returned, rows, schema)
        except Exception as exc:  # noqa: BLE001 - the batch's events go to failed/
            kept, problem = None, _summary(spec, exc)
        if kept is None:
            yield _rows_only(schema, rows, None, f"{problem}")
            continue
        kept_rows = kept.column(ROW)
        at = pc.index_in(kept_rows, value_set=rows)
        yield pa.RecordBatch.from_arrays(
            [*kept.columns[: len(schema) - 3], kept_rows, pc.take(tables, at),
             pa.nulls(kept.num_rows, pa.string())],
            schema=schema,
        )  # fmt: skip
        dropped = pc.invert(pc.is_in(rows, value_set=kept_rows))
        if pc.any(dropped).as_py():
            yield _rows_only(schema, rows.filter(dropped), FILTERED, None)


def _conformed(
    returned: pa.RecordBatch, rows: pa.Array, schema: pa.Schema
) -> tuple[pa.RecordBatch | None, str | None]:
    """``returned`` with the columns of ``schema`` (less TABLE and ERROR), in order and
    of their types, and each event's ROW; or why it cannot be."""
    import pyarrow as pa
    import pyarrow.compute as pc

    names = set(returned.schema.names)
    wanted = [f for f in schema if f.name not in (TABLE, ERROR)]
    extra = sorted(names - {f.name for f in wanted})
    if extra:
        return None, (
            f"returned column(s) {', '.join(extra)} that its result on the first events "
            "did not have"
        )
    if ROW not in names:
        if returned.num_rows != len(rows):
            return None, f"dropped the {ROW} column and changed the number of events"
        returned = returned.append_column(ROW, rows)
    elif not pc.all(pc.is_in(returned.column(ROW), value_set=rows)).as_py():
        return None, f"returned {ROW} values that are not its events'"
    columns = []
    for wanted_field in wanted:
        if wanted_field.name in names or wanted_field.name == ROW:
            column = returned.column(wanted_field.name)
            try:
                columns.append(column.cast(wanted_field.type))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                return None, f"column {wanted_field.name}: {exc}"
        else:
            columns.append(pa.nulls(returned.num_rows, wanted_field.type))
    return pa.RecordBatch.from_arrays(columns, schema=pa.schema(wanted)), None


def _rows_only(
    schema: pa.Schema, rows: pa.Array, table: str | None, error: str | None
) -> pa.RecordBatch:
    """Events by ROW alone, every field null: filtered (``table``) or failed (``error``)."""
    import pyarrow as pa

    count = len(rows)
    arrays = [pa.nulls(count, f.type) for f in schema if f.name not in (ROW, TABLE, ERROR)]
    return pa.RecordBatch.from_arrays(
        [*arrays, rows, pa.array([table] * count, pa.string()),
         pa.array([error] * count, pa.string())],
        schema=schema,
    )  # fmt: skip


def _summary(spec: str, exc: BaseException) -> str:
    """One line: the exception and where in the user's code it was raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    at = f" (at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return f"python transform {spec} raised {type(exc).__name__}: {exc}"[:500] + at
