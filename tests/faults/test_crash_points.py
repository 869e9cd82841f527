"""The pipeline dies at 20 points spread over a batch load, into DuckDB and into
PostgreSQL: before a load, during it (the database committed, the call did not return),
after it but before its status is recorded, before a run is marked done, before and
after a segment's archive files are written. Into PostgreSQL, the state store is in
PostgreSQL too (the production setup). After each, the next run completes the work,
every table equals (by a content hash) the tables of a run with no fault: no event lost,
none doubled, and the archive holds every event once and verifies.

The death is an exception the pipeline cannot catch as an error (a BaseException, like
Ctrl-C) raised at the chosen call, in the test's process with its Spark session, so that
40 deaths fit in the suite's time. A death in the thread that archives ahead (during the
loads) ends that thread where it was, and the run raises it when it waits for the thread.
Real kill -9s, at moments spread over a run, are in test_process_kill9.py and
test_collector_kill9.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import orjson
import psycopg
import pytest

from eventpipe.archive import write as archive_write
from eventpipe.archive.files import ArchivedSegment
from eventpipe.archive.read import lines
from eventpipe.archive.verify import verify
from eventpipe.config import Config
from eventpipe.destinations.duckdb import DuckDBDestination
from eventpipe.destinations.postgres import PostgresDestination
from eventpipe.processing.batch import archiving
from eventpipe.processing.batch.job import process_pending
from eventpipe.state.store import StateStore, open_state
from tests.conftest import make_config

TABLES = ("page", "click", "signup")
CRASHES = int(os.environ.get("EVENTPIPE_SOAK_CRASHES", "20"))
EVENTS = 3 * 60


class Died(BaseException):
    """The process died here."""


def _write_segments(data: Path) -> None:
    rng = random.Random(11)
    incoming = data / "incoming"
    incoming.mkdir(parents=True)
    for part in range(3):
        lines = [
            orjson.dumps({
                "event_type": rng.choice(TABLES), "n": rng.randint(0, 99),
                "price": rng.random(), "tag": rng.choice(["a", "b", None]),
                "event_id": f"p{part}-{i}", "api_key": "web",
            })
            for i in range(60)
        ]  # fmt: skip
        name = f"incoming.tok=web-2026-11-21T10-00-0{part}.000.log"
        (incoming / name).write_bytes(b"\n".join(lines) + b"\n")


class CrashPoints:
    """Counts the calls of the functions the pipeline could die in, and dies at the
    ``at``-th (None: counts only)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, load: tuple[type, str]) -> None:
        self.at: int | None = None
        self.calls = 0
        self.where: str | None = None
        self._lock = threading.Lock()  # the archive-ahead thread counts too
        points: list[tuple[Any, str, str]] = [
            (load[0], load[1], "before and after a load"),
            (StateStore, "record", "before and after a status record"),
            (StateStore, "finish_run", "before a run is marked"),
            (archiving, "archive_segment", "before and after a segment is archived"),
            (archive_write, "write_segment", "before and after its archive files are written"),
        ]
        for owner, name, _ in points:
            monkeypatch.setattr(owner, name, self._wrap(getattr(owner, name), name))

    def _wrap(self, real: Callable[..., Any], name: str) -> Callable[..., Any]:
        def dying(*args: Any, **kwargs: Any) -> Any:
            self._point(f"before {name}")
            result = real(*args, **kwargs)
            self._point(f"after {name}")
            return result

        return dying

    def _point(self, where: str) -> None:
        with self._lock:
            self.calls += 1
            dies = self.at is not None and self.calls == self.at
        if dies:
            self.where = where
            raise Died(where)


def _crash_then_complete(config: Config, spark: Any, points: CrashPoints, at: int) -> str | None:
    """Run with a death at the ``at``-th point, then without; where it died."""
    points.calls, points.at, points.where = 0, at, None
    with contextlib.suppress(Died):
        process_pending(config, spark)
    points.at = None
    process_pending(config, spark)
    assert open_state(config).unfinished_runs() == []
    assert not config.layout.sealed_segments()  # everything archived
    archive = verify(config.layout)
    assert archive.ok, archive.problems
    assert archive.events == EVENTS
    return points.where


def _digest(rows: list[tuple[Any, ...]]) -> str:
    return hashlib.sha256(repr(sorted(map(repr, rows))).encode()).hexdigest()


