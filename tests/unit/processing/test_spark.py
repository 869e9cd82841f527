"""The Spark session: eventpipe's settings, and segments read by Spark's own JSON reader."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from eventpipe.processing.runtime import class_data, python_daemon
from eventpipe.processing.runtime.spark import JavaMissingError, check_java, spark_settings


def test_config_wins_over_the_defaults() -> None:
    settings = spark_settings({"spark.master": "yarn", "spark.sql.shuffle.partitions": "16"})
    assert settings["spark.master"] == "yarn"
    assert settings["spark.sql.shuffle.partitions"] == "16"
    assert settings["spark.pyspark.python"] == sys.executable
    # Executors on other hosts must reach the driver: loopback is for local mode only.
    assert "spark.driver.bindAddress" not in settings
    assert spark_settings({})["spark.driver.bindAddress"] == "127.0.0.1"
    assert spark_settings({"spark.master": "local[2]"})["spark.driver.host"] == "127.0.0.1"


def test_a_launchers_settings_win_over_the_defaults_and_config_over_both() -> None:
    launcher = {"spark.master": "spark://10.0.0.1:7077", "spark.app.name": "nightly",
                "spark.pyspark.python": "/opt/venv/bin/python"}  # fmt: skip
    settings = spark_settings({"spark.sql.shuffle.partitions": "16"}, launcher)
    # What spark-submit set is kept by not setting it again; defaults fill the rest.
    assert not {"spark.master", "spark.app.name", "spark.pyspark.python"} & set(settings)
    assert "spark.driver.host" not in settings  # a cluster's master: Spark's own default
    assert settings["spark.sql.session.timeZone"] == "UTC"
    assert settings["spark.sql.shuffle.partitions"] == "16"
    local = spark_settings({}, {"spark.master": "local[3]"})
    assert local["spark.driver.host"] == "127.0.0.1"
    assert spark_settings({"spark.master": "local[1]"}, launcher)["spark.master"] == "local[1]"


def test_every_jvm_of_the_job_compiles_huge_generated_methods(spark: Any) -> None:
    """The driver this process started has the option; a cluster's executors get it
    before the options configured for them (which win); a launcher's are kept."""
    from eventpipe.processing.runtime.spark import COMPILE_HUGE_METHODS

    runtime = spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    assert COMPILE_HUGE_METHODS in list(runtime.getInputArguments())
    key = "spark.executor.extraJavaOptions"
    cluster = {"spark.master": "spark://master:7077"}
    assert spark_settings(cluster)[key] == COMPILE_HUGE_METHODS
    mine = spark_settings({**cluster, key: "-XX:+DontCompileHugeMethods"})[key]
    assert mine == f"{COMPILE_HUGE_METHODS} -XX:+DontCompileHugeMethods"
    assert key not in spark_settings({"spark.master": "local[2]"})  # the driver's JVM
    assert key not in spark_settings({}, {**cluster, key: "-Xss4m"})  # spark-submit's


def test_missing_java_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setattr(class_data.shutil, "which", lambda name: None)
    with pytest.raises(JavaMissingError) as info:
        check_java()
    assert "openjdk-17" in str(info.value)


def test_the_session_runs_with_our_settings(spark: Any) -> None:
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.driver.bindAddress") == "127.0.0.1"
    assert conf.get("spark.ui.enabled") == "false"
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.conf.get("spark.sql.caseSensitive") == "true"
    # Python workers run this interpreter (the one with eventpipe installed).
    [version] = spark.sparkContext.parallelize([0], 1).map(lambda _: sys.executable).collect()
    assert version == sys.executable


def _worker_origin(_: Any) -> tuple[str, str, bool]:
    """In a Python worker: its parent's command line, where PySpark came from, and
    whether pandas was imported before this task (a fresh worker's first task)."""
    import os

    import pyspark

    with open(f"/proc/{os.getppid()}/cmdline", "rb") as cmdline:
        parent = cmdline.read().replace(b"\0", b" ").decode()
    return parent, pyspark.__file__ or "", "pandas" in sys.modules


def test_python_workers_fork_from_eventpipes_daemon_with_its_imports_done(spark: Any) -> None:
    origins = set(spark.sparkContext.parallelize([0, 1], 2).map(_worker_origin).collect())
    for parent, pyspark_file, pandas in origins:
        assert "-m eventpipe.processing.runtime.python_daemon" in parent
        # Installed PySpark, with its bytecode, not Spark's zip of the same sources.
        assert ".zip" not in pyspark_file, pyspark_file
        assert pandas  # nothing in this task imports it: the daemon did


