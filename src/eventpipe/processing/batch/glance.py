"""A small run's lines looked at by the driver before Spark reads them (a stream's
micro-batch, a small ``process --once``): whether any is a browser event, and the schema
Spark's inference would give them, found in Python where it can be told exactly.

Spark's inference of 1,000 events (0.45 MB) took 230-390 ms from the driver's call to its
answer in a warm session, of which the job itself ran 40-70 ms; the driver here took
12-14 ms; of 17,000 (7.8 MB), 490-650 ms against 138-151 ms. Past :data:`GLANCE_BYTES`
nothing is read, and Spark infers.

**Exactly Spark's schema, or none.** Spark's JSON inference (``JsonInferSchema``) types
each value (null and empty text as null, boolean, an integer as long, a number with a
fraction or an exponent as double, other text as text, an object as a struct of its
keys, an array as an array of its items' merged type), merges the types of every line
(``compatibleType``: null gives way to any type, long beside double is double, arrays
merge their items, objects their keys, anything else beside another kind is text), then
canonicalises the result once (a type that was only ever null becomes text; objects
without keys, and keys that are ``""``, disappear). That is what :func:`infer` does,
over lines it can read exactly as Jackson does, and it gives up (None: Spark infers) on
anything else:

* a line that is not the exact text ``orjson.dumps`` makes of what ``orjson.loads`` read
  from it: whitespace, escapes or number forms orjson writes otherwise, a duplicate key
  (read once, written once), a line orjson refuses (NaN, integers past 64 bits), a line
  Spark may split differently (a carriage return). The collector, the imports and change
  capture write their lines with orjson, so the log's lines are such lines;
* a line that is not an object (Spark reads a top-level array as several rows, and
  anything else as a corrupt record);
* an integer outside the signed 64-bit range (Spark types it as a decimal);
* keys of one object that differ only in case (which one Spark keeps is Spark's to
  know), at any depth;
* lines that may be nested deeper, or keys longer, than Jackson reads (MOST_OPENINGS);
* a schema with no field at all.

``tests/unit/processing/test_glance.py`` checks :func:`infer` against Spark's inference of
the same lines, on the hostile suite's generated events and on ordinary ones.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from eventpipe.processing.batch.segment_schemas import CASE_FOLDS, java_order

GLANCE_BYTES = 8 << 20
"""Files of at most this many bytes in all are read."""

MOST_OPENINGS = 400
LONGEST_KEY = 10_000
"""Lines with more ``{`` and ``[`` (a bound on their depth), or a key longer, are left to
Spark: Jackson refuses a document nested deeper, or a name longer, than its limits (500
and 50,000 in Jackson 2.21), and a line Jackson refuses is a corrupt record, which only
Spark's inference gives a column."""

_NULL, _BOOL, _LONG, _DOUBLE, _TEXT = "null", "boolean", "long", "double", "text"
_LONGEST = 1 << 63


@dataclass(frozen=True)
class Glance:
    browser_events: bool
    """Whether a line may be a browser event (one that is not an object with ``src``
    ``"api"`` at its top level, as the collector marks server events; a line orjson
    cannot parse counts as one): the implicit browser lookups then have work."""
    schema: StructType | None
    """Spark's inference of the lines; None where it is left to Spark."""


def glance(paths: Sequence[str], most: int = GLANCE_BYTES, *, infer: bool = True) -> Glance:
    """The lines of ``paths`` looked at (module docstring); files of more than ``most``
    bytes in all are not read (taken to hold browser events). ``infer``: False where the
    schema is known already (only the browser events are looked for)."""
    try:
        size = sum(Path(p).stat().st_size for p in paths)
    except OSError:
        return Glance(True, None)  # the read will say what is wrong with the files
    if size > most:
        return Glance(True, None)
    inference = _Inference() if infer else None
    browser = False
    try:
        for line in _lines(paths):
            if line.endswith(b"\n"):
                line = line[:-1]
            if not line.strip():
                if line and inference is not None:  # blank to Python, maybe not to Jackson
                    inference = None
                continue
            if browser and inference is None:
                break  # nothing more to learn
            try:
                event = orjson.loads(line)
            except orjson.JSONDecodeError:
                browser, inference = True, None  # Spark's reader may take what orjson refuses
                continue
            if type(event) is not dict:
                browser, inference = True, None
                continue
            if not browser and event.get("src") != "api":
                browser = True
            if inference is not None and not inference.add(event, line):
                inference = None
    except OSError:
        return Glance(True, None)
    return Glance(browser, None if inference is None else inference.schema())


def infer(lines: Sequence[bytes]) -> StructType | None:
    """Spark's inference of JSON ``lines`` (without their newlines), or None where it is
    left to Spark (module docstring)."""
    inference = _Inference()
    for line in lines:
        if not line:
            continue
        try:
            event = orjson.loads(line)
        except orjson.JSONDecodeError:
            return None
        if type(event) is not dict or not inference.add(event, line):
            return None
    return inference.schema()


def _lines(paths: Sequence[str]) -> Iterator[bytes]:
    for path in paths:
        with open(path, "rb") as lines:
            yield from lines


class _Inexact(Exception):
    """A value whose type Spark's inference gives otherwise than :class:`_Inference`."""


class _Inference:
    """The merged type of the events added so far, before canonicalisation: a dict of
    key to type for an object (the keys in no order), ``("array", item type)`` for an
    array, one of the scalar names for the rest."""

    def __init__(self) -> None:
        self._type: dict[str, Any] = {}

    def add(self, event: dict[str, Any], line: bytes) -> bool:
        """Merge the type of ``event``, read from ``line``; False when Spark's inference
        must be left to Spark."""
        try:
            if orjson.dumps(event) != line:
                return False
        except orjson.JSONEncodeError:  # text orjson reads but does not write
            return False
        if line.count(b"{") + line.count(b"[") > MOST_OPENINGS:
            return False  # maybe deeper than Jackson reads
        try:
            _merge_object(self._type, event)
        except (_Inexact, RecursionError):
            return False
        return True

    def schema(self) -> StructType | None:
        if _folds_together(self._type):
            return None
        canonical = _canonical(self._type)
        return canonical if isinstance(canonical, StructType) else None


def _merge(merged: Any, value: Any) -> Any:
    """``merged`` (a type) with the type of ``value`` (Spark's ``compatibleType``)."""
    kind = type(value)
    if merged == _TEXT:
        if kind is int and not -_LONGEST <= value < _LONGEST:
            raise _Inexact  # a decimal beside text is text, but it is rare: Spark's to say
        return _TEXT
    if kind is dict:
        if merged == _NULL:
            merged = {}
        elif type(merged) is not dict:
            return _TEXT
        return _merge_object(merged, value)
    if kind is list:
        if merged == _NULL:
            item = _NULL
        elif type(merged) is tuple:
            item = merged[1]
        else:
            return _TEXT
        for element in value:
            item = _merge(item, element)
        return ("array", item)
    if value is None or value == "":  # Spark: an empty text is typed as null
        return merged
    if kind is str:
        scalar = _TEXT
    elif kind is bool:
        scalar = _BOOL
    elif kind is int:
        if not -_LONGEST <= value < _LONGEST:
            raise _Inexact
        scalar = _LONG
    elif kind is float:
        scalar = _DOUBLE
    else:  # nothing else comes from orjson.loads
        raise _Inexact
    if merged in (_NULL, scalar):
        return scalar
    if (merged == _LONG and scalar == _DOUBLE) or (merged == _DOUBLE and scalar == _LONG):
        return _DOUBLE
    return _TEXT  # beside an object, an array or another kind of scalar


def _merge_object(merged: dict[str, Any], value: dict[str, Any]) -> dict[str, Any]:
    for key, item in value.items():
        if len(key) > LONGEST_KEY:
            raise _Inexact
        merged[key] = _merge(merged.get(key, _NULL), item)
    return merged


_SCALARS: dict[str, DataType] = {
    _NULL: StringType(),
    _TEXT: StringType(),
    _BOOL: BooleanType(),
    _LONG: LongType(),
    _DOUBLE: DoubleType(),
}


def _canonical(merged: Any) -> DataType | None:
    """Spark's ``canonicalizeType``: null as text; empty objects and ``""`` keys gone."""
    if type(merged) is dict:
        fields = [
            StructField(name, data_type, True)
            for name in sorted(merged, key=java_order)
            if name and (data_type := _canonical(merged[name])) is not None
        ]
        return StructType(fields) if fields else None
    if type(merged) is tuple:
        item = _canonical(merged[1])
        return None if item is None else ArrayType(item, True)
    return _SCALARS[merged]


def _folds_together(merged: Any) -> bool:
    """Whether some object's keys differ only in case, at any depth."""
    if type(merged) is dict:
        if any(len({fold(k) for k in merged}) < len(merged) for fold in CASE_FOLDS):
            return True
        return any(_folds_together(t) for t in merged.values())
    if type(merged) is tuple:
        return _folds_together(merged[1])
    return False
