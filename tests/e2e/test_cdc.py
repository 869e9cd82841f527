"""A PostgreSQL source through the whole pipeline (docs/cdc.md): a workload of inserts,
updates (of the key too), deletes, a truncate and a column added, on tables with a
composite key, without a key and with TOASTed values, read by ``eventpipe read`` while
it is killed with SIGKILL at random moments, processed in several batches. DuckDB and
PostgreSQL end equal to the source's tables; Parquet holds every change in order."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, cast

import duckdb
import orjson
import psycopg
import pyarrow.parquet as pq
import pytest

from eventpipe.archive.read import lines
from eventpipe.config import Config
from eventpipe.destinations.base import Destination
from eventpipe.log import compaction
from eventpipe.processing.batch.job import process_pending
from eventpipe.processing.modes.fill import fill
from eventpipe.processing.runtime.pipeline import Runtime
from eventpipe.sources.postgres import PostgresSource
from eventpipe.sources.postgres.catalog import as_json, table_columns
from tests.conftest import make_config, source_sql
from tests.process import EVENTPIPE, CollectorProcess, _env, free_port, run, write_config

KEYED = ("public.orders", "public.lines", "public.docs")
"""The source's tables with a primary key: applied by key, equal to the source."""
SCHEMA = (
    "CREATE TABLE orders (id int PRIMARY KEY, amount numeric(12,2), tags int[], meta jsonb, "
    "at timestamptz, ref uuid, blob bytea, note text)",
    "CREATE TABLE lines (order_id int, line int, qty bigint, PRIMARY KEY (order_id, line))",
    "CREATE TABLE docs (id int PRIMARY KEY, title text, body text)",  # bodies out of line
    "CREATE TABLE notes (body text)",  # no primary key: append-only
    # Else PostgreSQL logs nothing that names a deleted row, and wal2json skips deletes.
    "ALTER TABLE notes REPLICA IDENTITY FULL",
)
BIG = "(SELECT string_agg(md5(g::text || '{seed}'), '') FROM generate_series(1, 400) g)"
"""12,800 characters that do not compress much: stored out of line (TOASTed)."""


@dataclass
class Workload:
    """Transactions on two connections, committed in random order (so the WAL order of
    changes differs from the commit order); each connection has keys of its own."""

    dsn: str
    rng: random.Random
    connections: list[psycopg.Connection[Any]] = field(default_factory=list)
    ids: list[list[int]] = field(default_factory=lambda: [[], []])
    next_id: list[int] = field(default_factory=lambda: [0, 1])
    statements: int = 0
    column_added: bool = False

    def __enter__(self) -> Workload:
        for _ in range(2):
            db = psycopg.connect(self.dsn)
            db.execute("SET synchronous_commit = on")  # decoding sees flushed WAL only
            self.connections.append(db)
        return self

    def __exit__(self, *exc: object) -> None:
        for db in self.connections:
            db.close()

    def _new_id(self, side: int) -> int:
        self.next_id[side] += 2
        return self.next_id[side]

    def transactions(self, count: int) -> None:
        for _ in range(count):
            order = [0, 1]
            self.rng.shuffle(order)
            for side in order:  # both open: the second to start may commit first
                for _ in range(self.rng.randint(1, 4)):
                    self._statement(side)
            for side in reversed(order) if self.rng.random() < 0.5 else order:
                self.connections[side].commit()

    def _statement(self, side: int) -> None:
        db, ids, rng = self.connections[side], self.ids[side], self.rng
        self.statements += 1
        choice = rng.random()
        if choice < 0.3 or len(ids) < 3:
            n = self._new_id(side)
            ids.append(n)
            db.execute(
                "INSERT INTO orders (id, amount, tags, meta, at, ref, blob, note) VALUES "
                "(%s, %s, ARRAY[%s, NULL], %s, '2026-11-20T10:00:00Z'::timestamptz + "
                "%s * interval '1 minute', gen_random_uuid(), %s, NULL)",
                [n, Decimal(n) / 4, n, json.dumps({"n": n, "x": [1, None]}), n,
                 bytes([n % 256, 0])],
            )  # fmt: skip
            db.execute("INSERT INTO lines VALUES (%s, 1, %s), (%s, 2, NULL)", [n, n, n])
            db.execute(f"INSERT INTO docs VALUES (%s, 't', {BIG.format(seed=n)})", [n])
            db.execute("INSERT INTO notes VALUES (%s)", [f"note {n}"])
        elif choice < 0.55:
            n = rng.choice(ids)
            db.execute("UPDATE orders SET amount = amount + 0.01, tags = tags || 7, "
                       "note = %s WHERE id = %s", [f"n{self.statements}", n])  # fmt: skip
            db.execute("UPDATE docs SET title = %s WHERE id = %s", [f"t{self.statements}", n])
            db.execute("UPDATE lines SET qty = coalesce(qty, 0) + 1 WHERE order_id = %s", [n])
        elif choice < 0.7:  # the key moves
            n = rng.choice(ids)
            moved = self._new_id(side)
            ids[ids.index(n)] = moved
            db.execute("UPDATE orders SET id = %s WHERE id = %s", [moved, n])
            db.execute("UPDATE lines SET order_id = %s WHERE order_id = %s", [moved, n])
            db.execute("UPDATE docs SET id = %s WHERE id = %s", [moved, n])
        elif choice < 0.8:
            n = rng.choice(ids)
            db.execute(f"UPDATE docs SET body = {BIG.format(seed=self.statements)} WHERE id = %s",
                       [n])  # fmt: skip
            db.execute("UPDATE lines SET line = 3 WHERE order_id = %s AND line = 2", [n])
        else:
            n = ids.pop(rng.randrange(len(ids)))
            db.execute("DELETE FROM orders WHERE id = %s", [n])
            db.execute("DELETE FROM lines WHERE order_id = %s AND line = 1", [n])
            db.execute("DELETE FROM docs WHERE id = %s", [n])
            db.execute("DELETE FROM notes WHERE body = %s", [f"note {n}"])
        if self.column_added:
            db.execute("UPDATE orders SET color = %s WHERE id = %s",
                       [f"c{self.statements}", rng.choice(ids)])  # fmt: skip

    def add_column(self) -> None:
        # With a DEFAULT: the rows that exist get it without a change in the WAL; the
        # reader reads them again, so that the destinations end equal.
        source_sql(self.dsn, "ALTER TABLE orders ADD COLUMN color text DEFAULT 'plain'")
        self.column_added = True

    def truncate(self) -> None:
        source_sql(self.dsn, "TRUNCATE lines")


