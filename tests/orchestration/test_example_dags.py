"""eventpipe's example DAGs under a real Airflow (installed from PyPI, pinned; its
metadata database in SQLite under a temporary directory; no web server, no scheduler:
``airflow dags test`` runs a DAG's tasks for one logical date).

Over a data directory with events of three days: the hourly DAG loads them, and again
changes nothing (skipped); after a mapping change, the daily DAG for one day rebuilds
that day only; a backfill of the three days rebuilds the other two; with Airflow's
database dropped and made again, the same backfill rebuilds nothing (eventpipe's state
store is the record, seed 4's restart from scratch) and the tables stay the same."""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
import subprocess
import sys
from contextlib import closing
from importlib import resources
from pathlib import Path
from typing import Any

import duckdb
import pytest
import yaml

from tests.process import _env

BIN = Path(sys.executable).parent
DAYS = ("2026-11-20", "2026-11-21", "2026-11-22")


class Airflow:
    """An Airflow home in a temporary directory, the example DAGs in its dags/ folder."""

    def __init__(self, home: Path, config: Path) -> None:
        self.home = home
        dags = home / "dags"
        dags.mkdir(parents=True)
        example = resources.files("eventpipe.airflow").joinpath("example_dag.py")
        shutil.copy(str(example), dags / "eventpipe_dags.py")  # as the docs say
        self.env = {
            **_env(),
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "EVENTPIPE_CONFIG": str(config),
            "EVENTPIPE_EXECUTABLE": str(BIN / "eventpipe"),
            "EVENTPIPE_START": "2026-11-01",
        }

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([str(BIN / "airflow"), *args], env=self.env, capture_output=True,
                              text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done

    def migrate(self) -> None:
        self.run("db", "migrate")

    def drop_database(self) -> None:
        for path in self.home.glob("airflow.db*"):  # with SQLite's journal files
            path.unlink()

    def test(self, dag: str, date: str) -> dict[str, str]:
        """``airflow dags test`` of one logical date: each task's final state, as Airflow's
        database records it."""
        self.run("dags", "test", dag, date)
        with closing(sqlite3.connect(self.home / "airflow.db")) as db:
            rows = db.execute(
                "SELECT task_id, state FROM task_instance WHERE dag_id = ? AND run_id = "
                "(SELECT run_id FROM dag_run WHERE dag_id = ? ORDER BY id DESC LIMIT 1)",
                [dag, dag],
            ).fetchall()
        return {task: state for task, state in rows}

    def tests(self, *runs: tuple[str, str], migrate: bool = False) -> list[dict[str, str]]:
        """Several runs as ``airflow dags test`` runs each (``DAG.test``), in one process
        (tests/orchestration/dag_runner.py): each run's task states."""
        runner = Path(__file__).with_name("dag_runner.py")
        arguments = [*(["--migrate"] if migrate else []), *(f"{d}={t}" for d, t in runs)]
        done = subprocess.run([sys.executable, str(runner), *arguments], env=self.env,
                              capture_output=True, text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        [line] = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULTS ")]
        return [run["states"] for run in json.loads(line.removeprefix("RESULTS "))]


def _tables(warehouse: Path) -> dict[str, Any]:
    """Per day: the rows' digest and whether they have the mapped column."""
    with duckdb.connect(str(warehouse), read_only=True) as db:
        columns = [c for (c,) in db.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'events'"
        ).fetchall()]  # fmt: skip
        number = "number" if "number" in columns else "NULL"
        rows = db.execute(
            f"SELECT strftime(_timestamp, '%Y-%m-%d'), eventn_ctx_event_id, n, {number} "
            "FROM events ORDER BY 1, 2"
        ).fetchall()
    days: dict[str, Any] = {}
    for day in DAYS:
        of_day = [r for r in rows if r[0] == day]
        days[day] = {
            "rows": len(of_day),
            "mapped": all(r[3] is not None and r[2] is None for r in of_day),
            "digest": hashlib.sha256(repr(of_day).encode()).hexdigest()[:16],
        }
    return days


@pytest.mark.slow
def test_the_example_dags_load_reprocess_and_restart_from_scratch(tmp_path: Path) -> None:
    data = tmp_path / "data"
    raw: dict[str, Any] = {
        "data_dir": str(data),
        "api_keys": [{"id": "web", "js": "js-web-secret-1", "server": "s2s-web-secret-1"}],
        "destinations": {"dw": {"type": "duckdb", "path": str(tmp_path / "w.duckdb")}},
        "spark": {"master": "local[2]", "spark.sql.shuffle.partitions": 2},
    }
    config = tmp_path / "eventpipe.yaml"
    config.write_text(yaml.safe_dump(raw))
    events = tmp_path / "events.ndjson"
    events.write_text("".join(
        json.dumps({"n": i, "_timestamp": f"{day}T{i % 24:02d}:00:00Z", "event_type": "e"}) + "\n"
        for day in DAYS for i in range(10)
    ))  # fmt: skip
    command = [str(BIN / "eventpipe"), "import", str(events), "--key", "web", "-c", str(config)]
    imported = subprocess.run(command, env=_env(), capture_output=True, text=True)
    assert imported.returncode == 0, imported.stderr

    airflow = Airflow(tmp_path / "airflow", config)
    airflow.migrate()
    hour = "2026-11-22T10:00:00+00:00"
    assert airflow.test("eventpipe_hourly", hour) == {"process": "success"}
    loaded = _tables(tmp_path / "w.duckdb")
    assert [loaded[d]["rows"] for d in DAYS] == [10, 10, 10]
    # The same hour again: nothing sealed is left, the task is skipped, nothing changes.
    assert airflow.tests(("eventpipe_hourly", hour)) == [{"process": "skipped"}]
    assert _tables(tmp_path / "w.duckdb") == loaded

    # A mapping change: the daily DAG of the 21st rebuilds the 21st, and only it; then a
    # backfill of the three days rebuilds the other two (the 21st is up to date).
    raw["destinations"]["dw"]["mappings"] = {
        "fields": [{"src": "/n", "dst": "/number", "action": "move"}]
    }
    config.write_text(yaml.safe_dump(raw))
    [one_day] = airflow.tests(("eventpipe_daily", "2026-11-21"))
    assert one_day == {"verify_archive": "success", "reprocess_day": "success"}
    after = _tables(tmp_path / "w.duckdb")
    assert [after[d]["mapped"] for d in DAYS] == [False, True, False]
    assert after["2026-11-20"] == loaded["2026-11-20"]
    assert after["2026-11-22"] == loaded["2026-11-22"]
    daily = [("eventpipe_daily", day) for day in DAYS]
    runs = airflow.tests(*daily)
    assert [run["reprocess_day"] for run in runs] == ["success", "skipped", "success"]
    rebuilt = _tables(tmp_path / "w.duckdb")
    assert all(rebuilt[d]["mapped"] and rebuilt[d]["rows"] == 10 for d in DAYS)

    # Airflow's database dropped and made again: the same backfill rebuilds nothing.
    airflow.drop_database()
    runs = airflow.tests(*daily, migrate=True)
    assert [run["reprocess_day"] for run in runs] == ["skipped", "skipped", "skipped"]
    assert _tables(tmp_path / "w.duckdb") == rebuilt
