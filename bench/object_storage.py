"""Object storage benchmark: eventpipe's loads of the lakes on S3, and the archive's upload,
beside the plain upload of the same bytes to the same server, in one run.

    .venv/bin/python bench/object_storage.py --rows 1000000 --segments 20

The server is moto's S3 (tests/s3.py: the stand-in the tests run, in-memory, Python),
so the ratios say what eventpipe's own work costs beside moving the bytes, not how fast
AWS S3 is.

1. A table of ``--rows`` rows (15 columns, three days) staged as four Parquet files, as a
   run stages them (bench/lakehouse.py).
2. The floor: those files uploaded to the bucket as they are (pyarrow's ``copy_files``:
   no conversion, no partitions, no record).
3. eventpipe's loads of the same files into a Parquet lake, an Iceberg table and a Delta
   table on the bucket (conversion by DuckDB, a file per day, the commit or the record),
   and each format's own writer given the same rows as one Arrow table (delta-rs's
   ``write_deltalake``, pyiceberg's ``append``): what eventpipe adds to the library.
4. The archive: ``--segments`` segments of the batch benchmark's events archived on disk,
   then uploaded by the run's step (``upload_archived``: a listing per day, four objects
   per segment) beside ``copy_files`` of the same files.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from lakehouse import staged_table  # noqa: E402

ARCHIVE_FLOOR = "floor: the archive's files uploaded as they are"
UPLOAD = "eventpipe's upload after a run"


def _timed(what: str, results: dict[str, float], action: Any) -> Any:
    started = time.perf_counter()
    value = action()
    results[what] = time.perf_counter() - started
    print(f"  {what}: {results[what]:.2f} s", flush=True)
    return value


def lakes(server: Any, rows: int, work: Path) -> dict[str, float]:
    import duckdb
    import pyarrow.fs as pafs
    from deltalake import write_deltalake
    from pyiceberg.catalog.sql import SqlCatalog
    from tests.s3 import open_lake

    from eventpipe.destinations.base import LoadRequest
    from eventpipe.objectstore import Location, S3Settings
    from eventpipe.schema.diff import Table, diff
    from eventpipe.schema.types import DataType as T

    files = staged_table(work / "staged", rows)
    columns = {"id": T.STRING, "_timestamp": T.TIMESTAMP, "user_id": T.INT64,
               "revenue": T.FLOAT64, "ok": T.BOOL,
               **{f"prop_{k}": T.STRING for k in range(10)}}  # fmt: skip
    settings = S3Settings(**server.settings())
    bucket = server.bucket()
    fs = settings.filesystem()
    results: dict[str, float] = {}
    print(f"{rows:,} rows, 15 columns, three days, in {len(files)} staged files", flush=True)
    _timed("floor: the staged files uploaded as they are", results, lambda: [
        pafs.copy_files(str(f), f"{bucket}/floor/{f.name}", destination_filesystem=fs)
        for f in files
    ])  # fmt: skip
    for kind in ("parquet", "iceberg", "delta"):
        dest = open_lake(kind, Location.of(f"s3://{bucket}/{kind}", settings), work / kind)
        dest.patch(diff(None, Table("t", columns)))
        request = LoadRequest("t", "b1", tuple(files), columns)
        loaded = _timed(f"eventpipe {kind} load", results, lambda d=dest, r=request: d.load(r))
        assert loaded.rows == rows
    table = duckdb.sql(
        "SELECT * REPLACE (_timestamp::TIMESTAMPTZ AS _timestamp) FROM read_parquet(?)",
        params=[[str(f) for f in files]],
    ).to_arrow_table()
    options = settings.delta_options()
    target = f"s3://{bucket}/plain-delta"
    _timed("delta-rs write_deltalake of the rows", results,
           lambda: write_deltalake(target, table, storage_options=options))  # fmt: skip
    catalog = SqlCatalog("b", uri=f"sqlite:///{work / 'plain.db'}",
                         warehouse=f"s3://{bucket}/plain-iceberg",
                         **settings.iceberg_properties())  # fmt: skip
    catalog.create_namespace("b")
    plain = catalog.create_table("b.t", schema=table.schema)
    _timed("pyiceberg append of the rows", results, lambda: plain.append(table))
    return results


def archive(server: Any, segments: int, work: Path) -> dict[str, float]:
    import pyarrow.fs as pafs
    from tests.conftest import make_config

    from batch import generate
    from eventpipe.archive.files import day_dirs, segments_of_day
    from eventpipe.archive.write import archive_segment
    from eventpipe.config import ArchiveConfig
    from eventpipe.paths import DataLayout
    from eventpipe.processing.batch.archiving import upload_archived

    bucket = server.bucket()
    config = make_config(work / "data", archive={"remote": f"s3://{bucket}/archive",
                                                 "s3": server.settings()})  # fmt: skip
    generate(config.layout.incoming, segments * 50_000, per_segment=50_000)
    layout: DataLayout = config.layout
    names = [p.name for p in layout.sealed_segments()]
    archived = [archive_segment(layout, n, ArchiveConfig()) for n in names]
    files = [p for d in day_dirs(layout) for s in segments_of_day(d)
             for p in (*s.sidecars, s.data)]  # fmt: skip
    size = sum(f.stat().st_size for f in files)
    print(f"archive: {len(archived)} segment(s), {len(files)} files, {size / 1e6:.1f} MB",
          flush=True)  # fmt: skip
    results: dict[str, float] = {}
    fs = config.archive.s3.settings().filesystem()  # type: ignore[union-attr]
    _timed(ARCHIVE_FLOOR, results, lambda: [
        pafs.copy_files(str(f), f"{bucket}/floor/{f.name}", destination_filesystem=fs)
        for f in files
    ])  # fmt: skip
    _timed(UPLOAD, results, lambda: upload_archived(config, archived))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--segments", type=int, default=20)
    args = parser.parse_args()
    from tests.s3 import S3Server

    server = S3Server()
    server.start()
    try:
        with tempfile.TemporaryDirectory(prefix="eventpipe-s3-bench-", dir="/var/tmp") as tmp:
            found = lakes(server, args.rows, Path(tmp) / "lakes")
            uploads = archive(server, args.segments, Path(tmp) / "archive")
    finally:
        server.remove()
    floor = found["floor: the staged files uploaded as they are"]
    print("\nratios in this run:")
    for kind in ("parquet", "iceberg", "delta"):
        ratio = found[f"eventpipe {kind} load"] / floor
        print(f"  eventpipe {kind} load: {ratio:.2f}x the plain upload of the staged files")
    for kind, plain in (("delta", "delta-rs write_deltalake of the rows"),
                        ("iceberg", "pyiceberg append of the rows")):  # fmt: skip
        ratio = found[f"eventpipe {kind} load"] / found[plain]
        print(f"  eventpipe {kind} load: {ratio:.2f}x {plain}")
    ratio = uploads[UPLOAD] / uploads[ARCHIVE_FLOOR]
    print(f"  the archive's upload: {ratio:.2f}x the plain upload of the same files")


if __name__ == "__main__":
    main()
