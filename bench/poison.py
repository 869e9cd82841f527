"""Poison benchmark: what a few events the database refuses cost a batch load, in one run.

    scripts/ensure-apt.sh postgresql
    .venv/bin/python bench/poison.py --events 1000000 --poison 10

The batch benchmark's events (bench/batch.py) with an ``amount`` field, loaded into one
table whose owner added ``CHECK (amount >= 0)``, in DuckDB and in PostgreSQL (a throwaway
local server):

* clean: no event breaks the constraint; the batch loads in one piece per table;
* poison: ``--poison`` events, spread at random, have ``amount: -1``. The database
  refuses the load; eventpipe loads the batch in parts (50,000 rows), halves each part
  it refuses down to the single events, sends those to failed/ and loads the rest.

Same Spark session, warmed up, same data but the poison. Prints seconds, rows loaded,
events failed, and the poison run's time over the clean run's.
"""

from __future__ import annotations

import argparse
import logging
import random
import shutil
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
    parser.add_argument("--poison", type=int, default=10)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    import duckdb
    import psycopg
    from tests.postgres import postgres_server

    from batch import generate
    from eventpipe.config import parse_config
    from eventpipe.processing.batch.job import process_once
    from eventpipe.processing.runtime.spark import start_session

    rng = random.Random(13)
    poison = set(rng.sample(range(args.events), args.poison))

    with (
        tempfile.TemporaryDirectory(prefix="eventpipe-poison-bench-") as tmp,
        postgres_server() as dsn,
    ):
        work = Path(tmp)
        sources = {
            "clean": work / "clean",
            "poison": work / "poison",
        }
        generate(sources["clean"], args.events, extra=lambda n: {"amount": n % 1000})
        generate(sources["poison"], args.events,
                 extra=lambda n: {"amount": -1 if n in poison else n % 1000})  # fmt: skip
        generate(work / "warm", 20_000, seed=1, extra=lambda n: {"amount": 1})
        print(f"{args.events:,} events; {args.poison} poison at lines "
              f"{sorted(poison)[:5]}{'...' if args.poison > 5 else ''}", flush=True)  # fmt: skip

        def destination(kind: str, name: str) -> dict[str, Any]:
            if kind == "duckdb":
                path = work / f"{name}.duckdb"
                with duckdb.connect(str(path)) as db:
                    db.execute("CREATE TABLE events (amount BIGINT CHECK (amount >= 0))")
                return {"type": "duckdb", "path": str(path)}
            with psycopg.connect(dsn, autocommit=True) as db:
                db.execute(f"CREATE SCHEMA {name}")
                db.execute(f"CREATE TABLE {name}.events (amount bigint CHECK (amount >= 0))")
            return {"type": "postgres", "dsn": dsn, "schema": name}

        def config(source: Path, kind: str, name: str) -> Any:
            data = work / f"data-{name}"
            shutil.copytree(source, data / "incoming")
            return parse_config(
                {"data_dir": str(data), "enrichment": {"browser_rules": False},
                 "destinations": {"dst": destination(kind, name)}},
                source="bench",
            )  # fmt: skip

        spark = None
        results: dict[tuple[str, str], float] = {}
        for kind in ("duckdb", "postgres"):
            for run in ("warm", "clean", "poison"):
                name = f"{kind}_{run}"
                source = work / "warm" if run == "warm" else sources[run]
                conf = config(source, kind, name)
                spark = spark or start_session(conf.spark.settings)
                started = time.perf_counter()
                report = process_once(conf, spark)
                seconds = time.perf_counter() - started
                assert report is not None
                loaded = sum(report.loaded.values())
                failed = sum(report.failed.values())
                if run == "warm":
                    continue
                results[(kind, run)] = seconds
                expected = args.events - (args.poison if run == "poison" else 0)
                assert loaded == expected, (loaded, expected)
                assert failed == (args.poison if run == "poison" else 0), failed
                print(f"  {kind:9} {run:7} {seconds:6.1f} s  {loaded:>9,} rows loaded  "
                      f"{failed:>3} failed", flush=True)  # fmt: skip
        print()
        for kind in ("duckdb", "postgres"):
            clean, bad = results[(kind, "clean")], results[(kind, "poison")]
            print(f"{kind}: {args.poison} poison events cost {bad - clean:.1f} s "
                  f"({bad / clean:.2f}x the clean load)")  # fmt: skip


if __name__ == "__main__":
    main()
