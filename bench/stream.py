"""Stream benchmark: events/s posted to `eventpipe run`, time from each 200 to its row.

    .venv/bin/python bench/stream.py --destination duckdb --seconds 120
    .venv/bin/python bench/stream.py --destination postgres --seconds 120   # starts a server
    .venv/bin/python bench/stream.py --destination clickhouse --seconds 120  # Debian's server
    .venv/bin/python bench/stream.py --destination bigquery --seconds 120    # bqemulator
    .venv/bin/python bench/stream.py --destination bigquery-jobs --seconds 120  # load jobs

Starts `eventpipe run` (collector + pipeline, as a user would) with one stream destination,
posts `--rate` events per second (in requests of `--per-request`) for `--seconds`, and
polls the destination every 100 ms for the events' sequence numbers (``--width N``: each
event N keys wider, as an SDK's events are). For every event:
the time from its 200 response to the end of the first poll that sees its row. Prints p50,
p99 and max (all events, those after the first 10 s, those of the second half: the JVM
compiles Spark's code for a minute or more), the lag at the end (events the stream had not
loaded when posting stopped, and how long it took to drain them), the peak RSS of the
pipeline's processes and the cores they used while posting.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from tests.process import CollectorProcess, free_port, write_config  # noqa: E402

from micro_batch import nested_keys  # noqa: E402 (this script's own folder)

SERVER_KEY = "s2s-web-secret-1"


def cpu_seconds(pid: int) -> dict[int, float]:
    """The CPU seconds (user and system) each process of the tree under ``pid`` has used."""
    used = {}
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            used[proc.pid] = times.user + times.system
    return used


def poll_duckdb(path: Path, since: int) -> list[int] | None:
    import duckdb

    try:
        db = duckdb.connect(str(path), read_only=True)
    except duckdb.Error:
        return None  # not created yet, or the pipeline holds it for a load
    try:
        return [int(s) for (s,) in db.execute("SELECT seq FROM events WHERE seq >= ?", [since])
                .fetchall()]  # fmt: skip
    except duckdb.Error:
        return None
    finally:
        db.close()


def poll_postgres(dsn: str, since: int) -> list[int] | None:
    import psycopg

    try:
        with psycopg.connect(dsn) as db:
            rows = db.execute("SELECT seq FROM bench.events WHERE seq >= %s", [since]).fetchall()
    except psycopg.Error:
        return None
    return [int(s) for (s,) in rows]


def poll_clickhouse(server: Any, since: int) -> list[int] | None:
    from eventpipe.destinations.clickhouse.client import ClickHouseClient
    from eventpipe.errors import EventpipeError

    try:
        with ClickHouseClient(server.url, password=server.password) as client:
            rows = client.query(f"SELECT seq FROM bench.events WHERE seq >= {int(since)}")[1]
    except EventpipeError:
        return None  # not created yet
    return [int(s) for (s,) in rows]


def poll_bigquery(dest: Any, since: int) -> list[int] | None:
    from eventpipe.errors import EventpipeError

    try:
        rows = dest.query(f"SELECT seq FROM events WHERE seq >= {int(since)}")[1]
    except EventpipeError:
        return None  # not created yet
    return [int(s) for (s,) in rows]


def bigquery_reader(server: Any) -> Any:
    """A BigQuery destination on the stand-in, to read the dataset ``bench`` with."""
    from eventpipe.destinations.bigquery import BigQueryDestination
    from eventpipe.locks import FileLocks

    settings = server.settings("bench")
    del settings["type"]
    return BigQueryDestination("poll", FileLocks(Path(tempfile.gettempdir())), **settings)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--destination",
        default="duckdb",
        choices=["duckdb", "postgres", "clickhouse", "bigquery", "bigquery-jobs"],
    )
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--rate", type=int, default=1000, help="events per second")
    parser.add_argument("--per-request", type=int, default=10)
    parser.add_argument(
        "--width", type=int, default=0,
        help="keys beside each event's three, half under context, half under properties "
        "(an SDK's event has 40-60 leaves)",
    )  # fmt: skip
    parser.add_argument("--interval", type=float, help="the destination's stream_interval_seconds")
    parser.add_argument(
        "--spark",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting of the pipeline (spark.eventLog.enabled=true)",
    )
    parser.add_argument("--keep-log", type=Path, help="copy the pipeline's log here at the end")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="eventpipe-stream-bench-") as tmp:
        work = Path(tmp)
        stack = contextlib.ExitStack()
        dsn = ""
        if args.destination == "postgres":
            from tests.postgres import postgres_server  # a throwaway local cluster

            dsn = stack.enter_context(postgres_server())
            dest = {"type": "postgres", "dsn": dsn, "schema": "bench", "mode": "stream"}
        elif args.destination == "clickhouse":
            from tests.clickhouse import ClickHouseServer

            server = ClickHouseServer()
            server.start()
            stack.callback(server.remove)
            dest = {"type": "clickhouse", "url": server.url, "password": server.password,
                    "database": "bench", "mode": "stream"}  # fmt: skip
        elif args.destination.startswith("bigquery"):  # appends: the Storage Write API or jobs
            from tests.bigquery import BigQueryServer

            bq = BigQueryServer()
            bq.start()
            stack.callback(bq.remove)
            appends = "load_job" if args.destination == "bigquery-jobs" else "storage_write"
            dest = {**bq.settings("bench"), "mode": "stream", "appends": appends}
            reader = bigquery_reader(bq)
        else:
            dest = {"type": "duckdb", "mode": "stream"}
        if args.interval is not None:
            dest["stream_interval_seconds"] = args.interval
        spark = {"master": "local[2]", **dict(kv.split("=", 1) for kv in args.spark)}
        port = free_port()
        config = write_config(
            work / "eventpipe.yaml", work / "data", port,
            destinations={"live": dest}, spark=spark,
            processing={"batch_period_seconds": 30},
        )  # fmt: skip
        run = CollectorProcess(config, port, work / "run.log", command="run")
        acked: dict[int, float] = {}
        seen: dict[int, float] = {}
        try:
            run.wait_ready()
            poll: Callable[[int], list[int] | None] = {
                "postgres": lambda since: poll_postgres(dsn, since),
                "clickhouse": lambda since: poll_clickhouse(server, since),
                "bigquery": lambda since: poll_bigquery(reader, since),
                "bigquery-jobs": lambda since: poll_bigquery(reader, since),
                "duckdb": lambda since: poll_duckdb(work / "data" / "warehouse.duckdb", since),
            }[args.destination]
            # Warm-up: one event, seen before the clock starts (Spark and the table ready).
            httpx.post(f"{run.url}/api/v1/s2s/event", headers={"X-Auth-Token": SERVER_KEY},
                       content=orjson.dumps({"seq": -1})).raise_for_status()  # fmt: skip
            deadline = time.monotonic() + 180
            while not poll(-1):
                if time.monotonic() > deadline:
                    raise SystemExit("the warm-up event never arrived; see " + str(run.log_path))
                time.sleep(0.2)
            print(f"warm: first event visible; posting {args.rate} events/s for "
                  f"{args.seconds:.0f} s", flush=True)  # fmt: skip

            stop = threading.Event()
            stop_time = 0.0
            peaks: dict[str, float] = {}
            polls: list[float] = []  # how long each poll took

            def watch() -> None:
                # A poll starts every 0.1 s (or as soon as the last one ends), and an
                # event counts as seen when the poll that found it has ended.
                low = 0
                while not stop.is_set() or len(seen) < len(acked):
                    began = time.monotonic()
                    found = poll(low)
                    now = time.monotonic()
                    polls.append(now - began)
                    for seq in found or ():
                        seen.setdefault(seq, now)
                    while low in seen:
                        low += 1
                    if stop.is_set() and now > stop_time + 120:
                        return
                    time.sleep(max(0.0, began + 0.1 - time.monotonic()))

            def sample() -> None:  # the memory of the pipeline's processes, each second
                while not stop.is_set():
                    try:
                        root = psutil.Process(run.proc.pid)
                        procs = [root, *root.children(recursive=True)]
                    except psutil.Error:
                        return
                    for proc in procs:
                        try:
                            kind = "jvm" if "java" in proc.name() else "python"
                            peaks[kind] = max(peaks.get(kind, 0), proc.memory_info().rss / 2**20)
                        except psutil.Error:
                            continue
                    stop.wait(1.0)

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            cpu_before = cpu_seconds(run.proc.pid)
            client = httpx.Client(base_url=run.url, headers={"X-Auth-Token": SERVER_KEY})
            started = time.monotonic()
            seq = 0
            wide = nested_keys(args.width) if args.width else {}
            requests = int(args.seconds * args.rate / args.per_request)
            interval = args.per_request / args.rate
            for i in range(requests):
                batch = [{"event_type": "tick", "seq": seq + k, "n": k, **wide}
                         for k in range(args.per_request)]  # fmt: skip
                client.post("/api/v1/s2s/event", content=orjson.dumps(batch)).raise_for_status()
                now = time.monotonic()
                for k in range(args.per_request):
                    acked[seq + k] = now
                seq += args.per_request
                pause = started + (i + 1) * interval - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
            stop_time = time.monotonic()
            posted_for = stop_time - started
            cpu_used = sum(
                t - cpu_before.get(pid, 0.0) for pid, t in cpu_seconds(run.proc.pid).items()
            )
            backlog = len(acked) - len(seen)
            stop.set()
            watcher.join(150)
            drained = max(seen.values(), default=stop_time) - stop_time
        finally:
            run.signal(signal.SIGTERM)
            run.wait(60)
            stack.close()
            if args.keep_log:
                args.keep_log.write_bytes(run.log_path.read_bytes())
    latencies = sorted(seen[s] - acked[s] for s in acked if s in seen)
    missing = len(acked) - len(latencies)
    print(f"{len(acked):,} events posted in {posted_for:.0f} s "
          f"({len(acked) / posted_for:,.0f}/s) into {args.destination}")  # fmt: skip
    print(f"200 -> row visible (a poll every 0.1 s, each {statistics.median(polls) * 1000:.0f} ms "
          f"on median):")  # fmt: skip
    # The first seconds include the JVM's and Python workers' warm-up (the first few
    # micro-batches take 2-3x longer), and the JVM's compiler keeps a core busy for a
    # minute: the later parts are shown apart, as the steady state.
    for label, since in [("all", 0.0), ("after the first 10 s", 10.0),
                         ("the second half", posted_for / 2)]:  # fmt: skip
        part = sorted(
            seen[s] - acked[s] for s in acked if s in seen and acked[s] >= started + since
        )
        if len(part) > 1:
            q = statistics.quantiles(part, n=100)
            print(f"  {label}: p50 {q[49]:.2f} s, p99 {q[98]:.2f} s, max {part[-1]:.2f} s")
    print(f"not loaded when posting stopped: {backlog:,} events; the last arrived "
          f"{drained:.1f} s after; never seen: {missing}")  # fmt: skip
    print(f"peak RSS: python processes (largest) {peaks.get('python', 0):.0f} MB, "
          f"Spark JVM {peaks.get('jvm', 0):.0f} MB")  # fmt: skip
    print(f"CPU of the pipeline's processes while posting: {cpu_used / posted_for:.2f} cores "
          f"(collector, driver, JVM, Python workers)")  # fmt: skip


if __name__ == "__main__":
    main()
