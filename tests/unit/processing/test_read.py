"""Reading a run's log files (processing/batch/read.py): each event's row id is the same on
every attempt of the run, whatever the cluster is when the run resumes. Failed rows find
their original events by it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pyspark.sql import functions as F

from eventpipe.processing.batch.read import read_events, run_session
from eventpipe.reserved import ROW


@contextmanager
def settings(spark: Any, **values: str) -> Iterator[None]:
    """Spark SQL settings on ``spark`` for a while (``files_x`` for spark.sql.files.x)."""
    keys = {f"spark.sql.files.{name.removeprefix('files_')}": v for name, v in values.items()}
    before = {key: spark.conf.get(key, None) for key in keys}
    try:
        for key, value in keys.items():
            spark.conf.set(key, value)
        yield
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def _segments(folder: Path) -> list[str]:
    folder.mkdir()
    paths = []
    for n, size in enumerate([1500, 400, 2600]):
        path = folder / f"incoming.tok=web-2026-11-25T10-00-0{n}.000.log"
        path.write_text("".join(json.dumps({"f": n, "n": i, "pad": "x" * (i % 50)}) + "\n"
                                for i in range(size)))  # fmt: skip
        paths.append(str(path))
    return paths


def test_a_run_numbers_its_rows_the_same_on_every_attempt_whatever_the_cluster(
    spark: Any, tmp_path: Path
) -> None:
    paths = _segments(tmp_path / "incoming")

    def row_ids(run: Path) -> dict[tuple[int, int], int]:
        frame = read_events(run_session(spark, run), paths)
        frame = frame.withColumn(ROW, F.monotonically_increasing_id())
        return {(r.f, r.n): r[ROW] for r in frame.select("f", "n", ROW).collect()}

    first = row_ids(tmp_path / "run")
    assert len(first) == 4500
    assert (tmp_path / "run" / "splits.json").exists()
    # The run resumes on a cluster that splits files otherwise (more cores, other sizes).
    with settings(spark, files_maxPartitionBytes="8192", files_openCostInBytes="1024",
                  files_minPartitionNum="7"):  # fmt: skip
        assert row_ids(tmp_path / "run") == first
        # A new run splits by the settings of its time: the ids differ, so they matter.
        assert row_ids(tmp_path / "another run") != first
