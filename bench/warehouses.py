"""Cloud warehouse benchmark: eventpipe `process --once` into each warehouse eventpipe loads
that cannot run here, against the stand-in the tests run, beside the warehouse's own bulk
command on the same server and the same rows, in one run per warehouse: Snowflake
(fakesnow's server, tests/snowflake.py; its COPY INTO is DuckDB reading the Parquet file),
BigQuery (bqemulator, tests/bigquery.py; its load job is DuckDB reading it too) and
Redshift (PostgreSQL behind the front of tests/redshift.py; its COPY reads the file from
moto's S3 and copies it into PostgreSQL).

    .venv/bin/python bench/warehouses.py --events 1000000 [--warehouse snowflake|bigquery|redshift]

1. The benchmark's events (bench/batch.py: 5 event types) are generated as sealed
   segments, twice; a warm-up run starts the JVM and the Python workers.
2. eventpipe `process --once` into DuckDB (the default destination), then into the
   warehouse (schema or dataset `ep`), a table per event type; the wall time of the table
   loads is reported.
3. The floor: each table's rows, written by DuckDB from step 2 to a Parquet file (as the
   run stages them), loaded by the warehouse's own bulk path into a table made like
   eventpipe's, one table after the other, through its own client: Snowflake `PUT` and
   `COPY INTO` (`MATCH_BY_COLUMN_NAME`), BigQuery a load job (`WRITE_APPEND`), Redshift
   an upload to S3 and `COPY ... FORMAT AS PARQUET` (of the file already in Redshift's
   types, made before the clock starts). No conversion, no transaction, no record.
4. eventpipe's loads alone, in the floor's conditions: the same rows as the run stages
   them (its row ids beside the columns, timestamps as instants) through the
   destination's `load` (a conversion where the file does not fit, the bulk path, the
   record), into tables made like eventpipe's.

Against a stand-in the ratio says what eventpipe's own work costs beside the bulk
command, not how fast the warehouse is.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


class Snowflake:
    """fakesnow's server; the floor: PUT and COPY INTO."""

    floor = "PUT + COPY INTO (the floor)"

    def __init__(self) -> None:
        from tests.snowflake import SnowflakeServer

        self.server = SnowflakeServer()

    def settings(self, schema: str) -> dict[str, Any]:
        return dict(self.server.settings(schema.upper()))

    def opened(self, schema: str, locks: Path) -> Any:
        from eventpipe.destinations.snowflake import SnowflakeDestination
        from eventpipe.locks import FileLocks

        settings = self.settings(schema)
        del settings["type"]
        return SnowflakeDestination(schema, FileLocks(locks), **settings)

    def bulk(self, files: list[tuple[Any, Path]]) -> None:
        import snowflake.connector
        from tests.snowflake import DATABASE

        server = self.server
        with snowflake.connector.connect(
            user=server.user, password=server.password, account=server.account,
            host="127.0.0.1", port=server.port, protocol="http", database=DATABASE,
            schema="FLOOR",
        ) as connection:  # fmt: skip
            cursor = connection.cursor()
            cursor.execute("CREATE STAGE IF NOT EXISTS floor_stage")
            for table, path in files:
                started = time.perf_counter()
                cursor.execute(f"PUT 'file://{path}' @floor_stage/{table.name} "
                               "AUTO_COMPRESS = FALSE")  # fmt: skip
                cursor.execute(
                    f'COPY INTO "{table.name}" FROM @floor_stage/{table.name} '
                    "FILE_FORMAT = (TYPE = PARQUET) MATCH_BY_COLUMN_NAME = CASE_INSENSITIVE"
                )
                print(f"    floor {table.name}: {time.perf_counter() - started:.2f} s",
                      flush=True)  # fmt: skip


