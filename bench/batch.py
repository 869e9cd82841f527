"""Batch benchmark: eventpipe `process --once` into DuckDB next to its peers, in one run.

    .venv/bin/pip install -e '.[bench]'        # dlt, for the comparison
    .venv/bin/python bench/batch.py --events 1000000

Generates realistic enriched events (nested properties, 5 event types, fields whose JSON
type varies, ~200 distinct user agents, random IPs) as sealed segments, then times:

* eventpipe: `process_once` (read, template, flatten, type, stage, patch, load) into DuckDB,
  on a warm Spark session (the session start is reported apart). Warm means what a
  running `eventpipe process` has: one earlier run, here of 20,000 other events (other
  IPs) into another data directory, so that the JVM's Arrow and Parquet paths are
  compiled and the Python workers started. Then once more on as many other events
  (steady state: what a scheduler's `process --once` sees, its run compressing the
  segments for the archive beside its loads). The floor runs after the warm-up too,
  three times (median);
* eventpipe's run as a running `eventpipe process` makes it, on other events: the
  segments compressed for the archive and their schemas inferred in the service's wait
  before the run, while Spark is idle (``prepare_sealed``, what that wait calls; its time
  printed apart), then the run;
* the hand-written job's tables loaded into a DuckDB file, and the segments archived
  with eventpipe's writer, one after another: what eventpipe does beyond that job,
  timed alone (the reference the job plus them makes is printed too);
* eventpipe's steady state once more, into a Parquet lake (``type: parquet``) instead of
  DuckDB: the kind of output the hand-written job writes, on other events again;
* Spark floor: `spark.read.json` then write Parquet, same session and settings;
* a hand-written Spark job for the same tables: `read.json`, eventpipe's two lookup UDFs
  (the fastest this project has), flatten, write Parquet partitioned by event type. No
  copy to resume from, no database load, no archive: what the lookups cost on top of the
  floor, and so how near the floor a job with lookups can be on this machine;
* DuckDB: `read_json_auto` into a table;
* dlt: the same events into DuckDB (dlt's defaults plus its documented speed settings), in
  a child process (its start and dlt's import, about a second, are in its time), stopped
  when it holds more than ``--dlt-memory-mb`` (it passed 22 GB on 1M of these events).

Prints wall seconds, events/s, the ratios the issue asks for, and peak RSS.

``--interleaved N`` instead: after the warm-up, N rounds of eventpipe's steady state (on
other events each round) and the hand-written job, alternating (eventpipe, job,
eventpipe...), so that drifts of the machine hit both alike; prints each round, the
medians and their ratio, and eventpipe's steps in each of its rounds (its log).

    .venv/bin/python bench/batch.py --events 1000000 --interleaved 3
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

EVENT_TYPES = ["page_view", "click", "signup", "purchase", "search"]


def user_agents(rng: random.Random) -> list[str]:
    agents = []
    for i in range(200):
        chrome = rng.randint(100, 131)
        agents.append(
            rng.choice([
                f"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like "
                f"Gecko) Chrome/{chrome}.0.{i}.0 Safari/537.36",
                f"Mozilla/5.0 (iPhone; CPU iPhone OS 17_{i % 10} like Mac OS X) AppleWebKit/"
                f"605.1.15 (KHTML, like Gecko) Version/17.{i % 10} Mobile/15E148 Safari/604.1",
                f"Mozilla/5.0 (X11; Linux x86_64; rv:{chrome}.0) Gecko/20100101 "
                f"Firefox/{chrome}.{i}",
            ])
        )  # fmt: skip
    return agents


def make_event(rng: random.Random, n: int, agents: list[str]) -> dict[str, Any]:
    kind = EVENT_TYPES[n % len(EVENT_TYPES)]
    return {
        "event_type": kind,
        "user": {"anonymous_id": f"a{rng.getrandbits(40):x}", "id": rng.randint(1, 10**6)},
        "page": {"url": f"https://shop.example.com/p/{rng.randint(1, 5000)}", "title": "Product"},
        "properties": {
            "price": round(rng.uniform(1, 500), 2),
            "quantity": rng.randint(1, 5),
            # a field whose JSON type varies: int, float and string across events
            "discount": rng.choice([0, 0.15, "none"]),
            "tags": ["a", "b"][: rng.randint(0, 2)],
        },
        "source_ip": ".".join(str(rng.randint(1, 254)) for _ in range(4)),
        "_timestamp": f"2026-11-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:"
                      f"{rng.randint(0, 59):02d}:00.000000Z",
        "api_key": "web",
        "eventn_ctx": {"event_id": f"e{n}", "user_agent": rng.choice(agents)},
    }  # fmt: skip


def generate(
    incoming: Path,
    events: int,
    per_segment: int = 250_000,
    seed: int = 2026,
    extra: Callable[[int], dict[str, Any]] | None = None,
) -> int:
    """``events`` events as sealed segments in ``incoming``; ``extra(n)``: fields added to
    event ``n``. Returns the bytes written."""
    rng = random.Random(seed)
    agents = user_agents(rng)
    incoming.mkdir(parents=True)
    total = 0
    for part in range(0, events, per_segment):
        lines = [
            orjson.dumps({**make_event(rng, n, agents), **(extra(n) if extra else {})}) + b"\n"
            for n in range(part, min(part + per_segment, events))
        ]
        path = incoming / f"incoming.tok=web-2026-11-21T10-00-{part // per_segment:02d}.000.log"
        data = b"".join(lines)
        path.write_bytes(data)
        total += len(data)
    return total


def hand_written(spark: Any, paths: list[str], out: Path, database: str) -> None:
    """The enrichment job as one would write it by hand, with eventpipe's lookup UDFs."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, StructType

    from eventpipe.processing.steps.lookup import rule_function

    raw = spark.read.json(paths)
    enriched = raw.withColumns({
        "location": rule_function("ip_lookup", database)(F.col("source_ip")),
        "parsed_ua": rule_function("user_agent_parse", database)(F.col("eventn_ctx.user_agent")),
    })  # fmt: skip

    def leaves(schema: StructType, prefix: tuple[str, ...]) -> list[Any]:
        out = []
        for f in schema.fields:
            path = (*prefix, f.name)
            column = F.col(".".join(f"`{p}`" for p in path))
            if isinstance(f.dataType, StructType):
                out += leaves(f.dataType, path)
            elif isinstance(f.dataType, ArrayType):
                out.append(F.to_json(column).alias("_".join(path)))
            else:
                out.append(column.alias("_".join(path)))
        return out

    enriched.select(*leaves(enriched.schema, ())).write.mode("overwrite").partitionBy(
        "event_type"
    ).parquet(str(out))


