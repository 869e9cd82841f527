"""Metering benchmark (issue 9): dedup + product classification of 1,000,000 usage
events against 100 products, eventpipe next to the same SQL run directly in Spark SQL and
in DuckDB, in one run.

    .venv/bin/python bench/metering.py --events 1000000

The events (~250 bytes each, in segments of 250,000): 25 event names with 4 products
each (no filter; ``_in``; ``not_in`` with ``optional``; ``_in`` and ``not_in`` on two
paths), a 26th name no product has (unclassified), 6% exact duplicates, 3% corrections
(same key, newer ``received_at``), 2% events 200 days old (outside the 90-day window).

* eventpipe: ``process_pending`` into DuckDB with ``metering:`` (read, dedup in the batch
  and against the tables, classify, flatten, type, load ``usage_events`` and
  ``unclassified``, archive the segments), as ``eventpipe process --once`` does;
* Spark SQL: the seed's SQL (ROW_NUMBER over the window, a join with the catalogue's
  tables, the filter semantics as joins) over the same files read as text, both tables
  written as Parquet, in eventpipe's Spark session;
* DuckDB: the same SQL text over ``read_json_objects``, into tables of a database file.

The three give the same rows: the bench checks their counts and usage sums per product.
The Spark session is warmed up on 20,000 other events first.
"""

from __future__ import annotations

import argparse
import logging
import random
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

NAMES = [f"feature_{i:02d}" for i in range(25)]
NOW = datetime(2026, 11, 21, 12, tzinfo=UTC)


def catalogue() -> list[dict[str, Any]]:
    """100 products: four per event name, one of each kind of filter."""
    products: list[dict[str, Any]] = []
    for name in NAMES:
        products += [
            {"product_uid": f"{name}-all", "event_name": name},
            {"product_uid": f"{name}-eu", "event_name": name,
             "filters": [{"path": "$.properties.region", "_in": ["eu"]}]},
            {"product_uid": f"{name}-paid", "event_name": name,
             "filters": [{"path": "$.properties.tier", "not_in": ["free"], "optional": True}]},
            {"product_uid": f"{name}-big", "event_name": name,
             "filters": [{"path": "$.properties.size", "_in": ["large", "xl"]},
                         {"path": "$.properties.region", "not_in": ["apac"]}]},
        ]  # fmt: skip
    return products


def generate(incoming: Path, events: int, seed: int = 2026, per_segment: int = 250_000) -> int:
    """``events`` usage events as sealed segments in ``incoming``; the bytes written."""
    rng = random.Random(seed)
    incoming.mkdir(parents=True)
    sent: list[dict[str, Any]] = []
    total = 0
    for part in range(0, events, per_segment):
        lines = []
        for n in range(part, min(part + per_segment, events)):
            received = (NOW - timedelta(seconds=events - n)).isoformat()
            roll = rng.random()
            if sent and roll < 0.06:  # an exact duplicate
                event = rng.choice(sent)
            elif sent and roll < 0.09:  # a correction: same key, newer, changed
                event = {**_event(rng, n), "transaction_id": rng.choice(sent)["transaction_id"],
                         "received_at": received}  # fmt: skip
            else:
                event = {**_event(rng, n), "received_at": received}
                if roll > 0.98:  # late: outside the window
                    event["metered_at"] = (NOW - timedelta(days=200)).isoformat()
            if len(sent) < 50_000:
                sent.append(event)
            else:
                sent[rng.randrange(len(sent))] = event
            lines.append(orjson.dumps(event) + b"\n")
        data = b"".join(lines)
        (incoming / f"incoming.tok=web-2026-11-21T10-00-{part // per_segment:02d}.000.log"
         ).write_bytes(data)  # fmt: skip
        total += len(data)
    return total


def _event(rng: random.Random, n: int) -> dict[str, Any]:
    properties: dict[str, Any] = {
        "name": rng.choice(NAMES) if rng.random() < 0.96 else "unknown_feature",
        "usage": rng.randint(1, 1000),
    }
    for key, choices in (("region", ["eu", "us", "apac"]), ("tier", ["free", "pro", "team"]),
                         ("size", ["small", "large", "xl"])):  # fmt: skip
        if rng.random() < 0.8:
            properties[key] = rng.choice(choices)
    metered = NOW - timedelta(seconds=rng.randint(0, 80 * 86400))
    return {"transaction_id": f"tx-{n}", "customer_id": f"c{rng.randint(1, 500)}",
            "metered_at": metered.isoformat(), "properties": properties}  # fmt: skip