class BigQuery:
    """bqemulator; the floor: a load job per file."""

    floor = "a load job per table (the floor)"

    def __init__(self) -> None:
        from tests.bigquery import BigQueryServer

        self.server = BigQueryServer()

    def settings(self, schema: str) -> dict[str, Any]:
        return dict(self.server.settings(schema.lower()))

    def opened(self, schema: str, locks: Path) -> Any:
        from eventpipe.destinations.bigquery import BigQueryDestination
        from eventpipe.locks import FileLocks

        settings = self.settings(schema)
        del settings["type"]
        return BigQueryDestination(schema, FileLocks(locks), **settings)

    def bulk(self, files: list[tuple[Any, Path]]) -> None:
        from google.cloud import bigquery

        client = self.opened("floor", Path(tempfile.gettempdir())).api.client()
        config = bigquery.LoadJobConfig(source_format="PARQUET", write_disposition="WRITE_APPEND")
        for table, path in files:
            started = time.perf_counter()
            with path.open("rb") as data:
                job = client.load_table_from_file(
                    data, f"{self.server.settings('floor')['project']}.floor.{table.name}",
                    job_config=config,
                )  # fmt: skip
            job.result()
            print(f"    floor {table.name}: {time.perf_counter() - started:.2f} s", flush=True)


class RedshiftStack:
    """The Redshift stand-in and what it stands on: a PostgreSQL server, moto's S3 server
    and the front (tests/redshift.py)."""

    def __init__(self) -> None:
        from tests.postgres import PostgresServer
        from tests.s3 import S3Server

        self.postgres = PostgresServer()
        self.s3 = S3Server()
        self.front: Any = None
        self.bucket = ""

    def start(self) -> None:
        from tests.redshift import RedshiftServer

        self.postgres.start()
        self.s3.start()
        self.bucket = self.s3.bucket()
        self.front = RedshiftServer(self.postgres.dsn, self.s3)
        self.front.start()

    def remove(self) -> None:
        if self.front is not None:
            self.front.remove()
        self.s3.remove()
        self.postgres.remove()


class Redshift:
    """PostgreSQL behind the front; the floor: each file uploaded to S3 and COPY."""

    floor = "an upload and COPY per table (the floor)"

    def __init__(self) -> None:
        self.server = RedshiftStack()

    def settings(self, schema: str) -> dict[str, Any]:
        return dict(self.server.front.settings(self.server.bucket, schema))

    def opened(self, schema: str, locks: Path) -> Any:
        from eventpipe.destinations.redshift import RedshiftDestination
        from eventpipe.locks import FileLocks
        from eventpipe.objectstore import Location, S3Settings

        settings = self.settings(schema)
        del settings["type"]
        staging = Location.of(settings.pop("staging"), S3Settings(**settings.pop("s3")))
        return RedshiftDestination(schema, FileLocks(locks), staging=staging, **settings)

    def bulk(self, files: list[tuple[Any, Path]]) -> None:
        """Each file first made the table's row in Redshift's types (as a user's own
        COPY needs them; not timed), then uploaded and copied."""
        import psycopg
        import pyarrow as pa
        import pyarrow.parquet as pq
        from tests.redshift import IAM_ROLE

        from eventpipe.schema.types import DataType

        typed = []
        for table, path in files:
            data = pq.read_table(path)
            fields = [pa.field(f.name, pa.decimal128(38, 18))
                      if table.columns[f.name] is DataType.FLOAT64 else f
                      for f in data.schema]  # fmt: skip
            out = path.with_suffix(".redshift.parquet")
            pq.write_table(data.cast(pa.schema(fields)), out)
            typed.append((table, out))
        client = self.server.s3.client()
        with psycopg.connect(self.server.front.dsn, autocommit=True) as db:
            for table, path in typed:
                started = time.perf_counter()
                key = f"floor/{table.name}/part-0.parquet"
                client.upload_file(str(path), self.server.bucket, key)
                db.execute(f'COPY "floor"."{table.name}" FROM '
                           f"'s3://{self.server.bucket}/floor/{table.name}/' "
                           f"IAM_ROLE '{IAM_ROLE}' FORMAT AS PARQUET")  # fmt: skip
                print(f"    floor {table.name}: {time.perf_counter() - started:.2f} s",
                      flush=True)  # fmt: skip


