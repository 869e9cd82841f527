"""Shared test fixtures: configs, and a real collector serving HTTP on 127.0.0.1."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from eventpipe.collector.app import Collector
from eventpipe.collector.server import uvicorn_config
from eventpipe.config import Config, parse_config
from eventpipe.processing.runtime.spark import SHORT_LIVED_JAVA_OPTIONS

WEB_JS = "js-web-secret-1"
WEB_SERVER = "s2s-web-secret-1"
SHOP_JS = "js-shop-secret-1"
SLOW_TIMEOUT = 900  # seconds: for a test marked slow that sets no limit of its own

# Every JVM of the suite (the workers' Spark sessions, the commands' drivers, a cluster's
# master and workers) compiles with the quick compiler only and collects garbage on one
# thread. Its jobs are small and many: the optimising compiler's threads took 42% of a
# session's CPU, on a machine whose two cores the suite keeps busy (docs/testing.md).
# What a user runs is unchanged; a setting in a config still wins (it comes later).
TEST_JVM_OPTIONS = f"{SHORT_LIVED_JAVA_OPTIONS} -XX:+UseSerialGC"
os.environ.setdefault("SPARK_SUBMIT_OPTS", TEST_JVM_OPTIONS)
os.environ.setdefault("SPARK_DAEMON_JAVA_OPTS", TEST_JVM_OPTIONS)


def deep_update(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_update(merged[key], value)
        else:
            merged[key] = value
    return merged


def make_config(data_dir: Path, **overrides: Any) -> Config:
    """A config with two keys: ``web`` (js + server, any origin), ``shop`` (js, origins)."""
    raw: dict[str, Any] = {
        "data_dir": str(data_dir),
        "server": {"host": "127.0.0.1", "port": 0, "shutdown_grace_seconds": 5},
        "api_keys": [
            {"id": "web", "js": WEB_JS, "server": WEB_SERVER},
            {
                "id": "shop",
                "js": SHOP_JS,
                "origins": ["https://shop.example.com", "https://*.example.org"],
            },
        ],
    }
    return parse_config(deep_update(raw, overrides), source="test", env={})


class RunningCollector:
    """The collector app under uvicorn on a free loopback port, in a background thread."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.collector = Collector(config)
        self.collector.open()
        self.server = uvicorn.Server(uvicorn_config(self.collector))
        self.thread = threading.Thread(target=self.server.run, name="collector", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("collector did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.port: int = port
        self.url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "collector did not stop"

    @property
    def layout(self):  # type: ignore[no-untyped-def]
        return self.config.layout

    @property
    def writer(self) -> str:
        """The collector's writer id (in the names of its segments)."""
        return self.collector.segment_log.writer


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The modules that hold a ``slow`` test first, each module's tests kept together:
    with ``make test``'s two workers (``-n 2 --dist loadfile``), the long ones start at
    once and the short ones fill the gaps, so that neither worker is left with a
    cluster or a kill loop at the end while the other idles."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)  # stable: the order within stays
    # A slow test shares the machine with the other worker's: its limit is for a hang,
    # not for a loaded machine (the default, 300 s, is for everything else). A limit
    # given on the command line (make soak's) is for every test.
    if config.getoption("timeout") is not None:
        return
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT))


@pytest.fixture(autouse=True, scope="module")
def _no_process_left_behind() -> Iterator[None]:
    """After each module, whatever ``eventpipe`` processes its tests left running (one
    that failed before stopping them) are killed, with their workers."""
    yield
    from tests.process import kill_left_behind

    kill_left_behind()


@pytest.fixture
def start_collector(tmp_path: Path) -> Iterator[Any]:
    """Start collectors with config overrides; all are stopped after the test."""
    running: list[RunningCollector] = []

    def start(**overrides: Any) -> RunningCollector:
        data_dir = overrides.pop("data_dir", tmp_path / "data")
        collector = RunningCollector(make_config(data_dir, **overrides))
        running.append(collector)
        return collector

    yield start
    for collector in running:
        if collector.thread.is_alive():
            collector.stop()


