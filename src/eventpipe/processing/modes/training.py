"""The class-data archive's training run (processing/runtime/class_data.py): a small batch of
sample events through the real job, in a driver JVM that writes the classes it loaded to
the archive as it exits. Built by ``eventpipe spark-archive`` (``make test``, and
``eventpipe run`` in the background when it is missing)."""

from __future__ import annotations

import os
import random
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from eventpipe.config import parse_config
from eventpipe.processing.batch.job import process_once
from eventpipe.processing.runtime import class_data
from eventpipe.processing.runtime.spark import start_session


def build(path: Path, work: Path | None = None) -> Path:
    """Build the archive at ``path`` by a training run (in this process, which must not
    have started Spark yet: the JVM it starts is the one archived). Written under another
    name, then moved into place whole: JVMs that map the old one keep it."""
    from pyspark import SparkContext

    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial.write_bytes(b"")  # writable, before a training run of half a minute
        partial.unlink()
    except OSError as exc:
        raise class_data.ClassDataError(
            f"cannot write the class-data archive in {path.parent}: {exc.strerror or exc}",
            fix="set EVENTPIPE_CACHE_DIR to a writable directory",
        ) from exc
    if SparkContext._active_spark_context is not None:
        raise RuntimeError("the class-data archive is built by a process without Spark")
    with tempfile.TemporaryDirectory(prefix="eventpipe-class-data-", dir=work) as tmp:
        root = Path(tmp)
        incoming = root / "data" / "incoming"
        incoming.mkdir(parents=True)
        (incoming / "incoming.tok=web-2026-01-01T00-00-00.000.log").write_bytes(
            b"".join(training_lines())
        )
        config = parse_config(
            {"data_dir": str(root / "data"),
             "destinations": {
                 "warehouse": {"type": "duckdb", "path": str(root / "warehouse.duckdb"),
                               "table_name_template": "{{ event_type }}"},
                 "files": {"type": "parquet", "path": str(root / "parquet")}}},
            source="class-data training",
        )  # fmt: skip
        # Warnings off: the dump names every class it leaves out (signed jars' ones).
        dump = f"-XX:ArchiveClassesAtExit={partial} -Xlog:cds=error:stderr"
        settings = {**config.spark.settings, class_data.JAVA_OPTIONS: dump}
        spark = start_session(settings, class_data_archive=False)
        try:
            process_once(config, spark)
        finally:
            spark.stop()
            _exit_jvm()
    if not partial.is_file():
        raise RuntimeError(f"the JVM wrote no class-data archive at {partial}")
    os.replace(partial, path)
    class_data.prune_stale(path)
    return path


def _exit_jvm() -> None:
    """End the session's JVM and wait for it: it writes the archive as it exits. PySpark's
    gateway JVM exits when its standard input closes."""
    from pyspark import SparkContext

    gateway: Any = SparkContext._gateway
    process = getattr(gateway, "proc", None)
    if process is None:
        return
    gateway.shutdown()
    if process.stdin is not None:
        process.stdin.close()
    process.wait(timeout=300)
    SparkContext._gateway = None
    SparkContext._jvm = None


def training_lines(events: int = 400, seed: int = 17) -> Iterator[bytes]:
    """Sample log lines for the training run: browser and server events of a few types,
    nested objects, arrays, a field whose JSON type varies, and one line that is not JSON
    (so that the failed/ path is trained too)."""
    import orjson

    rng = random.Random(seed)
    kinds = ["page_view", "click", "purchase"]
    for n in range(events):
        yield orjson.dumps({
            "event_type": kinds[n % len(kinds)],
            "_timestamp": f"2026-01-01T{n % 24:02d}:{n % 60:02d}:00.000000Z",
            "api_key": "web",
            "src": "api" if n % 4 == 0 else "jitsu",
            "source_ip": f"81.2.{rng.randint(0, 255)}.{rng.randint(1, 254)}",
            "user": {"id": rng.randint(1, 1000), "anonymous_id": f"a{rng.getrandbits(32):x}"},
            "properties": {"price": round(rng.uniform(1, 99), 2), "tags": ["a", "b"][: n % 3],
                           "discount": rng.choice([0, 0.5, "none", True])},
            "eventn_ctx": {"event_id": f"training-{n}",
                           "user_agent": "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) "
                                         "Gecko/20100101 Firefox/133.0"},
        }) + b"\n"  # fmt: skip
    yield b"{not json\n"