WAREHOUSES = {"snowflake": Snowflake, "bigquery": BigQuery, "redshift": Redshift}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--warehouse", choices=[*WAREHOUSES, "all"], default="all")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="    %(name)s: %(message)s")
    for noisy in ("py4j", "httpx", "snowflake", "botocore", "urllib3", "google"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    kinds = list(WAREHOUSES) if args.warehouse == "all" else [args.warehouse]
    for kind in kinds:
        print(f"\n== {kind}", flush=True)
        measure(kind, WAREHOUSES[kind](), args.events)


def measure(kind: str, warehouse: Any, events: int) -> None:
    from postgres import LoadSteps

    steps = LoadSteps()
    logging.getLogger("eventpipe.processing").addHandler(steps)

    from batch import destination_config, exported_tables, generate, timed
    from eventpipe.config import parse_config
    from eventpipe.destinations.base import LoadRequest
    from eventpipe.processing.batch.job import process_once
    from eventpipe.processing.runtime.spark import start_session
    from eventpipe.schema.diff import diff

    results: dict[str, float] = {}
    warehouse.server.start()
    try:
        with tempfile.TemporaryDirectory(prefix="eventpipe-wh-bench-") as tmp:
            work = Path(tmp)
            size = generate(work / "source", events)
            print(f"{events:,} events, {size / 1e6:.0f} MB of JSON lines", flush=True)

            duck = destination_config(work, "duck", {"type": "duckdb"})
            into = destination_config(work, "wh", warehouse.settings("ep"))
            spark = start_session(duck.spark.settings)
            generate(work / "warm" / "incoming", 10_000)
            process_once(parse_config({"data_dir": str(work / "warm")}, source="bench"), spark)
            timed("eventpipe process --once -> duckdb", results, lambda: process_once(duck, spark))
            steps.seconds = 0.0
            report = timed(f"eventpipe process --once -> {kind}", results,
                           lambda: process_once(into, spark))  # fmt: skip
            results["eventpipe table loads (wall)"] = steps.seconds
            print(f"  eventpipe table loads (wall): {steps.seconds:.1f} s", flush=True)
            spark.stop()
            tables = sorted(t for _, t in report.loaded) if report else []
            made = [warehouse.opened("ep", work / "locks").describe(t) for t in tables]
            files = exported_tables(
                work / "duck" / "warehouse.duckdb",
                [t for t in made if t is not None],
                work / "exported",
            )
            staged = exported_tables(work / "duck" / "warehouse.duckdb",
                                     [t for t in made if t is not None], work / "staged",
                                     staged=True)  # fmt: skip
            floor = warehouse.opened("floor", work / "locks")
            alone = warehouse.opened("alone", work / "locks")
            for table in made:
                assert table is not None
                floor.patch(diff(None, table))
                alone.patch(diff(None, table))

            def eventpipe_alone() -> None:
                for table, path in staged:
                    alone.load(LoadRequest(table.name, "alone", (path,), table.columns))

            timed(warehouse.floor, results, lambda: warehouse.bulk(files))
            timed("eventpipe's destination loads alone", results, eventpipe_alone)
            counts = {}
            for schema in ("ep", "floor", "alone"):
                opened = warehouse.opened(schema, work / "locks")
                q = opened.dialect.quote
                total = "SELECT " + " + ".join(f"(SELECT count(*) FROM {q(t)})" for t in tables)
                counts[schema] = opened.query(total)[1][0][0]
    finally:
        warehouse.server.remove()

    ep = results[f"eventpipe process --once -> {kind}"]
    floor_s = results[warehouse.floor]
    alone_s = results["eventpipe's destination loads alone"]
    duck_s = results["eventpipe process --once -> duckdb"]
    print(f"\nrows per schema: {counts}")
    print(f"eventpipe process --once -> {kind}: {events / ep:,.0f} events/s end to end")
    print(f"eventpipe's loads alone / {warehouse.floor}: {alone_s / floor_s:.2f}x the time")
    print(f"eventpipe table loads in the run / {warehouse.floor}: "
          f"{results['eventpipe table loads (wall)'] / floor_s:.2f}x the time")  # fmt: skip
    print(f"eventpipe -> {kind} / eventpipe -> duckdb: {ep / duck_s:.2f}x the time")


if __name__ == "__main__":
    main()
