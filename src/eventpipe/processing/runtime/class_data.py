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
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

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


def prune_stale(path: Path) -> None:
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
