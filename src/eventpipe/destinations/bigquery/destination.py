"""BigQuery (``type: bigquery``): the destination protocol through Google's own client
(``google-cloud-bigquery``, the ``bigquery`` extra).

* **Tables** in the configured dataset (created if missing, in ``location``), typed by
  seed 1's BigQuery column (schema.dialects.BIGQUERY: ``STRING``, ``FLOAT``,
  ``INTEGER``, ``BIGNUMERIC`` for integers beyond 64 bits, ``BOOLEAN``, ``TIMESTAMP``),
  partitioned by the day of ``_timestamp`` when they have it. With ``primary_key`` the
  table is clustered by the key, the key is declared (BigQuery does not enforce it: the
  loads do), and each key column's description says its place in the key, which is what
  :meth:`describe` reads back.
* **Patching** adds columns by a schema update (BigQuery's own, never a rewrite), under
  the table lock of the data directory.
* **A load**, under the same lock:

  1. the batch's record in ``_eventpipe_loads`` is looked up: found, nothing loads;
  2. an in-memory DuckDB converts the staged rows to the columns' types into one Parquet
     file (destinations/converted.py: a row with a value that does not convert is left
     out with the reason), unless the append below can load the run's staged files as
     they are (:func:`_as_staged`: several are joined into one, unconverted);
  3. an append (no key, no changes) with ``appends: storage_write`` (the default in
     stream mode): a pending stream of the Storage Write API, prepared, committed and
     recorded (write.py); otherwise one load job straight into the table whose
     id is the batch's own (:func:`_job_id`, then the attempt), and the record after it.
     BigQuery refuses a second job of one id: a rerun after a crash between the two
     finds the job done and writes the record alone; a failed job's id is spent, and
     the next attempt takes the next one;
  4. with a key or a source's changes: a load job makes a stage table of the batch's
     own from the file (``_eventpipe_stage_<key>``, replaced whole: a retried job
     writes the same table); one multi-statement transaction moves the stage's rows
     into the table (each key's newest row by ``MERGE``, a row already newer kept; or
     the changes applied) and writes the batch's record; then the stage is dropped. A
     crash before the ``COMMIT`` leaves the table as it was.
* **Days replaced** (``eventpipe reprocess``): one transaction deletes the days' rows and
  moves the shadows' rows in, with its record; the shadows are dropped after it.
* **A source's changes** (``changes: apply``) are staged the same way, and the
  transaction applies them by key (destinations/changes.py: a truncate empties the
  table, each key's last change decides); the two reads that plan it (the changes'
  count, the last truncate) run on the stage before the transaction.
* **Errors**: BigQuery's 5xx, throttling (429, ``rateLimitExceeded``,
  ``quotaExceeded``), a job past ``timeout_seconds`` and a network that fails are
  transient (the client retries within the request's deadline first); credentials
  refused stop with a configuration error; every other error is terminal for the batch,
  with BigQuery's message.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eventpipe import reserved
from eventpipe.destinations import changes
from eventpipe.destinations.base import (
    ALL_SWAPPED,
    QUERY_TIMEOUT_SECONDS,
    DaySwap,
    LoadRequest,
    LoadResult,
    swap_days,
    table_lock,
)
from eventpipe.destinations.bigquery.api import BigQueryApi
from eventpipe.destinations.bigquery.schema import DUCKDB_TYPES, LATTICE, field, key_of
from eventpipe.destinations.bigquery.write import writable
from eventpipe.destinations.converted import beside, converted_rows, fits, joined
from eventpipe.destinations.snowflake.query import check_query
from eventpipe.errors import QueryError, TerminalError, TransientError
from eventpipe.locks import Locks
from eventpipe.schema.dialects import BIGQUERY, TIMESTAMP_COLUMN
from eventpipe.schema.diff import Table, TablePatch
from eventpipe.schema.types import DataType

if TYPE_CHECKING:
    pass

LOADS_TABLE = reserved.LOADS_TABLE
STREAMS_TABLE = "_eventpipe_streams"
"""The Storage Write API's prepared streams, a batch's each (write.py)."""
STAGE_TABLE_PREFIX = "_eventpipe_stage_"
MAX_LOAD_ATTEMPTS = 100
"""Load jobs of one batch at most (a failed job's id is spent; each retry of a batch the
load refused tries the next id)."""


class BigQueryDestination:
    dialect = BIGQUERY
    parallel_loads = 2
    """Tables of a batch loaded at once (the client is shared: it is thread-safe)."""

    def __init__(
        self,
        destination_id: str,
        locks: Locks,
        *,
        project: str,
        dataset: str,
        location: str = "US",
        credentials_file: str | None = None,
        query_credentials_file: str | None = None,
        endpoint: str | None = None,
        storage_endpoint: str | None = None,
        appends: str = "load_job",
        timeout_seconds: float = 300.0,
    ) -> None:
        self.id = destination_id
        self.locks = locks
        self.project = project
        self.dataset = dataset
        self.location = location
        self.credentials_file = credentials_file
        self.query_credentials_file = query_credentials_file
        self.endpoint = endpoint
        self.storage_endpoint = storage_endpoint
        self.appends = appends
        """``load_job`` or ``storage_write``: how rows without a key are appended."""
        self.timeout_seconds = timeout_seconds
        self.api = BigQueryApi(destination_id, project, dataset, location, credentials_file,
                               endpoint, storage_endpoint, timeout_seconds)  # fmt: skip
        self._streams_ready = False
        self._ready = False

    def __repr__(self) -> str:
        return f"BigQueryDestination({self.id!r}, {self.project}.{self.dataset})"

    def _ensure_ready(self) -> None:
        """The dataset and the loads table, once per destination object."""
        if self._ready:
            return
        from google.api_core.exceptions import NotFound
        from google.cloud import bigquery

        client = self.api.client()
        with self.api.errors():
            # Looked up first: a loader may read and write a dataset it cannot create.
            try:
                client.get_dataset(f"{self.project}.{self.dataset}", **self.api.call)
            except NotFound:
                dataset = bigquery.Dataset(f"{self.project}.{self.dataset}")
                dataset.location = self.location
                client.create_dataset(dataset, exists_ok=True, **self.api.call)
        if self.api.get(LOADS_TABLE) is None:
            self.api.create(LOADS_TABLE, {"batch_id": "STRING", "tbl": "STRING", "rows": "INTEGER",
                                       "rejected": "STRING", "loaded_at": "TIMESTAMP"})  # fmt: skip
        self._ready = True

    # -- tables -------------------------------------------------------------------------

    def describe(self, table: str) -> Table | None:
        self._ensure_ready()
        return self._describe(table)

    def _describe(self, table: str) -> Table | None:
        found = self.api.get(table)
        if found is None:
            return None
        columns = {f.name: LATTICE.get(f.field_type.upper(), DataType.STRING)
                   for f in found.schema}  # fmt: skip
        return Table(table, columns, key_of(found.schema))

    def patch(self, patch: TablePatch) -> None:
        if patch.empty:
            return
        from google.cloud import bigquery

        self._ensure_ready()
        with table_lock(self.locks, self.id, patch.table):
            current = self.api.get(patch.table)  # again, under the lock
            client = self.api.client()
            if current is None:
                key = patch.set_primary_key
                made = bigquery.Table(self.api.ref(patch.table), schema=[
                    field(bigquery, c, t, key) for c, t in patch.add_columns
                ])  # fmt: skip
                if any(c == TIMESTAMP_COLUMN for c, _ in patch.add_columns):
                    made.time_partitioning = bigquery.TimePartitioning(field=TIMESTAMP_COLUMN)
                if key:
                    from google.cloud.bigquery.table import PrimaryKey, TableConstraints

                    made.clustering_fields = list(key[:4])  # BigQuery clusters by four
                    made.table_constraints = TableConstraints(
                        primary_key=PrimaryKey(columns=list(key)), foreign_keys=None
                    )
                with self.api.errors(patch.table):
                    client.create_table(made, exists_ok=True, **self.api.call)
                return
            present = {f.name for f in current.schema}
            new = [field(bigquery, c, t, ()) for c, t in patch.add_columns if c not in present]
            if new:
                current.schema = [*current.schema, *new]
                with self.api.errors(patch.table):
                    client.update_table(current, ["schema"], **self.api.call)

    def tables(self) -> list[str]:
        """The dataset's tables, but eventpipe's own and the loads' stage tables."""
        self._ensure_ready()
        with self.api.errors():
            listed = self.api.client().list_tables(f"{self.project}.{self.dataset}",
                                                **self.api.call)  # fmt: skip
            names = sorted(t.table_id for t in listed)
        return [n for n in names if not n.startswith(STAGE_TABLE_PREFIX) and n != LOADS_TABLE]

    def drop(self, tables: list[str]) -> None:
        self._ensure_ready()
        for table in tables:
            with self.api.errors(table):
                self.api.client().delete_table(self.api.ref(table), not_found_ok=True,
                                            **self.api.call)  # fmt: skip

    # -- loads --------------------------------------------------------------------------

    def load(self, request: LoadRequest) -> LoadResult:
        self._ensure_ready()
        with table_lock(self.locks, self.id, request.table):
            done = list(self.api.run(
                f"SELECT rows, rejected FROM {self.api.name(LOADS_TABLE)} "
                "WHERE batch_id = @batch AND tbl = @tbl",
                request.table, batch=request.batch_id, tbl=request.table,
            ))  # fmt: skip
            if done:
                rows, reasons = done[0]
                left_out = tuple((int(i), str(why)) for i, why in json.loads(reasons or "[]"))
                return LoadResult(rows=int(rows), already_loaded=True, rejected=left_out)
            current = self._describe(request.table)
            if current is None:
                raise TerminalError(f"{self.id}.{request.table} does not exist",
                                    table=request.table)  # fmt: skip
            missing = [c for c in request.columns if c not in current.columns]
            if missing:
                raise TerminalError(f"{self.id}.{request.table} has no column {missing[0]!r}",
                                    table=request.table)  # fmt: skip
            key = hashlib.sha1(f"{request.table}\0{request.batch_id}".encode()).hexdigest()[:16]
            stage = STAGE_TABLE_PREFIX + key
            types = {c: DUCKDB_TYPES[t] for c, t in current.columns.items()}
            appending = not request.primary_key and not request.apply_changes
            with tempfile.TemporaryDirectory(prefix="eventpipe-bigquery-",
                                             dir=beside(request)) as work:  # fmt: skip
                converted = Path(work) / "rows.parquet"
                if appending and _as_staged(request, types):
                    files, left_out = request.files, ()
                else:
                    rejected = converted_rows(request, types, converted, "bigquery")
                    left_out = tuple(sorted(rejected.items()))
                    files = (converted,) if converted.exists() else ()
                if not files:  # no row to load: the record alone
                    self._commit(request, None, 0, left_out)
                    return LoadResult(rows=0, rejected=left_out)
                if appending:
                    count = self._appended(current, request, files, Path(work))
                    self._commit(request, None, count, left_out)
                    return LoadResult(rows=count, rejected=left_out)
                # The rows or keys the batch brings (a source's changes: counted by the
                # statements that apply them).
                count = 0 if request.apply_changes else _brought(converted, request.primary_key)
                self._stage(stage, current, request, converted)
            try:
                count = self._commit(request, stage, count, left_out)
            finally:
                self.drop([stage])
        return LoadResult(rows=count, rejected=left_out)

    def _appended(
        self, table: Table, request: LoadRequest, files: tuple[Path, ...], work: Path
    ) -> int:
        """The rows of ``files`` appended to the table, by the Storage Write API
        (``appends: storage_write``; not into a table with integers beyond 64 bits) or
        one load job (several files joined into one first); the rows appended."""
        if self.appends == "storage_write" and writable(list(table.columns.values())):
            return self._written(table, request, files)
        one = files[0] if len(files) == 1 else joined(files, work / "all.parquet")
        return self._append(table, request, one)

    def _written(self, table: Table, request: LoadRequest, files: tuple[Path, ...]) -> int:
        """The rows appended through a pending stream of the Storage Write API, prepared
        and committed (write.py: a rerun commits a stream it finds prepared);
        the rows it holds."""
        streams = self.api.name(STREAMS_TABLE)
        if not self._streams_ready:
            self.api.create(STREAMS_TABLE, {"batch_id": "STRING", "tbl": "STRING",
                                         "stream": "STRING", "rows": "INTEGER",
                                         "prepared_at": "TIMESTAMP"})  # fmt: skip
            self._streams_ready = True
        writer = self.api.writer()
        prepared = list(self.api.run(
            f"SELECT stream, rows FROM {streams} WHERE batch_id = @batch AND tbl = @tbl "
            "ORDER BY prepared_at DESC LIMIT 1",
            request.table, batch=request.batch_id, tbl=request.table,
        ))  # fmt: skip
        with self.api.errors(request.table):
            if prepared and writer.commit(request.table, str(prepared[0][0])):
                return int(prepared[0][1])
            columns = {c: table.columns[c] for c in request.columns}
            stream, rows = writer.write(request.table, files, columns)
        self.api.run(
            f"INSERT INTO {streams} (batch_id, tbl, stream, rows, prepared_at) "
            "VALUES (@batch, @tbl, @stream, @rows, CURRENT_TIMESTAMP())",
            request.table, batch=request.batch_id, tbl=request.table, stream=stream, rows=rows,
        )  # fmt: skip
        with self.api.errors(request.table):
            if not writer.commit(request.table, stream):
                raise TransientError(f"bigquery ({self.id}.{request.table}): stream {stream} "
                                     "was not found to commit", table=request.table)  # fmt: skip
        return rows

    def _append(self, table: Table, request: LoadRequest, file: Path) -> int:
        """The converted rows appended to the table by one load job whose id is the
        batch's own (attempt 0, 1...: a failed job's id cannot be used again); the rows
        it loaded (the file's). A job of an earlier attempt that loaded the batch (the
        run died before the record) is found by its id and not run again: BigQuery
        refuses a second job of one id, so a retried load never appends twice."""
        from google.api_core import exceptions as google
        from google.cloud import bigquery

        schema = [field(bigquery, c, t, ()) for c, t in table.columns.items()]
        config = bigquery.LoadJobConfig(
            source_format=bigquery.SourceFormat.PARQUET, schema=schema,
            write_disposition=bigquery.WriteDisposition.WRITE_APPEND,
            ignore_unknown_values=True,  # a staged file's row ids, which no table has
        )  # fmt: skip
        client = self.api.client()
        base = _job_id(self.project, self.dataset, request)
        for attempt in range(MAX_LOAD_ATTEMPTS):
            job_id = f"{base}_{attempt}"
            with self.api.errors(request.table):
                try:
                    job, ours = (
                        client.get_job(job_id, location=self.location, **self.api.call),
                        False,
                    )
                except google.NotFound:
                    try:
                        with file.open("rb") as data:
                            job = client.load_table_from_file(
                                data, self.api.ref(request.table), job_id=job_id,
                                job_config=config, timeout=self.timeout_seconds,
                            )  # fmt: skip
                    except google.Conflict:  # the same attempt from another process
                        job = client.get_job(job_id, location=self.location, **self.api.call)
                    ours = True
                try:
                    job.result(**self.api.call)
                except google.GoogleAPICallError:
                    if ours or job.state != "DONE" or job.error_result is None:
                        raise
                    continue  # an earlier attempt's job that failed: its id is spent
            return _brought(file, ())  # the job's output_rows: the table's, in the stand-in
        raise TerminalError(
            f"{self.id}.{request.table}: {MAX_LOAD_ATTEMPTS} load jobs of this batch failed",
            table=request.table,
        )

    def _stage(self, stage: str, table: Table, request: LoadRequest, file: Path) -> None:
        """The batch's converted rows as the table ``stage``, in the request's columns
        with the table's types: one load job that makes it, or replaces it whole (a job
        retried after a crash writes the same table)."""
        from google.cloud import bigquery

        schema = [field(bigquery, c, table.columns[c], ()) for c in request.columns]
        config = bigquery.LoadJobConfig(
            source_format=bigquery.SourceFormat.PARQUET, schema=schema,
            write_disposition=bigquery.WriteDisposition.WRITE_TRUNCATE,
            create_disposition=bigquery.CreateDisposition.CREATE_IF_NEEDED,
        )  # fmt: skip
        with self.api.errors(request.table), file.open("rb") as data:
            job = self.api.client().load_table_from_file(
                data, self.api.ref(stage), job_config=config, timeout=self.timeout_seconds
            )
            job.result(**self.api.call)

    def _commit(
        self, request: LoadRequest, stage: str | None, count: int, left_out: tuple[Any, ...]
    ) -> int:
        """One transaction: the stage's rows into the table (by key: ``MERGE``, the newest
        wins; a source's changes applied by key) and the batch's record, ``count`` the
        rows (or keys) it brought; the count recorded (the changes', when applied)."""
        move = ""
        if stage is not None and request.apply_changes:
            statements, count = self._changes(request, stage)
            move = "".join(f"{statement}; " for statement in statements)
        elif stage is not None:
            move = _move(self.dialect.quote, self.api.name(request.table), self.api.name(stage),
                         request) + "; "  # fmt: skip
        reasons = json.dumps([list(r) for r in left_out])
        text = self.dialect.literal
        # Literals, not parameters: a script's statements take none in every server.
        self.api.run(
            f"BEGIN TRANSACTION; {move}INSERT INTO {self.api.name(LOADS_TABLE)} "
            "(batch_id, tbl, rows, rejected, loaded_at) VALUES ("
            f"{text(request.batch_id)}, {text(request.table)}, {count}, {text(reasons)}, "
            "CURRENT_TIMESTAMP()); COMMIT TRANSACTION;",
            request.table,
        )  # fmt: skip
        return count

    def _changes(self, request: LoadRequest, stage: str) -> tuple[list[str], int]:
        """The statements that apply the changes in ``stage`` by key
        (destinations/changes.py), for the load's transaction, and the changes' count:
        its reads of the stage run now, its writes wait for the transaction."""
        writes: list[str] = []

        def run(sql: str) -> list[tuple[Any, ...]]:
            if sql.startswith("SELECT"):
                return [tuple(row) for row in self.api.run(sql, request.table)]
            writes.append(sql)
            return []

        target, staged = self.api.name(request.table), self.api.name(stage)
        count = changes.apply(run, self.dialect.quote, target, staged, list(request.columns),
                              temporary=None)  # fmt: skip
        return writes, count

    # -- days replaced ------------------------------------------------------------------

    def replace_days(self, swap: DaySwap) -> dict[str, int]:
        """Delete the rows of ``swap.days`` from ``swap.tables`` and move the shadows'
        rows in (by key with a primary key), in one transaction recorded under
        ``swap.swap_id``; the shadows dropped after it. The rows moved in per table."""
        self._ensure_ready()
        loads = self.api.name(LOADS_TABLE)
        done = list(self.api.run(f"SELECT tbl, rows FROM {loads} WHERE batch_id = @swap",
                              swap=swap.swap_id))  # fmt: skip
        if done:
            self.drop(sorted(swap.shadows.values()))
            return {str(t): int(n) for t, n in done if t != ALL_SWAPPED}
        described = {t: self._describe(t) for t in {*swap.tables, *swap.shadows.values()}}
        statements: list[str] = []
        q = self.dialect.quote

        def delete(table: str, where: str) -> None:
            statements.append(f"DELETE FROM {self.api.name(table)} WHERE {where}")

        def move(request: LoadRequest, shadow: str) -> int:
            (count,) = next(
                iter(self.api.run(_count(self.api.name(shadow), request), request.table))
            )
            statements.append(
                _move(q, self.api.name(request.table), self.api.name(shadow), request)
            )
            return int(count)

        moved = swap_days(swap, q, described, delete, move, self.id)
        text = self.dialect.literal
        for table, count in [*moved.items(), (ALL_SWAPPED, 0)]:
            statements.append(
                f"INSERT INTO {loads} (batch_id, tbl, rows, loaded_at) VALUES ("
                f"{text(swap.swap_id)}, {text(table)}, {count}, CURRENT_TIMESTAMP())"
            )
        self.api.run("BEGIN TRANSACTION; " + "; ".join(statements) + "; COMMIT TRANSACTION;")
        self.drop(sorted(swap.shadows.values()))
        return moved

    # -- reads --------------------------------------------------------------------------

    def query(
        self, sql: str, *, timeout_seconds: float = QUERY_TIMEOUT_SECONDS
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run one read (parsed with sqlglot's BigQuery dialect) with the dataset as the
        default, as ``query_credentials_file``'s account when configured, stopped after
        ``timeout_seconds``; column names and rows."""
        from google.cloud import bigquery

        check_query(sql, "bigquery")
        config = bigquery.QueryJobConfig(default_dataset=f"{self.project}.{self.dataset}")
        client = self.api.client(self.query_credentials_file)
        try:
            with self.api.errors():
                retry = self.api.call["retry"]
                job = client.query(sql.strip().rstrip(";"), job_config=config,
                                   timeout=timeout_seconds, retry=retry)  # fmt: skip
                try:
                    result = job.result(timeout=timeout_seconds)
                except TimeoutError:
                    job.cancel()
                    raise QueryError(f"the query ran longer than query_timeout_seconds "
                                     f"({timeout_seconds:g})") from None  # fmt: skip
                names = [f.name for f in result.schema]
                return names, [tuple(row.values()) for row in result]
        except (TerminalError, TransientError) as exc:
            raise QueryError(exc.message) from None


def _job_id(project: str, dataset: str, request: LoadRequest) -> str:
    """The id of a batch's load jobs (with ``_<attempt>`` after it): the same for every
    retry of the batch, its own for each table (BigQuery takes letters, digits, ``_``
    and ``-``)."""
    digest = hashlib.sha1(f"{project}.{dataset}.{request.table}\0{request.batch_id}".encode())
    return f"eventpipe_load_{digest.hexdigest()[:32]}"


def _as_staged(request: LoadRequest, types: dict[str, str]) -> bool:
    """Whether an append loads the run's staged files as they are, unconverted (several
    joined into one: a load job takes one upload): their columns ones BigQuery takes
    whole (:func:`fits`; a Parquet load matches columns by name, a column the file lacks
    loads as NULL, the row ids are ignored as unknown values). Integers beyond 64 bits
    are always converted: a Parquet decimal's reading as ``BIGNUMERIC`` is not one
    eventpipe could check against BigQuery."""
    wanted = {c: types[c] for c in request.columns}
    return (
        bool(request.files)
        and not any(t.startswith("DECIMAL") for t in wanted.values())
        and fits(request.files, wanted)
    )


def _brought(file: Path, key: tuple[str, ...]) -> int:
    """The rows of a file, or its distinct keys (counted here, not by a query)."""
    import duckdb
    import pyarrow.parquet as pq

    from eventpipe.schema.dialects import DUCKDB

    if not key:
        return int(pq.ParquetFile(file).metadata.num_rows)
    keys = ", ".join(DUCKDB.quote(c) for c in key)
    what = f"(SELECT DISTINCT {keys} FROM read_parquet($f))" if key else "read_parquet($f)"
    with duckdb.connect() as db:
        row = db.execute(f"SELECT count(*) FROM {what}", {"f": str(file)}).fetchone()
    return int(row[0]) if row else 0


def _count(source: str, request: LoadRequest) -> str:
    """SQL counting what a batch brings: its rows, or its keys."""
    if not request.primary_key:
        return f"SELECT count(*) FROM {source}"
    keys = ", ".join(BIGQUERY.quote(c) for c in request.primary_key)
    return f"SELECT count(*) FROM (SELECT DISTINCT {keys} FROM {source})"


def _move(q: Any, target: str, source: str, request: LoadRequest) -> str:
    """SQL moving ``source``'s rows into ``target``: an insert; with a key, a ``MERGE``
    of each key's newest row that keeps a row already newer."""
    columns = [q(c) for c in request.columns]
    listed = ", ".join(columns)
    if not request.primary_key:
        return f"INSERT INTO {target} ({listed}) SELECT {listed} FROM {source}"
    keys = [q(c) for c in request.primary_key]
    ts = q(TIMESTAMP_COLUMN)
    has_ts = TIMESTAMP_COLUMN in request.columns
    order = f"{ts} DESC NULLS LAST" if has_ts else "1"
    newest = (f"SELECT * FROM {source} WHERE true QUALIFY ROW_NUMBER() OVER "
              f"(PARTITION BY {', '.join(keys)} ORDER BY {order}) = 1")  # fmt: skip
    on = " AND ".join(f"t.{k} = s.{k}" for k in keys)
    newer = f" AND (s.{ts} >= t.{ts} OR t.{ts} IS NULL OR s.{ts} IS NULL)" if has_ts else ""
    update = ", ".join(f"{c} = s.{c}" for c in columns)
    values = ", ".join(f"s.{c}" for c in columns)
    return (
        f"MERGE {target} AS t USING ({newest}) AS s ON {on} "
        f"WHEN MATCHED{newer} THEN UPDATE SET {update} "
        f"WHEN NOT MATCHED THEN INSERT ({listed}) VALUES ({values})"
    )
