"""Parquet files (``type: parquet``): a data lake that Spark, DuckDB, Trino and pandas read.

Layout, per table, Hive-style partitions by the day of ``_timestamp`` (``partition_by:
day``, the default) or none (``partition_by: none``)::

    <path>/<table>/day=2026-11-21/part-<batch>-0.parquet
    <path>/<table>/_eventpipe/table.json          columns and lattice types
    <path>/<table>/_eventpipe/loads/<batch>.json  one record per loaded batch
    <path>/.staging/                              batches being written

Readers skip the ``_eventpipe`` directory (Spark and Hive ignore names starting with
``_``; it holds no Parquet). New columns appear in new files: read with schema merging
(Spark ``mergeSchema``, DuckDB ``union_by_name``) to see them all.

* A load converts the staged rows to the table's types with DuckDB (``TRY_CAST``: a row
  that does not convert is left out with its reason, like the other destinations),
  writes them with DuckDB's partitioned ``COPY`` into ``<path>/.staging/``, then renames
  each file into its partition and writes the batch's record last.
  A file appears whole or not at all; a batch that spans several days appears day by
  day, microseconds apart.
* Idempotent: file names carry the batch's key. A retried batch with a record loads
  nothing; without one (a crash before the record) its own files are removed first, so
  it never adds twice.
* Local paths only for now (``path`` a directory); Hadoop-compatible URIs written by
  Spark are not built yet. No primary key: plain files cannot upsert.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import duckdb

from eventpipe.destinations.base import LoadRequest, LoadResult, table_lock
from eventpipe.destinations.duckdb import rows_of, unconvertible_rows
from eventpipe.paths import fsync_directory
from eventpipe.schema.dialects import DUCKDB
from eventpipe.schema.diff import Table, TablePatch
from eventpipe.schema.types import DataType

META = "_eventpipe"


class ParquetDestination:
    dialect = DUCKDB  # types and quoting of the DuckDB that writes and queries the files
    parallel_loads = 2

    def __init__(
        self, destination_id: str, root: Path, lock_dir: Path, partition_by: str = "day"
    ) -> None:
        self.id = destination_id
        self.root = root
        self.lock_dir = lock_dir
        self.partition_by = partition_by

    def _meta(self, table: str) -> Path:
        return self.root / table / META

    def describe(self, table: str) -> Table | None:
        path = self._meta(table) / "table.json"
        if not path.exists():
            return None
        columns = json.loads(path.read_text())["columns"]
        return Table(table, {name: DataType(t) for name, t in columns.items()})

    def patch(self, patch: TablePatch) -> None:
        if patch.empty:
            return
        with table_lock(self.lock_dir, self.id, patch.table):
            current = self.describe(patch.table)  # again, under the lock
            columns = {**(current.columns if current else {}), **dict(patch.add_columns)}
            _write_atomically(
                self._meta(patch.table) / "table.json",
                json.dumps({"columns": {c: t.value for c, t in columns.items()}}, indent=1),
            )

    def load(self, request: LoadRequest) -> LoadResult:
        key = hashlib.sha1(request.batch_id.encode()).hexdigest()[:16]
        table_dir = self.root / request.table
        record = self._meta(request.table) / "loads" / f"{key}.json"
        # Outside every table directory, so that no reader's glob finds half a batch.
        staging = self.root / ".staging" / f"{request.table}-{key}"
        with table_lock(self.lock_dir, self.id, request.table):
            if record.exists():
                done = json.loads(record.read_text())
                rejected = tuple((int(i), str(why)) for i, why in done["rejected"])
                return LoadResult(rows=done["rows"], already_loaded=True, rejected=rejected)
            # A crashed attempt of this batch may have left files: remove them first.
            shutil.rmtree(staging, ignore_errors=True)
            for leftover in table_dir.glob(f"*/part-{key}-*.parquet"):
                leftover.unlink()
            for leftover in table_dir.glob(f"part-{key}-*.parquet"):
                leftover.unlink()
            rows, rejected = self._write(request, key, staging)
            for file in sorted(staging.rglob("*.parquet")):
                target = table_dir / file.relative_to(staging)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(file, target)
                fsync_directory(target.parent)
            shutil.rmtree(staging, ignore_errors=True)
            _write_atomically(
                record,
                json.dumps({"batch_id": request.batch_id, "rows": rows,
                            "rejected": [list(r) for r in rejected]}),
            )  # fmt: skip
        return LoadResult(rows=rows, rejected=rejected)

    def _write(
        self, request: LoadRequest, key: str, staging: Path
    ) -> tuple[int, tuple[tuple[int, str], ...]]:
        """The batch's rows as the table's types, written under ``staging`` in partition
        directories; (rows written, rows left out)."""
        q = DUCKDB.quote
        files = [str(f) for f in request.files]
        # The table's types (as patched) win, as a database table's columns do.
        table = self.describe(request.table)
        known = table.columns if table else {}
        sql_types = {c: DUCKDB.sql_type(known.get(c, t)) for c, t in request.columns.items()}
        db = duckdb.connect()
        try:
            db.execute("SET TimeZone = 'UTC'")
            rejected = unconvertible_rows(db, request, files, sql_types)
            select = ", ".join(f"CAST({q(c)} AS {t}) AS {q(c)}" for c, t in sql_types.items())
            partition = ""
            if self.partition_by == "day" and "_timestamp" in request.columns:
                select += f", strftime(CAST({q('_timestamp')} AS TIMESTAMP), '%Y-%m-%d') AS day"
                partition = ", PARTITION_BY (day)"
            source, params = rows_of(select, files, rejected)
            staging.mkdir(parents=True, exist_ok=True)
            target = staging if partition else staging / f"part-{key}-0.parquet"
            pattern = f", FILENAME_PATTERN 'part-{key}-{{i}}'" if partition else ""
            row = db.execute(
                f"COPY ({source}) TO '{_sql_text(str(target))}' "
                f"(FORMAT parquet{partition}{pattern})",
                params,
            ).fetchone()
            return (int(row[0]) if row else 0), rejected
        finally:
            db.close()

    def query(self, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run SQL on the tables (one DuckDB view per table directory) and the batch
        records (``_eventpipe_loads``)."""
        db = duckdb.connect()
        try:
            q = DUCKDB.quote
            for table_dir in sorted(p for p in self.root.glob("*") if (p / META).is_dir()):
                files = f"{_sql_text(str(table_dir))}/**/*.parquet"
                if any(table_dir.rglob("*.parquet")):
                    source = (
                        f"SELECT * FROM read_parquet('{files}', hive_partitioning = true, "
                        "union_by_name = true)"
                    )
                else:  # patched, nothing loaded yet: its columns, no rows
                    table = self.describe(table_dir.name)
                    columns = table.columns.items() if table else ()
                    source = (
                        "SELECT "
                        + ", ".join(f"NULL::{DUCKDB.sql_type(t)} AS {q(c)}" for c, t in columns)
                        + " WHERE false"
                    )
                db.execute(f"CREATE VIEW {q(table_dir.name)} AS {source}")
            records = f"{_sql_text(str(self.root))}/*/{META}/loads/*.json"
            if any(self.root.glob(f"*/{META}/loads/*.json")):
                db.execute(
                    f"CREATE VIEW _eventpipe_loads AS SELECT * FROM read_json_auto('{records}')"
                )
            else:
                db.execute(
                    "CREATE VIEW _eventpipe_loads AS SELECT NULL::VARCHAR AS batch_id WHERE false"
                )
            cursor = db.execute(sql)
            names = [d[0] for d in cursor.description or []]
            return names, cursor.fetchall()
        finally:
            db.close()


def _sql_text(text: str) -> str:
    return text.replace("'", "''")


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with partial.open("w") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    os.replace(partial, path)
    fsync_directory(path.parent)
