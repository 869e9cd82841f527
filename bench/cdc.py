"""Change data capture benchmark: `eventpipe read` next to PostgreSQL's own floors, in one
run, on a throwaway local server (tests/postgres.py, wal_level = logical, wal2json).

    .venv/bin/python bench/cdc.py --rows 1000000

1. The copy: a table of ``--rows`` rows (id, numeric, text, timestamptz, jsonb) read by
   `eventpipe read --once` into the log (events, fsynced), next to `COPY (SELECT ...) TO
   STDOUT` of the same rows as JSON (the floor: the server's own export).
2. The changes: ``--rows`` updates in transactions of 10,000, read by `eventpipe read
   --once`, next to the slot read alone (`pg_logical_slot_peek_changes` of the same
   changes, counted, nothing written: the decoding floor), and to the same changes
   streamed over the replication protocol (psycopg2's ``START_REPLICATION``, counted:
   the other way to read a slot; ``pip install psycopg2-binary``, in the dev extras).
3. Latency (``--latency-seconds``, 0 to skip): `eventpipe run` with the source and a
   PostgreSQL destination in mode stream; a row is inserted every 20 ms (its commit time
   in the row, ``clock_timestamp()``), and a poller sees each arrive in the destination
   (every 10 ms): p50, p99 and the worst of arrival - commit, with eventpipe's default
   settings (reader ``poll_seconds`` 0.5, a PostgreSQL destination's
   ``stream_interval_seconds`` 0.5), then with faster ones (0.05 and 0.2).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
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
    parser.add_argument("--latency-seconds", type=float, default=60.0)
    parser.add_argument("--runs", default="defaults,fast",
                        help="the latency runs: with eventpipe's defaults (or --interval), "
                        "with faster settings, or both")  # fmt: skip
    parser.add_argument("--interval", type=float, default=None,
                        help="the first latency run's stream_interval_seconds (default: "
                        "eventpipe's)")  # fmt: skip
    parser.add_argument("--poll", type=float, default=None,
                        help="the first latency run's poll_seconds (default: "
                        "eventpipe's)")  # fmt: skip
    args = parser.parse_args()
    import psycopg
    from tests.postgres import postgres_server

    from eventpipe.config import parse_config
    from eventpipe.sources.postgres import WAL2JSON, PostgresSource

    rows = args.rows
    results: dict[str, float] = {}
    latencies: dict[str, str] = {}
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
            print(f"slot read alone ({changes:,} rows of wal2json, counted in the server): "
                  f"{results['slot read']:.1f} s", flush=True)  # fmt: skip
            started = time.perf_counter()
            fetched = 0
            with db.cursor() as cursor:  # the same, every row sent to this client
                cursor.execute(
                    "SELECT lsn::text, data FROM pg_logical_slot_peek_changes(%s, NULL, NULL, "
                    + ", ".join(["%s"] * len(WAL2JSON))
                    + ")",
                    [source.slot, *WAL2JSON],
                )
                for _ in cursor:
                    fetched += 1
            results["slot fetched"] = time.perf_counter() - started
        print(f"slot read and fetched by this client ({fetched:,} rows): "
              f"{results['slot fetched']:.1f} s", flush=True)  # fmt: skip
        results["slot streamed"] = streamed(dsn, source.slot, changes)
        print(f"slot streamed alone (psycopg2 START_REPLICATION, {changes:,} messages): "
              f"{results['slot streamed']:.1f} s", flush=True)  # fmt: skip
        started = time.perf_counter()
        report = source.read(once=True)
        results["eventpipe changes"] = time.perf_counter() - started
        assert report.changes == rows
        print(f"eventpipe read (changes): {results['eventpipe changes']:.1f} s", flush=True)

        runs = (("defaults", args.poll, args.interval), ("fast", 0.05, 0.2))
        for label, poll, interval in (r for r in runs if r[0] in args.runs.split(",")):
            if args.latency_seconds > 0:
                latencies[label] = latency(dsn, Path(tmp) / label, args.latency_seconds,
                                           poll, interval)  # fmt: skip

    print("\nin this run:")
    copied_in, floor = results["eventpipe copy"], results["copy floor"]
    print(f"  copy: {rows / copied_in:,.0f} rows/s; {copied_in / floor:.1f}x COPY TO STDOUT")
    changes, slot = results["eventpipe changes"], results["slot read"]
    print(f"  changes: {rows / changes:,.0f} changes/s; {changes / slot:.1f}x the slot read alone")
    stream, fetched_s = results["slot streamed"], results["slot fetched"]
    print(
        f"  the slot streamed (psycopg2) took {stream / fetched_s:.2f}x the SQL read of it "
        f"fetched by the client ({stream / slot:.2f}x the read counted in the server)"
    )
    for label, text in latencies.items():
        print(f"  latency ({label}): {text}")


def streamed(dsn: str, slot: str, messages: int) -> float:
    """Seconds to receive ``messages`` of the slot over the replication protocol
    (psycopg2's ``LogicalReplicationConnection``), counted, nothing confirmed: the
    streaming floor, beside the SQL read's."""
    import psycopg2
    import psycopg2.extras
    from psycopg2.extras import StopReplication

    from eventpipe.sources.postgres import WAL2JSON

    connection = psycopg2.connect(
        dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection
    )
    cursor = connection.cursor()
    options = dict(zip(WAL2JSON[::2], WAL2JSON[1::2], strict=True))
    started = time.perf_counter()
    cursor.start_replication(slot_name=slot, decode=False, options=options)
    received = 0

    def consume(message: object) -> None:
        nonlocal received
        received += 1
        if received >= messages:
            raise StopReplication

    with contextlib.suppress(StopReplication):
        cursor.consume_stream(consume)
    seconds = time.perf_counter() - started
    connection.close()
    return seconds


def latency(
    dsn: str, root: Path, seconds: float, poll: float | None, interval: float | None
) -> str:
    """A change's time from its commit to its row in a stream destination, under
    `eventpipe run` (see the module's docstring): p50, p99, worst. ``poll`` and
    ``interval`` None: eventpipe's defaults."""
    import signal
    import subprocess
    import threading
    from datetime import datetime

    import psycopg
    import yaml
    from tests.process import EVENTPIPE, _env, free_port

    database = "latency_defaults" if poll is None else f"latency_{int(poll * 1000)}"
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute(f"CREATE DATABASE {database}")
    source = dsn.rsplit("/", 1)[0] + f"/{database}"
    with psycopg.connect(source, autocommit=True) as db:
        db.execute("CREATE TABLE ticks (id int PRIMARY KEY, at timestamptz)")
    root.mkdir(parents=True)
    config = root / "eventpipe.yaml"
    config.write_text(yaml.safe_dump({
        "data_dir": str(root / "data"),
        "server": {"host": "127.0.0.1", "port": free_port()},
        "sources": {"pg": {"dsn": source, **({} if poll is None else {"poll_seconds": poll})}},
        "destinations": {"live": {"type": "postgres", "dsn": dsn, "schema": database,
                                  "mode": "stream", "table_name_template": "{{ _namespace }}",
                                  **({} if interval is None else
                                     {"stream_interval_seconds": interval})}},
        "spark": {"master": "local[2]", "spark.sql.shuffle.partitions": 2},
    }))  # fmt: skip
    log = (root / "run.log").open("wb")
    service = subprocess.Popen([*EVENTPIPE, "run", "-c", str(config)], stdout=log,
                               stderr=subprocess.STDOUT, env=_env())  # fmt: skip
    seen: dict[int, float] = {}
    stop = threading.Event()

    def poller() -> None:
        with psycopg.connect(dsn, autocommit=True) as db:
            while not stop.is_set():
                try:
                    found = db.execute(
                        f"SELECT id FROM {database}.public_ticks WHERE id > %s",
                        [max(seen, default=-1)],
                    ).fetchall()
                except psycopg.errors.UndefinedTable:
                    found = []
                now = time.time()
                for (i,) in found:
                    seen.setdefault(i, now)
                time.sleep(0.01)

    thread = threading.Thread(target=poller, daemon=True)
    thread.start()
    committed: dict[int, float] = {}
    try:
        with psycopg.connect(source, autocommit=True) as db:
            db.execute("SET synchronous_commit = on")
            db.execute("INSERT INTO ticks VALUES (0, clock_timestamp())")  # started
            deadline = time.monotonic() + 180
            while 0 not in seen:
                assert time.monotonic() < deadline, "eventpipe run did not start"
                time.sleep(0.1)
            end = time.monotonic() + seconds
            n = 0
            while time.monotonic() < end:
                n += 1
                [(at,)] = db.execute(
                    "INSERT INTO ticks VALUES (%s, clock_timestamp()) RETURNING at", [n]
                ).fetchall()
                committed[n] = datetime.timestamp(at)
                time.sleep(0.02)
        deadline = time.monotonic() + 60
        while len([i for i in committed if i in seen]) < len(committed):
            assert time.monotonic() < deadline, "changes did not arrive"
            time.sleep(0.1)
    finally:
        stop.set()
        service.send_signal(signal.SIGTERM)
        service.wait(120)

    def spread(ids: list[int]) -> str:
        waits = sorted(seen[i] - committed[i] for i in ids)
        p50, p99 = waits[len(waits) // 2], waits[int(len(waits) * 0.99)]
        return f"p50 {p50:.2f} s, p99 {p99:.2f} s, worst {waits[-1]:.2f} s"

    # The JVM compiles Spark's code for the first minute: the second half apart.
    second_half = [i for i in committed if i > n // 2]
    batches = [float(line.split(" in ")[1].split(" s")[0]) for line in
               (root / "run.log").read_text(errors="replace").splitlines()
               if "micro-batch" in line and " row(s) in " in line]  # fmt: skip
    settings = ", ".join([f"poll_seconds {'default' if poll is None else poll}",
                          f"stream_interval_seconds {interval or 'default'}"])  # fmt: skip
    logged = (f"{statistics.median(batches):.2f} s on median, {max(batches):.2f} s at most"
              if batches else "none logged")  # fmt: skip
    text = (f"{len(committed)} changes, {spread(list(committed))}; the second half "
            f"{spread(second_half)}; micro-batches {logged} ({settings})")  # fmt: skip
    print(f"latency: {text}", flush=True)
    return text


if __name__ == "__main__":
    main()
