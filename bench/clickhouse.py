"""ClickHouse benchmark: eventpipe `process --once` into ClickHouse, beside ClickHouse's own
bulk insert of the same rows and the same run into DuckDB, in one run, on a throwaway
local server (Debian's, tests/clickhouse.py).

    scripts/ensure-apt.sh clickhouse-server clickhouse-client
    .venv/bin/python bench/clickhouse.py --events 1000000

1. The benchmark's events (bench/batch.py: 5 event types, nested, varying types) are
   generated as sealed segments, twice.
2. eventpipe: after a warm-up run (JVM and Python workers), `process --once` (read,
   flatten, type, stage, patch, load) into database `ep`, a table per event type; the
   wall time of its table loads is reported too. The implicit browser lookups are off:
   this compares loading, not enrichment.
3. The floor: the rows eventpipe loaded, exported from `ep` in Native format to files,
   inserted by `clickhouse-client` (its native TCP protocol) into tables made like
   them, one table after the other: ClickHouse's own bulk path, with no conversion.
4. The same `process --once` into DuckDB (the default destination).
5. eventpipe's load alone, in the floor's conditions: the rows of each table, written by
   DuckDB from step 4 to a Parquet file (as the run stages them), loaded by the
   ClickHouse destination (`load`: stage, attach, records) into tables made like
   eventpipe's, one table after the other, with nothing else running. Step 2's figure
   shares the two cores with the run's other work (the archive's compression, a second
   table's load); this one compares like with like.
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

CLIENT = Path("/usr/bin/clickhouse-client")


class DestinationLoads(logging.Handler):
    """The time of the destination's own loads: the job's "<dest>.<table>: load: S s"
    steps (the table step also holds patching and the job's bookkeeping)."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix
        self.seconds = 0.0

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith(self.prefix) and ": load: " in message and message.endswith(" s"):
            self.seconds += float(message.rsplit(" ", 2)[1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    args = parser.parse_args()
    if not CLIENT.exists():
        sys.exit(f"{CLIENT} is missing: scripts/ensure-apt.sh clickhouse-client")
    logging.basicConfig(level=logging.INFO, format="    %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from postgres import LoadSteps

    steps, loads = LoadSteps(), DestinationLoads("ch.")
    logging.getLogger("eventpipe.processing").addHandler(steps)
    logging.getLogger("eventpipe.processing").addHandler(loads)

    from tests.clickhouse import ClickHouseServer

    from batch import destination_config, exported_tables, generate, timed
    from eventpipe.config import parse_config
    from eventpipe.destinations.base import LoadRequest
    from eventpipe.destinations.clickhouse import ClickHouseDestination
    from eventpipe.destinations.clickhouse.client import ClickHouseClient
    from eventpipe.locks import FileLocks
    from eventpipe.processing.batch.job import process_once
    from eventpipe.processing.runtime.spark import start_session
    from eventpipe.schema.diff import diff

    results: dict[str, float] = {}
    server = ClickHouseServer()
    server.start()
    try:
        with tempfile.TemporaryDirectory(prefix="eventpipe-ch-bench-") as tmp:
            work = Path(tmp)
            size = generate(work / "source", args.events)
            print(f"{args.events:,} events, {size / 1e6:.0f} MB of JSON lines", flush=True)

            ch = destination_config(work, "ch", {
                "type": "clickhouse", "url": server.url, "database": "ep",
                "password": server.password,
            })  # fmt: skip
            duck = destination_config(work, "duck", {"type": "duckdb"})
            spark = start_session(ch.spark.settings)  # type: ignore[attr-defined]
            # A first run warms the JVM and the Python workers for both timed runs.
            generate(work / "warm" / "incoming", 10_000)
            process_once(parse_config({"data_dir": str(work / "warm")}, source="bench"), spark)
            steps.seconds = loads.seconds = 0.0
            report = timed("eventpipe process --once -> clickhouse", results,
                           lambda: process_once(ch, spark))  # fmt: skip
            results["eventpipe table loads (wall)"] = steps.seconds
            results["destination.load calls"] = loads.seconds
            print(f"  eventpipe table loads (wall): {steps.seconds:.1f} s; of it the "
                  f"destination's loads {loads.seconds:.1f} s", flush=True)  # fmt: skip
            tables = sorted(t for _, t in report.loaded) if report else []
            loaded = sum(report.loaded.values()) if report else 0

            exported = work / "export"
            exported.mkdir()
            with ClickHouseClient(server.url, password=server.password) as client:
                client.execute("CREATE DATABASE floor")
                for table in tables:
                    (exported / f"{table}.native").write_bytes(
                        client.execute(f"SELECT * FROM ep.`{table}` FORMAT Native")
                    )
                    client.execute(f"CREATE TABLE floor.`{table}` AS ep.`{table}`")

            def floor() -> None:
                for table in tables:
                    with (exported / f"{table}.native").open("rb") as rows:
                        subprocess.run(
                            [str(CLIENT), "--host", "127.0.0.1", "--port", str(server.tcp_port),
                             "--password", server.password,
                             "--query", f"INSERT INTO floor.`{table}` FORMAT Native"],
                            stdin=rows, check=True,
                        )  # fmt: skip

            timed("clickhouse-client INSERT ... FORMAT Native", results, floor)
            timed("eventpipe process --once -> duckdb", results,
                  lambda: process_once(duck, spark))  # fmt: skip
            spark.stop()

            def opened(database: str) -> ClickHouseDestination:
                locks = FileLocks(work / "locks")
                return ClickHouseDestination(database, server.url, locks, database=database,
                                             password=server.password)  # fmt: skip

            made = [opened("ep").describe(table) for table in tables]
            destination = opened("alone")
            for table in made:
                assert table is not None
                destination.patch(diff(None, table))
            alone = exported_tables(
                work / "duck" / "warehouse.duckdb",
                [t for t in made if t is not None],
                work / "alone",
            )

            def eventpipe_alone() -> None:
                for table, path in alone:
                    destination.load(LoadRequest(table.name, "alone", (path,), table.columns))

            timed("eventpipe's destination loads alone", results, eventpipe_alone)
            with ClickHouseClient(server.url, password=server.password) as client:
                counts = {
                    database: client.query(
                        "SELECT sum(rows) FROM system.parts "
                        f"WHERE database = '{database}' AND active "
                        "AND NOT startsWith(table, '_eventpipe')"
                    )[1][0][0]
                    for database in ("ep", "floor", "alone")
                }
    finally:
        server.remove()

    ep = results["eventpipe process --once -> clickhouse"]
    load = results["eventpipe table loads (wall)"]
    floor_s = results["clickhouse-client INSERT ... FORMAT Native"]
    duck_s = results["eventpipe process --once -> duckdb"]
    print(f"\neventpipe loaded {loaded:,} rows; rows per database: {counts}")
    print(f"eventpipe process --once -> clickhouse: {args.events / ep:,.0f} events/s end to end")
    print(f"eventpipe table loads / clickhouse-client: {load / floor_s:.2f}x the time")
    calls = results["destination.load calls"]
    print(f"the destination's loads alone / clickhouse-client: {calls / floor_s:.2f}x the time")
    print(f"eventpipe -> clickhouse / eventpipe -> duckdb: {ep / duck_s:.2f}x the time")
    alone_s = results["eventpipe's destination loads alone"]
    print(f"eventpipe's loads alone / clickhouse-client: {alone_s / floor_s:.2f}x the time")


if __name__ == "__main__":
    main()
