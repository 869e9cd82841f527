"""Each sealed segment's inferred schema, kept while the service waits, so that the next
batch run merges its segments' schemas instead of inferring them again.

A batch run reads its JSON twice: once for Spark's schema inference, once for the pass
that stages its tables. On the batch benchmark inference is 4.2-4.5 s of a 28-30 s run of
1M events (2 cores). ``eventpipe process`` waits ``batch_period_seconds`` between two runs
with Spark idle; that wait now infers the schema of each segment sealed meanwhile
(:func:`keep_schema`, called by archiving.prepare_sealed) and keeps it under
``tmp/schemas/``. A run whose segments all have one merges them (:func:`kept_schema`).

Exactly what inference gives, or nothing. Spark infers each line's type, merges them
(``compatibleType``), then canonicalises the result once: a field that was only ever
null becomes text, and empty objects (``{}``, or objects whose keys are all ``""``)
disappear. A segment's kept schema is canonical already, so two of them cannot always be
merged as Spark merges lines. :func:`merge` merges where the canonical types say
everything Spark's merge would use, and refuses (``Inexact``) where they might not:

* text meeting any other type at the same field: the text may have been nulls only
  (Spark would then take the other type);
* a field one segment lacks and the other has with a value that is not an array
  somewhere below it, when the segment that lacks it may hold an empty object (a byte
  scan, kept beside the schema): Spark merges ``{}`` with a number as text;
* numbers other than integers with floats (decimals past int64, timestamps): rare, and
  Spark's rules for them are left to Spark.

Arrays are read as their JSON text (read.read_events), so their element types never
matter. A refusal costs only what the run did before: it infers. A segment with lines
Spark cannot parse keeps no schema (its corrupt-record column has a name of that
inference's own). ``tests/unit/processing/test_segment_schemas.py`` checks the merge
against Spark's inference of the same segments read together, on the hostile suite's
generated events.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

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

from eventpipe.errors import first_line
from eventpipe.files import write_file
from eventpipe.paths import DataLayout
from eventpipe.reserved import CORRUPT, unguessable

if TYPE_CHECKING:
    from pyspark.sql import DataFrameReader, SparkSession

log = logging.getLogger("eventpipe.processing")

FORMAT = 1
"""The kept file's format; a file of another is not used."""


class Inexact(Exception):
    """Canonical schemas that may not merge to what Spark's inference gives."""


@dataclass(frozen=True)
class SegmentSchema:
    schema: StructType
    """What Spark's inference gives for the segment alone."""
    empty_objects: bool
    """The segment may hold an object Spark's inference drops (``{}`` or ``""`` keys)."""


def schema_file(layout: DataLayout, name: str) -> Path:
    return layout.tmp / "schemas" / f"{name}.json"


def inference_settings(spark: SparkSession) -> str:
    """A digest of what the inference depends on besides the file: Spark's version and
    its SQL settings (the files' split settings aside: they never change a schema)."""
    from pyspark import __version__

    settings = sorted(
        (key, value)
        for key, value in spark.conf.getAll.items()
        if key.startswith("spark.sql.") and not key.startswith("spark.sql.files.")
    )
    return hashlib.sha256(json.dumps([__version__, settings]).encode()).hexdigest()[:16]


def infer(spark: SparkSession, paths: Sequence[str]) -> tuple[StructType, str]:
    """Spark's inference of the JSON lines of ``paths``, as the pipeline's reader makes
    it, and the name it gave its corrupt-record column (present if some line is not JSON)."""

    corrupt = unguessable(CORRUPT)
    return json_reader(spark, corrupt).json(list(paths)).schema, corrupt


def is_kept(layout: DataLayout, name: str, settings: str) -> bool:
    """Whether segment ``name`` (in incoming/) has its schema kept, as it is now."""
    source = layout.incoming / name
    try:
        size = source.stat().st_size
    except OSError:
        return False
    return _record(layout, name, size, settings) is not None


