"""The Spark session: eventpipe's defaults for one machine, overridden by ``spark:`` config.

The same job runs on a cluster by changing only config (``spark: {master: spark://...}``,
YARN or Kubernetes settings): nothing here assumes local mode except the defaults.

Defaults, and why:

* ``spark.master: local[*]``: embedded, all cores.
* in local mode, the driver bound to 127.0.0.1: nothing listens beyond loopback unless
  asked (with a cluster's master, executors must reach the driver: Spark's own default,
  the host's address, stays). The UI is off.
* ``spark.sql.shuffle.partitions: 4``: batches here are small; 200 partitions measured
  slower on 2 cores.
* ``spark.sql.session.timeZone: UTC``: timestamps are UTC everywhere in eventpipe.
* ``spark.sql.caseSensitive: true``: ``{"A": 1, "a": 2}`` are two JSON keys; Spark would
  otherwise refuse the schema as having duplicate columns (eventpipe.schema.naming decides
  which one keeps the column).
* partition column type inference off: staged tables are partitioned by table name, and
  a table named ``true`` or ``2024`` must stay a string.
* ``spark.pyspark.python``: this interpreter, so Python workers have eventpipe's packages;
  ``spark.python.daemon.module``: eventpipe's, which forks them with those packages
  imported (runtime/python_daemon.py).

With ``spark: {remote: sc://host:15002}`` the session is a Spark Connect client: the
server has its own master and settings, and only the ``spark.sql.*`` settings above (and
configured ones) are set, per session. docs/deploy.md says what runs that way.

Launched by ``spark-submit`` (docs/deploy.md), the launcher's settings (``--master``,
``--conf``, ``spark-defaults.conf``) win over these defaults; the ``spark:`` keys of
eventpipe.yaml win over both, as settings made in code do in Spark.

Spark 4 runs ANSI SQL by default, and eventpipe keeps it: a bad cast raises instead of
quietly becoming null. Steps that expect bad values use the ``try_`` functions
(``try_to_timestamp``, ``try_cast``) and turn the nulls into EventErrors themselves.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from eventpipe.errors import EventpipeError
from eventpipe.processing.runtime import class_data, gateway

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULTS: Mapping[str, str] = {
    "spark.master": "local[*]",
    "spark.app.name": "eventpipe",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.caseSensitive": "true",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # Staged tables are partitioned by table name: a table named "true" or "2024" must
    # stay a string when read back.
    "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
    # Parquet timestamps as INT64 microseconds, which DuckDB and PostgreSQL tools read.
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    # A write partitioned by table keeps up to this many files open per task instead of
    # sorting its rows by table first: staging 1M events into 5 tables took 8.6 s instead
    # of 10.9 s (bench/batch.py). Parquet's memory manager shrinks the row groups of
    # concurrent writers to stay within the heap; more tables than this fall back to
    # sorting.
    "spark.sql.maxConcurrentOutputFileWriters": "16",
    # A run builds its plans from thousands of column expressions (flattening, table
    # names, casts). With this on, PySpark records the Python call site of each one in
    # the JVM: six more calls into it per expression, and a walk of the Python stack.
    # Errors then name eventpipe's own lines, which its messages already do.
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    # Inferring constraints over every alias of a wide projection is what Spark's own
    # documentation warns of; eventpipe's plans gain nothing from it (their only joins,
    # of refused rows with their originals by row number, need no inferred filters).
    "spark.sql.constraintPropagation.enabled": "false",
    # Python workers forked from a daemon that has PySpark's worker, pyarrow, pandas and
    # eventpipe's task modules imported already (runtime/python_daemon.py).
    "spark.python.daemon.module": "eventpipe.processing.runtime.python_daemon",
}


LOCAL_DEFAULTS: Mapping[str, str] = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}
"""For a ``local`` master only: executors on other hosts could not reach 127.0.0.1."""


SHORT_LIVED_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"
"""For a local JVM that lives a few seconds (``process --once`` of a small batch): the
quick compiler only. The optimising one pays off over minutes; in a run of seconds its
compile threads take the cores from the job (bench/cold_start.py)."""


COMPILE_HUGE_METHODS = "-XX:-DontCompileHugeMethods"
"""For every JVM that runs the job (the driver, a cluster's executors): compile methods
of more than 8,000 bytes of bytecode too. HotSpot leaves those to its interpreter, and
the code Spark generates for the flattening pass of an event with a few dozen fields is
such a method (``processNext``, 8,412 bytes for bench/batch.py's events with a
``table_name_template`` of ``{{ event_type }}``: Spark logs "Generated method too long to
be JIT compiled"). The pass over 1M events took 12.1-14.9 s with it against 18.9-20.5 s
without (the run 23.3-28.6 s against 31.8-33.8 s; Spark's ``hugeMethodLimit`` of 8,000
instead, which gives up whole-stage code generation for such a stage, 15.2 s). Options
configured come after it and win (``-XX:+DontCompileHugeMethods`` turns it off)."""


LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")
JVM_LOG_OPTIONS = (
    f"-Xlog:disable -Xlog:all=warning:stderr -Dlog4j2.configurationFile={LOG4J_CONFIG.as_uri()}"
)
"""The JVM's own warnings on standard error, where Spark's log goes: by default they go
to standard output, which is the commands' answer (``log step`` prints positions there).
A class-data archive that the JVM cannot map says so in such a warning. Spark's log in
eventpipe's format, without its start-up notes (``Using Spark's default log4j
profile``, ``Setting default log level``) and the warnings of log4j2.properties."""


def java_options(
    settings: Mapping[str, str], *, archive: Path | None, short_lived: bool
) -> dict[str, str]:
    """``settings`` (resolved: with the master) for a driver JVM this process starts: its
    warnings on standard error, huge methods compiled (COMPILE_HUGE_METHODS), and the
    quick compiler only when ``short_lived`` on a local master, before the Java options
    configured (which win); the class-data ``archive`` mapped, after them."""
    out = class_data.with_archive(settings, archive)
    first = [JVM_LOG_OPTIONS, COMPILE_HUGE_METHODS]
    if short_lived and out.get("spark.master", "").startswith("local"):
        first.append(SHORT_LIVED_JAVA_OPTIONS)
    configured = out.get(class_data.JAVA_OPTIONS)
    out[class_data.JAVA_OPTIONS] = " ".join(filter(None, [*first, configured]))
    return out


class JavaMissingError(EventpipeError):
    exit_code = 2  # the machine's setup, not something a retry fixes
    name = "java_missing"


def spark_settings(
    overrides: Mapping[str, str], launcher: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The settings to give the session: eventpipe's defaults, except where the launcher
    (``spark-submit``'s settings, None if not launched by it) set a key, then the
    configured settings on top (config wins)."""
    if "spark.remote" in overrides:  # a Connect server: only session settings are ours
        return {k: v for k, v in {**DEFAULTS, **overrides}.items()
                if k.startswith("spark.sql.") or k == "spark.remote"}  # fmt: skip
    launched = launcher or {}
    defaults = {**DEFAULTS, "spark.pyspark.python": sys.executable,
                "spark.pyspark.driver.python": sys.executable}  # fmt: skip
    settings = {k: v for k, v in defaults.items() if k not in launched}
    master = (
        overrides.get("spark.master") or launched.get("spark.master") or DEFAULTS["spark.master"]
    )
    if master.startswith("local"):
        settings.update({k: v for k, v in LOCAL_DEFAULTS.items() if k not in launched})
    settings.update(overrides)
    executors = "spark.executor.extraJavaOptions"
    if not master.startswith("local") and executors not in launched:
        configured = overrides.get(executors)
        settings[executors] = " ".join(filter(None, [COMPILE_HUGE_METHODS, configured]))
    return settings


def on_terminal(settings: Mapping[str, str]) -> dict[str, str]:
    """``settings`` with Spark's console progress bar (stages, tasks done of all) when
    standard error is a terminal, unless configured either way: a command run by hand
    shows its progress; one run by cron or a service logs plain step lines."""
    import sys

    key = "spark.ui.showConsoleProgress"
    if key in settings or not sys.stderr.isatty():
        return dict(settings)
    return {**settings, key: "true"}


def launcher_settings() -> dict[str, str] | None:
    """The settings ``spark-submit`` started this process with (its JVM's ``spark.*``
    system properties), or None when this process was not launched by it."""
    if "PYSPARK_GATEWAY_PORT" not in os.environ:  # set by spark-submit's PythonRunner
        return None
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # connects to the launcher's JVM
    return dict(SparkConf().getAll())


def check_java() -> None:
    """Fail with a clear message, instead of a Py4J stack trace, when Java 17+ is missing."""
    java = class_data.java_binary()
    fix = "install Java 17 or newer (make setup does: apt-get install openjdk-17-jre-headless)"
    if java is None:
        raise JavaMissingError("Spark needs Java, and none was found on PATH or JAVA_HOME", fix=fix)
    out = class_data.java_version(java)
    try:
        quoted = out.split('"')[1]
        major = int(quoted.split(".")[1] if quoted.startswith("1.") else quoted.split(".")[0])
    except (IndexError, ValueError):
        return  # an unusual version string: let Spark itself decide
    if major < 17:
        raise JavaMissingError(f"Spark needs Java 17 or newer; {java} is Java {major}", fix=fix)


def start_session(
    overrides: Mapping[str, str],
    *,
    class_data_archive: bool = True,
    short_lived: bool = False,
    jvm_log: Path | None = None,
) -> SparkSession:
    """Start (or reuse) the Spark session with eventpipe's settings. A driver JVM this
    starts maps the class-data archive where one was built (``class_data_archive``), and
    compiles quickly only when it will live seconds (``short_lived``; see java_options).
    ``jvm_log``: the file the JVM's standard error goes to (appended), not this process's
    (see stderr_to); unused when Spark's console progress bar is on, which is drawn
    there."""
    check_java()
    from pyspark.sql import SparkSession

    if "spark.remote" in overrides:
        return _connect(spark_settings(overrides))
    launcher = launcher_settings()
    settings = spark_settings(overrides, launcher)
    if launcher is None:  # else spark-submit started the JVM already
        archive = class_data.archive_path() if class_data_archive else None
        settings = java_options(settings, archive=archive, short_lived=short_lived)
    if python := settings.get("spark.pyspark.python"):
        os.environ.setdefault("PYSPARK_PYTHON", python)
    if launcher is None and settings.get("spark.master", "").startswith("local"):
        # An embedded driver talks to itself only: bound to the loopback address, Spark
        # does not print "Your hostname ... resolves to a loopback address" on every
        # command (a user can do nothing about it).
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    progress = settings.get("spark.ui.showConsoleProgress") == "true"
    log_to = jvm_log if launcher is None and not progress else None
    with stderr_to(log_to) if log_to is not None else contextlib.nullcontext():
        session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    _make_query_context_loggers()
    gateway.remember_lookups(session)
    # Concurrent Parquet writers (above) make its memory manager warn for every file it
    # shrinks a row group of: expected, and not the operator's concern.
    jvm = session.sparkContext._jvm
    if jvm is not None:
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
            "org.apache.parquet.hadoop.MemoryManager", jvm.org.apache.logging.log4j.Level.ERROR
        )
    return session


