"""A Parquet lake on an S3-compatible store (``type: parquet`` with ``path: s3://...``),
through pyarrow's S3 filesystem: the layout, types and records of the local lake
(destinations/parquet.py), without Spark's S3 connector.

* A load writes the batch's files with the local lake's DuckDB into a local directory of
  the run's work directory, then uploads each to its final name (``part-<batch key>-<n>
  .parquet`` in its day partition) and puts the batch's record last. Each object is one
  PUT, so it appears whole; a batch of several days appears day by day, as locally. A
  retry without a record deletes the batch's objects first, so nothing is added twice.
* ``eventpipe query`` registers each table as an Arrow dataset over its objects (columns
  of the table's schema files, ``day`` from the partition), read by an in-memory DuckDB
  that reads no file itself.
* Days are not replaced by ``eventpipe reprocess``: that moves directories, which an
  object store can only copy object by object (a reader would see a day half old, half
  new). Iceberg and Delta on S3 replace days in one commit.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path
from typing import Any

from eventpipe.destinations.base import QUERY_TIMEOUT_SECONDS, DaySwap, LoadRequest, LoadResult
from eventpipe.destinations.duckdb import read_only_query
from eventpipe.destinations.parquet import ParquetDestination
from eventpipe.destinations.storage import ObjectStorage, join
from eventpipe.errors import TerminalError, TransientError, first_line
from eventpipe.locks import Locks
from eventpipe.objectstore import Location
from eventpipe.reserved import LOADS_TABLE
from eventpipe.schema.dialects import DUCKDB
from eventpipe.schema.diff import Table, TablePatch


class S3ParquetDestination(ParquetDestination):
    """Parquet tables under ``s3://bucket/prefix``; batches staged under ``work_dir``."""

    def __init__(
        self,
        destination_id: str,
        location: Location,
        locks: Locks,
        work_dir: Path,
        partition_by: str = "day",
    ) -> None:
        self.id = destination_id
        self.locks = locks
        self.partition_by = partition_by
        self.location = location
        self.work_dir = Path(work_dir)
        """Where batches are written before their upload (the run's work directory)."""

    @cached_property
    def storage(self) -> ObjectStorage:
        return ObjectStorage(self.location)

    def describe(self, table: str) -> Table | None:
        with self._store_errors_are_transient():
            return super().describe(table)

    def patch(self, patch: TablePatch) -> None:
        with self._store_errors_are_transient():
            super().patch(patch)

    def load(self, request: LoadRequest) -> LoadResult:
        with self._store_errors_are_transient():
            return super().load(request)

    @contextmanager
    def _store_errors_are_transient(self) -> Iterator[None]:
        """A store that fails (unreachable, throttled past pyarrow's retries, denied) fails
        the run, which resumes with backoff; the events are not at fault."""
        try:
            yield
        except OSError as exc:
            raise TransientError(f"parquet {self.location}: {first_line(exc)}",
                                 destination=self.id) from exc  # fmt: skip

    def _staging(self, table: str, key: str) -> str:
        # Local: DuckDB writes files here, which are then uploaded one by one.
        return str(self.work_dir / "parquet-s3" / self.id / f"{table}-{key}")

    def _clear(self, staging: str) -> None:
        shutil.rmtree(staging, ignore_errors=True)

    def _publish(self, staging: str, table_dir: str, key: str) -> None:
        written = sorted(p for p in Path(staging).rglob("*.parquet") if p.is_file())
        for n, local in enumerate(written):
            partition = local.parent.relative_to(staging).as_posix()
            name = f"part-{key}-{n}.parquet"
            self.storage.upload(local, join(table_dir, partition, name) if partition != "."
                                else join(table_dir, name))  # fmt: skip
        self._clear(staging)

    def replace_days(self, swap: DaySwap) -> dict[str, int]:
        raise TerminalError(
            f"parquet destination {self.id!r} is on an object store, which cannot swap a "
            "day's files at once",
            fix="reprocess into iceberg or delta on S3 (one commit per table)",
        )

    def query(
        self, sql: str, *, timeout_seconds: float = QUERY_TIMEOUT_SECONDS
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run SQL on the tables (an Arrow dataset each, in the columns of its schema
        files) and the batch records (``_eventpipe_loads``), in an in-memory DuckDB that
        reads no file (read_only_query)."""
        import duckdb
        import pyarrow as pa
        import pyarrow.dataset as ds

        fs = self.location.filesystem()
        db = duckdb.connect(config={"enable_external_access": False})
        try:
            for table in self._tables():
                described = self.describe(table)
                columns = dict(described.columns) if described else {}
                schema = _arrow_schema(db, {c: DUCKDB.sql_type(t) for c, t in columns.items()})
                table_dir = join(self.storage.root, table)
                paths = [self.location.fs_path(join(table_dir, f))
                         for f in self.storage.files(table_dir, ".parquet")]  # fmt: skip
                if paths:
                    hive = None
                    if any("/day=" in p for p in paths):
                        schema = schema.append(pa.field("day", pa.date32()))
                        # DuckDB names a batch's rows without a day's partition day=NULL.
                        hive = ds.HivePartitioning(pa.schema([("day", pa.date32())]),
                                                   null_fallback="NULL")  # fmt: skip
                    rows: Any = ds.dataset(
                        paths, schema=schema, format="parquet", filesystem=fs,
                        partitioning=hive, partition_base_dir=self.location.fs_path(table_dir),
                    )  # fmt: skip
                else:  # patched, nothing loaded yet: its columns, no rows
                    rows = schema.empty_table()
                db.register(table, rows)
            records = [json.loads(text) for r in self._records()
                       if (text := self.storage.read_text(r)) is not None]  # fmt: skip
            loads = pa.Table.from_pylist(
                [{"batch_id": r["batch_id"], "rows": r["rows"],
                  "rejected": json.dumps(r["rejected"])} for r in records],
                schema=pa.schema([("batch_id", pa.string()), ("rows", pa.int64()),
                                  ("rejected", pa.string())]),
            )  # fmt: skip
            db.register(LOADS_TABLE, loads)
            return read_only_query(db, sql, timeout_seconds=timeout_seconds)
        finally:
            db.close()


def _arrow_schema(db: Any, sql_types: dict[str, str]) -> Any:
    """The Arrow types DuckDB writes columns of ``sql_types`` as (what the files hold)."""
    import pyarrow as pa

    if not sql_types:
        return pa.schema([])
    q = DUCKDB.quote
    select = ", ".join(f"CAST(NULL AS {t}) AS {q(c)}" for c, t in sql_types.items())
    return db.sql(f"SELECT {select} WHERE false").to_arrow_table().schema