def load_by_hand(hand: Path, database: Path) -> None:
    """The hand-written job's tables into a DuckDB file, one per event type: the load
    eventpipe makes and the hand-written job does not."""
    import duckdb

    db = duckdb.connect(str(database))
    for part in sorted(hand.glob("event_type=*")):
        table = part.name.split("=", 1)[1]
        db.execute(f'CREATE TABLE "{table}" AS SELECT * FROM read_parquet(?)',
                   [str(part / "*.parquet")])  # fmt: skip
    db.close()


def archive_by_hand(paths: list[str], out: Path, settings: Any) -> None:
    """The segments archived (LZ4 frames, index, ids, manifest) with eventpipe's own
    writer, one after another: the archive eventpipe keeps and the hand-written job
    does not."""
    from eventpipe.archive.files import SUFFIX, ArchivedSegment
    from eventpipe.archive.write import write_segment

    out.mkdir(parents=True, exist_ok=True)
    for path in paths:
        write_segment(Path(path), ArchivedSegment(out / (Path(path).name + SUFFIX)), settings)


def dlt_load(source: Path, work: Path) -> None:
    """dlt loading the events of ``source`` into DuckDB (dlt's defaults plus its
    documented speed settings); run as ``batch.py --dlt-only SOURCE WORK``."""
    os.environ.setdefault("NORMALIZE__WORKERS", "2")
    os.environ.setdefault("DATA_WRITER__BUFFER_MAX_ITEMS", "100000")
    os.environ.setdefault("DATA_WRITER__FILE_MAX_ITEMS", "250000")
    import dlt

    def rows() -> Any:
        for path in sorted(source.iterdir()):
            with path.open("rb") as fh:
                yield from (orjson.loads(line) for line in fh)

    pipeline = dlt.pipeline(
        pipeline_name="bench",
        destination=dlt.destinations.duckdb(str(work / "dlt.duckdb")),
        dataset_name="events",
        pipelines_dir=str(work / "dlt"),
    )
    pipeline.run(rows(), table_name="events")


