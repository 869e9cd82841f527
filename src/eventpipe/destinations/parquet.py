"""Parquet files (``type: parquet``): a data lake that Spark, DuckDB, Trino and pandas read.

``path`` is a local directory, or any Hadoop-compatible URI the Spark session can write
(``hdfs://``, ``s3a://``, ``abfss://``, ``gs://``, ``file://``). Layout, per table,
Hive-style partitions by the day of ``_timestamp`` (``partition_by: day``, the default) or
none (``partition_by: none``)::

    <path>/<table>/day=2026-11-21/part-<batch>-0.parquet
    <path>/<table>/_eventpipe/schema/000001.json  columns and lattice types, one file per
                                                  patch (the last one holds)
    <path>/<table>/_eventpipe/loads/<batch>.json  one record per loaded batch
    <path>/.staging/                              batches being written
    <path>/_eventpipe/swaps/<swap>.json           a reprocess's day partitions replaced
    <path>/.staging/swap-<swap>/                  the partitions it replaced, until done

Readers skip the ``_eventpipe`` directory (Spark and Hive ignore names starting with
``_``; it holds no Parquet). New columns appear in new files: read with schema merging
(Spark ``mergeSchema``, DuckDB ``union_by_name``) to see them all.

* A load converts the staged rows to the table's types: a row that does not convert is
  left out with its reason, like the other destinations. It writes them partitioned
  into ``<path>/.staging/``, then renames each file into its partition and writes the
  batch's record last. A file appears whole or not at all; a batch that spans several
  days appears day by day, microseconds apart (plain files have no multi-file
  transaction).
* Idempotent: file names carry the batch's key. A retried batch with a record loads
  nothing; without one (a crash before the record) its own files are removed first, so
  it never adds twice.
* Local directories are written by DuckDB (in memory) and queried through DuckDB views;
  URIs are written by Spark's own Parquet writer and queried with Spark SQL, through the
  Hadoop FileSystem (eventpipe.destinations.storage). The layout is the same.
* No primary key: plain files cannot upsert. Table locks are the data directory's locks
  (eventpipe.state.locks): one eventpipe data directory writes a given lake.
* ``eventpipe reprocess`` (local directories partitioned by day) replaces day partitions:
  the rebuilt rows are loaded into shadow tables (directories of their own), then each
  ``day=D`` directory of every table is renamed aside and the shadow's renamed in. A
  journal written first names every move, so a swap cut short is finished by the next
  attempt; a reader may see a day missing for the moment between two renames.

Length (about 500 lines): the local lake and the one Spark writes to a URI implement the
same protocol over the same file layout (schema files, load records, day partitions).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import posixpath
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cached_property, reduce
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from eventpipe import reserved
from eventpipe.destinations.base import (
    QUERY_TIMEOUT_SECONDS,
    DaySwap,
    LoadRequest,
    LoadResult,
    table_lock,
)
from eventpipe.destinations.duckdb import (
    file_offsets,
    read_only_query,
    rows_of,
    unconvertible_rows,
)
from eventpipe.destinations.storage import HadoopStorage, LocalStorage, Storage, join
from eventpipe.errors import QueryError, TerminalError, TransientError, first_line
from eventpipe.locks import Locks
from eventpipe.schema.dialects import DUCKDB
from eventpipe.schema.diff import Table, TablePatch
from eventpipe.schema.types import DataType

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

META = reserved.META_DIR
Rejected = tuple[tuple[int, str], ...]


class ParquetDestination:
    """Parquet tables in a local directory, written by DuckDB."""

    dialect = DUCKDB  # types and quoting of the DuckDB that writes and queries the files
    parallel_loads = 2

    def __init__(
        self, destination_id: str, root: Path, locks: Locks, partition_by: str = "day"
    ) -> None:
        self.id = destination_id
        self.root = root
        self.locks = locks
        self.partition_by = partition_by

    @cached_property
    def storage(self) -> Storage:
        return LocalStorage(self.root)

    def _meta(self, table: str, *parts: str) -> str:
        return join(self.storage.root, table, META, *parts)

    def _schemas(self, table: str) -> list[str]:
        """The table's schema files, oldest first (the last one holds)."""
        return [n for n in self.storage.names(self._meta(table, "schema")) if _is_json(n)]

    def describe(self, table: str) -> Table | None:
        return self._described(table, self._schemas(table))

    def _described(self, table: str, schemas: list[str]) -> Table | None:
        if not schemas:
            return None
        text = self.storage.read_text(self._meta(table, "schema", schemas[-1]))
        assert text is not None  # schema files are never removed
        columns = json.loads(text)["columns"]
        return Table(table, {name: DataType(t) for name, t in columns.items()})

    def patch(self, patch: TablePatch) -> None:
        if patch.empty:
            return
        with table_lock(self.locks, self.id, patch.table):
            schemas = self._schemas(patch.table)  # again, under the lock
            current = self._described(patch.table, schemas)
            columns = {**(current.columns if current else {}), **dict(patch.add_columns)}
            # A new file per patch, never a file rewritten in place: object stores cannot
            # replace a file atomically, and the history shows when each column came.
            self.storage.create_text(
                self._meta(patch.table, "schema", f"{len(schemas) + 1:06d}.json"),
                json.dumps({"columns": {c: t.value for c, t in columns.items()}}, indent=1),
            )

    def load(self, request: LoadRequest) -> LoadResult:
        key = hashlib.sha1(request.batch_id.encode()).hexdigest()[:16]
        storage = self.storage
        table_dir = join(storage.root, request.table)
        record = self._meta(request.table, "loads", f"{key}.json")
        staging = self._staging(request.table, key)
        with table_lock(self.locks, self.id, request.table):
            done = storage.read_text(record)
            if done is not None:
                loaded = json.loads(done)
                rejected = tuple((int(i), str(why)) for i, why in loaded["rejected"])
                return LoadResult(rows=loaded["rows"], already_loaded=True, rejected=rejected)
            # A crashed attempt of this batch may have left files: remove them first.
            self._clear(staging)
            for leftover in storage.files(table_dir, ".parquet"):
                if posixpath.basename(leftover).startswith(f"part-{key}-"):
                    storage.delete(join(table_dir, leftover))
            table = self.describe(request.table)
            known = table.columns if table else {}
            # The table's types (as patched) win, as a database table's columns do.
            types = {c: known.get(c, t) for c, t in request.columns.items()}
            rows, rejected = self._write(request, types, staging)
            self._publish(staging, table_dir, key)
            storage.create_text(
                record,
                json.dumps({"batch_id": request.batch_id, "rows": rows,
                            "rejected": [list(r) for r in rejected]}),
            )  # fmt: skip
        return LoadResult(rows=rows, rejected=rejected)

    def _staging(self, table: str, key: str) -> str:
        """Where a batch's files are written before they are moved into the table: outside
        every table directory, so that no reader's glob finds half a batch."""
        return join(self.storage.root, ".staging", f"{table}-{key}")

    def _clear(self, staging: str) -> None:
        self.storage.delete(staging)

    def _publish(self, staging: str, table_dir: str, key: str) -> None:
        """Move the batch's files from ``staging`` into their partitions of the table,
        each named by the batch's key (one by one: each appears whole)."""
        storage = self.storage
        for n, written in enumerate(storage.files(staging, ".parquet")):
            partition = posixpath.dirname(written)
            name = f"part-{key}-{n}.parquet"
            storage.move(join(staging, written), join(table_dir, partition, name))
        storage.delete(staging)

    def _partitioned(self, request: LoadRequest) -> bool:
        return self.partition_by == "day" and "_timestamp" in request.columns

    def _write(
        self, request: LoadRequest, types: dict[str, DataType], staging: str
    ) -> tuple[int, Rejected]:
        """The batch's rows as ``types``, written under ``staging`` (in partition
        directories); (rows written, rows left out)."""
        q = DUCKDB.quote
        files = [str(f) for f in request.files]
        sql_types = {c: DUCKDB.sql_type(t) for c, t in types.items()}
        db = duckdb.connect()
        try:
            db.execute("SET TimeZone = 'UTC'")
            rejected = unconvertible_rows(db, request, files, sql_types)
            select = ", ".join(f"CAST({q(c)} AS {t}) AS {q(c)}" for c, t in sql_types.items())
            partition = ""
            if self._partitioned(request):
                select += f", strftime(TRY_CAST({q('_timestamp')} AS TIMESTAMP), '%Y-%m-%d') AS day"
                partition = ", PARTITION_BY (day)"
            source, params = rows_of(select, files, rejected)
            Path(staging).mkdir(parents=True, exist_ok=True)
            target = staging if partition else join(staging, "part-0.parquet")
            row = db.execute(
                f"COPY ({source}) TO '{_sql_text(target)}' (FORMAT parquet{partition})", params
            ).fetchone()
            return (int(row[0]) if row else 0), rejected
        finally:
            db.close()

    def _tables(self) -> list[str]:
        root = self.storage.root
        return [n for n in self.storage.names(root) if META in self.storage.names(join(root, n))]

    def tables(self) -> list[str]:
        """The table directories (shadow tables of a reprocess included)."""
        return self._tables()

    def drop(self, tables: list[str]) -> None:
        for table in tables:
            self.storage.delete(join(self.storage.root, table))

    def replace_days(self, swap: DaySwap) -> dict[str, int]:
        """Replace the ``day=D`` partitions of ``swap.days`` in every table of
        ``swap.tables`` by the shadows' (none where a shadow has no rows of the day);
        the rows moved in per table. Done once per ``swap.swap_id``: the journal written
        first lists the moves, and an attempt cut short is finished by the next."""
        if self.partition_by != "day":
            raise TerminalError(
                f"parquet destination {self.id!r} has partition_by: none: a reprocess "
                "replaces day partitions",
                fix="reprocess a destination with partition_by: day",
            )
        storage, root = self.storage, self.storage.root
        key = hashlib.sha1(swap.swap_id.encode()).hexdigest()[:16]
        journal = join(root, META, "swaps", f"{key}.json")
        aside = join(root, ".staging", f"swap-{key}")  # outside every table
        tables = sorted({*swap.tables, *swap.shadows})
        with contextlib.ExitStack() as held:
            for table in tables:
                held.enter_context(table_lock(self.locks, self.id, table))
            text = storage.read_text(journal)
            if text is None:  # the plan, from the shadows as they are before any move
                moves = [
                    [table, day]
                    for table, shadow in sorted(swap.shadows.items())
                    for day in swap.days
                    if storage.names(join(root, shadow, f"day={day}"))
                ]
                rows = {t: self._loaded_rows(s) for t, s in sorted(swap.shadows.items())}
                plan: dict[str, Any] = {
                    "swap_id": swap.swap_id, "days": list(swap.days), "tables": tables,
                    "moves": moves, "rows": rows, "done": False,
                }  # fmt: skip
                storage.create_text(journal, json.dumps(plan))
            else:
                plan = json.loads(text)
                if plan["done"]:
                    return {t: int(n) for t, n in plan["rows"].items()}
            moved = {(table, day) for table, day in plan["moves"]}
            for table in plan["tables"]:
                for day in plan["days"]:
                    partition = join(root, table, f"day={day}")
                    rebuilt = None
                    if (table, day) in moved:
                        rebuilt = join(root, swap.shadows[table], f"day={day}")
                        if not storage.names(rebuilt):
                            continue  # moved in by an earlier attempt
                    if storage.names(partition):
                        storage.move(partition, join(aside, table, f"day={day}"))
                    if rebuilt is not None:
                        storage.move(rebuilt, partition)
            storage.delete(aside)
            self.drop(sorted(swap.shadows.values()))
            storage.create_text(journal, json.dumps({**plan, "done": True}))
        return {t: int(n) for t, n in plan["rows"].items()}

    def _loaded_rows(self, table: str) -> int:
        """The rows of ``table``'s batch records."""
        records = [n for n in self.storage.names(self._meta(table, "loads")) if _is_json(n)]
        texts = (self.storage.read_text(self._meta(table, "loads", n)) for n in records)
        return sum(json.loads(t)["rows"] for t in texts if t is not None)

    def _records(self) -> list[str]:
        """Every table's batch records."""
        return [
            self._meta(table, "loads", name)
            for table in self._tables()
            for name in self.storage.names(self._meta(table, "loads"))
            if _is_json(name)
        ]

    def query(
        self, sql: str, *, timeout_seconds: float = QUERY_TIMEOUT_SECONDS
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run SQL on the tables (one DuckDB view per table directory) and the batch
        records (``_eventpipe_loads``). The connection reads files under the
        destination's directory only, and takes one query (read_only_query)."""
        db = duckdb.connect()
        try:
            db.execute("SET allowed_directories = ?", [[self.storage.root.rstrip("/") + "/"]])
            db.execute("SET enable_external_access = false")
            db.execute("SET lock_configuration = true")
            q = DUCKDB.quote
            for table in self._tables():
                table_dir = join(self.storage.root, table)
                if self.storage.files(table_dir, ".parquet"):
                    source = (
                        f"SELECT * FROM read_parquet('{_sql_text(table_dir)}/**/*.parquet', "
                        "hive_partitioning = true, union_by_name = true)"
                    )
                else:  # patched, nothing loaded yet: its columns, no rows
                    described = self.describe(table)
                    columns = described.columns.items() if described else ()
                    source = (
                        "SELECT "
                        + ", ".join(f"NULL::{DUCKDB.sql_type(t)} AS {q(c)}" for c, t in columns)
                        + " WHERE false"
                    )
                db.execute(f"CREATE VIEW {q(table)} AS {source}")
            records = self._records()
            if records:
                db.execute(
                    "CREATE VIEW _eventpipe_loads AS SELECT * FROM read_json_auto("
                    + ", ".join(f"'{_sql_text(r)}'" for r in records).join("[]")
                    + ")"
                )
            else:
                db.execute(
                    "CREATE VIEW _eventpipe_loads AS SELECT NULL::VARCHAR AS batch_id WHERE false"
                )
            return read_only_query(db, sql, timeout_seconds=timeout_seconds)
        finally:
            db.close()


class SparkParquetDestination(ParquetDestination):
    """Parquet tables under a Hadoop-compatible URI, written by Spark's Parquet writer.

    ``spark`` gives the session (started on first use): its ``spark.hadoop.*`` settings
    carry the file system's credentials, as for any Spark job.
    """

    def __init__(
        self,
        destination_id: str,
        uri: str,
        locks: Locks,
        spark: Callable[[], SparkSession],
        partition_by: str = "day",
    ) -> None:
        self.id = destination_id
        self.uri = uri
        self.locks = locks
        self.partition_by = partition_by
        self._session = spark

    @cached_property
    def spark(self) -> SparkSession:
        return self._session()

    def patch(self, patch: TablePatch) -> None:
        with self._io_errors_are_transient():
            super().patch(patch)

    def load(self, request: LoadRequest) -> LoadResult:
        with self._io_errors_are_transient():
            return super().load(request)

    @contextmanager
    def _io_errors_are_transient(self) -> Iterator[None]:
        """A file system that fails (unreachable, throttled, denied) fails the run, which
        then resumes with backoff; the events are not at fault."""
        from py4j.protocol import Py4JJavaError

        try:
            yield
        except Py4JJavaError as exc:
            io_error = self.spark.sparkContext._jvm.java.io.IOException  # type: ignore[union-attr]
            cause = exc.java_exception
            while cause is not None:
                if io_error._java_lang_class.isInstance(cause):
                    raise TransientError(
                        f"parquet {self.uri}: {cause.toString()}", destination=self.id
                    ) from exc
                cause = cause.getCause()
            raise

    @cached_property
    def storage(self) -> Storage:
        return HadoopStorage(self.spark, self.uri)

    def _write(
        self, request: LoadRequest, types: dict[str, DataType], staging: str
    ) -> tuple[int, Rejected]:
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        from eventpipe.schema.casts import SPARK_TYPES, cast_to, conversion_problem

        frame = self._read(request)
        sources = {f.name: f.dataType for f in frame.schema.fields}
        converted = {c: cast_to(F.col(f"`{c}`"), t, sources[c]) for c, t in types.items()}
        problems = [
            conversion_problem(F.col(f"`{c}`"), c, t, converted[c])
            for c, t in types.items()
            if sources[c] != SPARK_TYPES[t]
        ]
        rejected: Rejected = ()
        if problems:
            checked = frame.withColumn(_WHY, F.concat_ws("; ", *problems))
            found = checked.filter(F.col(_WHY) != "").select(_FILE, _ROW_INDEX, _WHY).collect()
            offsets = file_offsets([str(f) for f in request.files])
            starts = [offsets[str(f)] for f in request.files]
            rejected = tuple(sorted((starts[r[0]] + r[1], r[2]) for r in found))
            frame = checked.filter(F.col(_WHY) == "")
        out = frame.select(*(converted[c].alias(c) for c in types))
        writer_columns: list[str] = []
        if self._partitioned(request):
            out = out.withColumn(
                "day", F.date_format(F.try_to_timestamp(F.col("_timestamp")), "yyyy-MM-dd")
            )
            writer_columns = ["day"]
        counted = Observation("rows")
        out = out.observe(counted, F.count(F.lit(1)).alias("rows"))
        out.write.mode("overwrite").partitionBy(*writer_columns).parquet(staging)
        return int(counted.get["rows"]), rejected

    def _read(self, request: LoadRequest) -> DataFrame:
        """The request's files as one frame with every column of the request, and each
        row's file (its index in ``request.files``) and row number in that file."""
        from pyspark.sql import functions as F

        from eventpipe.schema.casts import SPARK_TYPES

        def read(i: int, file: Path) -> DataFrame:
            rows = self.spark.read.parquet(str(file))
            # From the scan itself: a table may have a column named _metadata.
            index = rows.metadataColumn("_metadata").getField("row_index")
            return rows.select("*", F.lit(i).alias(_FILE), index.alias(_ROW_INDEX))

        parts = [read(i, file) for i, file in enumerate(request.files)]
        frame = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), parts)
        for column, data_type in request.columns.items():
            if column not in frame.columns:
                frame = frame.withColumn(column, F.lit(None).cast(SPARK_TYPES[data_type]))
        return frame.select(*(F.col(f"`{c}`") for c in request.columns), _FILE, _ROW_INDEX)

    def query(
        self, sql: str, *, timeout_seconds: float = QUERY_TIMEOUT_SECONDS
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run Spark SQL on the tables (one temporary view per table directory, schemas
        merged) and the batch records (``_eventpipe_loads``), in a session of its own,
        which takes one query (no command, no write: _check_spark_query) and reads no
        file by path. Its Spark jobs are cancelled after ``timeout_seconds``."""
        from pyspark.sql import types as T

        from eventpipe.schema.casts import SPARK_TYPES

        session = self.spark.newSession()
        session.conf.set("spark.sql.runSQLOnFiles", "false")  # no parquet.`/any/path`
        _check_spark_query(session, sql)
        for table in self._tables():
            table_dir = join(self.storage.root, table)
            if self.storage.files(table_dir, ".parquet"):
                frame = session.read.option("mergeSchema", "true").parquet(table_dir)
            else:  # patched, nothing loaded yet: its columns, no rows
                described = self.describe(table)
                columns = described.columns.items() if described else ()
                schema = T.StructType([T.StructField(c, SPARK_TYPES[t]) for c, t in columns])
                frame = session.createDataFrame([], schema)
            frame.createOrReplaceTempView(table)
        files = self._records()
        if files:
            # Named one by one: Spark leaves out what a glob finds under a "_" directory.
            records = session.read.json(files)
        else:
            records = session.createDataFrame([], "batch_id string")
        records.createOrReplaceTempView("_eventpipe_loads")
        from py4j.protocol import Py4JJavaError
        from pyspark.errors import PySparkException

        context = session.sparkContext
        group = f"eventpipe-query-{uuid.uuid4().hex}"
        context.setJobGroup(group, "eventpipe query", interruptOnCancel=True)
        timer = threading.Timer(timeout_seconds, context.cancelJobGroup, [group])
        timer.daemon = True
        timer.start()
        try:
            result = session.sql(sql)
            return list(result.columns), [tuple(row) for row in result.collect()]
        except (PySparkException, Py4JJavaError) as exc:  # the SQL, as Spark answers it
            if not timer.is_alive():
                raise QueryError(
                    f"the query ran longer than query_timeout_seconds ({timeout_seconds:g})"
                ) from None
            raise QueryError(first_line(exc)) from None
        finally:
            timer.cancel()
            context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]


_NOT_QUERIES = ("Command", "ParsedStatement", "InsertIntoDir")
"""Spark's parsed plans that are not queries (what runs at once, what writes)."""
_REFLECTION = ("reflect", "java_method", "try_reflect")
"""Spark SQL functions that call any Java method."""


def _check_spark_query(session: SparkSession, sql: str) -> None:
    """Refuse ``sql`` unless it is one query, before Spark runs it (spark.sql runs
    commands at once); and take the functions that call Java methods out of ``session``."""
    jvm, jsession = session._jvm, session._jsparkSession
    assert jvm is not None
    try:
        plan = jsession.sessionState().sqlParser().parsePlan(sql)
    except Exception as exc:  # noqa: BLE001 (Py4J carries Spark's ParseException)
        raise QueryError(first_line(exc)) from None
    logical = "org.apache.spark.sql.catalyst.plans.logical."
    for name in _NOT_QUERIES:
        if jvm.java.lang.Class.forName(logical + name).isInstance(plan):
            kind = plan.getClass().getSimpleName()
            raise QueryError(f"eventpipe query runs one query (SELECT ...); this is {kind}")
    registry = jsession.sessionState().functionRegistry()  # this session's own copy
    builtin, system = jvm.scala.Some("builtin"), jvm.scala.Some("system")
    for function in _REFLECTION:
        name = jvm.org.apache.spark.sql.catalyst.FunctionIdentifier(function, builtin, system)
        registry.dropFunction(name)


# Beside a table's columns while it loads (eventpipe's names: no column is named so).
_FILE, _ROW_INDEX, _WHY = (reserved.PREFIX + n for n in ("_file_index", "_row_index", "_why"))


def _is_json(name: str) -> bool:
    return name.endswith(".json") and not name.startswith(".")


def _sql_text(text: str) -> str:
    return text.replace("'", "''")
