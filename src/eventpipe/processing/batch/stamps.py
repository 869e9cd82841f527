"""Timestamp text converted while a stream's micro-batch is staged, so that its load needs
no conversion pass.

A text column that a destination's table holds as timestamps (the commit time of a
change from PostgreSQL, an SDK's ``sentAt``) is staged as text, and its load converts it
(load.py): a Spark job of its own over the table's staged rows, 0.1-0.25 s of a
micro-batch of 40 changes that takes 0.7-0.9 s on a 2-core machine (docs/stream.md).

A stream knows from its earlier micro-batches which columns its loads converted so
(``SchemaCache.stamped``). The next micro-batch's staging pass converts those too, with
the load's own conversion (``cast_to``), into columns of their own that the driver writes
aside (``stamped/``, beside ``flat/``, each file with its twin's row ids), and counts the
values of each that do not convert. A table whose load has no conversion but of such
columns, where the batch typed them as timestamps and none of their values failed to
convert, gets its staged files with those columns taken from aside, in the driver, and
loads them. Anything else (a value that does not convert, another conversion, rows that
a contract holds back) takes the conversion pass: what loads is the same either way.
The values that do not convert are counted over the micro-batch, not per table: where
one table holds a column as text and another as timestamps, the text values send the
other's load to its pass too (correct, and no faster than before).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from eventpipe.processing.batch.read import write_staged
from eventpipe.processing.batch.run import ref
from eventpipe.reserved import ROW, STAMPED, TABLE
from eventpipe.schema.casts import SPARK_TYPES, cast_to, conversion_problem
from eventpipe.schema.types import DataType

if TYPE_CHECKING:
    from pyspark.sql import Column
    from pyspark.sql.types import DataType as SparkType

ASIDE = "stamped"
"""Where a destination's converted columns are staged, beside its ``flat/``."""


def twins(types: Mapping[str, SparkType], predicted: Iterable[str]) -> dict[str, str]:
    """The columns of ``predicted`` that the batch has as text, each with the name of its
    converted twin."""
    text = [c for c in sorted(set(predicted)) if isinstance(types.get(c), StringType)]
    return {column: f"{STAMPED}{i}" for i, column in enumerate(text)}


def converted(column: str) -> Column:
    """``column``'s text as the load converts it to a timestamp (null where it does not)."""
    return cast_to(ref(column), DataType.TIMESTAMP, StringType())


def unconverted(column: str) -> Column:
    """An aggregate: the values of ``column`` that do not convert."""
    problem = conversion_problem(ref(column), column, DataType.TIMESTAMP, converted(column))
    return F.count_if(problem.isNotNull())


def counted(names: Mapping[str, str], counts: Iterable[int]) -> dict[str, list[Any]]:
    """What the run's counts keep of the staging's: per column, its twin and its values
    that did not convert."""
    return {column: [twin, n] for (column, twin), n in zip(names.items(), counts, strict=True)}


@dataclass(frozen=True)
class Stamps:
    """A table's converted columns, staged aside."""

    twins: dict[str, str]
    """The columns whose every value converted, each with its twin's name."""
    files: tuple[Path, ...]
    """The table's files aside: the twins and the row ids of the staged files."""


def stamps_of(where: Path, table: str, counts: Mapping[str, Any]) -> Stamps | None:
    """Table ``table``'s converted columns, from the destination's staging (``where``)
    and its counts; None where none were staged."""
    found = counts.get("stamps")
    files = tuple(sorted((where / ASIDE / f"{TABLE}={table}").glob("*.parquet")))
    if not found or not files:
        return None
    return Stamps({column: twin for column, (twin, failed) in found.items() if not failed}, files)


def with_stamps(
    files: tuple[Path, ...],
    stamps: Stamps | None,
    targets: Mapping[str, DataType],
    batch: Mapping[str, DataType],
    spark_types: Mapping[str, SparkType],
    out: Path,
) -> tuple[Path, ...] | None:
    """The staged ``files`` of a table with every column whose type is not its target's
    (``targets``) taken from ``stamps``, written to ``out`` by the driver; None where a
    column needs a conversion they do not hold (the load converts in a pass of its own).

    Only for columns the batch typed as timestamps (``batch``): where it typed one as
    text, some values are not timestamps, and the table's contract decides what becomes
    of them in the pass."""
    import pyarrow.parquet as pq

    if stamps is None:
        return None
    needed = [c for c, t in targets.items() if spark_types[c] != SPARK_TYPES[t]]
    if not needed or any(
        targets[c] is not DataType.TIMESTAMP
        or batch.get(c) is not DataType.TIMESTAMP
        or c not in stamps.twins
        for c in needed
    ):
        return None
    if [p.name for p in files] != [p.name for p in stamps.files]:
        return None
    tables = []
    for path, aside in zip(files, stamps.files, strict=True):
        rows, twin = pq.read_table(path), pq.read_table(aside)
        if not rows.column(ROW).equals(twin.column(ROW)):
            return None  # not the rows they were staged with: convert them in a pass
        for column in needed:
            at = rows.schema.get_field_index(column)
            rows = rows.set_column(at, column, twin.column(stamps.twins[column]))
        tables.append((out / path.name, rows))
    if out.exists():  # from an attempt that stopped part way
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for path, rows in tables:
        write_staged(rows, path)
    return tuple(path for path, _ in tables)
