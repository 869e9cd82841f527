"""Lakehouse benchmark: Iceberg and Delta next to DuckDB and plain Parquet, in one run.

    .venv/bin/python bench/lakehouse.py --events 1000000 --rows 1000000

1. The pipeline: `process --once` of the same events (bench/batch.py: 5 event types,
   nested, varying types; three days) into one destination at a time (duckdb,
   parquet, iceberg, delta), one Spark session; the total and the table loads' wall
   time (the step that differs) are reported.
2. The commit path, on one table of ``--rows`` rows (15 columns, three days) staged as
   Parquet files, as the pipeline stages them:
   * plain Parquet files (the parquet destination: DuckDB's partitioned COPY): the floor
     of writing the data files;
   * eventpipe's Iceberg and Delta loads (DuckDB converts to Arrow, the library writes
     and commits);
   * the alternative the choice was measured against: the data files written by DuckDB
     (as for Parquet), then registered in one Iceberg commit with ``add_files``;
   * upserts: 10% of the keys again, newer, by primary key (Delta MERGE, Iceberg upsert),
     into the table of ``--rows`` rows.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from postgres import LoadSteps  # noqa: E402

DESTINATIONS = {
    "duckdb": {"type": "duckdb"},
    "parquet": {"type": "parquet"},
    "iceberg": {"type": "iceberg"},
    "delta": {"type": "delta"},
}


def pipeline(events: int, work: Path) -> dict[str, tuple[float, float]]:
    """(total, table loads) seconds of `process --once` per destination type."""
    from batch import generate
    from eventpipe.config import parse_config
    from eventpipe.processing.batch.job import process_once
    from eventpipe.processing.runtime.spark import start_session

    steps = LoadSteps()
    processing = logging.getLogger("eventpipe.processing")
    processing.addHandler(steps)  # its step lines, not printed
    processing.setLevel(logging.INFO)
    processing.propagate = False
    size = generate(work / "source", events)
    print(f"{events:,} events, {size / 1e6:.0f} MB of JSON lines", flush=True)
    spark = None
    results = {}
    for name, dest in [("warm-up", DESTINATIONS["duckdb"]), *DESTINATIONS.items()]:
        data = work / f"data-{name}"
        shutil.copytree(work / "source", data / "incoming")
        config = parse_config(
            {"data_dir": str(data), "enrichment": {"browser_rules": False},
             "destinations": {"d": {**dest, "table_name_template": "{{ event_type }}"}}},
            source="bench",
        )  # fmt: skip
        spark = spark or start_session(config.spark.settings)
        steps.seconds = 0.0
        started = time.perf_counter()
        report = process_once(config, spark)
        total = time.perf_counter() - started
        assert report is not None
        assert sum(report.loaded.values()) > 0
        if name != "warm-up":
            results[name] = (total, steps.seconds)
            files = len(list((data / name).rglob("*.parquet"))) if name != "duckdb" else 0
            written = f", {files} data files" if files else ""
            print(f"  process --once -> {name}: {total:.1f} s (table loads {steps.seconds:.1f} s"
                  f"{written})", flush=True)  # fmt: skip
        shutil.rmtree(data)
    return results


def staged_table(path: Path, rows: int, first: int = 0, shift: int = 0) -> list[Path]:
    """``rows`` rows of 15 columns over three days, in four Parquet files."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.mkdir(parents=True)
    rng = np.random.default_rng(7 + shift)
    start = datetime(2026, 11, 20, tzinfo=UTC) + timedelta(seconds=shift)
    ids = np.arange(first, first + rows)
    table = pa.table({
        "id": pa.array([f"e{i}" for i in ids]),
        "_timestamp": pa.array([start + timedelta(seconds=int(s)) for s in ids % 259_200],
                               pa.timestamp("us")),
        "user_id": pa.array(rng.integers(0, 100_000, rows)),
        "revenue": pa.array(rng.random(rows) * 100),
        "ok": pa.array(rng.random(rows) > 0.5),
        **{f"prop_{k}": pa.array([f"value-{k}-{v}" for v in rng.integers(0, 1000, rows)])
           for k in range(10)},
    })  # fmt: skip
    files = []
    for n, offset in enumerate(range(0, rows, -(-rows // 4))):
        file = path / f"part-{n}.parquet"
        pq.write_table(table.slice(offset, -(-rows // 4)), file)
        files.append(file)
    return files


def commits(rows: int, work: Path) -> dict[str, float]:
    import duckdb

    from eventpipe.destinations.base import LoadRequest
    from eventpipe.destinations.delta import DeltaDestination
    from eventpipe.destinations.iceberg import IcebergDestination
    from eventpipe.destinations.parquet import ParquetDestination
    from eventpipe.locks import FileLocks
    from eventpipe.schema.diff import Table, diff
    from eventpipe.schema.types import DataType as T

    files = staged_table(work / "staged", rows)
    columns = {
        "id": T.STRING,
        "_timestamp": T.TIMESTAMP,
        "user_id": T.INT64,
        "revenue": T.FLOAT64,
        "ok": T.BOOL,
        **{f"prop_{k}": T.STRING for k in range(10)},
    }
    locks = FileLocks(work / "locks")
    catalog = {"type": "sql", "uri": f"sqlite:///{work / 'catalog.db'}"}
    lakes: dict[str, Any] = {
        "parquet files (DuckDB COPY)": ParquetDestination("p", work / "parquet", locks),
        "iceberg append (eventpipe)": IcebergDestination(
            "i", work / "iceberg", locks, catalog, "i"),
        "delta write (eventpipe)": DeltaDestination("d", work / "delta", locks),
    }  # fmt: skip
    results: dict[str, float] = {}
    print(f"{rows:,} rows, 15 columns, three days, in {len(files)} staged files", flush=True)
    for label, dest in lakes.items():
        dest.patch(diff(None, Table("t", columns)))
        started = time.perf_counter()
        loaded = dest.load(LoadRequest("t", "b1", tuple(files), columns))
        results[label] = time.perf_counter() - started
        assert loaded.rows == rows
        root = Path(dest.location.uri) if hasattr(dest, "location") else dest.root
        written = len(list(root.rglob("*.parquet")))
        print(f"  {label}: {results[label]:.1f} s, {written} data files", flush=True)
        if label != "parquet files (DuckDB COPY)":  # the conversion's share, alone
            described = dest.describe("t")
            started = time.perf_counter()
            dest._rows(LoadRequest("t", "b1", tuple(files), columns), described)
            converted = time.perf_counter() - started
            print(f"    of which DuckDB's conversion to Arrow: {converted:.1f} s; the library's "
                  f"write and commit: {results[label] - converted:.1f} s", flush=True)  # fmt: skip

    # The alternative: DuckDB writes the data files, one Iceberg commit adds them.
    iceberg = lakes["iceberg append (eventpipe)"]
    iceberg.patch(diff(None, Table("added", columns)))
    table = iceberg.catalog.load_table(("i", "added"))
    started = time.perf_counter()
    target = work / "iceberg" / "added" / "data"
    listed = ", ".join(f"'{f}'" for f in files)
    duckdb.execute("SET TimeZone = 'UTC'")
    duckdb.execute(
        f"COPY (SELECT * REPLACE (_timestamp::TIMESTAMPTZ AS _timestamp), "
        f"strftime(_timestamp, '%Y-%m-%d') AS day FROM read_parquet([{listed}])) "
        f"TO '{target}' (FORMAT parquet, PARTITION_BY (day))"
    )
    written = time.perf_counter() - started
    table.add_files([str(p) for p in sorted(target.rglob("*.parquet"))])
    label = "iceberg add_files of DuckDB's files"
    results[label] = time.perf_counter() - started
    print(f"  {label}: {results[label]:.1f} s (files {written:.1f} s, the commit "
          f"{results[label] - written:.1f} s)", flush=True)  # fmt: skip

    # Upserts: a tenth of the keys again, a second newer, by primary key.
    changed = staged_table(work / "changed", rows // 10, first=0, shift=1)
    for name, dest in (("iceberg", iceberg), ("delta", lakes["delta write (eventpipe)"])):
        dest.patch(diff(None, Table("keyed", columns, primary_key=("id",))))
        dest.load(LoadRequest("keyed", "k1", tuple(files), columns, ("id",)))
        started = time.perf_counter()
        dest.load(LoadRequest("keyed", "k2", tuple(changed), columns, ("id",)))
        label = f"{name} upsert of {rows // 10:,} keys into {rows:,} rows"
        results[label] = time.perf_counter() - started
        print(f"  {label}: {results[label]:.1f} s", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--skip-pipeline", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="eventpipe-lake-bench-", dir="/var/tmp") as tmp:
        work = Path(tmp)
        runs = {} if args.skip_pipeline else pipeline(args.events, work / "pipeline")
        found = commits(args.rows, work / "commits")
    print("\nratios in this run:")
    if runs:
        duck_total, duck_loads = runs["duckdb"]
        for name, (total, loads) in runs.items():
            print(f"  process --once -> {name}: {total / duck_total:.2f}x duckdb's total, "
                  f"table loads {loads / duck_loads:.2f}x")  # fmt: skip
    floor = found["parquet files (DuckDB COPY)"]
    for label, seconds in found.items():
        print(f"  {label}: {seconds / floor:.2f}x the plain Parquet files")


if __name__ == "__main__":
    main()
