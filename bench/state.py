"""State store benchmark: SQLite next to PostgreSQL, in one run.

    .venv/bin/python bench/state.py [--events 200000] [--segments 40]

* The store's own calls, 300 each: a status record (one transaction that writes) and a
  lookup (``table_ok``), then ``history`` over 1,000 runs.
* The batch pipeline with each store: the same events (bench/batch.py's, in
  ``--segments`` sealed segments) processed into DuckDB by ``process_pending``, one run
  per store and round, two rounds alternating the stores, after a warm-up. The
  difference is what the store costs in a run.

PostgreSQL is a throwaway server on 127.0.0.1 (tests/postgres.py, trust auth), so the
figures exclude a network and password checks.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def _per_call(calls: int, call: Callable[[int], object]) -> float:
    started = time.perf_counter()
    for n in range(calls):
        call(n)
    return (time.perf_counter() - started) / calls * 1000


def _calls(store: Any) -> tuple[float, float, float]:
    record = _per_call(300, lambda n: store.record([f"s{n}"], "dw", "events", ok=True, rows=10))
    lookup = _per_call(300, lambda n: store.table_ok([f"s{n}"], "dw", "events"))
    for n in range(1000):
        run = store.begin_run([f"s{n}"], "once")
        store.record([f"s{n}"], "dw", "events", ok=True, rows=10, run_id=run.run_id)
        store.finish_run(run.run_id, "done")
    history = _per_call(10, lambda n: store.history(1000))
    return record, lookup, history


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--segments", type=int, default=40)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    from tests.postgres import postgres_server

    from batch import generate
    from eventpipe.config import Config, parse_config
    from eventpipe.processing.batch.job import process_pending
    from eventpipe.processing.runtime.spark import start_session
    from eventpipe.state.db import PostgresDatabase
    from eventpipe.state.store import StateStore

    with (
        postgres_server() as dsn,
        tempfile.TemporaryDirectory(prefix="eventpipe-state-bench-") as tmp,
    ):
        work = Path(tmp)
        stores = {
            "sqlite": lambda name: {},
            "postgres": lambda name: {"type": "postgres", "dsn": dsn, "schema": name},
        }
        print("store calls (ms per call):")
        print(f"{'store':<10} {'record':>8} {'lookup':>8} {'history(1000)':>14}")
        for kind in stores:
            store = (
                StateStore(work / "calls.sqlite")
                if kind == "sqlite"
                else StateStore(PostgresDatabase(dsn, "calls"))
            )
            record, lookup, history = _calls(store)
            print(f"{kind:<10} {record:8.2f} {lookup:8.2f} {history:14.1f}")

        per_segment = -(-args.events // args.segments)
        generate(work / "source", args.events, per_segment=per_segment)
        generate(work / "warm-source", 10_000, per_segment=2_500, seed=1)

        def config(name: str, state: dict[str, Any]) -> Config:
            return parse_config(
                {"data_dir": str(work / name), "state": state,
                 "destinations": {"warehouse": {"type": "duckdb"}}},
                source="bench",
            )  # fmt: skip

        spark = start_session(config("warm", {}).spark.settings)
        print(f"\nprocess --once, {args.events:,} events in {args.segments} segments, DuckDB:")
        for kind, state in stores.items():
            warm = config(f"warm-{kind}", state(f"warm_{kind}"))
            shutil.copytree(work / "warm-source", warm.layout.incoming)
            process_pending(warm, spark)
        for attempt in (1, 2):  # alternated, so that neither store has the warmer JVM
            for kind, state in stores.items():
                full = config(f"full-{kind}-{attempt}", state(f"full_{kind}_{attempt}"))
                shutil.copytree(work / "source", full.layout.incoming)
                started = time.perf_counter()
                reports = process_pending(full, spark)
                took = time.perf_counter() - started
                rows = sum(n for report in reports for n in report.loaded.values())
                print(f"{kind:<10} {took:6.1f} s  {args.events / took:9,.0f} events/s  "
                      f"rows {rows:,}  (round {attempt})")  # fmt: skip
        spark.stop()


if __name__ == "__main__":
    main()
