"""Spark reads the archive in parallel: each LZ4 frame is a unit of work, so that a day of
a few large segments still spreads over every core (reprocessing reads this way).

Spark's own LZ4 codec is Hadoop's block format, not the LZ4 frame format, so frames are
decompressed by python-lz4 in Arrow-batched Python tasks (``mapInArrow``): the driver
lists the frames from the indexes (small JSON files), the tasks read their frames by
offset. The archive must be where the executors can read it, as ``incoming/`` must.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import lz4.frame

from eventpipe.archive.files import ArchivedSegment, Index, events_of
from eventpipe.sessions import parallelism

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

LINES_SCHEMA = "segment string, line long, value binary"
"""What :func:`read_archive` gives: each event's segment file name, line and bytes."""

_WHOLE_FILE = -1
"""A frame entry's size for a legacy ``.gz`` file: read whole by one task."""


def read_archive(spark: SparkSession, segments: Sequence[ArchivedSegment]) -> DataFrame:
    """Every event of ``segments`` as rows of :data:`LINES_SCHEMA`, frames read in
    parallel (at most two frames' worth of lines held at once per task)."""
    units = []
    for segment in segments:
        if segment.legacy:
            units.append((str(segment.data), 0, _WHOLE_FILE, 0, segment.segment_file))
            continue
        for frame in Index.read(segment.index).frames:
            units.append((str(segment.data), frame.offset, frame.size, frame.first,
                          segment.segment_file))  # fmt: skip
    frames = spark.createDataFrame(
        units, "path string, offset long, size long, first long, segment string"
    )
    tasks = max(1, min(len(units), parallelism(spark) * 4))
    return frames.repartition(tasks).mapInArrow(_decompress, LINES_SCHEMA)


def _decompress(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    import pyarrow as pa

    for batch in batches:
        for unit in batch.to_pylist():
            if unit["size"] == _WHOLE_FILE:
                with gzip.open(unit["path"], "rb") as stream:
                    events = events_of(stream.read())
            else:
                with open(unit["path"], "rb") as data:
                    data.seek(unit["offset"])
                    events = events_of(lz4.frame.decompress(data.read(unit["size"])))
            first = unit["first"]
            yield pa.RecordBatch.from_pydict(
                {
                    "segment": [unit["segment"]] * len(events),
                    "line": list(range(first, first + len(events))),
                    "value": events,
                },
                schema=pa.schema(
                    [("segment", pa.string()), ("line", pa.int64()), ("value", pa.binary())]
                ),
            )
