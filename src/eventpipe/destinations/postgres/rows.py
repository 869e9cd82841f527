"""The rows a PostgreSQL load sends, and the rows it leaves out.

A load streams its staged Parquet files to ``COPY ... FROM STDIN (FORMAT csv)``
(:func:`csv_chunks`, written a chunk :func:`ahead` in a thread), without the rows it
leaves out: those the server refused by line (:func:`copy_line`, :func:`position_of`,
:func:`reason_of`), and those whose floats a ``numeric(p,s)`` column would round
(:func:`inexact_rows`). Positions count rows across the request's files, from 0.
"""

from __future__ import annotations

import io
import queue
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from eventpipe.destinations.base import LoadRequest
from eventpipe.errors import first_line
from eventpipe.schema.types import DataType

_ARROW = {
    DataType.STRING: pa.string(),
    DataType.FLOAT64: pa.float64(),
    DataType.INT64: pa.int64(),
    DataType.INT128: pa.decimal128(38, 0),
    DataType.BOOL: pa.bool_(),
    DataType.TIMESTAMP: pa.timestamp("us", tz="UTC"),
}


def csv_chunks(request: LoadRequest, skip: set[int]) -> Iterator[tuple[bytes, int]]:
    """The request's files as CSV for COPY, in the order of ``request.columns``, without
    the rows at the ``skip`` positions (across the files, from 0); with each chunk, its
    row count.

    Nulls are unquoted empty fields and strings are always quoted, so COPY's CSV format
    tells a null from an empty string. Columns a file lacks are nulls.
    """
    columns = list(request.columns)
    options = pacsv.WriteOptions(include_header=False, quoting_style="needed")
    position = 0
    for path in request.files:
        parquet = pq.ParquetFile(path)
        present = set(parquet.schema_arrow.names)
        for batch in parquet.iter_batches(
            batch_size=65_536, columns=[c for c in columns if c in present]
        ):
            start, position = position, position + batch.num_rows
            if skip and any(start <= s < position for s in skip):
                keep = [i for i in range(batch.num_rows) if start + i not in skip]
                batch = batch.take(pa.array(keep, type=pa.int64()))
            arrays = []
            for name in columns:
                data_type = request.columns[name]
                if name in present:
                    array = batch.column(name)
                    if data_type is DataType.STRING and pa.types.is_string(array.type):
                        array = pc.replace_substring(array, "\x00", "\ufffd")
                else:
                    array = pa.nulls(batch.num_rows, _ARROW[data_type])
                arrays.append(array)
            sink = io.BytesIO()
            pacsv.write_csv(pa.RecordBatch.from_arrays(arrays, names=columns), sink, options)
            yield sink.getvalue(), batch.num_rows


def ahead(chunks: Iterator[tuple[bytes, int]], depth: int = 2) -> Iterator[tuple[bytes, int]]:
    """``chunks``, made in a thread of their own up to ``depth`` ahead: pyarrow writes
    the next CSV chunk (without the GIL) while the server takes this one."""
    results: queue.Queue[tuple[bytes, int] | BaseException | None] = queue.Queue(depth)
    stop = threading.Event()

    def put(item: tuple[bytes, int] | BaseException | None) -> bool:
        """False once the consumer is gone (it stopped early)."""
        while not stop.is_set():
            try:
                results.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for chunk in chunks:
                if not put(chunk):
                    return
            put(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            put(exc)

    thread = threading.Thread(target=produce, name="eventpipe-csv", daemon=True)
    thread.start()
    try:
        while (item := results.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join()


def inexact_rows(files: Sequence[Path], scales: Mapping[str, int]) -> dict[int, str]:
    """Rows with a float that its ``numeric`` column of ``scales[column]`` decimal places
    would round (``1.5e-19`` into ``numeric(38,18)`` is 0), each with the reason: left out
    as a row the server refuses is, instead of stored changed. A float holds at most 17
    significant digits, so only those below ``10**(16-s)`` can have more than ``s``
    decimal places: the others are not looked at one by one."""
    inexact: dict[int, str] = {}
    position = 0
    for path in files:
        parquet = pq.ParquetFile(path)
        present = set(parquet.schema_arrow.names)
        columns = [c for c in scales if c in present]
        values = parquet.read(columns=columns)
        for column in columns:
            scale = scales[column]
            found = values.column(column)
            small = pc.and_(pc.less(pc.abs(found), 10.0 ** (16 - scale)), pc.not_equal(found, 0.0))
            for index in pc.indices_nonzero(pc.fill_null(small, False)).to_pylist():
                value = found[index].as_py()
                places = -int(Decimal(repr(value)).as_tuple().exponent)
                if places > scale:
                    inexact.setdefault(
                        position + index,
                        f"column {column} (numeric with {scale} decimal places) cannot hold "
                        f"{value!r} exactly",
                    )
        position += parquet.metadata.num_rows
    return inexact


MAX_REJECTED_ROWS = 100
"""Rows a load leaves out, one attempt each, before the whole batch is given up."""

_COPY_LINE = re.compile(r"^COPY \S+, line (\d+)")


def copy_line(exc: Exception) -> int | None:
    """The line (from 1) of the COPY input that an error is about, if it says."""
    context = getattr(getattr(exc, "diag", None), "context", None) or ""
    found = _COPY_LINE.search(context)
    return int(found.group(1)) if found else None


def position_of(line: int, rejected: dict[int, str]) -> int:
    """The position across the files of the ``line``-th row sent (rejected rows are not
    sent)."""
    position = line - 1
    for skipped in sorted(rejected):
        if skipped > position:
            break
        position += 1
    return position


def reason_of(exc: Exception) -> str:
    """The database's message, with where (column and value) when it says."""
    context = getattr(getattr(exc, "diag", None), "context", None) or ""
    where = context.split(", ", 1)[1].split(", ", 1)[1] if context.count(", ") >= 2 else ""
    return f"postgres: {first_line(exc)}" + (f" ({where.splitlines()[0]})" if where else "")