def test_the_daemon_prefers_the_installed_pyspark_to_sparks_copy_of_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import pyspark

    package = Path(pyspark.__file__).parent
    own = [str(package / "python" / "lib" / "pyspark.zip"),
           str(package / "python" / "lib" / "py4j-0.10.9.9-src.zip")]  # fmt: skip
    elsewhere = str(tmp_path / "spark-4.0.0" / "python" / "lib" / "pyspark.zip")
    monkeypatch.setattr(sys, "path", [*own, elsewhere, *sys.path])
    python_daemon.installed_pyspark_first()
    assert elsewhere in sys.path  # a cluster's own Spark: kept
    assert not set(own) & set(sys.path)


def test_segments_are_read_by_sparks_json_reader(spark: Any, tmp_path: Path) -> None:
    segment = tmp_path / "incoming.tok=web-2026-11-21T10-00-00.000.log"
    segment.write_text(
        '{"event_type": "a", "A": 1, "a": 2, "user": {"id": 7}}\n'
        '{"event_type": "b", "list": [1, 2], "user": {"id": 8, "name": "x"}}\n'
    )
    frame = spark.read.json(str(segment))
    assert set(frame.columns) == {"A", "a", "event_type", "list", "user"}  # case-sensitive
    rows = sorted(frame.collect(), key=lambda r: r.event_type)
    assert rows[0].user.id == 7
    assert rows[1].user.name == "x"


def test_a_spark_connect_session_takes_only_session_settings() -> None:
    settings = spark_settings({"spark.remote": "sc://h:15002", "spark.sql.shuffle.partitions": "8"})
    assert settings["spark.remote"] == "sc://h:15002"
    assert settings["spark.sql.shuffle.partitions"] == "8"
    assert settings["spark.sql.session.timeZone"] == "UTC"
    # The server's own: its master, its Python, where its driver listens.
    assert not [k for k in settings if not k.startswith("spark.sql.") and k != "spark.remote"]


def test_a_terminal_gets_sparks_progress_bar_and_a_log_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from eventpipe.processing.runtime.spark import on_terminal

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert on_terminal({})["spark.ui.showConsoleProgress"] == "true"
    configured = {"spark.ui.showConsoleProgress": "false"}
    assert on_terminal(configured) == configured  # configured either way: as configured
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert "spark.ui.showConsoleProgress" not in on_terminal({})


def test_a_short_lived_local_session_compiles_quickly_unless_configured_otherwise(
    tmp_path: Path,
) -> None:
    from eventpipe.processing.runtime.spark import (
        COMPILE_HUGE_METHODS,
        JVM_LOG_OPTIONS,
        java_options,
    )

    # its warnings kept off standard output; huge generated methods compiled
    first = f"{JVM_LOG_OPTIONS} {COMPILE_HUGE_METHODS}"

    def options(settings: dict[str, str], **kwargs: Any) -> str:
        out = java_options(settings, **kwargs)[class_data.JAVA_OPTIONS]
        assert out.startswith(f"{first} ")
        return out.removeprefix(f"{first} ")

    local = {"spark.master": "local[2]"}
    assert options(local, archive=None, short_lived=True) == "-XX:TieredStopAtLevel=1"
    assert java_options(local, archive=None, short_lived=False) == {
        **local,
        class_data.JAVA_OPTIONS: first,
    }
    mine = {**local, class_data.JAVA_OPTIONS: "-XX:TieredStopAtLevel=4"}
    assert options(mine, archive=None, short_lived=True) == (
        "-XX:TieredStopAtLevel=1 -XX:TieredStopAtLevel=4"
    )
    cluster = {"spark.master": "spark://master:7077"}  # executors elsewhere: as they are
    assert java_options(cluster, archive=None, short_lived=True) == {
        **cluster,
        class_data.JAVA_OPTIONS: first,
    }
    archive = tmp_path / "spark.jsa"
    archive.write_bytes(b"built")
    assert options(mine, archive=archive, short_lived=True) == (
        f"-XX:TieredStopAtLevel=1 -XX:TieredStopAtLevel=4 -XX:SharedArchiveFile={archive}"
    )