@contextlib.contextmanager
def stderr_to(path: Path) -> Iterator[None]:
    """Standard error (file descriptor 2) appended to ``path`` while the block runs, then
    back: what a child process starts with inherits it for its life. The driver JVM's
    own output (``WARNING: Using incubator modules``, Java's traces when it is stopped
    by Ctrl-C) goes to the file, and this process's log stays on the terminal."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.dup2(target, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(target)


class ConnectMissingError(EventpipeError):
    exit_code = 2
    name = "connect_missing"


def _connect(settings: Mapping[str, str]) -> SparkSession:
    """A Spark Connect session to ``spark.remote``, with the session settings."""
    import importlib.util

    if importlib.util.find_spec("grpc") is None:  # the client's transport (connect extra)
        raise ConnectMissingError(
            "spark.remote needs the Spark Connect client, which is not installed",
            fix="pip install 'eventpipe[connect]' (pyspark's connect extra: grpcio...)",
        )
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.remote(settings["spark.remote"])
    for key, value in settings.items():
        if key != "spark.remote":
            builder = builder.config(key, value)
    return builder.getOrCreate()


def _make_query_context_loggers() -> None:
    """PySpark makes the loggers of its query errors on first use, by switching the
    logging module's logger class for a moment: not thread-safe. A logger first made by
    one of the job's threads while another switched the class back is a plain one, and
    PySpark then calls it with arguments it refuses: every later Spark analysis error of
    the process surfaced as ``TypeError: Logger._log() got an unexpected keyword argument
    'errorClass'`` instead (seen in the test suite). Made here first, on one thread."""
    import logging

    from pyspark.logger import PySparkLogger

    loggers = logging.Logger.manager.loggerDict
    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        existing = loggers.get(name)
        if existing is not None and not isinstance(existing, PySparkLogger):
            del loggers[name]  # made plain already: made again, of PySpark's class
        PySparkLogger.getLogger(name)
