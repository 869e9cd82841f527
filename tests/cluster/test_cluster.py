"""The pipeline on a real standalone cluster (tests/cluster/conftest.py) gives the same
tables as on ``local[2]``, with only ``spark:`` changed: into DuckDB, PostgreSQL and
Parquet, a stream destination, through a Python transform and both lookups, the IP
database a file only the driver has (pytest's ``/tmp``, which executors do not see),
the runs' staging files in a work directory of their own. A worker killed mid-run does
not change the tables; ``replay failed`` launched by ``spark-submit`` in client mode and
``reprocess`` on the cluster give local mode's tables too."""

from __future__ import annotations

import datetime
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import duckdb
import orjson
import psycopg
import pytest
import yaml

from eventpipe.config import parse_config
from eventpipe.processing.batch.job import process_pending
from eventpipe.processing.modes import stream
from eventpipe.processing.modes.replay import replay_failed
from eventpipe.processing.modes.reprocess import reprocess
from tests.process import EVENTPIPE, _env, free_port
from tests.standalone import SPARK_HOME, Cluster

ROOT = Path(__file__).resolve().parents[2]
AGENTS = [
    "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 "
    "(KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1",
]
DAYS = ("2026-11-20", "2026-11-21", "2026-11-22")


def _segments(incoming: Path, events: int) -> None:
    """Sealed segments of two writers, as collectors write them; one event in 40 has a
    ``day`` that the ``pg`` destination's table name template cannot read."""
    rng = random.Random(7)
    incoming.mkdir(parents=True)
    for writer in ("a-0", "b-0"):
        lines = []
        for n in range(events // 2):
            day = "soon" if n % 40 == 5 else f"{DAYS[n % 3]}T10:00:00Z"
            lines.append(orjson.dumps({
                "eventn_ctx": {"event_id": f"{writer}-{n}", "user_agent": rng.choice(AGENTS)},
                "source_ip": rng.choice(["81.2.69.10", "2001:db8::1", "192.0.2.1"]),
                "client_ip": "81.2.69.20",
                "_timestamp": f"{DAYS[n % 3]}T10:00:00.000000Z", "day": day,
                "api_key": "web", "event_type": rng.choice(["view", "click"]), "n": n,
                "props": {"price": rng.randint(1, 100), "tags": ["a", "b"][: n % 3]},
            }))  # fmt: skip
        name = f"incoming.tok=web|w={writer}-2026-11-23T10-00-00.000.log"
        (incoming / name).write_bytes(b"\n".join(lines) + b"\n")


def _config(
    data: Path, spark: dict[str, Any], geo: Path, dsn: str, schema: str, *, fixed: bool = False
) -> dict[str, Any]:
    """``fixed``: the ``pg`` destination as the operator fixes it before replaying."""
    pg: dict[str, Any] = {"type": "postgres", "dsn": dsn, "schema": schema,
                          "table_name_template": "{{ day | date('%Y') }}"}  # fmt: skip
    if fixed:
        pg.update(table_name_template="2026",
                  mappings={"fields": [{"action": "remove", "src": "/day"}]})  # fmt: skip
    return {
        "data_dir": str(data),
        "api_keys": [{"id": "web", "js": "js-web-secret-1", "server": "s2s-web-secret-1"}],
        "enrichment": {"ip_database": str(geo)},
        "processing": {"work_dir": str(data.parent / "work")},
        "spark": spark,
        "destinations": {
            "warehouse": {
                "type": "duckdb",
                "table_name_template": "{{ event_type }}",
                "enrichment": [{"name": "ip_lookup", "from": "/client_ip", "to": "/client_geo"}],
                "transforms": [{"python": "tests.transform_functions:keep_even"}],
            },
            "live": {"type": "duckdb", "mode": "stream", "path": str(data / "live.duckdb")},
            "lake": {"type": "parquet"},
            "pg": pg,
        },
    }


def _rows(db: Any, sql: str) -> list[tuple[Any, ...]]:
    return sorted(db.execute(sql).fetchall(), key=repr)


def _duckdb_tables(file: Path) -> dict[str, list[tuple[Any, ...]]]:
    with duckdb.connect(str(file), read_only=True) as db:
        names = [r[0] for r in db.execute(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_name NOT LIKE '\\_eventpipe%' ESCAPE '\\'").fetchall()]  # fmt: skip
        return {t: _rows(db, f'SELECT * FROM "{t}"')
                for t in sorted(names)}  # fmt: skip


def _parquet_rows(data: Path) -> list[tuple[Any, ...]]:
    files = str(data / "parquet/events/**/*.parquet")
    with duckdb.connect() as db:
        return _rows(db, f"SELECT * FROM read_parquet('{files}')")


def _postgres_tables(dsn: str, schema: str) -> dict[str, list[tuple[Any, ...]]]:
    with psycopg.connect(dsn) as db:
        found: dict[str, list[tuple[Any, ...]]] = {}
        tables = [r[0] for r in db.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s "
            "AND table_name NOT LIKE '\\_eventpipe%%'", (schema,)).fetchall()]  # fmt: skip
        for table in tables:
            columns = [r[0] for r in db.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = %s "
                "AND table_name = %s ORDER BY ordinal_position", (schema, table),
            ).fetchall()]  # fmt: skip
            listed = ", ".join(f'"{c}"' for c in columns)
            found[table] = _rows(db, f'SELECT {listed} FROM "{schema}"."{table}"')
        return found


def _tables(data: Path, dsn: str, schema: str, *, stream: bool = True) -> dict[str, Any]:
    found = {
        "warehouse": _duckdb_tables(data / "warehouse.duckdb"),
        "lake": _parquet_rows(data),
        "pg": _postgres_tables(dsn, schema),
    }
    if stream:
        found["live"] = _duckdb_tables(data / "live.duckdb")
    return found


class _Watched:
    """A command whose output is read as it comes: ``saw(text)`` waits for a line."""

    def __init__(self, command: list[str], **kwargs: Any) -> None:
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, **kwargs)  # fmt: skip
        self.lines: list[str] = []
        self._new = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._new:
                self.lines.append(line)
                self._new.notify_all()

    def saw(self, text: str, timeout: float) -> bool:
        with self._new:
            return self._new.wait_for(lambda: any(text in line for line in self.lines), timeout)

    def wait(self, timeout: float) -> tuple[int, str]:
        code = self.process.wait(timeout)
        time.sleep(0.2)  # the reader's last lines
        assert self.process.stdout is not None
        self.process.stdout.close()
        return code, "".join(self.lines)