def _run_faults(
    tmp_path: Path,
    spark: Any,
    monkeypatch: pytest.MonkeyPatch,
    destination: Callable[[Path], dict[str, Any]],
    load: tuple[type, str],
    tables: Callable[[Config], dict[str, str]],
    state: Callable[[Path], dict[str, Any]] = lambda root: {},
) -> None:
    def fresh(name: str) -> Config:
        data = tmp_path / name / "data"
        _write_segments(data)
        root = tmp_path / name
        return make_config(data, destinations={"dst": destination(root)}, state=state(root))

    points = CrashPoints(monkeypatch, load)
    clean = fresh("clean")
    process_pending(clean, spark)
    expected = tables(clean)
    assert len(expected) == len(TABLES)
    total = points.calls
    rng = random.Random(20261122)
    # Points spread over the whole run, with random ones in between.
    wanted = min(CRASHES, total)  # each point at most once: a death there is repeatable
    chosen = sorted({1 + (total - 1) * i // (wanted - 1) for i in range(wanted)})
    while len(chosen) < wanted:
        chosen = sorted(set(chosen) | {rng.randint(1, total)})
    died = []
    for index, at in enumerate(chosen):
        config = fresh(f"crash{index}")
        died.append(_crash_then_complete(config, spark, points, at))
        assert tables(config) == expected, f"after a death {died[-1]} (point {at})"
    print(f"\n{len(died)} deaths at {total} points, the tables equal after each: "
          + ", ".join(f"{w} x{died.count(w)}" for w in sorted(set(map(str, died)))))  # fmt: skip
    assert None not in died  # each of the deaths happened
    assert {"before load", "after load", "before record", "after record"} <= set(died), died


def _duckdb_tables(config: Config) -> dict[str, str]:
    path = Path(config.destinations["dst"].path or "")
    with duckdb.connect(str(path), read_only=True) as db:
        names = db.execute(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_name NOT LIKE '\\_eventpipe%' ESCAPE '\\'"
        ).fetchall()
        return {t: _digest(db.execute(f"SELECT * FROM {t}").fetchall()) for (t,) in names}


@pytest.mark.slow
def test_duckdb_equals_the_clean_run_after_20_deaths(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _run_faults(
        tmp_path, spark, monkeypatch,
        lambda root: {"type": "duckdb", "path": str(root / "warehouse.duckdb"),
                      "table_name_template": "{{ event_type }}"},
        (DuckDBDestination, "load"), _duckdb_tables,
    )  # fmt: skip


@pytest.fixture
def schemas(postgres_dsn: str) -> Iterator[list[str]]:
    made: list[str] = []
    yield made
    with psycopg.connect(postgres_dsn, autocommit=True) as db:
        for schema in made:
            db.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.mark.slow
def test_postgres_equals_the_clean_run_after_20_deaths(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch, postgres_dsn: str,
    schemas: list[str],
) -> None:  # fmt: skip
    def destination(root: Path) -> dict[str, Any]:
        schemas.append(f"crash_{root.name}_{len(schemas)}")
        return {"type": "postgres", "dsn": postgres_dsn, "schema": schemas[-1],
                "table_name_template": "{{ event_type }}"}  # fmt: skip

    def state(root: Path) -> dict[str, Any]:  # the production setup: the state in PostgreSQL
        schemas.append(f"state_{root.name}_{len(schemas)}")
        return {"type": "postgres", "dsn": postgres_dsn, "schema": schemas[-1]}

    def tables(config: Config) -> dict[str, str]:
        schema = config.destinations["dst"].db_schema
        with psycopg.connect(postgres_dsn) as db:
            names = db.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s "
                "AND table_name NOT LIKE '\\_eventpipe%%'", [schema],
            ).fetchall()  # fmt: skip
            return {
                t: _digest(db.execute(f'SELECT * FROM "{schema}"."{t}"').fetchall())
                for (t,) in names
            }

    _run_faults(tmp_path, spark, monkeypatch, destination, (PostgresDestination, "load"), tables,
                state)  # fmt: skip


def test_a_batch_replayed_twice_leaves_the_tables_unchanged(
    tmp_path: Path, spark: Any, postgres_dsn: str, schemas: list[str]
) -> None:
    """A finished run loaded again from the start, as if neither its status records nor
    its archive had been written (its segments back in incoming/): every load is
    recognised by its batch id, in DuckDB and in PostgreSQL, and nothing changes."""
    import sqlite3

    data = tmp_path / "data"
    _write_segments(data)
    schemas.append("replayed_twice")
    config = make_config(data, destinations={
        "dw": {"type": "duckdb", "path": str(tmp_path / "w.duckdb"),
               "table_name_template": "{{ event_type }}"},
        "pg": {"type": "postgres", "dsn": postgres_dsn, "schema": "replayed_twice",
               "table_name_template": "{{ event_type }}"},
    })  # fmt: skip
    [report] = process_pending(config, spark)

    def snapshot() -> dict[str, str]:
        with duckdb.connect(str(tmp_path / "w.duckdb"), read_only=True) as db:
            found = {f"dw.{t}": _digest(db.execute(f"SELECT * FROM {t}").fetchall())
                     for t in TABLES}  # fmt: skip
        with psycopg.connect(postgres_dsn) as db:
            for t in TABLES:
                rows = db.execute(f'SELECT * FROM replayed_twice."{t}"').fetchall()
                found[f"pg.{t}"] = _digest(rows)
        return found

    before = snapshot()
    for _ in range(2):
        for archived in report.archived:  # the segments back where they were
            segment = ArchivedSegment(archived)
            events = b"".join(line for _, line in lines(segment))
            (data / "incoming" / segment.segment_file).write_bytes(events)
        with sqlite3.connect(data / "state.sqlite") as db:  # its status never recorded
            db.execute("UPDATE runs SET status = 'running' WHERE run_id = ?", [report.run_id])
            db.execute("DELETE FROM segment_status")
        [again] = process_pending(config, spark)
        assert again.run_id == report.run_id
        assert again.resumed
        assert snapshot() == before