def run_dlt(source: Path, work: Path, limit_mb: int, results: dict[str, float]) -> str | None:
    """Time :func:`dlt_load` in a child process, stopped when it and its workers pass
    ``limit_mb`` of resident memory (the machine's OOM killer would otherwise pick a
    process, maybe this one). None when it finished; else what stopped it."""
    import psutil

    command = [sys.executable, __file__, "--dlt-only", str(source), str(work)]
    started = time.perf_counter()
    child = psutil.Popen(command)
    peak = 0.0
    while child.poll() is None:
        try:
            procs = [child, *child.children(recursive=True)]
            rss = sum(p.memory_info().rss for p in procs if p.is_running()) / 2**20
        except psutil.Error:
            rss = 0.0
        peak = max(peak, rss)
        if rss > limit_mb:
            for proc in [*child.children(recursive=True), child]:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
            child.wait()
            return f"stopped at {rss:,.0f} MB resident (over --dlt-memory-mb {limit_mb:,})"
        time.sleep(0.2)
    if child.returncode != 0:
        return f"failed (exit {child.returncode})"
    results["dlt -> duckdb"] = time.perf_counter() - started
    print(f"  dlt -> duckdb: {results['dlt -> duckdb']:.1f} s (peak {peak:,.0f} MB resident)",
          flush=True)  # fmt: skip
    return None


HAND = "hand-written Spark job: read.json, lookups, flatten -> parquet (second run)"
LAKE = "eventpipe steady state into a Parquet lake, on other events"
SERVICE = "eventpipe's run in a service, after its wait, on other events"
WAITED = "  its segments compressed for the archive and their schemas inferred in the wait"
HAND_LOAD = "the hand-written job's tables into DuckDB"
HAND_ARCHIVE = "the segments archived with eventpipe's writer, one after another"
PEAKS: dict[str, float] = {}