def read_lines(paths: list[Path]) -> list[dict[str, Any]]:
    import orjson

    return [orjson.loads(line) for path in paths for line in path.read_bytes().splitlines()]


def stored_events(c: RunningCollector, key: str = "web") -> list[dict[str, Any]]:
    """The events a running collector has stored for ``key`` (its active segment)."""
    path = c.layout.active_segment(key, c.writer)
    return read_lines([path]) if path.exists() else []


def refused_events(c: RunningCollector, key: str = "web") -> list[dict[str, Any]]:
    """The EventErrors of what a running collector refused for ``key``."""
    path = c.layout.failed_receiving(key, c.writer)
    return read_lines([path]) if path.exists() else []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """A test that failed in the middle of a py4j call (pytest-timeout raises wherever the
    test is) leaves that call's answer unread on its connection, and the traceback pytest
    keeps holds the connection alive: every later call of the worker's session would
    read the answer before its own. The failed test's connection is dropped; the next
    call opens a fresh one."""
    try:
        return (yield)
    except BaseException:
        _drop_spark_connection()
        raise


def _drop_spark_connection() -> None:
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    client = getattr(gateway, "_gateway_client", None)
    connection = getattr(client, "get_thread_connection", lambda: None)()
    if connection is not None:
        connection.close()
        client.thread_connection.connection = None


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One real Spark session for the whole test run (starting one takes ~15 s)."""
    from eventpipe.processing.runtime.spark import start_session

    session = start_session({"spark.master": "local[2]", "spark.sql.shuffle.partitions": "2"})
    yield session
    session.stop()


# A small MaxMind-format City database, built with mmdb-writer: the records the lookup
# tests expect, nothing downloaded.
GEO_RECORDS = {
    "81.2.69.0/24": {
        "country": {"iso_code": "GB", "names": {"en": "United Kingdom"}},
        "subdivisions": [{"iso_code": "ENG", "names": {"en": "England"}}],
        "city": {"names": {"en": "London"}},
        "postal": {"code": "SW1A"},
        "location": {"latitude": 51.5142, "longitude": -0.0931, "time_zone": "Europe/London"},
    },
    "2001:db8::/32": {
        "country": {"iso_code": "DE", "names": {"en": "Germany"}},
        "city": {"names": {"en": "Berlin"}},
    },
}


@pytest.fixture(scope="session")
def geo_database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mmdb_writer import MmdbF64, MMDBWriter
    from netaddr import IPSet

    def typed(value: Any) -> Any:
        if isinstance(value, float):
            return MmdbF64(value)
        if isinstance(value, dict):
            return {k: typed(v) for k, v in value.items()}
        if isinstance(value, list):
            return [typed(v) for v in value]
        return value

    writer = MMDBWriter(ip_version=6, ipv4_compatible=True, database_type="GeoIP2-City")
    for network, record in GEO_RECORDS.items():
        writer.insert_network(IPSet([network]), typed(record))
    path = tmp_path_factory.mktemp("geo") / "test-city.mmdb"
    writer.to_db_file(str(path))
    return path


def _running(server: Any) -> Iterator[Any]:
    """A test server (one with ``start()`` and ``remove()``), started, and removed when
    the fixture ends whatever happened."""
    try:
        server.start()
        yield server
    finally:
        server.remove()


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """A throwaway PostgreSQL server for the whole run (tests/postgres.py)."""
    from tests.postgres import postgres_server

    with postgres_server() as dsn:
        yield dsn


@pytest.fixture(scope="session")
def clickhouse_server() -> Iterator[Any]:
    """A throwaway ClickHouse server (Debian's) for the whole run (tests/clickhouse.py)."""
    from tests.clickhouse import ClickHouseServer

    yield from _running(ClickHouseServer())


@pytest.fixture(scope="session")
def chdb_server() -> Iterator[Any]:
    """Today's ClickHouse engine (chDB) behind the HTTP interface, for the whole run
    (tests/chdb_server.py)."""
    from tests.chdb_server import ChdbServer

    yield from _running(ChdbServer())


@pytest.fixture(scope="session")
def clickhouse_cluster() -> Iterator[Any]:
    """ZooKeeper and two ClickHouse servers (Debian's), the replicas of one shard of
    cluster ``events``, for the whole run (tests/clickhouse.py)."""
    from tests.clickhouse import ClickHouseCluster

    yield from _running(ClickHouseCluster())


@pytest.fixture(scope="session")
def snowflake_server() -> Iterator[Any]:
    """A stand-in for Snowflake (fakesnow's server mode) for the whole run
    (tests/snowflake.py)."""
    from tests.snowflake import SnowflakeServer

    yield from _running(SnowflakeServer())


@pytest.fixture(scope="session")
def bigquery_server() -> Iterator[Any]:
    """A stand-in for BigQuery (bqemulator) for the whole run (tests/bigquery.py)."""
    from tests.bigquery import BigQueryServer

    yield from _running(BigQueryServer())


@pytest.fixture
def bigquery_dataset(bigquery_server: Any) -> str:
    """A dataset of the test's own on the run's BigQuery stand-in (made by the
    destination)."""
    return str(bigquery_server.dataset())


@pytest.fixture(scope="session")
def s3_server() -> Iterator[Any]:
    """A stand-in for S3 (moto's server mode) for the whole run (tests/s3.py)."""
    from tests.s3 import S3Server

    yield from _running(S3Server())


@pytest.fixture(scope="session")
def redshift_server(postgres_dsn: str, s3_server: Any) -> Iterator[Any]:
    """A stand-in for Redshift (the run's PostgreSQL behind a front that copies from the
    S3 stand-in) for the whole run (tests/redshift.py)."""
    from tests.redshift import RedshiftServer

    yield from _running(RedshiftServer(postgres_dsn, s3_server))


@pytest.fixture
def s3_bucket(s3_server: Any) -> str:
    """A new, empty bucket of the run's S3 stand-in."""
    return str(s3_server.bucket())


@pytest.fixture
def snowflake_schema() -> str:
    """A schema name of one test's own (eventpipe creates it)."""
    import uuid

    return f"T_{uuid.uuid4().hex[:12].upper()}"


CLICKHOUSE_ENGINES = {"18.16": "clickhouse_server", "today": "chdb_server"}
"""The ClickHouse servers the tests run: Debian's 18.16, and today's engine (chDB)."""


@pytest.fixture
def clickhouse_database() -> str:
    """A database name of one test's own (eventpipe creates it; the servers are
    removed with the run)."""
    import uuid

    return f"t_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def postgres_schema(postgres_dsn: str) -> Iterator[str]:
    """A schema of its own for one test, dropped afterwards."""
    import uuid

    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    yield schema
    with psycopg.connect(postgres_dsn, autocommit=True) as db:
        db.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def postgres_state(postgres_dsn: str) -> Iterator[dict[str, str]]:
    """A ``state:`` config: a PostgreSQL state store in a schema of its own, dropped
    afterwards."""
    import uuid

    import psycopg

    schema = f"state_{uuid.uuid4().hex[:12]}"
    yield {"type": "postgres", "dsn": postgres_dsn, "schema": schema}
    with psycopg.connect(postgres_dsn, autocommit=True) as db:
        db.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def source_database(postgres_dsn: str) -> Iterator[str]:
    """A database of its own: the source's tables, its slot dropped afterwards."""
    import uuid

    import psycopg

    name = f"src_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as db:
        db.execute(f'CREATE DATABASE "{name}"')
    dsn = postgres_dsn.rsplit("/", 1)[0] + f"/{name}"
    yield dsn
    with psycopg.connect(postgres_dsn, autocommit=True) as db:
        db.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE database = %s",
            [name],
        )
        db.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def source_sql(dsn: str, *statements: str) -> None:
    """Run statements on a source database, each committed and flushed: logical decoding
    sees flushed WAL only (the test server runs ``synchronous_commit = off``)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute("SET synchronous_commit = on")
        for statement in statements:
            db.execute(statement)