SQL = """
WITH events AS (
    SELECT id, doc,
           {json}(doc, '$.transaction_id') AS transaction_id,
           {json}(doc, '$.properties.name') AS name,
           CAST({json}(doc, '$.received_at') AS TIMESTAMP) AS received_at,
           CAST({json}(doc, '$.metered_at') AS TIMESTAMP) AS metered_at
    FROM raw
),
kept AS (                         -- the seed's dedup: newest per key inside the window
    SELECT id, doc, name, transaction_id FROM (
        SELECT e.*, ROW_NUMBER() OVER (
            PARTITION BY transaction_id ORDER BY received_at DESC, id DESC) AS rank
        FROM events e WHERE metered_at >= TIMESTAMP '{cutoff}'
    ) ranked WHERE rank = 1
    UNION ALL                     -- older than the window: compared with nothing
    SELECT id, doc, name, transaction_id FROM events WHERE metered_at < TIMESTAMP '{cutoff}'
),
candidates AS (                   -- the products of the event's name
    SELECT k.id, p.product_uid FROM kept k JOIN products p ON p.event_name = k.name
),
checked AS (                      -- each candidate's filters, with the event's value
    SELECT c.id, c.product_uid, f.path, f.optional, f.listed,
           {json}(k.doc, f.path) AS value
    FROM candidates c
    JOIN kept k ON k.id = c.id
    JOIN filters f ON f.product_uid = c.product_uid
),
failing AS (                      -- missing and not optional; not in _in; in not_in
    SELECT DISTINCT v.id, v.product_uid
    FROM checked v
    LEFT JOIN allowed a ON a.product_uid = v.product_uid AND a.path = v.path
                       AND a.value = v.value
    LEFT JOIN refused r ON r.product_uid = v.product_uid AND r.path = v.path
                       AND r.value = v.value
    WHERE CASE WHEN v.value IS NULL THEN NOT v.optional
               ELSE (v.listed AND a.value IS NULL) OR r.value IS NOT NULL END
),
matched AS (
    SELECT c.id, c.product_uid FROM candidates c
    LEFT JOIN failing x ON x.id = c.id AND x.product_uid = c.product_uid
    WHERE x.id IS NULL
)
"""
"""Seed 5 in SQL both engines run: ``raw`` is (id, doc: the event's JSON text);
``products``, ``filters`` (listed: the filter has ``_in`` values), ``allowed`` and
``refused`` hold the catalogue."""

USAGE = "SELECT m.product_uid, k.doc FROM matched m JOIN kept k ON k.id = m.id"
UNCLASSIFIED = "SELECT k.doc FROM kept k LEFT JOIN matched m ON m.id = k.id WHERE m.id IS NULL"


def catalogue_rows(products: list[dict[str, Any]]) -> dict[str, list[tuple[Any, ...]]]:
    """The catalogue as the rows of the SQL's four tables."""
    rows: dict[str, list[tuple[Any, ...]]] = {
        "products": [], "filters": [], "allowed": [], "refused": []}  # fmt: skip
    for p in products:
        rows["products"].append((p["product_uid"], p["event_name"]))
        for f in p.get("filters", []):
            uid, path = p["product_uid"], f["path"]
            rows["filters"].append((uid, path, bool(f.get("optional")), bool(f.get("_in"))))
            rows["allowed"] += [(uid, path, v) for v in f.get("_in", [])]
            rows["refused"] += [(uid, path, v) for v in f.get("not_in", [])]
    return rows


COLUMNS = {
    "products": "product_uid STRING, event_name STRING",
    "filters": "product_uid STRING, path STRING, optional BOOLEAN, listed BOOLEAN",
    "allowed": "product_uid STRING, path STRING, value STRING",
    "refused": "product_uid STRING, path STRING, value STRING",
}


def run_spark(spark: Any, paths: list[str], out: Path, cutoff: str) -> None:
    from pyspark.sql import functions as F

    for table, rows in catalogue_rows(catalogue()).items():
        spark.createDataFrame(rows, COLUMNS[table]).createOrReplaceTempView(table)
    raw = spark.read.text(paths).select(
        F.monotonically_increasing_id().alias("id"), F.col("value").alias("doc")
    )
    raw.createOrReplaceTempView("raw")
    common = SQL.format(json="get_json_object", cutoff=cutoff)
    # Both outputs from one plan: the kept events with their products (null: none,
    # the unclassified).
    both = spark.sql(common + "SELECT m.product_uid, k.doc FROM kept k "
                     "LEFT JOIN matched m ON m.id = k.id")  # fmt: skip
    both.write.mode("overwrite").parquet(str(out))