def keep_schema(spark: SparkSession, layout: DataLayout, name: str, settings: str) -> None:
    """Infer and keep the schema of the sealed segment ``incoming/<name>`` (``settings``:
    :func:`inference_settings` of ``spark``)."""
    source = layout.incoming / name
    size = source.stat().st_size
    schema, corrupt_column = infer(spark, [str(source)])
    record = {
        "format": FORMAT,
        "size": size,
        "settings": settings,
        # A segment with lines Spark cannot parse: kept as such, so that it is not
        # inferred again, and never merged (its runs infer).
        "schema": None if corrupt_column in schema.fieldNames() else schema.jsonValue(),
        "empty_objects": may_hold_empty_object(source),
    }
    write_file(schema_file(layout, name), json.dumps(record))


def forget_gone(layout: DataLayout) -> None:
    """Remove the kept schemas of segments no longer in incoming/ (after archiving, as
    the files archived ahead for them)."""
    folder = layout.tmp / "schemas"
    if folder.is_dir():
        for kept in folder.glob("*.json"):
            if not (layout.incoming / kept.name.removesuffix(".json")).exists():
                kept.unlink(missing_ok=True)


def kept_schema(spark: SparkSession, layout: DataLayout, paths: Sequence[str]) -> StructType | None:
    """The schema Spark's inference would give ``paths`` read together, merged from their
    kept schemas; None when one has none, or when they may not merge exactly."""
    sources = [Path(path) for path in paths]
    if not sources or not all(
        s.parent == layout.incoming and schema_file(layout, s.name).exists() for s in sources
    ):
        return None  # a stream's micro-batch, a replay, a scheduler's run: none kept
    try:
        settings = inference_settings(spark)
        kept: list[SegmentSchema] = []
        for source in sources:
            found = _read(layout, source.name, source.stat().st_size, settings)
            if found is None:
                return None
            kept.append(found)
        return merge_all(kept)
    except Inexact as exc:
        log.info("the segments' kept schemas do not merge exactly (%s): inferring", exc)
    except Exception as exc:  # noqa: BLE001 (a kept file is a shortcut, never a run's end)
        log.warning("the segments' kept schemas could not be read (%s): inferring",
                    first_line(exc))  # fmt: skip
    return None


def _record(layout: DataLayout, name: str, size: int, settings: str) -> dict[str, Any] | None:
    """The kept record of segment ``name``, if it was kept for it at ``size`` with these
    inference ``settings``."""
    try:
        record = json.loads(schema_file(layout, name).read_text())
    except (OSError, ValueError):
        return None
    if (
        not isinstance(record, dict)
        or record.get("format") != FORMAT
        or record.get("size") != size
        or record.get("settings") != settings
    ):
        return None
    return record


def _read(layout: DataLayout, name: str, size: int, settings: str) -> SegmentSchema | None:
    """The kept schema of segment ``name``; None when it has none (see :func:`_record`)."""
    record = _record(layout, name, size, settings)
    if record is None or record.get("schema") is None:
        return None
    schema = StructType.fromJson(record["schema"])
    return SegmentSchema(schema, bool(record.get("empty_objects", True)))


# An object literal with no members, or a member whose key is empty: what Spark's
# inference drops (SPARK-8093). Inside strings too: that costs only an inference.
_DROPPED = re.compile(rb'\{[ \t\r\n]*\}|""[ \t\r\n]*:')


def may_hold_empty_object(path: Path, chunk: int = 8 << 20) -> bool:
    """Whether the JSON lines of ``path`` may hold an object Spark's inference drops,
    read ``chunk`` bytes at a time (a match across two chunks is found: what may begin one
    is carried over)."""
    carry = b""
    with path.open("rb") as lines:
        while block := lines.read(chunk):
            data = carry + block
            if _DROPPED.search(data):
                return True
            carry = _open_tail(data)
    return False


def _open_tail(data: bytes) -> bytes:
    """What a match may begin with at the end of ``data``: an open brace or a quote
    followed by nothing but whitespace (``{``, ``""``, ``"``), else nothing."""
    end = len(data.rstrip(b" \t\r\n"))
    if data[end - 2 : end] == b'""':
        return b'""'
    if data[end - 1 : end] in (b"{", b'"'):
        return data[end - 1 : end]
    return b""