def _cli(*args: str, timeout: float = 600) -> str:
    done = subprocess.run([*EVENTPIPE, *args], cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


@pytest.mark.slow
@pytest.mark.timeout(900)  # about 150 s alone; runs of the cluster's apps are slow
def test_a_standalone_cluster_loads_what_local_mode_loads(
    cluster: Cluster, shared_dir: Path, tmp_path: Path, spark: Any, geo_database: Path,
    postgres_dsn: str, postgres_schema: str,
) -> None:  # fmt: skip
    on_cluster, local = shared_dir / "data", tmp_path / "data"
    _segments(on_cluster / "incoming", 400)
    shutil.copytree(on_cluster / "incoming", local / "incoming")
    config_path = shared_dir / "eventpipe.yaml"
    cluster_schema = postgres_schema + "_c"
    ours = (geo_database, postgres_dsn, cluster_schema)
    config_path.write_text(yaml.safe_dump(_config(on_cluster, cluster.spark_settings(), *ours)))
    theirs = (geo_database, postgres_dsn, postgres_schema)
    local_config = _config(local, {"master": "local[2]"}, *theirs)
    try:
        # A worker dies while the batch run shapes the events: its executor's tasks and
        # shuffle files are lost, Spark runs them again on the other worker.
        run = _Watched([*EVENTPIPE, "process", "--once", "-c", str(config_path)], cwd=ROOT,
                       env=_env())  # fmt: skip
        assert run.saw("dst=warehouse: enrich, map, flatten and stage ...", 300), run.lines
        cluster.kill_worker(0)
        code, output = run.wait(600)
        print(f"process --once with a worker killed: exit {code}")  # shown by pytest -rP
        if code != 0:  # the run may stop on the loss; it then resumes to the same tables
            assert "error" in output, output[-4000:]
            _cli("process", "--once", "-c", str(config_path))
        assert "Telling app of lost executor" in (cluster.logs / "master.log").read_text()
        cluster.start_worker(0)
        in_local_mode = parse_config(local_config, source="t", env={})
        stream.run_once(spark, in_local_mode)  # as process --once does: streams, then batch
        process_pending(in_local_mode, spark)

        tables = _tables(on_cluster, postgres_dsn, cluster_schema)
        assert set(tables["warehouse"]) == {"view", "click"}
        assert sum(len(rows) for rows in tables["warehouse"].values()) == 200  # keep_even ran
        assert len(tables["lake"]) == 400
        assert sum(len(rows) for rows in tables["live"].values()) == 400
        assert sum(len(rows) for rows in tables["pg"].values()) == 390  # 10 failed
        assert tables == _tables(local, postgres_dsn, postgres_schema)
        with duckdb.connect(str(on_cluster / "warehouse.duckdb"), read_only=True) as db:
            cities = {r[0] for r in db.execute("SELECT client_geo_city FROM view").fetchall()}
            browsers = {r[0] for r in db.execute(
                "SELECT eventn_ctx_parsed_ua_ua_family FROM view").fetchall()}  # fmt: skip
        assert cities == {"London"}  # the driver's IP database, read on the executors
        assert browsers == {"Firefox", "Mobile Safari"}
        assert list((on_cluster / "incoming").glob("incoming.*")) == []  # archived
        assert not (on_cluster / "tmp").exists()  # staged in processing.work_dir

        # The operator fixes pg's template and replays its failed events, launching the
        # job with spark-submit (client mode): the master is spark-submit's.
        fixed_path = shared_dir / "fixed.yaml"
        submitted = {k: v for k, v in cluster.spark_settings().items() if k != "master"}
        fixed_path.write_text(yaml.safe_dump(_config(on_cluster, submitted, *ours, fixed=True)))
        cluster.wait_for_workers(2)
        replayed = _Watched([
            str(SPARK_HOME / "bin/spark-submit"), "--master", cluster.master,
            "--name", "eventpipe-replay", _entry(),
            "replay", "failed", "--destination", "pg", "-c", str(fixed_path),
        ], cwd=ROOT, env={**_env(), "PYSPARK_PYTHON": sys.executable})  # fmt: skip
        code, output = replayed.wait(600)
        assert code == 0, output[-4000:]
        assert "pg._2026: 10 rows" in output, output[-2000:]
        assert "eventpipe-replay" in cluster.finished_apps()
        replay_failed(parse_config(_config(local, {"master": "local[2]"}, *theirs, fixed=True),
                                   source="t", env={}), spark, "pg")  # fmt: skip

        # Reprocess rebuilds the warehouse's days from the archive, on the cluster.
        days = ("--from", DAYS[0], "--to", DAYS[-1], "--destination", "warehouse", "--force")
        assert "3 day(s) rebuilt" in _cli("reprocess", *days, "-c", str(config_path))
        first, last = (datetime.date.fromisoformat(d) for d in (DAYS[0], DAYS[-1]))
        reprocess(spark, in_local_mode, "warehouse", first, last, force=True)

        tables = _tables(on_cluster, postgres_dsn, cluster_schema)
        assert sum(len(rows) for rows in tables["pg"].values()) == 400
        assert sum(len(rows) for rows in tables["warehouse"].values()) == 200
        assert tables == _tables(local, postgres_dsn, postgres_schema)
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True) as db:
            db.execute(f'DROP SCHEMA IF EXISTS "{cluster_schema}" CASCADE')