def run_duckdb(db: Any, paths: list[str], cutoff: str) -> None:
    for table, rows in catalogue_rows(catalogue()).items():
        db.execute(f"CREATE TABLE {table} ({COLUMNS[table].replace('STRING', 'VARCHAR')})")
        if rows:
            db.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(rows[0]))})", rows)
    db.execute(
        "CREATE TEMP TABLE raw AS SELECT row_number() OVER () AS id, json AS doc "
        f"FROM read_json_objects({paths!r}, format = 'newline_delimited')"
    )
    common = SQL.format(json="json_extract_string", cutoff=cutoff)
    db.execute(f"CREATE TEMP TABLE matched_ AS {common} SELECT * FROM matched")
    db.execute(f"CREATE TEMP TABLE kept_ AS {common} SELECT * FROM kept")
    db.execute("CREATE TABLE usage_events AS SELECT m.product_uid, k.doc "
               "FROM matched_ m JOIN kept_ k ON k.id = m.id")  # fmt: skip
    db.execute("CREATE TABLE unclassified AS SELECT k.doc FROM kept_ k "
               "LEFT JOIN matched_ m ON m.id = k.id WHERE m.id IS NULL")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    args = parser.parse_args()
    # The job's step timings (read, dedup and classify, stage, load) on stderr.
    logging.basicConfig(level=logging.INFO, format="    %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)

    import duckdb

    from eventpipe.config import Config, parse_config
    from eventpipe.processing.batch.job import process_pending
    from eventpipe.processing.runtime.spark import start_session

    def config(data: Path, products: Path) -> Config:
        return parse_config({"data_dir": str(data), "destinations": {"billing": {
            "type": "duckdb", "metering": {"products": str(products)}}}},
            source="bench")  # fmt: skip

    results: dict[str, float] = {}

    def timed(label: str, fn: Any) -> None:
        started = time.perf_counter()
        fn()
        results[label] = time.perf_counter() - started
        print(f"  {label}: {results[label]:.1f} s", flush=True)

    with tempfile.TemporaryDirectory(prefix="eventpipe-metering-bench-") as tmp:
        work = Path(tmp)
        products = work / "products.yaml"
        products.write_text(yaml.safe_dump(catalogue()))
        size = generate(work / "source", args.events)
        paths = [str(p) for p in sorted((work / "source").iterdir())]
        print(f"{args.events:,} events, {size / 1e6:.0f} MB, {len(catalogue())} products",
              flush=True)  # fmt: skip
        # Warm-up on 20,000 other events: JIT, class loading, Python workers.
        generate(work / "warm-source", 20_000, seed=1)
        shutil.copytree(work / "warm-source", work / "warm" / "incoming")
        warm = config(work / "warm", products)
        spark = start_session(warm.spark.settings)
        cutoff = (datetime.now(UTC) - timedelta(days=90)).strftime("%Y-%m-%d %H:%M:%S")
        process_pending(warm, spark)
        run_spark(spark, [str(p) for p in (work / "warm-source").iterdir()],
                  work / "spark-warm", cutoff)  # fmt: skip

        timed("spark sql -> parquet", lambda: run_spark(spark, paths, work / "spark", cutoff))
        db = duckdb.connect(str(work / "peer.duckdb"))
        timed("duckdb sql -> tables", lambda: run_duckdb(db, paths, cutoff))
        data = work / "data"
        shutil.copytree(work / "source", data / "incoming")
        ours = config(data, products)
        timed("eventpipe process --once -> duckdb (metering)",
              lambda: process_pending(ours, spark))  # fmt: skip

        # The same rows in all three: counts and usage per product.
        peer = db.execute(
            "SELECT product_uid, count(*), "
            "sum(CAST(json_extract_string(doc, '$.properties.usage') AS BIGINT)) "
            "FROM usage_events GROUP BY 1 ORDER BY 1"
        ).fetchall()
        peer_unclassified = db.execute("SELECT count(*) FROM unclassified").fetchone()
        db.close()
        sparked = spark.read.parquet(str(work / "spark"))
        sparked.createOrReplaceTempView("sparked")
        spark_usage = [tuple(r) for r in spark.sql(
            "SELECT product_uid, count(*), "
            "sum(CAST(get_json_object(doc, '$.properties.usage') AS BIGINT)) "
            "FROM sparked WHERE product_uid IS NOT NULL GROUP BY 1 ORDER BY 1"
        ).collect()]  # fmt: skip
        spark_unclassified = sparked.filter("product_uid IS NULL").count()
        spark.stop()
        with duckdb.connect(str(data / "warehouse.duckdb"), read_only=True) as ep:
            mine = ep.execute(
                "SELECT product_uid, count(*), sum(properties_usage) FROM usage_events "
                "GROUP BY 1 ORDER BY 1"
            ).fetchall()
            mine_unclassified = ep.execute("SELECT count(*) FROM unclassified").fetchone()
        assert mine == peer == spark_usage, "the three disagree on usage_events"
        assert mine_unclassified == peer_unclassified == (spark_unclassified,), (
            mine_unclassified, peer_unclassified, spark_unclassified)  # fmt: skip
        rows = sum(r[1] for r in mine)
        print(f"usage_events: {rows:,} rows in {len(mine)} products; "
              f"unclassified: {spark_unclassified:,}; the three agree")  # fmt: skip
        ep_time = results["eventpipe process --once -> duckdb (metering)"]
        for label in ("spark sql -> parquet", "duckdb sql -> tables"):
            print(f"eventpipe / {label.split(' ->')[0]}: {ep_time / results[label]:.2f}x the time")
        print(f"eventpipe: {args.events / ep_time:,.0f} events/s")


if __name__ == "__main__":
    main()
