"""Usage metering (seed 5): product classification of events.

A product (``product_uid``, ``event_name``, ``filters``) matches an event when the
event's ``$.properties.name`` equals ``event_name`` and every filter passes. A filter is
``{path, _in, not_in, optional}``:

* ``path``: a JSONPath into the event (``$.properties.region``, ``$.items[0].sku``);
* ``_in``: the value must be one of these; ignored when empty;
* ``not_in``: the value must be none of these; ignored when empty;
* ``optional``: when the event has no value at ``path``, the filter passes (``_in`` and
  ``not_in`` are ignored); without it, a missing value fails the filter. When the value
  is there, ``_in`` and ``not_in`` apply either way.

Values are compared as the text of their JSON value (``"eu"``, ``5``, ``2.5``,
``true``): a list entry ``5`` matches the number 5 and the string "5". A JSON null is a
missing value. An event matching several products gives one row per product; one
matching none has a null ``product_uid`` (it goes to the unclassified table).

The catalogue comes from a CSV file (columns ``product_uid``, ``event_name``, ``filters``,
the last a JSON list), a YAML file (a list of the same objects), or rows of a table read
before the run (docs/metering.md). Matching runs natively in Spark: each distinct path is
read once per event, from the event's columns (or its JSON text for paths beyond names and
indexes), and one CASE over the event names evaluates only the products of the event's name.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eventpipe import reserved
from eventpipe.errors import ConfigError
from eventpipe.processing.steps import lambdas
from eventpipe.yamlfiles import load_yaml

if TYPE_CHECKING:
    from datetime import datetime

    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

    from eventpipe.config import MeteringConfig
    from eventpipe.destinations.base import Metered

NAME_PATH = "$.properties.name"
"""Where an event's name is read to match ``event_name`` (seed 5's default)."""


@dataclass(frozen=True)
class Filter:
    path: str
    within: tuple[str, ...] = ()
    """``_in``, as JSON text."""
    not_within: tuple[str, ...] = ()
    """``not_in``, as JSON text."""
    optional: bool = False


@dataclass(frozen=True)
class Product:
    uid: str
    event_name: str
    filters: tuple[Filter, ...] = field(default_factory=tuple)


def load_products(path: Path) -> list[Product]:
    """The catalogue in ``path`` (``.csv``, ``.yaml`` or ``.yml``); ConfigError naming the
    file and the entry when one is not a product."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"products {path}: {exc.strerror or exc}") from None
    if path.suffix == ".csv":
        rows: list[Any] = list(csv.DictReader(text.splitlines()))
    elif path.suffix in (".yaml", ".yml"):
        rows = load_yaml(text, str(path)) or []
        if not isinstance(rows, list):
            raise ConfigError(f"products {path}: a list of products is expected")
    else:
        raise ConfigError(f"products {path}: use a .csv, .yaml or .yml file")
    return products_of(rows, str(path))


def read_catalogue(metered: MeteringConfig, destination: Metered | None) -> list[Product]:
    """The products of a metering destination: its ``products`` file, or the rows of its
    ``products_table`` (ConfigError when the table is missing or lacks a column)."""
    if metered.products is not None:
        return load_products(metered.products)
    table = metered.products_table
    assert table is not None  # checked by the config model
    assert destination is not None
    where = f"products_table {table} of destination {destination.id}"
    found = destination.describe(table)
    if found is None:
        raise ConfigError(
            f"{where}: no such table",
            fix="create it with columns product_uid, event_name and filters (JSON)",
        )
    missing = [c for c in ("product_uid", "event_name") if c not in found.columns]
    if missing:
        raise ConfigError(f"{where}: no column {', '.join(missing)}")
    columns = [c for c in ("product_uid", "event_name", "filters") if c in found.columns]
    return products_of(destination.rows(table, columns), f"table {destination.id}.{table}")


def products_of(rows: Iterable[Any], source: str) -> list[Product]:
    """Products from mappings with ``product_uid``, ``event_name`` and ``filters`` (a
    list, or its JSON text; empty or absent: none)."""
    found = []
    seen: set[str] = set()
    for number, row in enumerate(rows, start=1):
        where = f"products {source}, entry {number}"
        if not isinstance(row, dict):
            raise ConfigError(f"{where}: not an object with product_uid and event_name")
        uid, name = row.get("product_uid"), row.get("event_name")
        if not uid or not name:
            raise ConfigError(f"{where}: product_uid and event_name are required")
        if str(uid) in seen:
            raise ConfigError(f"{where}: product_uid {uid!r} is used twice")
        seen.add(str(uid))
        found.append(Product(str(uid), str(name), _filters(row.get("filters"), where)))
    return found