def _entry() -> str:
    """The file spark-submit runs, as ``eventpipe spark-entry`` prints it."""
    return _cli("spark-entry").strip()


@pytest.mark.timeout(600)
def test_spark_connect_runs_the_batch_pipeline_on_the_cluster(
    cluster: Cluster, shared_dir: Path, tmp_path: Path, spark: Any, geo_database: Path,
    postgres_dsn: str, postgres_schema: str,
) -> None:  # fmt: skip
    """A Spark Connect server (pyspark's own jar) whose master is the cluster; eventpipe
    is its client (``spark: {remote: sc://...}``), and the IP database reaches the
    executors as an artifact of the client's session."""
    on_cluster, local = shared_dir / "data", tmp_path / "data"
    _segments(on_cluster / "incoming", 200)
    shutil.copytree(on_cluster / "incoming", local / "incoming")
    cluster_schema = postgres_schema + "_c"

    def config(data: Path, spark: dict[str, Any], schema: str) -> dict[str, Any]:
        settings = _config(data, spark, geo_database, postgres_dsn, schema)
        del settings["destinations"]["live"]  # a stream needs a classic session
        settings["destinations"]["pg"].pop("table_name_template")
        return settings

    port = free_port()
    server_settings = parse_config({"spark": cluster.spark_settings()}, source="t", env={})
    settings = {**server_settings.spark.settings, "spark.connect.grpc.binding.port": str(port),
                "spark.pyspark.python": sys.executable}  # fmt: skip
    master = settings.pop("spark.master")
    confs = [a for k, v in settings.items() for a in ("--conf", f"{k}={v}")]
    cluster.wait_for_workers(2)
    server = _Watched([
        str(SPARK_HOME / "bin/spark-submit"), "--master", master, "--name", "connect-server",
        "--class", "org.apache.spark.sql.connect.service.SparkConnectServer", *confs,
        str(next((SPARK_HOME / "jars").glob("spark-connect_*.jar"))),
    ], cwd=ROOT, env={**_env(), "SPARK_NO_DAEMONIZE": "1"}, start_new_session=True)  # fmt: skip
    try:
        assert server.saw("Spark Connect server started", 120), "".join(server.lines)[-4000:]
        config_path = shared_dir / "connect.yaml"
        remote = {"remote": f"sc://127.0.0.1:{port}"}
        config_path.write_text(yaml.safe_dump(config(on_cluster, remote, cluster_schema)))
        output = _cli("process", "--once", "-c", str(config_path))
        assert "warehouse.view" in output, output
        process_pending(parse_config(config(local, {"master": "local[2]"}, postgres_schema),
                                     source="t", env={}), spark)  # fmt: skip

        tables = _tables(on_cluster, postgres_dsn, cluster_schema, stream=False)
        assert sum(len(rows) for rows in tables["warehouse"].values()) == 100
        assert len(tables["lake"]) == 200
        assert tables == _tables(local, postgres_dsn, postgres_schema, stream=False)
        with duckdb.connect(str(on_cluster / "warehouse.duckdb"), read_only=True) as db:
            cities = {r[0] for r in db.execute("SELECT client_geo_city FROM view").fetchall()}
        assert cities == {"London"}  # the client's IP database, on the executors
    finally:
        os.killpg(server.process.pid, signal.SIGTERM)
        server.wait(60)
        with psycopg.connect(postgres_dsn, autocommit=True) as db:
            db.execute(f'DROP SCHEMA IF EXISTS "{cluster_schema}" CASCADE')
