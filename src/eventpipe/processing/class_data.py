"""The JVM class-data archive: Spark's driver starts in about half the time.

A JVM spends most of Spark's start loading and verifying some 20,000 classes from the
jars. Java's class-data sharing (CDS) keeps them parsed and verified in an archive that
the next JVMs map from disk. eventpipe builds one archive per machine (``eventpipe
spark-archive``, which ``make run`` and ``make test`` run) by a training run: a small
batch of sample events through the real job, in a JVM started with
``-XX:ArchiveClassesAtExit``. Later sessions start their driver with
``-XX:SharedArchiveFile`` when the archive for this Java and this Spark exists.

Measured here (2 cores, Java 17, Spark 4): the session start went from 7.4-7.9 s to
3.7-4.1 s, and the first job after it from 4.2-4.5 s to 1.9-2.0 s (bench/cold_start.py
runs a whole cold ``process --once`` with and without).

The archive belongs to one Java build and one Spark installation (the jars' paths,
sizes and times are in it), so its name is derived from both; another Java or Spark, or
the same Spark installed again, finds no archive and starts as before. A JVM that
cannot use an archive says so in one warning line (on standard error) and starts
without it. Only the driver uses it (in local mode, the executors are the same
JVM); a cluster's executors start as they always did.
"""

from __future__ import annotations

import functools
import hashlib
import os
import random
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from eventpipe.errors import EventpipeError

JAVA_OPTIONS = "spark.driver.extraJavaOptions"


class ClassDataError(EventpipeError):
    exit_code = 2  # the machine's setup, not something a retry fixes
    name = "class_data"


def cache_dir() -> Path:
    """Where eventpipe keeps what it builds for this machine: ``EVENTPIPE_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/eventpipe``, else ``~/.cache/eventpipe``."""
    if configured := os.environ.get("EVENTPIPE_CACHE_DIR"):
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "eventpipe"


def java_binary() -> str | None:
    """The java that spark-submit starts (JAVA_HOME's, else the one on PATH)."""
    if home := os.environ.get("JAVA_HOME"):
        candidate = os.path.join(home, "bin", "java")
        if os.path.exists(candidate):
            return candidate
    return shutil.which("java")


@functools.cache
def java_version(java: str) -> str:
    """What ``java -version`` prints (on standard error), asked once per process."""
    return subprocess.run([java, "-version"], capture_output=True, text=True).stderr


def archive_path() -> Path | None:
    """The archive's path for this machine's Java and Spark (which may not exist yet);
    None without Java. Its name holds two digests: the installation (Java's build,
    Spark's directory and version) and the jars as they are on disk (names, sizes,
    modification times: what the JVM checks before it maps an archive). Spark installed
    again at the same path, as a new virtualenv does, names another archive."""
    java = java_binary()
    if java is None:
        return None
    import pyspark

    spark_home = os.path.dirname(os.path.realpath(pyspark.__file__))
    installation = _digest([os.path.realpath(java), java_version(java), spark_home,
                            pyspark.__version__])  # fmt: skip
    jars = _digest(_stamps(os.path.join(spark_home, "jars")))
    return cache_dir() / f"spark-{pyspark.__version__}-{installation}-{jars}.jsa"


def _stamps(directory: str) -> list[str]:
    try:
        entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
    except FileNotFoundError:
        return []
    return [f"{e.name} {e.stat().st_size} {e.stat().st_mtime_ns}" for e in entries]


def _digest(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def _prune_stale(path: Path) -> None:
    """Remove the archives of this installation's earlier jars: no JVM can map them. A
    JVM that has one mapped keeps it."""
    installation = path.name.rsplit("-", 1)[0]
    for stale in path.parent.glob(f"{installation}-*.jsa"):
        if stale != path:
            stale.unlink(missing_ok=True)


def with_archive(settings: Mapping[str, str], archive: Path | None) -> dict[str, str]:
    """``settings`` with the driver's JVM told to map ``archive`` (when it exists),
    after any Java options configured."""
    out = dict(settings)
    if archive is None or not archive.is_file():
        return out
    option = f"-XX:SharedArchiveFile={archive}"
    out[JAVA_OPTIONS] = f"{out[JAVA_OPTIONS]} {option}" if out.get(JAVA_OPTIONS) else option
    return out


def build(path: Path, work: Path | None = None) -> Path:
    """Build the archive at ``path`` by a training run (in this process, which must not
    have started Spark yet: the JVM it starts is the one archived). Written under another
    name, then moved into place whole: JVMs that map the old one keep it."""
    from pyspark import SparkContext

    from eventpipe.config import parse_config
    from eventpipe.processing.job import process_once
    from eventpipe.processing.spark import start_session

    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial.write_bytes(b"")  # writable, before a training run of half a minute
        partial.unlink()
    except OSError as exc:
        raise ClassDataError(
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
        settings = {**config.spark.settings, JAVA_OPTIONS: dump}
        spark = start_session(settings, class_data_archive=False)
        try:
            process_once(config, spark)
        finally:
            spark.stop()
            _exit_jvm()
    if not partial.is_file():
        raise RuntimeError(f"the JVM wrote no class-data archive at {partial}")
    os.replace(partial, path)
    _prune_stale(path)
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