def peak_rss_mb(pid: int) -> float:
    """A process's peak resident memory (VmHWM) in MB; 0 when it exited meanwhile, or is a
    zombie (an exited Python worker not yet reaped: no memory lines)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    return next((int(x.split()[1]) for x in status.splitlines() if x.startswith("VmHWM")), 0) / 1024


def record_peaks() -> None:
    """Peak resident memory (VmHWM) of this process and of the Spark JVM it started."""
    import psutil

    me = psutil.Process()
    for proc in [me, *me.children(recursive=True)]:
        kind = "jvm" if "java" in proc.name() else "python"
        PEAKS[kind] = max(PEAKS.get(kind, 0), peak_rss_mb(proc.pid))


def destination_config(
    work: Path, name: str, destination: dict[str, Any], source: str = "source", **sections: Any
) -> Any:
    """A config whose one destination ``name`` loads a copy of ``work/source``'s sealed
    segments (under ``work/name``), a table per event type, with the implicit browser
    lookups off: the benchmarks that use it compare loading, not enrichment. ``sections``:
    more of the config (``contracts={...}``)."""
    from eventpipe.config import parse_config

    data = work / name
    shutil.copytree(work / source, data / "incoming")
    return parse_config(
        {"data_dir": str(data), "enrichment": {"browser_rules": False},
         "destinations": {name: {**destination, "table_name_template": "{{ event_type }}"}},
         **sections},
        source="bench",
    )  # fmt: skip


def exported_tables(
    database: Path, tables: list[Any], out: Path, staged: bool = False
) -> list[tuple[Any, Path]]:
    """Each of ``tables`` (a name and its columns) read from a DuckDB run's file into a
    Parquet file of its own in ``out``: a table's rows. ``staged``: as the run stages
    them for a destination, its row ids (``_eventpipe_row``) first and timestamps as
    instants (Spark's TIMESTAMP_MICROS, adjusted to UTC)."""
    import duckdb

    from eventpipe.reserved import ROW
    from eventpipe.schema.types import DataType

    out.mkdir(parents=True, exist_ok=True)
    files = []
    with duckdb.connect(str(database), read_only=True) as db:
        db.execute("SET TimeZone = 'UTC'")
        for table in tables:
            path = out / f"{table.name}.parquet"
            listed = ", ".join(
                f'CAST("{c}" AS TIMESTAMPTZ) AS "{c}"'
                if staged and t is DataType.TIMESTAMP
                else f'"{c}"'
                for c, t in table.columns.items()
            )
            if staged:
                listed = f'row_number() OVER () - 1 AS "{ROW}", {listed}'
            db.execute(f"COPY (SELECT {listed} FROM \"{table.name}\") TO $path (FORMAT parquet)",
                       {"path": str(path)})  # fmt: skip
            files.append((table, path))
    return files


def timed(label: str, results: dict[str, float], fn: Any) -> Any:
    started = time.perf_counter()
    value = fn()
    results[label] = time.perf_counter() - started
    print(f"  {label}: {results[label]:.1f} s", flush=True)
    return value


def interleaved(args: argparse.Namespace, spark: Any, config: Any, paths: list[str],
                work: Path) -> None:  # fmt: skip
    """Alternating rounds of eventpipe's steady state (other events each round, as a
    running ``eventpipe process`` sees) and the hand-written job on the same number of
    events; the medians and their ratio."""
    import statistics

    from eventpipe.processing.batch.job import process_once
    from eventpipe.processing.steps.lookup import default_ip_database

    database = default_ip_database()
    hand_written(spark, paths, work / "hand", database)  # its first run decodes the IPs'
    # records; eventpipe's warm-up did as much for its workers
    again = config.model_copy(update={"data_dir": work / "again"})
    generate(again.data_dir / "incoming", args.events, seed=7)
    process_once(again, spark)  # eventpipe's own second run, as in the full benchmark
    ours: list[float] = []
    theirs: list[float] = []
    for round_ in range(args.interleaved):
        data = work / f"round-{round_}"
        generate(data / "incoming", args.events, seed=100 + round_)
        run = config.model_copy(update={"data_dir": data})
        print(f"round {round_ + 1}: eventpipe's steps", flush=True)
        started = time.perf_counter()
        process_once(run, spark)
        ours.append(time.perf_counter() - started)
        shutil.rmtree(data)
        started = time.perf_counter()
        hand_written(spark, paths, work / "hand", database)
        theirs.append(time.perf_counter() - started)
        print(f"round {round_ + 1}: eventpipe {ours[-1]:.1f} s, hand-written job "
              f"{theirs[-1]:.1f} s ({ours[-1] / theirs[-1]:.2f}x)", flush=True)  # fmt: skip
    median_ours, median_theirs = statistics.median(ours), statistics.median(theirs)
    print(
        f"\n{args.events:,} events, {args.interleaved} interleaved rounds: eventpipe "
        f"(steady state, into DuckDB) median {median_ours:.1f} s "
        f"({', '.join(f'{t:.1f}' for t in ours)}), the hand-written job median "
        f"{median_theirs:.1f} s ({', '.join(f'{t:.1f}' for t in theirs)}): "
        f"{median_ours / median_theirs:.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--skip-dlt", action="store_true", help="when dlt is not installed")
    parser.add_argument(
        "--no-lookups", action="store_true",
        help="turn off the implicit browser lookups (geo of 1M random IPs, user agents)",
    )  # fmt: skip
    parser.add_argument(
        "--spark", action="append", default=[], metavar="KEY=VALUE",
        help="a Spark setting for eventpipe's session (spark.driver.memory=1g), repeatable",
    )  # fmt: skip
    parser.add_argument(
        "--dlt-memory-mb", type=int, default=12_000,
        help="stop dlt (run in a child process) when it holds more resident memory",
    )  # fmt: skip
    parser.add_argument(
        "--interleaved", type=int, metavar="N",
        help="only N alternating rounds of eventpipe's steady state and the hand-written job",
    )  # fmt: skip
    parser.add_argument("--dlt-only", nargs=2, metavar=("SOURCE", "WORK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.dlt_only:
        dlt_load(Path(args.dlt_only[0]), Path(args.dlt_only[1]))
        return
    # The job's step timings (read, table names, flatten and type, stage, load) on stderr.
    logging.basicConfig(level=logging.INFO, format="    %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)

    from eventpipe.config import parse_config
    from eventpipe.processing.batch.archiving import prepare_sealed
    from eventpipe.processing.batch.job import process_once
    from eventpipe.processing.runtime.spark import start_session

    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="eventpipe-batch-bench-") as tmp:
        work = Path(tmp)
        source = work / "source"
        size = generate(source, args.events)
        print(f"{args.events:,} events, {size / 1e6:.0f} MB of JSON lines", flush=True)
        data = work / "data"
        shutil.copytree(source, data / "incoming")

        def bench_config(data_dir: Path, kind: str) -> Any:
            return parse_config(
                {"data_dir": str(data_dir), "enrichment": {"browser_rules": not args.no_lookups},
                 "spark": dict(setting.split("=", 1) for setting in args.spark),
                 "destinations": {"warehouse": {
                    "type": kind, "table_name_template": "{{ event_type }}"}}},
                source="bench",
            )  # fmt: skip

        config = bench_config(data, "duckdb")
        spark = timed("spark session start", results,
                      lambda: start_session(config.spark.settings))  # fmt: skip
        paths = [str(p) for p in sorted(source.iterdir())]
        # Warm the session (JIT, class loading, Python workers) with a small earlier run.
        generate(work / "warm" / "incoming", 20_000, seed=1)
        warm = config.model_copy(update={"data_dir": work / "warm"})
        timed("warm-up: eventpipe on 20,000 other events", results,
              lambda: process_once(warm, spark))  # fmt: skip
        spark.read.json(paths[0]).limit(1000).count()
        if args.interleaved:
            interleaved(args, spark, config, paths, work)
            spark.stop()
            return
        # The floor varied from 5.8 s to 8.6 s between runs here: its median of three.
        floors = []
        for attempt in range(3):
            timed(f"spark floor: read.json -> parquet (#{attempt + 1})", results,
                  lambda: spark.read.json(paths).write.mode("overwrite")
                  .parquet(str(work / "floor")))  # fmt: skip
            floors.append(results.pop(f"spark floor: read.json -> parquet (#{attempt + 1})"))
        results["spark floor: read.json -> parquet"] = sorted(floors)[1]
        print(f"  spark floor, median of 3: {sorted(floors)[1]:.1f} s", flush=True)
        if not args.no_lookups:
            from eventpipe.processing.steps.lookup import default_ip_database

            # Twice, the second timed: the first decodes the IP database's records that
            # eventpipe's runs after it then find in the workers' memo.
            database = default_ip_database()
            hand_written(spark, paths, work / "hand", database)
            timed(HAND, results, lambda: hand_written(spark, paths, work / "hand", database))
        report = timed("eventpipe process --once -> duckdb", results,
                       lambda: process_once(config, spark))  # fmt: skip
        # Again, as a running `eventpipe process` would, on as many other events (another
        # seed: other IPs and ids) in a fresh data directory: the JVM's code is compiled by
        # now, and the workers keep the IP database's records they decoded.
        generate(work / "again" / "incoming", args.events, seed=7)
        again = config.model_copy(update={"data_dir": work / "again"})
        timed("eventpipe again, on other events (steady state)", results,
              lambda: process_once(again, spark))  # fmt: skip
        # As `eventpipe process` runs it: its segments sealed during the wait between two
        # runs, compressed for the archive and their schemas inferred in that wait (Spark
        # idle), timed apart.
        generate(work / "service" / "incoming", args.events, seed=13)
        service = config.model_copy(update={"data_dir": work / "service"})
        timed(WAITED, results, lambda: prepare_sealed(service, spark))
        timed(SERVICE, results, lambda: process_once(service, spark))
        record_peaks()  # of the runs into DuckDB, as before the runs that follow
        # The steady state into a Parquet lake, what the hand-written job writes, on yet
        # other events (seen IPs would be found in the workers' memo).
        generate(work / "lake" / "incoming", args.events, seed=11)
        lake = bench_config(work / "lake", "parquet")
        timed(LAKE, results, lambda: process_once(lake, spark))
        if HAND in results:
            timed(HAND_LOAD, results, lambda: load_by_hand(work / "hand", work / "hand.duckdb"))
            archive = work / "hand-archive"
            timed(HAND_ARCHIVE, results, lambda: archive_by_hand(paths, archive, config.archive))
        loaded = sum(report.loaded.values()) if report else 0
        spark.stop()

        import duckdb

        db = duckdb.connect(str(work / "peer.duckdb"))
        timed("duckdb read_json_auto -> table", results, lambda: db.execute(
            f"CREATE TABLE events AS SELECT * FROM read_json_auto({[str(p) for p in sorted(source.iterdir())]})"  # noqa: E501
        ))  # fmt: skip
        db.close()

        if not args.skip_dlt:
            # In a child process of its own, watched: on 1M of these events dlt grew past
            # 22 GB and the kernel's OOM killer took the whole benchmark with it.
            died = run_dlt(source, work, args.dlt_memory_mb, results)
            if died:
                print(f"  dlt -> duckdb: {died}", flush=True)

    ep = results["eventpipe process --once -> duckdb"]
    floor = results["spark floor: read.json -> parquet"]
    print(f"\neventpipe loaded {loaded:,} rows")
    print(f"eventpipe: {args.events / ep:,.0f} events/s; {ep / floor:.2f}x the Spark floor's time")
    steady = results["eventpipe again, on other events (steady state)"]
    print(
        f"eventpipe steady state: {args.events / steady:,.0f} events/s; "
        f"{steady / floor:.2f}x the Spark floor's time"
    )
    run = results[SERVICE]
    print(
        f"eventpipe's run in a service ({results[WAITED]:.1f} s of archiving and inference in "
        f"the wait before it): {args.events / run:,.0f} events/s; {run / floor:.2f}x the "
        "floor's time"
    )
    hand = results.get(HAND)
    if hand:
        print(
            f"hand-written job with lookups: {hand / floor:.2f}x the floor's time; eventpipe "
            f"(steady state) {steady / hand:.2f}x the hand-written job's"
        )
    if hand:
        print(f"eventpipe's run in a service: {run / hand:.2f}x the hand-written job's")
    if hand and HAND_LOAD in results and HAND_ARCHIVE in results:
        extras = hand + results[HAND_LOAD] + results[HAND_ARCHIVE]
        print(
            f"hand-written job, then its DuckDB load and the archive: {extras:.1f} s; "
            f"eventpipe (steady state) {steady / extras:.2f}x that"
        )
    if hand and LAKE in results:
        print(
            f"eventpipe steady state into a Parquet lake: {results[LAKE] / hand:.2f}x the "
            "hand-written job's (which writes Parquet too)"
        )
    if "dlt -> duckdb" in results:
        print(f"dlt / eventpipe time: {results['dlt -> duckdb'] / ep:.2f}x")
    duck = results["duckdb read_json_auto -> table"]
    print(f"duckdb read_json_auto / eventpipe time: {duck / ep:.2f}x")
    print(f"peak RSS of the runs into DuckDB: python driver {PEAKS.get('python', 0):.0f} MB, "
          f"Spark JVM {PEAKS.get('jvm', 0):.0f} MB")  # fmt: skip


if __name__ == "__main__":
    main()
