"""`eventpipe run`: collector and pipeline as one service, as `make run` starts it."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import duckdb
import httpx
import psutil
import pytest

from tests.process import CollectorProcess, free_port, run, write_config


def _count(path: Path) -> int | None:
    try:
        db = duckdb.connect(str(path), read_only=True)
    except duckdb.Error:
        return None  # the pipeline holds the file while loading
    try:
        return int(db.execute("SELECT count(*) FROM events").fetchone()[0])  # type: ignore[index]
    except duckdb.CatalogException:
        return None
    finally:
        db.close()


@pytest.mark.slow
def test_run_collects_processes_and_stops_cleanly(tmp_path: Path) -> None:
    port = free_port()
    config = write_config(
        tmp_path / "eventpipe.yaml", tmp_path / "data", port,
        incoming={"rotate_seconds": 1},
        processing={"batch_period_seconds": 4, "release_idle_seconds": 6},
        spark={"master": "local[2]", "spark.sql.shuffle.partitions": 2},
    )  # fmt: skip
    proc = CollectorProcess(config, port, tmp_path / "run.log", command="run")
    try:
        proc.wait_ready()
        # A second `run` of the same config finds the port taken, before its pipeline
        # starts a JVM (it took 37 s to refuse); the first goes on.
        second = run("run", "-c", str(config), timeout=30)
        assert second.returncode == 2, second.stderr
        assert f"127.0.0.1:{port} is taken by pid " in second.stderr
        assert "pipeline started" not in second.stderr + second.stdout
        # Five events, then five more once the first are loaded: those seal (after 1 s)
        # while the pipeline waits its 4 s for the next run, and that wait compresses
        # them for the archive and infers their schemas.
        for first in (0, 5):
            for i in range(first, first + 5):
                response = httpx.post(
                    proc.url + "/api/v1/event", params={"token": "js-web-secret-1"}, json={"i": i}
                )
                assert response.status_code == 200
            deadline = time.monotonic() + 120
            while _count(tmp_path / "data/warehouse.duckdb") != first + 5:
                assert time.monotonic() < deadline, proc.log_path.read_text()[-3000:]
                time.sleep(0.5)
        # Idle for release_idle_seconds: the pipeline stops, its JVM with it, and the
        # service holds the collector's memory only; a sealed segment starts it again.
        _wait_for_line(proc, "stopping Spark to free its memory")
        deadline = time.monotonic() + 30
        while any("java" in p.name() for p in _tree(proc.proc.pid)):
            assert time.monotonic() < deadline, "the JVM is still running"
            time.sleep(0.5)
        idle_mb = sum(p.memory_info().rss for p in _tree(proc.proc.pid)) / 2**20
        assert idle_mb < 400, f"the idle service holds {idle_mb:.0f} MB"
        for i in range(10, 15):
            response = httpx.post(
                proc.url + "/api/v1/event", params={"token": "js-web-secret-1"}, json={"i": i}
            )
            assert response.status_code == 200
        deadline = time.monotonic() + 180
        while _count(tmp_path / "data/warehouse.duckdb") != 15:
            assert time.monotonic() < deadline, proc.log_path.read_text()[-3000:]
            time.sleep(0.5)
        assert "pipeline: work arrived; starting it again" in proc.log_path.read_text()
        # The rows are in before the run archives and prints its summary: wait for that,
        # so that what follows the signal is the stopping alone.
        deadline = time.monotonic() + 60
        while "archived " not in proc.log_path.read_text().split("starting it again")[-1]:
            assert time.monotonic() < deadline, proc.log_path.read_text()[-3000:]
            time.sleep(0.5)
        stopping = len(proc.log_path.read_text().splitlines())
        proc.signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        proc.kill()
    log = proc.log_path.read_text()
    assert "pipeline started" in log
    # Stopping: a line per process (two collector workers, the pipeline), nothing of
    # Spark's (the JVM's own output is in data/logs/spark.log).
    last = log.splitlines()[stopping:]
    assert len(last) <= 3, last
    assert "Using incubator modules" not in log
    assert "Using incubator modules" in (tmp_path / "data/logs/spark.log").read_text()
    # (a segment per collector worker), compressed for the archive and its schema
    # inferred in the wait; the next run merged those schemas instead of inferring.
    assert re.search(r"prepared \d+ sealed segment\(s\) while waiting", log), log[-3000:]
    assert re.search(r"merge the kept schemas of \d+ segment\(s\)", log), log[-3000:]
    data = tmp_path / "data"
    assert len(list((data / "archive").rglob("*.lz4"))) >= 2
    assert not any((data / "tmp/archive-ahead").iterdir())  # moved in, none left
    # the kept schemas of archived segments are removed with them
    kept = [p.name.removesuffix(".json") for p in (data / "tmp/schemas").glob("*.json")]
    assert all((data / "incoming" / name).exists() for name in kept), kept


def _tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def _wait_for_line(proc: CollectorProcess, text: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while text not in proc.log_path.read_text():
        assert time.monotonic() < deadline, proc.log_path.read_text()[-3000:]
        time.sleep(0.5)
