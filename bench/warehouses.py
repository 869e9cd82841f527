"""Cloud warehouse benchmark: eventpipe `process --once` into each warehouse eventpipe loads
that cannot run here, against the stand-in the tests run, beside the warehouse's own bulk
command on the same server and the same rows, in one run. Today: Snowflake (fakesnow's
server, tests/snowflake.py; its COPY INTO is DuckDB reading the Parquet file).

    .venv/bin/python bench/warehouses.py --events 1000000

1. The benchmark's events (bench/batch.py: 5 event types) are generated as sealed
   segments, twice; a warm-up run starts the JVM and the Python workers.
2. eventpipe `process --once` into DuckDB (the default destination), then into Snowflake
   (schema `EP`), a table per event type; the wall time of the table loads is reported.
3. The floor: each table's rows, written by DuckDB from step 2 to a Parquet file (as the
   run stages them), `PUT` to a stage and `COPY INTO` a table made like eventpipe's
   (`MATCH_BY_COLUMN_NAME`) through the connector, one table after the other: the
   warehouse's own bulk path, no conversion, no transaction, no record.
4. eventpipe's loads alone, in the floor's conditions: the same Parquet files through
   the destination's `load` (DuckDB's conversion, PUT, COPY into a stage, one
   transaction with the record), into tables made like eventpipe's.

Against the stand-in the ratio says what eventpipe's own work costs beside the bulk
command, not how fast Snowflake is.
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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="    %(name)s: %(message)s")
    for noisy in ("py4j", "httpx", "snowflake", "botocore", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from postgres import LoadSteps

    steps = LoadSteps()
    logging.getLogger("eventpipe.processing").addHandler(steps)

    from tests.snowflake import SnowflakeServer

    from batch import destination_config, exported_tables, generate, timed
    from eventpipe.config import parse_config
    from eventpipe.destinations.base import LoadRequest
    from eventpipe.destinations.snowflake import SnowflakeDestination
    from eventpipe.locks import FileLocks
    from eventpipe.processing.batch.job import process_once
    from eventpipe.processing.runtime.spark import start_session
    from eventpipe.schema.diff import diff

    results: dict[str, float] = {}
    server = SnowflakeServer()
    server.start()
    try:
        with tempfile.TemporaryDirectory(prefix="eventpipe-wh-bench-") as tmp:
            work = Path(tmp)
            size = generate(work / "source", args.events)
            print(f"{args.events:,} events, {size / 1e6:.0f} MB of JSON lines", flush=True)

            duck = destination_config(work, "duck", {"type": "duckdb"})
            sf = destination_config(work, "sf", server.settings("EP"))
            spark = start_session(duck.spark.settings)
            generate(work / "warm" / "incoming", 10_000)
            process_once(parse_config({"data_dir": str(work / "warm")}, source="bench"), spark)
            timed("eventpipe process --once -> duckdb", results, lambda: process_once(duck, spark))
            steps.seconds = 0.0
            report = timed("eventpipe process --once -> snowflake", results,
                           lambda: process_once(sf, spark))  # fmt: skip
            results["eventpipe table loads (wall)"] = steps.seconds
            print(f"  eventpipe table loads (wall): {steps.seconds:.1f} s", flush=True)
            spark.stop()
            tables = sorted(t for _, t in report.loaded) if report else []

            def opened(schema: str) -> SnowflakeDestination:
                settings = server.settings(schema)
                del settings["type"]
                return SnowflakeDestination(schema, FileLocks(work / "locks"), **settings)

            made = [opened("EP").describe(table) for table in tables]
            files = exported_tables(
                work / "duck" / "warehouse.duckdb",
                [t for t in made if t is not None],
                work / "exported",
            )
            floor, alone = opened("FLOOR"), opened("ALONE")
            for table in made:
                assert table is not None
                floor.patch(diff(None, table))
                alone.patch(diff(None, table))

            def bulk() -> None:
                _copy_into(server, files)

            def eventpipe_alone() -> None:
                for table, path in files:
                    alone.load(LoadRequest(table.name, "alone", (path,), table.columns))

            timed("PUT + COPY INTO (the floor)", results, bulk)
            timed("eventpipe's destination loads alone", results, eventpipe_alone)
            total = "SELECT " + " + ".join(f'(SELECT count(*) FROM "{t}")' for t in tables)
            counts = {s: opened(s).query(total)[1][0][0] for s in ("EP", "FLOOR", "ALONE")}
    finally:
        server.remove()

    ep = results["eventpipe process --once -> snowflake"]
    floor_s = results["PUT + COPY INTO (the floor)"]
    alone_s = results["eventpipe's destination loads alone"]
    duck_s = results["eventpipe process --once -> duckdb"]
    print(f"\nrows per schema: {counts}")
    print(f"eventpipe process --once -> snowflake: {args.events / ep:,.0f} events/s end to end")
    print(f"eventpipe's loads alone / PUT + COPY INTO: {alone_s / floor_s:.2f}x the time")
    print(f"eventpipe table loads in the run / PUT + COPY INTO: "
          f"{results['eventpipe table loads (wall)'] / floor_s:.2f}x the time")  # fmt: skip
    print(f"eventpipe -> snowflake / eventpipe -> duckdb: {ep / duck_s:.2f}x the time")


def _copy_into(server: Any, files: list[tuple[Any, Path]]) -> None:
    """The floor: each file PUT to a stage and copied into its table in FLOOR."""
    import snowflake.connector
    from tests.snowflake import DATABASE

    with snowflake.connector.connect(
        user=server.user, password=server.password, account=server.account, host="127.0.0.1",
        port=server.port, protocol="http", database=DATABASE, schema="FLOOR",
    ) as connection:  # fmt: skip
        cursor = connection.cursor()
        cursor.execute("CREATE STAGE IF NOT EXISTS floor_stage")
        for table, path in files:
            started = time.perf_counter()
            cursor.execute(f"PUT 'file://{path}' @floor_stage/{table.name} AUTO_COMPRESS = FALSE")
            cursor.execute(
                f'COPY INTO "{table.name}" FROM @floor_stage/{table.name} '
                "FILE_FORMAT = (TYPE = PARQUET) MATCH_BY_COLUMN_NAME = CASE_INSENSITIVE"
            )
            print(f"    floor {table.name}: {time.perf_counter() - started:.2f} s", flush=True)


if __name__ == "__main__":
    main()
