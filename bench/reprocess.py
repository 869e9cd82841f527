"""Reprocess benchmark: rebuilding days from the archive next to the batch pipeline's own
load of the same events, in one run.

    .venv/bin/python bench/reprocess.py --events 1000000

The batch benchmark's events (bench/batch.py: ~330 bytes each, in segments of 250,000,
their ``_timestamp`` spread over 28 days of November), into DuckDB:

* process: ``process_pending`` over the sealed segments (read, enrich, flatten, type,
  load, archive as LZ4), as ``eventpipe process --once`` does;
* reprocess: the mapping changes (one field moved), and ``reprocess`` rebuilds every
  day from the archive (decompress, the same job into shadow tables, one swap);
* reprocess, up to date: the same command again, which finds nothing to do.

Same Spark session, warmed up on a small set first. Prints seconds and events/s of each,
and checks that the rebuilt table has every event once.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    import duckdb

    from batch import generate
    from eventpipe.config import Config, parse_config
    from eventpipe.processing.batch.job import process_pending
    from eventpipe.processing.modes import reprocess as rp
    from eventpipe.processing.runtime.spark import start_session

    first, last = date(2026, 11, 1), date(2026, 11, 28)

    def config(data: Path, moved: bool) -> Config:
        warehouse: dict[str, object] = {"type": "duckdb"}
        if moved:
            warehouse["mappings"] = {
                "fields": [{"src": "/event_type", "dst": "/kind", "action": "move"}]
            }
        return parse_config(
            {"data_dir": str(data), "destinations": {"warehouse": warehouse}}, source="bench"
        )

    with tempfile.TemporaryDirectory(prefix="eventpipe-reprocess-bench-") as tmp:
        work = Path(tmp)
        raw = generate(work / "source", args.events)
        generate(work / "warm" / "incoming", 20_000, seed=1)
        print(f"{args.events:,} events, {raw / 1e6:.0f} MB", flush=True)
        spark = None
        for name in ("warm", "full"):
            data = work / name
            if name == "full":
                shutil.copytree(work / "source", data / "incoming")
            before, after = config(data, False), config(data, True)
            spark = spark or start_session(before.spark.settings)
            events = 20_000 if name == "warm" else args.events
            started = time.perf_counter()
            process_pending(before, spark)
            processed = time.perf_counter() - started
            started = time.perf_counter()
            _, results = rp.reprocess(spark, after, "warehouse", first, last)
            rebuilt = time.perf_counter() - started
            started = time.perf_counter()
            _, again = rp.reprocess(spark, after, "warehouse", first, last)
            noop = time.perf_counter() - started
            if name == "warm":
                continue
            assert again == [], again
            days = sum(len(r.plan.days) for r in results)
            with duckdb.connect(str(data / "warehouse.duckdb"), read_only=True) as db:
                row = db.execute(
                    "SELECT count(*), count(DISTINCT eventn_ctx_event_id), count(kind) FROM events"
                ).fetchone()
            assert row == (events, events, events), row  # every event once, rebuilt
            print(f"  process    {processed:6.1f} s  {events / processed:>9,.0f} events/s")
            print(f"  reprocess  {rebuilt:6.1f} s  {events / rebuilt:>9,.0f} events/s  "
                  f"({days} days in {len(results)} run(s))")  # fmt: skip
            print(f"  again      {noop:6.1f} s  (nothing to do)")
            print(f"reprocess / process: {rebuilt / processed:.2f}x the time")
        assert spark is not None
        spark.stop()


if __name__ == "__main__":
    main()