def _filters(value: Any, where: str) -> tuple[Filter, ...]:
    if value in (None, ""):
        return ()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: filters is not JSON: {exc}") from None
    if not isinstance(value, list):
        raise ConfigError(f"{where}: filters must be a list")
    filters = []
    for item in value:
        if not isinstance(item, dict) or not isinstance(item.get("path"), str):
            raise ConfigError(f"{where}: each filter needs a path")
        path = item["path"]
        if not path.startswith("$"):
            raise ConfigError(f"{where}: filter path {path!r} is not a JSONPath ($.a.b)")
        unknown = set(item) - {"path", "_in", "not_in", "optional"}
        if unknown:
            raise ConfigError(f"{where}: unknown filter key(s) {', '.join(sorted(unknown))}")
        filters.append(Filter(
            path,
            _texts(item.get("_in"), where),
            _texts(item.get("not_in"), where),
            bool(item.get("optional", False)),
        ))  # fmt: skip
    return tuple(filters)


def _texts(values: Any, where: str) -> tuple[str, ...]:
    if values in (None, ""):
        return ()
    if not isinstance(values, list):
        raise ConfigError(f"{where}: _in and not_in take lists")
    return tuple(value_text(v) for v in values)


def value_text(value: Any) -> str:
    """The text a JSON value is compared by (``get_json_object``'s form: strings as
    they are, other scalars as JSON)."""
    return value if isinstance(value, str) else json.dumps(value)


def classify(value_at: Callable[[str], Column], products: Sequence[Product]) -> Column:
    """The ``product_uid`` of every product matching the event, as an array: empty when
    none does. ``value_at(path)``: the text of the event's value at a JSONPath, null when
    missing (json_text_at, or get_json_object over the event's JSON text).

    One CASE over the catalogue's event names picks the event's products, and only their
    conditions are evaluated; each path's value is computed once per event. (Not a
    lookup inside a lambda: Spark cannot share values into one, and with 100 products
    its generated code passed the JVM's 64 KB limit.)"""
    from pyspark.sql import functions as F

    none = F.array().cast("array<string>")
    if not products:
        return none
    paths = sorted({NAME_PATH} | {f.path for p in products for f in p.filters})
    values = {path: value_at(path) for path in paths}
    by_name: dict[str, list[Product]] = {}
    for product in products:
        by_name.setdefault(product.event_name, []).append(product)
    case: Column | None = None
    for name, group in by_name.items():
        named = values[NAME_PATH] == F.lit(name)
        found = F.array(*(F.when(_matches(p, values), F.lit(p.uid)) for p in group))
        case = F.when(named, found) if case is None else case.when(named, found)
    assert case is not None
    return lambdas.keep(case.otherwise(none), lambda uid: uid.isNotNull(), "product")


