"""The pipeline on a real standalone cluster (tests/cluster/conftest.py) gives the same
tables as on ``local[2]``, with only ``spark:`` changed: into DuckDB, PostgreSQL and
Parquet, through a Python transform and both lookups, the IP database a file only the
driver has (pytest's ``/tmp``, which executors do not see)."""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

import duckdb
import orjson
import psycopg
import yaml

from eventpipe.config import parse_config
from eventpipe.processing.job import process_pending
from tests.cluster.conftest import Cluster
from tests.process import _env

ROOT = Path(__file__).resolve().parents[2]
AGENTS = [
    "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 "
    "(KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1",
]


def _segments(incoming: Path, events: int) -> None:
    """Sealed segments of two writers, as collectors write them."""
    rng = random.Random(7)
    incoming.mkdir(parents=True)
    for writer in ("a-0", "b-0"):
        lines = []
        for n in range(events // 2):
            lines.append(orjson.dumps({
                "eventn_ctx": {"event_id": f"{writer}-{n}", "user_agent": rng.choice(AGENTS)},
                "source_ip": rng.choice(["81.2.69.10", "2001:db8::1", "192.0.2.1"]),
                "client_ip": "81.2.69.20",
                "_timestamp": f"2026-11-2{n % 3}T10:00:00.000000Z",
                "api_key": "web", "event_type": rng.choice(["view", "click"]), "n": n,
                "props": {"price": rng.randint(1, 100), "tags": ["a", "b"][: n % 3]},
            }))  # fmt: skip
        name = f"incoming.tok=web|w={writer}-2026-11-23T10-00-00.000.log"
        (incoming / name).write_bytes(b"\n".join(lines) + b"\n")


def _config(data: Path, spark: dict[str, Any], geo: Path, dsn: str, schema: str) -> dict[str, Any]:
    return {
        "data_dir": str(data),
        "api_keys": [{"id": "web", "js": "js-web-secret-1", "server": "s2s-web-secret-1"}],
        "enrichment": {"ip_database": str(geo)},
        "spark": spark,
        "destinations": {
            "warehouse": {
                "type": "duckdb",
                "table_name_template": "{{ event_type }}",
                "enrichment": [{"name": "ip_lookup", "from": "/client_ip", "to": "/client_geo"}],
                "transforms": [{"python": "tests.transform_functions:keep_even"}],
            },
            "lake": {"type": "parquet"},
            "pg": {"type": "postgres", "dsn": dsn, "schema": schema},
        },
    }


def _rows(db: Any, sql: str) -> list[tuple[Any, ...]]:
    return sorted(db.execute(sql).fetchall(), key=repr)


def _duckdb_tables(data: Path) -> dict[str, list[tuple[Any, ...]]]:
    with duckdb.connect(str(data / "warehouse.duckdb"), read_only=True) as db:
        names = [r[0] for r in db.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_name NOT LIKE '\\_%' "
            "ESCAPE '\\'").fetchall()]  # fmt: skip
        return {t: _rows(db, f'SELECT * FROM "{t}"')
                for t in sorted(names)}  # fmt: skip


def _parquet_rows(data: Path) -> list[tuple[Any, ...]]:
    files = str(data / "parquet/events/**/*.parquet")
    with duckdb.connect() as db:
        return _rows(db, f"SELECT * FROM read_parquet('{files}')")


def _postgres_rows(dsn: str, schema: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as db:
        columns = [r[0] for r in db.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = %s "
            "AND table_name = 'events' "
            "ORDER BY ordinal_position", (schema,)).fetchall()]  # fmt: skip
        listed = ", ".join(f'"{c}"' for c in columns)
        return _rows(db, f'SELECT {listed} FROM "{schema}".events')


def test_a_standalone_cluster_loads_what_local_mode_loads(
    cluster: Cluster, shared_dir: Path, tmp_path: Path, spark: Any, geo_database: Path,
    postgres_dsn: str, postgres_schema: str,
) -> None:  # fmt: skip
    on_cluster, local = shared_dir / "data", tmp_path / "data"
    _segments(on_cluster / "incoming", 400)
    shutil.copytree(on_cluster / "incoming", local / "incoming")
    config_path = shared_dir / "eventpipe.yaml"
    cluster_schema = postgres_schema + "_c"
    settings = _config(on_cluster, cluster.spark_settings(), geo_database, postgres_dsn,
                       cluster_schema)  # fmt: skip
    config_path.write_text(yaml.safe_dump(settings))
    try:
        done = subprocess.run(
            [*_eventpipe(), "process", "--once", "-c", str(config_path)],
            cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-4000:]
        process_pending(parse_config(_config(local, {"master": "local[2]"}, geo_database,
                                             postgres_dsn, postgres_schema), source="t",
                                     env={}), spark)  # fmt: skip

        tables = _duckdb_tables(on_cluster)
        assert set(tables) == {"view", "click"}
        assert tables == _duckdb_tables(local)
        assert sum(len(rows) for rows in tables.values()) == 200  # keep_even ran
        with duckdb.connect(str(on_cluster / "warehouse.duckdb"), read_only=True) as db:
            cities = {r[0] for r in db.execute("SELECT client_geo_city FROM view").fetchall()}
            browsers = {r[0] for r in db.execute(
                "SELECT eventn_ctx_parsed_ua_ua_family FROM view").fetchall()}  # fmt: skip
        assert cities == {"London"}  # the driver's IP database, read on the executors
        assert browsers == {"Firefox", "Mobile Safari"}
        assert len(_parquet_rows(on_cluster)) == 400
        assert _parquet_rows(on_cluster) == _parquet_rows(local)
        assert _postgres_rows(postgres_dsn, cluster_schema) == _postgres_rows(
            postgres_dsn, postgres_schema
        )
        assert list((on_cluster / "incoming").glob("incoming.*")) == []  # archived
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True) as db:
            db.execute(f'DROP SCHEMA IF EXISTS "{cluster_schema}" CASCADE')


def _eventpipe() -> list[str]:
    from tests.process import EVENTPIPE

    return EVENTPIPE
