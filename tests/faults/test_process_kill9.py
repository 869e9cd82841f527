"""kill -9 `eventpipe process --once` at moments spread over a run, then run it again: the
tables equal those of a run without the fault (nothing lost, nothing doubled)."""

from __future__ import annotations

import random
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pytest

from tests.process import EVENTPIPE, _env, write_config

TABLES = ["page", "click", "signup", "purchase"]


def _segment(data: Path) -> None:
    rng = random.Random(7)
    incoming = data / "incoming"
    incoming.mkdir(parents=True)
    for part in range(3):
        lines = []
        for i in range(400):
            lines.append(orjson.dumps({
                "event_type": rng.choice(TABLES),
                "n": rng.randint(0, 100),
                "props": {"price": rng.random(), "tag": rng.choice(["a", "b", None])},
                "api_key": "web",
                "_timestamp": "2026-11-21T10:00:00.000000Z",
                "eventn_ctx": {"event_id": f"p{part}-{i}"},
            }) + b"\n")  # fmt: skip
        (incoming / f"incoming.tok=web-2026-11-21T10-00-0{part}.000.log").write_bytes(
            b"".join(lines)
        )


def _setup(root: Path) -> Path:
    data = root / "data"
    _segment(data)
    return write_config(
        root / "eventpipe.yaml", data, 0,
        destinations={"warehouse": {"type": "duckdb", "table_name_template": "{{ event_type }}"}},
        spark={"master": "local[2]", "spark.sql.shuffle.partitions": 2},
    )  # fmt: skip


def _process(config: Path, kill_after: float | None = None) -> float:
    started = time.monotonic()
    proc = subprocess.Popen(
        [*EVENTPIPE, "process", "--once", "-c", str(config)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(),
    )  # fmt: skip
    if kill_after is None:
        assert proc.wait(300) == 0
    else:
        try:
            proc.wait(kill_after)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
    return time.monotonic() - started


def _tables(data: Path) -> dict[str, list[tuple[Any, ...]]]:
    db = duckdb.connect(str(data / "warehouse.duckdb"), read_only=True)
    try:
        return {
            t: db.execute(
                f"SELECT eventn_ctx_event_id, n, props_price, props_tag FROM {t} ORDER BY 1"
            ).fetchall()
            for t in TABLES
        }
    finally:
        db.close()


def _loads(data: Path) -> int:
    path = data / "warehouse.duckdb"
    if not path.exists():
        return 0
    db = duckdb.connect(str(path), read_only=True)
    try:
        return int(db.execute("SELECT count(*) FROM _eventpipe_loads").fetchone()[0])  # type: ignore[index]
    except duckdb.CatalogException:
        return 0
    finally:
        db.close()


def _run_started(data: Path) -> bool:
    import sqlite3

    path = data / "state.sqlite"
    if not path.exists():
        return False
    db = sqlite3.connect(path)
    try:
        return db.execute("SELECT count(*) FROM runs").fetchone()[0] > 0
    except sqlite3.OperationalError:
        return False
    finally:
        db.close()


@pytest.mark.slow
def test_a_killed_run_completes_to_the_clean_result(tmp_path: Path) -> None:
    clean = _setup(tmp_path / "clean")
    duration = _process(clean)
    expected = _tables(tmp_path / "clean/data")
    assert sum(len(rows) for rows in expected.values()) == 1200

    # Kill at moments spread over a run (start-up, reading, loading, archiving), several
    # times on the same data directory, then let one run finish.
    faulty = _setup(tmp_path / "faulty")
    data = tmp_path / "faulty/data"
    mid_run = 0
    for fraction in (0.55, 0.75, 0.85, 0.92, 0.97):
        _process(faulty, kill_after=duration * fraction)
        loaded = _loads(data)
        if _run_started(data) and loaded < len(TABLES):
            mid_run += 1  # killed after the run was planned, before every table was in
    _process(faulty)
    assert mid_run >= 1, "no kill landed inside a run; the test proved nothing"
    assert _tables(data) == expected
    assert _loads(data) == len(TABLES)  # each table's batch committed exactly once
    assert not list((tmp_path / "faulty/data/incoming").glob("incoming.*"))  # all archived
    shutil.rmtree(tmp_path / "clean")