def merge_all(kept: Sequence[SegmentSchema]) -> StructType:
    """The schemas of ``kept`` merged in order (:func:`merge`)."""
    merged = kept[0].schema
    empty = kept[0].empty_objects
    for one in kept[1:]:
        merged = merge(merged, one.schema, empty, one.empty_objects)
        empty = empty or one.empty_objects
    return merged


def merge(a: StructType, b: StructType, a_empty: bool, b_empty: bool) -> StructType:
    """Two canonical inferred schemas merged as Spark's inference of both segments
    together would give; Inexact where that cannot be told from them (module docstring).
    ``a_empty``, ``b_empty``: whether each side may hold an object inference drops."""
    merged = _merge(a, b, a_empty, b_empty, ())
    assert isinstance(merged, StructType)
    return merged


def _merge(
    a: DataType, b: DataType, a_empty: bool, b_empty: bool, path: tuple[str, ...]
) -> DataType:
    if a == b:
        return a
    where = ".".join(path) or "the event"
    if isinstance(a, StructType) and isinstance(b, StructType):
        left = {f.name: f.dataType for f in a.fields}
        right = {f.name: f.dataType for f in b.fields}
        names = left.keys() | right.keys()
        if any(len({fold(n) for n in names}) < len(names) for fold in CASE_FOLDS):
            # Spark merges objects whose keys differ only in case by the first one's
            # keys (case-insensitive resolution): which one is first is Spark's to know.
            raise Inexact(f"{where}: keys that differ only in case")
        fields = []
        for name in sorted(names, key=java_order):
            if name in left and name in right:
                data_type = _merge(left[name], right[name], a_empty, b_empty, (*path, name))
            else:
                data_type = left[name] if name in left else right[name]
                lacking_empty = b_empty if name in left else a_empty
                if lacking_empty and _has_values(data_type):
                    raise Inexact(f"{'.'.join((*path, name))}: absent beside empty objects")
            fields.append(StructField(name, data_type, True))
        return StructType(fields)
    if isinstance(a, ArrayType) and isinstance(b, ArrayType):
        return ArrayType(StringType(), True)  # read as JSON text either way
    if isinstance(a, StringType) or isinstance(b, StringType):
        # Nulls only would give the other type (an array: marked as JSON text when read).
        other = b if isinstance(a, StringType) else a
        raise Inexact(f"{where}: text (maybe nulls only) beside {other.simpleString()}")
    if {type(a), type(b)} == {LongType, DoubleType}:
        return DoubleType()
    kinds = (StructType, ArrayType, LongType, DoubleType, BooleanType)
    if isinstance(a, kinds) and isinstance(b, kinds):
        return StringType()  # Spark's merge of unrelated kinds, on types as they were
    raise Inexact(f"{where}: {a.simpleString()} beside {b.simpleString()}")


def _fold_lower(name: str) -> str:
    return "".join(c.lower() if len(c.lower()) == 1 else c for c in name)


def _fold_upper(name: str) -> str:
    return "".join(c.upper() if len(c.upper()) == 1 else c for c in name)


CASE_FOLDS = (_fold_lower, _fold_upper)
"""Java's ``equalsIgnoreCase`` compares character by character, by upper or by lower case."""


def _has_values(data_type: DataType) -> bool:
    """A value below this type that is not an array (which is read as text anyway)."""
    if isinstance(data_type, StructType):
        return any(_has_values(f.dataType) for f in data_type.fields)
    return not isinstance(data_type, ArrayType)


def java_order(name: str) -> bytes:
    """Java's ``String.compareTo`` order (by UTF-16 code units), in which Spark's
    inference sorts an object's fields."""
    return name.encode("utf-16-be", errors="surrogatepass")


def json_reader(spark: SparkSession, corrupt: str) -> DataFrameReader:
    """Spark's JSON reader as the pipeline reads its log: lines that are not JSON objects
    kept, their text in the column ``corrupt``."""
    return spark.read.options(mode="PERMISSIVE", columnNameOfCorruptRecord=corrupt)