def source_digests(dsn: str) -> dict[str, str]:
    """Each keyed source table's rows, as the reader renders values, digested."""
    found = {}
    with psycopg.connect(dsn) as db:
        for table in KEYED:
            schema, name = table.split(".")
            columns = table_columns(db, table)
            rows = db.execute(
                psycopg.sql.SQL("SELECT {} FROM {}.{}").format(
                    as_json(columns), psycopg.sql.Identifier(schema), psycopg.sql.Identifier(name)
                )
            ).fetchall()
            found[table] = _digest([json.loads(text) for (text,) in rows])
    return found


def _value(value: Any) -> Any:
    if isinstance(value, Decimal):  # PostgreSQL's numeric(38,18) for a JSON number
        return float(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def _digest(rows: list[dict[str, Any]]) -> str:
    canonical = sorted(json.dumps({k: _value(v) for k, v in row.items()}, sort_keys=True)
                       for row in rows)  # fmt: skip
    return hashlib.sha256("\n".join(canonical).encode()).hexdigest() + f" ({len(rows)} rows)"


def destination_digests(
    query: Callable[[str], tuple[list[str], list[tuple[Any, ...]]]],
    source_dsn: str,
    quote: Callable[[str], str] = str,
) -> dict[str, str]:
    """Each keyed table of a destination, its source's columns only, digested
    (``quote``: how the destination's SQL quotes a table's name)."""
    found = {}
    with psycopg.connect(source_dsn) as db:
        wanted = {t: [c for c, _ in table_columns(db, t)] for t in KEYED}
    for table, columns in wanted.items():
        names, rows = query(f"SELECT * FROM {quote(table.replace('.', '_'))}")
        names = [n.lower() for n in names]  # Snowflake names result columns in capitals
        found[table] = _digest([
            {c: row[names.index(c)] for c in columns if c in names} | {
                c: None for c in columns if c not in names}
            for row in rows
        ])  # fmt: skip
        keys = [row[names.index("_key")] for row in rows]
        assert len(keys) == len(set(keys)), f"{table}: a key twice"
    return found


def _queried(config: Config, dest_id: str) -> Callable[[str], tuple[list[str], list[Any]]]:
    """A destination's own read-only query (``eventpipe query``): column names and rows."""
    opened = Runtime(config).open_destination(dest_id)
    return cast(Destination, opened).query


def _rounds(
    config: Config, spark: Any, dsn: str, *, seed: int, rounds: int, transactions: int
) -> int:
    """Rounds of the workload, each read by the source (``--once``) and processed (the
    second adds a column and truncates ``lines``); the events logged."""
    source = PostgresSource(config, "pg")
    logged = 0
    with Workload(dsn, random.Random(seed)) as workload:
        for round_ in range(rounds):
            workload.transactions(transactions)
            if round_ == 1:
                workload.add_column()
                workload.truncate()
            report = source.read(once=True)
            logged += report.changes + sum(report.copied.values())
            process_pending(config, spark)  # archives (and compacts, when due)
    return logged


def _config(
    tmp_path: Path, source: str, dsn: str, schema: str, **options: Any
) -> tuple[Config, Path]:
    raw = {
        "data_dir": str(tmp_path / "data"),
        "sources": {"pg": {"dsn": source, "tables": "^public\\.", "poll_seconds": 0.05,
                           "max_changes": 300, **options}},
        "destinations": {
            "dw": {"type": "duckdb", "path": str(tmp_path / "w.duckdb"), "only_keys": ["pg"],
                   "table_name_template": "{{ _namespace }}"},
            "pg": {"type": "postgres", "dsn": dsn, "schema": schema, "only_keys": ["pg"],
                   "table_name_template": "{{ _namespace }}"},
            "lake": {"type": "parquet", "path": str(tmp_path / "lake"), "only_keys": ["pg"],
                     "table_name_template": "{{ _namespace }}", "partition_by": "none"},
        },
    }  # fmt: skip
    path = tmp_path / "eventpipe.yaml"
    path.write_bytes(orjson.dumps(raw))
    return make_config(tmp_path / "data", **{k: v for k, v in raw.items() if k != "data_dir"}), path


def _slot_released(dsn: str, slot: str = "eventpipe_pg", timeout: float = 30) -> None:
    """Wait until no connection holds the source's replication slot: the backend of a
    reader killed in a query lets it go when it next reads its socket (a restarted
    `eventpipe read` retries meanwhile; a read in the test would fail once)."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as db:
        query = "SELECT active FROM pg_replication_slots WHERE slot_name = %s"
        while db.execute(query, [slot]).fetchone() == (True,):
            assert time.monotonic() < deadline, f"{slot} still held {timeout} s after the kill"
            time.sleep(0.05)


@pytest.mark.slow
def test_destinations_equal_the_source_after_20_kills_of_the_reader(
    tmp_path: Path, spark: Any, source_database: str, postgres_dsn: str, postgres_schema: str
) -> None:
    source_sql(source_database, *SCHEMA)
    config, config_file = _config(tmp_path, source_database, postgres_dsn, postgres_schema)
    rng = random.Random(2026_11_24)
    kills = 0
    with (
        (tmp_path / "reader.log").open("ab") as log_file,
        Workload(source_database, rng) as workload,
    ):
        workload.transactions(20)  # rows for the copy
        for round_ in range(20):
            reader = subprocess.Popen([*EVENTPIPE, "read", "pg", "-c", str(config_file)],
                                      stdout=log_file, stderr=log_file, env=_env())  # fmt: skip
            deadline = time.monotonic() + rng.uniform(0.2, 0.8)
            while time.monotonic() < deadline:
                workload.transactions(1)
            if round_ == 8:
                workload.add_column()
            if round_ == 12:
                workload.truncate()
            os.kill(reader.pid, signal.SIGKILL)
            reader.wait()
            kills += 1
            if round_ % 7 == 6:  # batches in between: replays cross their boundaries
                process_pending(config, spark)
        # The copy done, whatever the kills left of it (on a busy machine a reader may
        # be killed in its copy every time): then changes that come after it, whatever
        # the timing, on every table.
        _slot_released(source_database)
        PostgresSource(config, "pg").read(once=True)
        workload.transactions(30)
    PostgresSource(config, "pg").read(once=True)  # what is left
    process_pending(config, spark)

    expected = source_digests(source_database)
    for dest_id in ("dw", "pg"):
        assert destination_digests(_queried(config, dest_id), source_database) == expected
    _, notes = _queried(config, "dw")("SELECT _op, count(*) FROM public_notes GROUP BY 1")
    # Without a key, every change is a row: the inserts and deletes of notes are there.
    assert {op for op, _ in notes} >= {"read", "insert", "delete"}
    # Parquet holds every change, in order, once per position (a change logged twice by a
    # killed reader is one event id, and twice in the lake).
    lake = pq.read_table(tmp_path / "lake" / "public_lines").to_pylist()
    ops = {row["_op"] for row in lake}
    assert ops >= {"read", "insert", "update", "delete", "truncate"}
    positions = {(row["_lsn"], row["_seq"]) for row in lake}
    with duckdb.connect(str(tmp_path / "w.duckdb"), read_only=True) as db:
        applied = db.execute("SELECT _lsn, _seq FROM public_lines").fetchall()
    assert set(applied) <= positions  # the lake has the change each row came from
    assert workload.statements > 200
    print(f"{workload.statements} statements, {kills} kills, source rows: {expected}")


def test_a_destination_added_later_is_filled_from_the_compacted_log(
    tmp_path: Path, spark: Any, source_database: str, postgres_dsn: str, postgres_schema: str
) -> None:
    """The pipeline compacts the source's archived segments as soon as they pass
    ``compaction_bytes`` (1 byte here: every run), while the workload goes on; a
    destination added at the end and filled from the archive equals the source."""
    source_sql(source_database, *SCHEMA)
    config, config_file = _config(tmp_path, source_database, postgres_dsn, postgres_schema,
                                  compaction_bytes=1)  # fmt: skip
    source = PostgresSource(config, "pg")
    logged = _rounds(config, spark, source_database, seed=7, rounds=3, transactions=60)
    segments = compaction.source_segments(config, "pg")
    assert [compaction.is_compacted(s) for s in segments] == [True]  # one, all of it
    shown = run("log", "segments", "-c", str(config_file))
    assert shown.returncode == 0, shown.stderr
    assert "compacted" in shown.stdout
    kept = sum(1 for _ in lines(segments[0]))
    assert kept < logged / 2, (kept, logged)  # the older versions of keys are gone
    # What no destination has handled yet is never compacted: a segment in incoming/.
    source_sql(source_database, "UPDATE docs SET title = 'waiting'")
    source.read(once=True)
    waiting = {p: p.read_bytes() for p in config.layout.sealed_segments()}
    assert waiting
    compacted = run("log", "compact", "-c", str(config_file))
    assert compacted.returncode == 0, compacted.stderr
    assert "pg: nothing to compact" in compacted.stdout  # only the compacted one archived
    assert {p: p.read_bytes() for p in config.layout.sealed_segments()} == waiting
    process_pending(config, spark)  # now handled, archived and compacted (compaction_bytes)
    assert [compaction.is_compacted(s) for s in compaction.source_segments(config, "pg")] == [True]
    # A destination added now, filled from the compacted archive.
    late = make_config(config.layout.root, sources=config.model_dump()["sources"], destinations={
        "late": {"type": "duckdb", "path": str(tmp_path / "late.duckdb"), "only_keys": ["pg"],
                 "table_name_template": "{{ _namespace }}"}})  # fmt: skip
    [report] = fill(spark, late, "late")
    assert report.loaded
    expected = source_digests(source_database)
    assert destination_digests(_queried(late, "late"), source_database) == expected
    assert fill(spark, late, "late") == []  # filled: nothing again
    # A destination there all along, filled again: the compacted state is the current
    # one, so it stays equal to the source.
    assert fill(spark, config, "dw")
    assert destination_digests(_queried(config, "dw"), source_database) == expected


@pytest.mark.slow
def test_eventpipe_run_reads_its_sources_into_a_stream_destination(
    tmp_path: Path, source_database: str, postgres_dsn: str, postgres_schema: str
) -> None:
    """`eventpipe run` supervises a reader per source beside the collector and the
    pipeline: a change in the source reaches a stream destination while it runs."""
    source_sql(source_database, "CREATE TABLE items (id int PRIMARY KEY, name text)",
               "INSERT INTO items VALUES (1, 'one'), (2, 'two')")  # fmt: skip
    port = free_port()
    config = write_config(
        tmp_path / "eventpipe.yaml", tmp_path / "data", port,
        sources={"shop": {"dsn": source_database, "tables": "^public\\.items$",
                          "poll_seconds": 0.1}},
        destinations={"live": {"type": "postgres", "dsn": postgres_dsn, "schema": postgres_schema,
                               "mode": "stream", "only_keys": ["shop"],
                               "table_name_template": "{{ _namespace }}"}},
        spark={"master": "local[2]", "spark.sql.shuffle.partitions": 2},
    )  # fmt: skip
    proc = CollectorProcess(config, port, tmp_path / "run.log", command="run")

    def rows() -> list[tuple[Any, ...]] | None:
        with psycopg.connect(postgres_dsn) as db:
            try:
                found = db.execute(
                    f'SELECT id, name FROM "{postgres_schema}".public_items ORDER BY id'
                ).fetchall()
            except psycopg.errors.UndefinedTable:
                return None
            return [tuple(row) for row in found]

    def until(wanted: list[tuple[Any, ...]]) -> None:
        deadline = time.monotonic() + 120
        while rows() != wanted:
            assert time.monotonic() < deadline, proc.log_path.read_text()[-3000:]
            time.sleep(0.2)

    try:
        proc.wait_ready()
        until([(1, "one"), (2, "two")])  # the copy
        source_sql(source_database, "UPDATE items SET name = 'ONE' WHERE id = 1",
                   "DELETE FROM items WHERE id = 2",
                   "INSERT INTO items VALUES (3, 'three')")  # fmt: skip
        until([(1, "ONE"), (3, "three")])  # the changes, applied as they come
        proc.signal(signal.SIGTERM)
        assert proc.wait(90) == 0
    finally:
        proc.kill()
    log = proc.log_path.read_text()
    assert "source shop started" in log
    assert "pipeline started" in log


def test_iceberg_and_delta_keep_the_current_table_or_the_history(
    tmp_path: Path, spark: Any, source_database: str
) -> None:
    """``changes: apply`` (the default) keeps an Iceberg or Delta table equal to the
    source's (a copy-on-write of the table per batch); ``changes: append`` keeps every
    change as a row."""
    source_sql(source_database, *SCHEMA)
    template = {"only_keys": ["pg"], "table_name_template": "{{ _namespace }}"}
    config = make_config(tmp_path / "data", sources={"pg": {"dsn": source_database}},
                         destinations={
        "ice": {"type": "iceberg", "partition_by": "none", **template},
        "delta": {"type": "delta", **template},
        "history": {"type": "iceberg", "changes": "append", **template},
    })  # fmt: skip
    _rounds(config, spark, source_database, seed=11, rounds=2, transactions=25)
    expected = source_digests(source_database)
    for dest_id in ("ice", "delta"):
        assert destination_digests(_queried(config, dest_id), source_database) == expected, dest_id
    _, ops = _queried(config, "history")("SELECT _op, count(*) FROM public_lines GROUP BY 1")
    assert {op for op, _ in ops} >= {"read", "insert", "update", "delete", "truncate"}


def test_clickhouse_keeps_the_source_tables(
    tmp_path: Path,
    spark: Any,
    source_database: str,
    clickhouse_database: str,
    clickhouse_server: Any,
) -> None:
    """``changes: apply`` on ClickHouse (Debian's 18.16; the same statements run on
    today's engine in tests/integration/destinations/test_clickhouse.py): each batch
    rebuilds the table (no partitions) and swaps it in (destinations/clickhouse/changes.py);
    the tables equal the source's."""
    server = clickhouse_server
    source_sql(source_database, *SCHEMA)
    ch = {"type": "clickhouse", "url": server.url, "password": server.password,
          "database": clickhouse_database, "only_keys": ["pg"],
          "table_name_template": "{{ _namespace }}"}  # fmt: skip
    config = make_config(tmp_path / "data", sources={"pg": {"dsn": source_database}},
                         destinations={"ch": ch})  # fmt: skip
    _rounds(config, spark, source_database, seed=12, rounds=2, transactions=25)
    assert destination_digests(_queried(config, "ch"), source_database) == source_digests(
        source_database
    )


@pytest.mark.parametrize("kind", ["snowflake", "redshift", "bigquery"])
def test_the_cloud_warehouses_keep_the_source_tables(
    request: pytest.FixtureRequest, tmp_path: Path, spark: Any, source_database: str, kind: str
) -> None:
    """``changes: apply`` on Snowflake, Redshift and BigQuery (their stand-ins: fakesnow's
    server, PostgreSQL behind the Redshift front, bqemulator): each batch's changes
    applied by key in the load's transaction; the tables equal the source's."""
    from eventpipe.schema.dialects import DIALECTS

    source_sql(source_database, *SCHEMA)
    if kind == "snowflake":
        settings = request.getfixturevalue("snowflake_server").settings(
            request.getfixturevalue("snowflake_schema"))  # fmt: skip
    elif kind == "redshift":
        server = request.getfixturevalue("redshift_server")
        settings = server.settings(request.getfixturevalue("s3_bucket"))
    else:
        server = request.getfixturevalue("bigquery_server")
        settings = server.settings(request.getfixturevalue("bigquery_dataset"))
    wh = {**settings, "only_keys": ["pg"], "table_name_template": "{{ _namespace }}"}
    config = make_config(tmp_path / "data", sources={"pg": {"dsn": source_database}},
                         destinations={"wh": wh})  # fmt: skip
    _rounds(config, spark, source_database, seed=13, rounds=2, transactions=25)
    quote = DIALECTS[kind].quote
    assert destination_digests(_queried(config, "wh"), source_database, quote) == (
        source_digests(source_database)
    )