def json_text_at(schema: StructType, fallback: Callable[[], Column]) -> Callable[[str], Column]:
    """``value_at`` for classify over an event's columns (``schema``): the text of the
    value at a JSONPath as ``get_json_object`` gives it from the event's JSON (strings as
    they are, numbers and booleans as JSON, objects and lists as JSON text), read from
    the columns directly. A path that is more than names and indexes (``$.a[*]``,
    ``$..a``), or meets a type with no plain JSON text, is read by get_json_object from
    ``fallback()``: the event's JSON text."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import (
        ArrayType,
        BooleanType,
        DoubleType,
        FloatType,
        IntegralType,
        MapType,
        StringType,
        StructType,
    )

    from eventpipe.processing.steps.fields import is_json_text, reference

    def value_at(path: str) -> Column:
        steps = _steps(path)
        if steps is None:
            return F.get_json_object(fallback(), path)
        column: Column | None = None
        data_type: Any = schema
        json_text = False
        for i, step in enumerate(steps):
            if column is not None and json_text:  # an array, as the JSON text it was sent as
                rest = "".join(f".{s}" if isinstance(s, str) else f"[{s}]" for s in steps[i:])
                return F.get_json_object(column, "$" + rest)
            if isinstance(step, str):
                if not isinstance(data_type, StructType):
                    return F.lit(None).cast("string")
                names = data_type.fieldNames()
                if step not in names:
                    return F.lit(None).cast("string")
                if sum(n.lower() == step.lower() for n in names) > 1:  # ambiguous to Spark
                    return F.get_json_object(fallback(), path)
                column = reference((step,)) if column is None else column.getField(step)
                json_text = is_json_text(data_type[step])
                data_type = data_type[step].dataType
            else:
                if not isinstance(data_type, ArrayType) or column is None:
                    return F.lit(None).cast("string")
                column = F.get(column, step)  # null past the end
                data_type = data_type.elementType
        assert column is not None
        if isinstance(data_type, StringType):
            return column
        if isinstance(data_type, BooleanType | IntegralType | DoubleType | FloatType):
            return column.cast("string")
        if isinstance(data_type, StructType | ArrayType | MapType):
            return F.to_json(column)
        return F.get_json_object(fallback(), path)

    return value_at


def _steps(path: str) -> list[str | int] | None:
    """``$.a.b[0].c`` as ["a", "b", 0, "c"]; None for anything else JSONPath allows."""
    steps: list[str | int] = []
    for name, index in re.findall(r"\.([^.\[\]*]+)|\[(\d+)\]", path[1:]):
        steps.append(name if name else int(index))
    rebuilt = "".join(f".{s}" if isinstance(s, str) else f"[{s}]" for s in steps)
    return steps if path.startswith("$") and rebuilt == path[1:] and steps else None


def _matches(product: Product, values: dict[str, Column]) -> Column:
    from pyspark.sql import functions as F

    check = F.lit(True)
    for rule in product.filters:
        value = values[rule.path]
        present = F.lit(True)
        if rule.within:
            present = present & value.isin(list(rule.within))
        if rule.not_within:
            present = present & ~value.isin(list(rule.not_within))
        missing = F.lit(rule.optional)
        check = check & F.when(value.isNull(), missing).otherwise(present)
    return check


KEY, ORDER_AT, WINDOW_AT, ARRIVAL = (
    reserved.METER_KEY,
    reserved.METER_ORDER_AT,
    reserved.METER_WINDOW_AT,
    reserved.METER_ARRIVAL,
)
PRODUCT = "product_uid"


def route(
    frame: DataFrame,
    metering: MeteringConfig,
    products: Sequence[Product],
    cutoff: datetime,
    arrival: str,
) -> DataFrame:
    """The destination's events (their fields and TABLE, ERROR, ROW) as metered rows:
    within the batch only the newest version of each key inside the window; one row per
    matching product in ``metering.table``, or one in ``metering.unclassified_table``;
    an event without a key fails. ``cutoff``: the window's start; ``arrival``: this
    run's place among runs (text that sorts by time)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from eventpipe.processing.steps.fields import column_at, field_type, json_object, reference
    from eventpipe.processing.steps.transforms import live
    from eventpipe.reserved import ERROR, FILTERED, ROW, TABLE
    from eventpipe.schema.casts import cast_to
    from eventpipe.schema.types import DataType

    fields = [c for c in frame.columns if c not in (TABLE, ERROR, ROW)]

    def time(*paths: str) -> Column:
        """The first of the fields at ``paths`` that converts to a timestamp (null when
        no event of the batch has any of them)."""
        converted = []
        for path in paths:
            parts = tuple(path.split("."))
            if (source := field_type(frame.schema, parts)) is not None:
                converted.append(cast_to(reference(parts), DataType.TIMESTAMP, source))
        return F.coalesce(*converted, F.lit(None).cast("timestamp"))

    key = column_at(frame.schema, tuple(metering.key.split(".")))
    frame = frame.withColumns({
        KEY: (F.lit(None) if key is None else key).cast("string"),
        ORDER_AT: time(metering.order_by, "_timestamp"),
        WINDOW_AT: time(metering.window_by, "_timestamp"),
        # ROW: a long (monotonically_increasing_id), 19 digits at most: padded, it sorts
        ARRIVAL: F.concat(F.lit(arrival), F.lpad(F.col(ROW).cast("string"), 20, "0")),
    })  # fmt: skip
    no_key = live() & F.col(KEY).isNull()
    frame = frame.withColumns({
        ERROR: F.when(no_key, F.lit(f"metering: the event has no {metering.key}"))
                .otherwise(F.col(ERROR)),
        TABLE: F.when(no_key, F.lit(None)).otherwise(F.col(TABLE)),
    })  # fmt: skip
    compared = live() & (F.col(WINDOW_AT) >= F.lit(cutoff))
    newest = Window.partitionBy(KEY).orderBy(F.col(ORDER_AT).desc_nulls_last(),
                                             F.col(ARRIVAL).desc())  # fmt: skip
    rank = F.when(compared, F.row_number().over(newest))
    frame = frame.withColumn(TABLE, F.when(rank > 1, F.lit(FILTERED)).otherwise(F.col(TABLE)))

    def event_json() -> Column:
        return json_object(frame.schema, {c: c for c in fields})

    value_at = json_text_at(frame.select(*(F.col(f"`{c}`") for c in fields)).schema, event_json)
    matched = F.when(live(), classify(value_at, products)).otherwise(
        F.array().cast("array<string>")
    )
    frame = frame.withColumn(PRODUCT, F.explode_outer(matched))
    return frame.withColumn(
        TABLE,
        F.when(
            live(),
            F.when(F.col(PRODUCT).isNull(), F.lit(metering.unclassified_table)).otherwise(
                F.lit(metering.table)
            ),
        ).otherwise(F.col(TABLE)),
    )
