"""Pipeline on a cluster: the same events processed on ``local[2]`` and on a standalone
cluster of two one-core workers (tests/standalone.py), side by side in one run.

    .venv/bin/python bench/cluster.py --events 1000000

Both runs are eventpipe's ``process_once`` into DuckDB with the implicit browser lookups
(the events of bench/batch.py), from this process as the driver, each on a warm session
(one earlier run of 20,000 other events, as a running ``eventpipe process`` has). The
data directories are under ``/var/tmp``, which the workers see; their ``/tmp`` is their
own. Also timed: the cluster's start (master and workers up), each session's start, and
the Spark floor (``read.json`` -> Parquet) on each, for scale.

What this measures on one machine: the cost of running distributed (executors in
JVMs of their own, shuffles over the network stack, tasks scheduled by a master) with
the same two cores. Driver, master, workers and executors share those cores, so the
per-core figure is a floor for a real cluster, whose executors have their cores to
themselves.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))  # tests.standalone: the cluster the tests start

from batch import generate, timed  # noqa: E402 - bench/, the script's directory


def run_side(
    name: str, spark_settings: dict[str, Any], work: Path, source: Path, results: dict[str, float]
) -> int:
    """Session start, warm-up, floor, and the timed run on one side; rows loaded."""
    from eventpipe.config import parse_config
    from eventpipe.processing.batch.job import process_once
    from eventpipe.processing.runtime.spark import start_session

    def config(data: Path) -> Any:
        return parse_config(
            {"data_dir": str(data), "spark": spark_settings,
             "destinations": {"warehouse": {
                 "type": "duckdb", "table_name_template": "{{ event_type }}"}}},
            source="bench", env={},
        )  # fmt: skip

    side = work / name.partition("[")[0]  # Spark reads paths as globs: no brackets
    shutil.copytree(source, side / "data" / "incoming")
    generate(side / "warm" / "incoming", 20_000, seed=1)
    spark = timed(f"{name}: session start", results,
                  lambda: start_session(config(side / "data").spark.settings))  # fmt: skip
    try:
        timed(f"{name}: warm-up on 20,000 other events", results,
              lambda: process_once(config(side / "warm"), spark))  # fmt: skip
        paths = [str(p) for p in sorted((side / "data" / "incoming").iterdir())]
        timed(f"{name}: spark floor, read.json -> parquet", results,
              lambda: spark.read.json(paths).write.mode("overwrite")
              .parquet(str(side / "floor")))  # fmt: skip
        report = timed(f"{name}: eventpipe process_once -> duckdb", results,
                       lambda: process_once(config(side / "data"), spark))  # fmt: skip
        return sum(report.loaded.values()) if report else 0
    finally:
        spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--executor-memory", default="2g")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    from tests.standalone import standalone_cluster

    results: dict[str, float] = {}
    work = Path("/var/tmp") / f"eventpipe-cluster-bench-{uuid.uuid4().hex[:8]}"
    work.mkdir()
    try:
        source = work / "source"
        size = generate(source, args.events)
        print(f"{args.events:,} events, {size / 1e6:.0f} MB of JSON lines", flush=True)
        local_rows = run_side("local[2]", {"master": "local[2]", "sql.shuffle.partitions": 4},
                              work, source, results)  # fmt: skip
        with tempfile.TemporaryDirectory(prefix="cluster-logs-") as logs:
            started = time.perf_counter()
            with standalone_cluster(Path(logs), workers=2, worker_memory="3g") as cluster:
                results["cluster start: master and 2 workers up"] = time.perf_counter() - started
                print(f"  cluster start: {results['cluster start: master and 2 workers up']:.1f} s")
                settings = {**cluster.spark_settings(args.executor_memory),
                            "sql.shuffle.partitions": 4}  # fmt: skip
                cluster_rows = run_side("cluster", settings, work, source, results)
        assert local_rows == cluster_rows, (local_rows, cluster_rows)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    local = results["local[2]: eventpipe process_once -> duckdb"]
    remote = results["cluster: eventpipe process_once -> duckdb"]
    print(f"\n{args.events:,} events, {local_rows:,} rows on each side; 2 executor cores each")
    print(f"{'':58} {'s':>7} {'events/s':>10} {'per core':>9}")
    for label, seconds in results.items():
        rate = args.events / seconds if "process_once" in label or "floor" in label else None
        line = f"{label:58} {seconds:7.1f}"
        if rate is not None:
            line += f" {rate:10,.0f} {rate / 2:9,.0f}"
        print(line)
    print(f"\ncluster / local[2], eventpipe: {remote / local:.2f}x the time")
    floor_ratio = (results["cluster: spark floor, read.json -> parquet"]
                   / results["local[2]: spark floor, read.json -> parquet"])  # fmt: skip
    print(f"cluster / local[2], spark floor: {floor_ratio:.2f}x the time")


if __name__ == "__main__":
    main()
