"""Change data capture benchmark: `eventpipe read` next to PostgreSQL's own floors, in one
run, on a throwaway local server (tests/postgres.py, wal_level = logical, wal2json).

    .venv/bin/python bench/cdc.py --rows 1000000

1. The copy: a table of ``--rows`` rows (id, numeric, text, timestamptz, jsonb) read by
   `eventpipe read --once` into the log (events, fsynced), next to `COPY (SELECT ...) TO
   STDOUT` of the same rows as JSON (the floor: the server's own export).
2. The changes: ``--rows`` updates in transactions of 10,000, read by `eventpipe read
   --once`, next to the slot read alone (`pg_logical_slot_peek_changes` of the same
   changes, counted, nothing written: the decoding floor).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--max-changes", type=int, default=None,
                        help="The source's max_changes (default: eventpipe's).")  # fmt: skip
    args = parser.parse_args()
    import psycopg
    from tests.postgres import postgres_server

    from eventpipe.config import parse_config
    from eventpipe.sources.postgres import WAL2JSON, PostgresSource

    rows = args.rows
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="eventpipe-cdc-bench-", dir="/var/tmp") as tmp, \
            postgres_server() as dsn:  # fmt: skip
        with psycopg.connect(dsn, autocommit=True) as db:
            db.execute("SET synchronous_commit = on")
            db.execute("CREATE TABLE orders (id bigint PRIMARY KEY, amount numeric(12,2), "
                       "name text, at timestamptz, meta jsonb)")  # fmt: skip
            db.execute(
                "INSERT INTO orders SELECT g, g / 7.0, 'customer ' || g, now(), "
                "jsonb_build_object('n', g, 'tags', jsonb_build_array('a', 'b')) "
                "FROM generate_series(1, %s) g",
                [rows],
            )
            started = time.perf_counter()
            copied = 0
            with db.cursor().copy(
                "COPY (SELECT row_to_json(o)::text FROM orders o) TO STDOUT"
            ) as copy:
                for chunk in copy:
                    copied += len(chunk)
            results["copy floor"] = time.perf_counter() - started
        print(f"{rows:,} rows; COPY TO STDOUT as JSON: {results['copy floor']:.1f} s "
              f"({copied / 1e6:.0f} MB)", flush=True)  # fmt: skip

        tuning = {"max_changes": args.max_changes} if args.max_changes else {}
        config = parse_config(
            {"data_dir": str(Path(tmp) / "data"),
             "sources": {"pg": {"dsn": dsn, "tables": "^public\\.orders$", **tuning}}},
            source="bench",
        )  # fmt: skip
        source = PostgresSource(config, "pg")
        started = time.perf_counter()
        report = source.read(once=True)
        results["eventpipe copy"] = time.perf_counter() - started
        assert report.copied == {"public.orders": rows}
        print(f"eventpipe read (copy): {results['eventpipe copy']:.1f} s", flush=True)

        with psycopg.connect(dsn, autocommit=True) as db:
            db.execute("SET synchronous_commit = on")
            for first in range(1, rows + 1, 10_000):
                db.execute("UPDATE orders SET amount = amount + 1 WHERE id >= %s AND id < %s",
                           [first, first + 10_000])  # fmt: skip
            started = time.perf_counter()
            [(changes,)] = db.execute(
                "SELECT count(*) FROM pg_logical_slot_peek_changes(%s, NULL, NULL, "
                + ", ".join(["%s"] * len(WAL2JSON))
                + ")",
                [source.slot, *WAL2JSON],
            ).fetchall()
            results["slot read"] = time.perf_counter() - started
        print(f"slot read alone ({changes:,} rows of wal2json): {results['slot read']:.1f} s",
              flush=True)  # fmt: skip
        started = time.perf_counter()
        report = source.read(once=True)
        results["eventpipe changes"] = time.perf_counter() - started
        assert report.changes == rows
        print(f"eventpipe read (changes): {results['eventpipe changes']:.1f} s", flush=True)

    print("\nin this run:")
    copy, floor = results["eventpipe copy"], results["copy floor"]
    print(f"  copy: {rows / copy:,.0f} rows/s; {copy / floor:.1f}x COPY TO STDOUT")
    changes, slot = results["eventpipe changes"], results["slot read"]
    print(f"  changes: {rows / changes:,.0f} changes/s; {changes / slot:.1f}x the slot read alone")


if __name__ == "__main__":
    main()
