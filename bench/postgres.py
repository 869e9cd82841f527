"""PostgreSQL benchmark: eventpipe `process --once` into PostgreSQL next to Spark's own JDBC
writer and a plain COPY of the same rows, in one run, on a throwaway local server.

    scripts/ensure-apt.sh postgresql libpostgresql-jdbc-java    # the server, the JDBC jar
    .venv/bin/python bench/postgres.py --events 1000000

1. The benchmark's events (bench/batch.py: 5 event types, nested, varying types) are
   generated as sealed segments.
2. eventpipe: `process --once` (read, flatten, type, stage, patch, COPY) into schema `ep`,
   one table per event type; the wall time of its table loads is reported too. The implicit
   browser lookups are off: this compares loading, not enrichment.
3. The same rows (exported from `ep` with COPY TO) are then loaded by:
   * Spark's JDBC writer (`/usr/share/java/postgresql.jar`), from Parquet, into `jdbc`;
   * a plain `COPY ... FROM STDIN (FORMAT csv)` of the CSV, one connection, into `copy`.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

JDBC_JAR = Path("/usr/share/java/postgresql.jar")
DRIVER = {"driver": "org.postgresql.Driver"}


class LoadSteps(logging.Handler):
    """The wall time of the job's table loads: its "<dest>: N table(s) on M thread(s):
    S s" step (per-table timings overlap when tables load in parallel)."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds = 0.0

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if " table(s) on " in message and message.endswith(" s"):
            self.seconds += float(message.rsplit(" ", 2)[1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    args = parser.parse_args()
    if not JDBC_JAR.exists():
        sys.exit(f"{JDBC_JAR} is missing: scripts/ensure-apt.sh libpostgresql-jdbc-java")
    logging.basicConfig(level=logging.INFO, format="    %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    steps = LoadSteps()
    logging.getLogger("eventpipe.processing").addHandler(steps)

    import psycopg
    from tests.postgres import postgres_server

    from batch import generate, timed
    from eventpipe.config import parse_config
    from eventpipe.processing.batch.job import process_once
    from eventpipe.processing.runtime.spark import start_session

    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="eventpipe-pg-bench-") as tmp, postgres_server() as dsn:
        work = Path(tmp)
        size = generate(work / "source", args.events)
        print(f"{args.events:,} events, {size / 1e6:.0f} MB of JSON lines", flush=True)
        data = work / "data"
        shutil.copytree(work / "source", data / "incoming")
        config = parse_config(
            {"data_dir": str(data), "enrichment": {"browser_rules": False},
             "spark": {"spark.jars": str(JDBC_JAR)},
             "destinations": {"pg": {"type": "postgres", "dsn": dsn, "schema": "ep",
                                     "table_name_template": "{{ event_type }}"}}},
            source="bench",
        )  # fmt: skip
        spark = start_session(config.spark.settings)
        report = timed("eventpipe process --once -> postgres", results,
                       lambda: process_once(config, spark))  # fmt: skip
        results["eventpipe table loads (wall)"] = steps.seconds
        print(f"  eventpipe table loads (wall): {steps.seconds:.1f} s", flush=True)
        tables = sorted(t for _, t in report.loaded) if report else []
        loaded = sum(report.loaded.values()) if report else 0

        # The same rows, out of PostgreSQL: CSV for COPY, Parquet for Spark's JDBC writer.
        exported = work / "export"
        exported.mkdir()
        with psycopg.connect(dsn, autocommit=True) as db:
            for table in tables:
                with (
                    (exported / f"{table}.csv").open("wb") as out,
                    db.cursor().copy(f'COPY ep."{table}" TO STDOUT (FORMAT csv)') as copy,
                ):
                    for chunk in copy:
                        out.write(chunk)
            for schema in ("jdbc", "copy"):
                db.execute(f'CREATE SCHEMA "{schema}"')
                for table in tables:
                    db.execute(f'CREATE TABLE "{schema}"."{table}" (LIKE ep."{table}")')
        url = "jdbc:" + dsn.replace("postgresql://postgres@", "postgresql://") + "?user=postgres"
        for table in tables:
            spark.read.jdbc(url, f'ep."{table}"', properties=DRIVER).write.parquet(
                str(exported / f"{table}.parquet")
            )

        def jdbc() -> None:
            for table in tables:
                spark.read.parquet(str(exported / f"{table}.parquet")).write.mode("append").jdbc(
                    url, f'jdbc."{table}"', properties={**DRIVER, "batchsize": "10000"}
                )

        def copy() -> None:
            with psycopg.connect(dsn) as db:
                for table in tables:
                    with (
                        (exported / f"{table}.csv").open("rb") as source,
                        db.cursor().copy(f'COPY "copy"."{table}" FROM STDIN (FORMAT csv)') as sink,
                    ):
                        while chunk := source.read(1 << 20):
                            sink.write(chunk)
                db.commit()

        timed("spark jdbc writer (from parquet)", results, jdbc)
        timed("plain COPY (csv, one connection)", results, copy)
        spark.stop()
        with psycopg.connect(dsn) as db:
            counts = {
                schema: db.execute(
                    "SELECT "
                    + " + ".join(f'(SELECT count(*) FROM "{schema}"."{t}")' for t in tables)
                ).fetchone()
                for schema in ("ep", "jdbc", "copy")
            }  # fmt: skip

    ep = results["eventpipe process --once -> postgres"]
    load = results["eventpipe table loads (wall)"]
    jdbc_s = results["spark jdbc writer (from parquet)"]
    copy_s = results["plain COPY (csv, one connection)"]
    print(f"\neventpipe loaded {loaded:,} rows; rows per schema: "
          f"{ {k: v[0] if v else None for k, v in counts.items()} }")  # fmt: skip
    print(f"eventpipe process --once: {args.events / ep:,.0f} events/s end to end")
    print(f"eventpipe table loads / JDBC writer: {load / jdbc_s:.2f}x the time")
    print(f"eventpipe table loads / plain COPY: {load / copy_s:.2f}x the time")
    print(f"eventpipe end to end / JDBC writer: {ep / jdbc_s:.2f}x the time")


if __name__ == "__main__":
    main()
