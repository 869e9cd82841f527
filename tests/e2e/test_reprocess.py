"""`eventpipe reprocess`: days rebuilt from the archive after a mapping change replace
exactly that destination's rows of those days; late events belong to their own day;
a second reprocess changes nothing; a reprocess that dies anywhere and runs again gives
the same tables; a changed archive file is re-ingested; a pruned day is refused; an
archive the disk lost is restored from its copy on S3 first."""

from __future__ import annotations

import contextlib
import hashlib
import shutil
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import duckdb
import orjson
import psycopg
import pytest

from eventpipe.archive.files import ArchivedSegment, Manifest
from eventpipe.archive.write import write_segment
from eventpipe.config import Config
from eventpipe.destinations.duckdb import DuckDBDestination
from eventpipe.errors import ConfigError
from eventpipe.processing.batch.job import process_pending
from eventpipe.processing.batch.version import code_version
from eventpipe.processing.modes import reprocess as rp
from eventpipe.processing.modes.replay import replay_failed
from eventpipe.state.store import StateStore, open_state
from tests.conftest import make_config
from tests.process import run, write_config

DAY = date.fromisoformat
MOVE_N = {"fields": [{"src": "/n", "dst": "/number", "action": "move"}]}
REBUILT_20TH = {  # _three_days's rows after a reprocess of the 20th with MOVE_N
    "page": [
        ("e1", "2026-11-20", 1, None), ("e2", "2026-11-20", 2, None),
        ("e4", "2026-11-18", None, 4), ("e6", "2026-11-21", None, 6),
        ("e7", "2026-11-21", None, 7),
    ],
    "click": [("e3", "2026-11-20", 3, None), ("e8", "2026-11-20", 8, None)],
}  # fmt: skip


def _event(n: int, stamp: str, kind: str = "page") -> dict[str, Any]:
    return {"event_type": kind, "n": n, "_timestamp": stamp, "api_key": "web",
            "eventn_ctx": {"event_id": f"e{n}"}}  # fmt: skip


def _segment(data: Path, sealed: str, events: list[dict[str, Any]]) -> None:
    (data / "incoming").mkdir(parents=True, exist_ok=True)
    lines = b"".join(orjson.dumps(e) + b"\n" for e in events)
    (data / "incoming" / f"incoming.tok=web-{sealed}.log").write_bytes(lines)


def _three_days(data: Path) -> None:
    """Days 2026-11-18..21: the 18th's event arrives late, on the 20th; one of the 20th's
    arrives on the 21st; one event has a _timestamp that never converts."""
    _segment(data, "2026-11-20T23-00-00.000", [
        _event(1, "2026-11-20T08:00:00.000000Z"), _event(2, "2026-11-20T09:00:00.000000Z"),
        _event(3, "2026-11-20T10:00:00Z", "click"), _event(4, "2026-11-18T12:00:00.000000Z"),
        _event(5, "not a time"),
    ])  # fmt: skip
    _segment(data, "2026-11-21T23-00-00.000", [
        _event(6, "2026-11-21T01:00:00.000000Z"), _event(7, "2026-11-21T02:00:00.000000Z"),
        _event(8, "2026-11-21T01:30:00+05:00", "click"),  # an offset: the 20th in UTC
    ])  # fmt: skip


def _rows(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    with duckdb.connect(str(path), read_only=True) as db:
        tables = [t for (t,) in db.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_name NOT LIKE '\\_%' "
            "ESCAPE '\\' ORDER BY 1"
        ).fetchall()]  # fmt: skip
        return {
            t: sorted(
                db.execute(
                    f"SELECT eventn_ctx_event_id, strftime(_timestamp, '%Y-%m-%d'), "
                    f"{'number' if _has(db, t, 'number') else 'NULL'}, "
                    f"{'n' if _has(db, t, 'n') else 'NULL'} FROM {t}"
                ).fetchall()
            )
            for t in tables
        }


def _has(db: Any, table: str, column: str) -> bool:
    return bool(db.execute(
        "SELECT 1 FROM information_schema.columns WHERE table_name = ? AND column_name = ?",
        [table, column],
    ).fetchall())  # fmt: skip


def _config(data: Path, mappings: dict[str, Any] | None = None, **dest: Any) -> Config:
    warehouse = {"type": "duckdb", "table_name_template": "{{ event_type }}", **dest}
    if mappings:
        warehouse["mappings"] = mappings
    return make_config(data, destinations={"warehouse": warehouse})


def test_a_mapping_change_rebuilds_only_the_chosen_days(tmp_path: Path, spark: Any) -> None:
    data = tmp_path / "data"
    _three_days(data)
    before = _config(data)
    process_pending(before, spark)
    assert not before.layout.sealed_segments()  # archived: reprocess reads the archive
    loaded = _rows(before.layout.warehouse)
    assert loaded["page"] == [
        ("e1", "2026-11-20", None, 1), ("e2", "2026-11-20", None, 2),
        ("e4", "2026-11-18", None, 4), ("e6", "2026-11-21", None, 6),
        ("e7", "2026-11-21", None, 7),
    ]  # fmt: skip
    assert loaded["click"] == [("e3", "2026-11-20", None, 3), ("e8", "2026-11-20", None, 8)]
    state = StateStore(before.layout.state)
    old = code_version(before, "warehouse")
    assert {d: [v.code_version for v in vs] for d, vs in state.day_versions(
        "warehouse", "2026-11-01", "2026-11-30").items()} == {
        "2026-11-18": [old], "2026-11-20": [old], "2026-11-21": [old]}  # fmt: skip

    after = _config(data, MOVE_N)
    new = code_version(after, "warehouse")
    todo, results = rp.reprocess(spark, after, "warehouse", DAY("2026-11-20"), DAY("2026-11-20"))
    assert [r.plan.days for r in results] == [("2026-11-20",)]
    assert results[0].plan.reason == f"built with code version {old} (now {new})"
    assert results[0].rows == {"page": 2, "click": 2}  # e8 arrived the next day: included
    rebuilt = _rows(after.layout.warehouse)
    assert rebuilt == REBUILT_20TH
    with duckdb.connect(str(after.layout.warehouse), read_only=True) as db:
        left = db.execute("SELECT table_name FROM information_schema.tables "
                          "WHERE table_name LIKE '_eventpipe_rp_%'").fetchall()  # fmt: skip
    assert left == []  # the shadows went with the swap

    # Twice: nothing to do, nothing changes.
    todo, results = rp.reprocess(spark, after, "warehouse", DAY("2026-11-20"), DAY("2026-11-20"))
    assert (results, todo.up_to_date) == ([], ["2026-11-20"])
    assert _rows(after.layout.warehouse) == rebuilt

    # The whole range: the days still built with the old mapping, the late one included.
    todo, results = rp.reprocess(spark, after, "warehouse", DAY("2026-11-01"), DAY("2026-11-30"))
    # Read from different files (the 18th's only from the first): two runs.
    assert [r.plan.days for r in results] == [("2026-11-18",), ("2026-11-21",)]
    assert todo.up_to_date == ["2026-11-20"]
    assert _rows(after.layout.warehouse)["page"] == [
        ("e1", "2026-11-20", 1, None), ("e2", "2026-11-20", 2, None),
        ("e4", "2026-11-18", 4, None), ("e6", "2026-11-21", 6, None),
        ("e7", "2026-11-21", 7, None),
    ]  # fmt: skip
    versions = state.day_versions("warehouse", "2026-11-01", "2026-11-30")
    assert {d: [v.code_version for v in vs] for d, vs in versions.items()} == {
        "2026-11-18": [new], "2026-11-20": [new], "2026-11-21": [new]}  # fmt: skip
    history = state.history()
    assert history[0].trigger == "reprocess"
    assert history[0].code_versions == {"warehouse": new}
    # The event whose _timestamp never converts went to failed/ once, by the first run.
    failed = (data / "failed" / "failed.dst=warehouse.log").read_bytes().splitlines()
    assert len(failed) == 1
    assert b'"e5"' in failed[0]


def test_force_rebuilds_up_to_date_days_to_the_same_rows(tmp_path: Path, spark: Any) -> None:
    data = tmp_path / "data"
    _three_days(data)
    config = _config(data)
    process_pending(config, spark)
    loaded = _rows(config.layout.warehouse)
    todo, results = rp.reprocess(spark, config, "warehouse", DAY("2026-11-17"), DAY("2026-11-21"))
    assert results == []
    assert todo.up_to_date == ["2026-11-18", "2026-11-20", "2026-11-21"]
    todo, results = rp.reprocess(spark, config, "warehouse", DAY("2026-11-20"), DAY("2026-11-21"),
                                 force=True)  # fmt: skip
    # Both days are read from the same two files: one run rebuilds them.
    assert [(r.plan.days, r.plan.reason) for r in results] == [
        (("2026-11-20", "2026-11-21"), "--force")]  # fmt: skip
    assert _rows(config.layout.warehouse) == loaded


def test_a_destination_that_lost_its_loads_is_rebuilt_without_force(
    tmp_path: Path, spark: Any
) -> None:
    """A damaged DuckDB file moved away: the state store still records its days, but the
    new file holds none of their loads, so a reprocess without --force rebuilds them."""
    data = tmp_path / "data"
    _three_days(data)
    config = _config(data)
    process_pending(config, spark)
    loaded = _rows(config.layout.warehouse)
    config.layout.warehouse.rename(config.layout.warehouse.with_suffix(".damaged"))
    # One later load in the new file: the table exists again, the older days' loads do not.
    _segment(data, "2026-11-22T23-00-00.000", [_event(9, "2026-11-22T01:00:00.000000Z")])
    process_pending(config, spark)
    todo, results = rp.reprocess(spark, config, "warehouse", DAY("2026-11-17"), DAY("2026-11-22"))
    assert todo.up_to_date == ["2026-11-22"]
    assert sorted(d for r in results for d in r.plan.days) == [
        "2026-11-18", "2026-11-20", "2026-11-21"]  # fmt: skip
    assert all("does not hold run" in r.plan.reason for r in results)
    rows = _rows(config.layout.warehouse)
    assert rows["page"] == sorted([*loaded["page"], ("e9", "2026-11-22", None, 9)])
    assert rows["click"] == loaded["click"]
    again, results = rp.reprocess(spark, config, "warehouse", DAY("2026-11-17"), DAY("2026-11-22"))
    assert results == []  # now held: up to date
    assert again.up_to_date == ["2026-11-18", "2026-11-20", "2026-11-21", "2026-11-22"]


def test_a_changed_archive_file_is_ingested_again(tmp_path: Path, spark: Any) -> None:
    data = tmp_path / "data"
    _three_days(data)
    config = _config(data)
    process_pending(config, spark)
    rp.reprocess(spark, config, "warehouse", DAY("2026-11-21"), DAY("2026-11-21"), force=True)
    # The file holding the 21st is replaced (a repaired copy, say) with one more event.
    [segment] = [
        s for s in (config.layout.archive / "2026-11-21").iterdir() if s.name.endswith(".lz4")
    ]
    source = tmp_path / segment.name.removesuffix(".lz4")
    _segment(tmp_path / "copy", "2026-11-21T23-00-00.000", [
        _event(6, "2026-11-21T01:00:00.000000Z"), _event(7, "2026-11-21T02:00:00.000000Z"),
        _event(8, "2026-11-21T01:30:00+05:00", "click"), _event(9, "2026-11-21T03:00:00Z"),
    ])  # fmt: skip
    shutil.move(tmp_path / "copy" / "incoming" / source.name, source)
    write_segment(source, ArchivedSegment(segment), config.archive)
    todo, results = rp.reprocess(spark, config, "warehouse", DAY("2026-11-18"), DAY("2026-11-21"))
    assert [r.plan.days for r in results] == [("2026-11-21",)]
    assert results[0].plan.reason.startswith(f"archive file {source.name} changed")
    assert ("e9", "2026-11-21", None, 9) in _rows(config.layout.warehouse)["page"]
    assert todo.up_to_date == ["2026-11-18", "2026-11-20"]


def _failed(data: Path) -> list[tuple[str, str | None, str]]:
    """The warehouse's failed/ file: (event id, day, error) of each EventError, in order."""
    path = data / "failed" / "failed.dst=warehouse.log"
    if not path.exists():
        return []
    records = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    return [(r["event"]["eventn_ctx"]["event_id"], r["day"], r["error"]) for r in records]


def test_a_reprocess_replaces_the_failed_events_of_its_days(tmp_path: Path, spark: Any) -> None:
    """An event that failed and then loads in a reprocess leaves failed/ (else `replay
    failed` would load it twice); one that fails again is there once."""
    data = tmp_path / "data"
    _segment(data, "2026-11-21T23-00-00.000", [
        _event(1, "2026-11-20T08:00:00Z"), {**_event(2, "2026-11-20T09:00:00Z"), "n": "two"},
        _event(6, "2026-11-21T01:00:00Z"), {**_event(7, "2026-11-21T02:00:00Z"), "n": "seven"},
        _event(5, "not a time"),
    ])  # fmt: skip
    strict = _config(data, {"fields": [{"action": "cast", "src": "/n", "type": "INT64"}]})
    lenient = _config(data, {"fields": [{"action": "remove", "src": "/n"}]})
    process_pending(strict, spark)
    failed = _failed(data)
    assert sorted((event, day) for event, day, _ in failed) == [
        ("e2", "2026-11-20"), ("e5", None), ("e7", "2026-11-21")]  # fmt: skip

    rp.reprocess(spark, lenient, "warehouse", DAY("2026-11-20"), DAY("2026-11-20"))
    assert sorted(e for e, _, _ in _failed(data)) == ["e5", "e7"]  # e2 loaded: not failed
    assert [r[0] for r in _rows(lenient.layout.warehouse)["page"]] == ["e1", "e2", "e6"]

    replay_failed(lenient, spark, "warehouse")  # e7 loads; e5 has no time: fails again
    assert [e for e, _, _ in _failed(data)] == ["e5"]
    assert [r[0] for r in _rows(lenient.layout.warehouse)["page"]] == ["e1", "e2", "e6", "e7"]

    # Back to the strict cast: e2 fails again, and is in failed/ once.
    rp.reprocess(spark, strict, "warehouse", DAY("2026-11-20"), DAY("2026-11-20"))
    rp.reprocess(spark, strict, "warehouse", DAY("2026-11-20"), DAY("2026-11-20"), force=True)
    failed = _failed(data)
    assert sorted((e, d) for e, d, _ in failed) == [("e2", "2026-11-20"), ("e5", None)]
    assert "n" in next(error for e, _, error in failed if e == "e2")  # names the column
    assert [r[0] for r in _rows(strict.layout.warehouse)["page"]] == ["e1", "e6", "e7"]
    assert not list(data.glob("failed/*.partial"))


def test_a_pruned_day_is_refused_and_the_cli_reports_it(tmp_path: Path, spark: Any) -> None:
    data = tmp_path / "data"
    _three_days(data)
    config = _config(data)
    process_pending(config, spark)
    path = write_config(tmp_path / "eventpipe.yaml", data, 0, destinations={
        "warehouse": {"type": "duckdb", "table_name_template": "{{ event_type }}",
                      "mappings": MOVE_N},
    })  # fmt: skip
    dry = run("reprocess", "--from", "2026-11-18", "--to", "2026-11-21", "--dry-run",
              "-c", str(path))  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    assert "warehouse 2026-11-20: would rebuild: built with code version" in dry.stdout
    assert "3 day(s) to rebuild in 2 run(s), 0 up to date, 0 refused" in dry.stdout
    from eventpipe.archive import retention

    retention.prune(config.layout, retention_days=1, today=DAY("2026-11-22"))  # the 20th goes
    result = run("reprocess", "--from", "2026-11-18", "--to", "2026-11-21", "-c", str(path))
    assert result.returncode == 65, result.stdout  # days that cannot be: a retry will not do
    assert "warehouse 2026-11-18: not rebuilt: the archive was pruned through 2026-11-20" in (
        result.stdout
    )
    assert "warehouse 2026-11-21 (1/1): built with code version" in result.stdout
    assert "warehouse: 1 day(s) rebuilt, 0 up to date, 2 refused" in result.stdout
    assert "2 day(s) could not be rebuilt" in result.stderr
    again = run("reprocess", "--from", "2026-11-18", "--to", "2026-11-21", "-c", str(path))
    assert again.returncode == 65  # the pruned days are still refused; no Spark is started
    assert "warehouse: 0 day(s) rebuilt, 1 up to date, 2 refused" in again.stdout
    page = _rows(config.layout.warehouse)["page"]
    assert ("e6", "2026-11-21", 6, None) in page
    assert ("e1", "2026-11-20", None, 1) in page


class Died(BaseException):
    """The process died here."""


def _dying(monkeypatch: pytest.MonkeyPatch, points: list[tuple[Any, str]]) -> Callable[[int], Any]:
    """Wrap each (owner, name): the ``at``-th call of any of them, before or after, dies."""
    state = {"at": 0, "calls": 0}

    def wrap(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            point()
            result = real(*args, **kwargs)
            point()
            return result

        return call

    def point() -> None:
        state["calls"] += 1
        if state["calls"] == state["at"]:
            raise Died

    for owner, name in points:
        monkeypatch.setattr(owner, name, wrap(getattr(owner, name)))

    def arm(at: int) -> dict[str, int]:
        state["at"], state["calls"] = at, 0
        return state

    return arm


def _digest(tables: dict[str, list[tuple[Any, ...]]]) -> str:
    return hashlib.sha256(repr(sorted(tables.items())).encode()).hexdigest()


@pytest.mark.slow
def test_a_reprocess_restores_from_the_archive_copy_what_the_disk_lost(
    tmp_path: Path, spark: Any, s3_server: Any, s3_bucket: str
) -> None:
    data = tmp_path / "data"
    _three_days(data)
    copy = {"remote": f"s3://{s3_bucket}/archive", "s3": s3_server.settings()}
    process_pending(make_config(data, destinations=_config(data).destinations, archive=copy),
                    spark)  # fmt: skip
    uploaded = [k for k in s3_server.keys(s3_bucket, "archive/") if k.endswith(".log.lz4")]
    assert len(uploaded) == 2  # each run's archived segments, copied after it
    shutil.rmtree(data / "archive")  # the disk lost the archive
    after = make_config(data, destinations=_config(data, MOVE_N).destinations, archive=copy)
    _, results = rp.reprocess(spark, after, "warehouse", DAY("2026-11-20"), DAY("2026-11-20"))
    assert results[0].rows == {"page": 2, "click": 2}  # e8, archived the next day, too
    assert _rows(after.layout.warehouse) == REBUILT_20TH
    assert len(list((data / "archive").rglob("*.log.lz4"))) == 2  # restored on disk


def test_a_reprocess_killed_anywhere_then_run_again_gives_the_same_tables(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tmp_path / "base"
    _three_days(base)
    _segment(base, "2026-11-21T23-30-00.000", [{**_event(10, "2026-11-20T11:00:00Z"), "x": "ten"}])
    process_pending(_config(base), spark)
    # Moved, and a cast that e10's x fails: the rebuild writes failed/ too.
    mappings = {"fields": [*MOVE_N["fields"], {"action": "cast", "src": "/x", "type": "INT64"}]}

    def fresh(name: str) -> Config:
        shutil.copytree(base, tmp_path / name)
        return _config(tmp_path / name, mappings)

    def reprocess(config: Config) -> None:
        rp.reprocess(spark, config, "warehouse", DAY("2026-11-18"), DAY("2026-11-21"))

    arm = _dying(monkeypatch, [
        (DuckDBDestination, "load"), (DuckDBDestination, "replace_days"),
        (StateStore, "reprocessed_days"), (StateStore, "record"), (rp, "spark_inputs"),
        (rp, "_supersede_failed"),
    ])  # fmt: skip
    clean = fresh("clean")
    calls = arm(0)
    reprocess(clean)
    expected = _digest(_rows(clean.layout.warehouse))
    failed = _failed(clean.data_dir)
    assert [(e, d) for e, d, _ in failed] == [("e5", None), ("e10", "2026-11-20")]
    total = calls["calls"]
    assert total >= 12
    deaths = range(1, total + 1, max(1, total // 8))
    for at in deaths:
        config = fresh(f"died{at}")
        arm(at)
        with contextlib.suppress(Died):
            reprocess(config)
        assert calls["calls"] >= at  # it died
        arm(0)
        reprocess(config)
        assert _digest(_rows(config.layout.warehouse)) == expected, f"died at call {at}"
        assert _failed(config.data_dir) == failed, f"died at call {at}"
        state = StateStore(config.layout.state)
        days = state.day_versions("warehouse", "2026-11-18", "2026-11-21")
        assert all(len(v) == 1 for v in days.values()), days
        assert not list((config.layout.tmp).glob("reprocess-*"))
    print(f"\n{len(deaths)} deaths among {total} points of a 3-day reprocess: the tables "
          "and failed/ equal")  # fmt: skip


def test_reprocess_replaces_a_days_rows_in_postgres(
    tmp_path: Path,
    spark: Any,
    postgres_dsn: str,
    postgres_schema: str,
    postgres_state: dict[str, str],
) -> None:
    """PostgreSQL as warehouse and as state store (design.md's production setup)."""
    data = tmp_path / "data"
    _three_days(data)
    pg = {
        "type": "postgres", "dsn": postgres_dsn, "schema": postgres_schema,
        "table_name_template": "{{ event_type }}", "primary_key": ["eventn_ctx_event_id"],
    }  # fmt: skip
    process_pending(make_config(data, destinations={"pg": pg}, state=postgres_state), spark)
    after = make_config(data, destinations={"pg": {**pg, "mappings": MOVE_N}},
                        state=postgres_state)  # fmt: skip
    _, results = rp.reprocess(spark, after, "pg", DAY("2026-11-20"), DAY("2026-11-20"))
    assert results[0].rows == {"page": 2, "click": 2}
    with psycopg.connect(postgres_dsn) as db:
        rows = db.execute(
            f'SELECT eventn_ctx_event_id, number, n FROM "{postgres_schema}".page ORDER BY 1'
        ).fetchall()
        shadows = db.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s "
            "AND table_name LIKE '\\_eventpipe\\_rp\\_%%'",
            [postgres_schema],
        ).fetchall()
    assert rows == [("e1", 1, None), ("e2", 2, None), ("e4", None, 4), ("e6", None, 6),
                    ("e7", None, 7)]  # fmt: skip
    assert shadows == []
    assert not (data / "state.sqlite").exists()
    days = open_state(after).day_versions("pg", "2026-11-18", "2026-11-21")
    assert [len(days[d]) for d in sorted(days)] == [1, 1, 1]
    assert days["2026-11-20"][0].code_version == code_version(after, "pg")
    assert days["2026-11-20"][0].inputs  # the archive files it read, with their sha1
    _, results = rp.reprocess(spark, after, "pg", DAY("2026-11-20"), DAY("2026-11-20"))
    assert results == []


def _parquet_rows(root: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Like _rows, of the parquet tables under ``root`` (shadows and hidden directories
    left out, as readers do)."""
    tables = sorted(p.name for p in root.iterdir() if p.is_dir() and p.name[0] not in "._")
    found = {}
    with duckdb.connect() as db:
        for table in tables:
            files = f"{root / table}/day=*/*.parquet"
            columns = {r[0] for r in db.execute(f"DESCRIBE SELECT * FROM read_parquet("
                       f"'{files}', union_by_name = true)").fetchall()}  # fmt: skip
            found[table] = sorted(db.execute(
                f"SELECT eventn_ctx_event_id, strftime(_timestamp, '%Y-%m-%d'), "
                f"{'number' if 'number' in columns else 'NULL'}, "
                f"{'n' if 'n' in columns else 'NULL'} "
                f"FROM read_parquet('{files}', union_by_name = true)"
            ).fetchall())  # fmt: skip
    return found


def test_reprocess_replaces_day_partitions_of_parquet_tables(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tmp_path / "base"
    _three_days(base)
    lake = {"type": "parquet", "table_name_template": "{{ event_type }}"}
    process_pending(make_config(base, destinations={"lake": lake}), spark)

    def fresh(name: str) -> Config:
        shutil.copytree(base, tmp_path / name)
        return make_config(tmp_path / name, destinations={"lake": {**lake, "mappings": MOVE_N}})

    from eventpipe.destinations.storage import LocalStorage

    real_move = LocalStorage.move
    calls = {"n": 0, "at": 0}

    def move(self: Any, source: str, target: str) -> None:
        calls["n"] += 1
        if calls["n"] == calls["at"]:
            raise Died
        real_move(self, source, target)

    monkeypatch.setattr(LocalStorage, "move", move)
    clean = fresh("clean")
    _, results = rp.reprocess(spark, clean, "lake", DAY("2026-11-20"), DAY("2026-11-20"))
    assert results[0].rows == {"page": 2, "click": 2}
    rebuilt = _parquet_rows(clean.layout.root / "parquet")
    assert rebuilt == REBUILT_20TH
    left = {p.name for p in (clean.layout.root / "parquet").iterdir()} - {".staging"}
    assert left == {"_eventpipe", "click", "page"}  # no shadow, nothing aside
    _, results = rp.reprocess(spark, clean, "lake", DAY("2026-11-20"), DAY("2026-11-20"))
    assert results == []

    # Killed at each rename (the shadow loads' files, then the swap's partitions aside
    # and in), then run again: the same rows.
    total, calls["n"] = calls["n"], 0
    assert total >= 6
    for at in range(1, total + 1):
        config = fresh(f"died{at}")
        calls["n"], calls["at"] = 0, at
        with contextlib.suppress(Died):
            rp.reprocess(spark, config, "lake", DAY("2026-11-20"), DAY("2026-11-20"))
        assert calls["n"] >= at  # it died there (the other table's load may go on)
        calls["at"] = 0
        rp.reprocess(spark, config, "lake", DAY("2026-11-20"), DAY("2026-11-20"))
        assert _parquet_rows(config.layout.root / "parquet") == rebuilt, f"died at move {at}"
        assert not list((config.layout.root / "parquet" / ".staging").glob("swap-*"))


def test_only_destinations_whose_days_can_be_replaced(tmp_path: Path) -> None:
    config = make_config(tmp_path, destinations={"api": {"type": "http", "url": "http://x/"}})
    kinds = "only duckdb, postgres, clickhouse, snowflake, bigquery, redshift, parquet"
    with pytest.raises(ConfigError, match=kinds):
        rp.replaceable(config, "api")
    for lake in ({"path": "s3a://bucket/lake"}, {"path": "s3://bucket/lake"},
                 {"partition_by": "none"}):  # fmt: skip
        config = make_config(tmp_path, destinations={"lake": {"type": "parquet", **lake}})
        with pytest.raises(ConfigError, match=r"needs a local path \(an object store has no "
                           r"rename\) and partition_by: day"):  # fmt: skip
            rp.replaceable(config, "lake")
    config = make_config(tmp_path, destinations={"live": {"type": "duckdb", "mode": "stream"}})
    with pytest.raises(ConfigError, match="in mode stream"):
        rp.replaceable(config, "live")
    fed = {"sources": {"pg": {"dsn": "postgresql://db/shop"}}}
    both = {"dw": {"type": "postgres", "dsn": "postgresql://x/dw"}, "lake": {"type": "parquet"}}
    config = make_config(tmp_path, destinations=both, **fed)
    with pytest.raises(ConfigError, match=r"applies the changes of source\(s\) pg by key"):
        rp.replaceable(config, "dw")
    rp.replaceable(config, "lake")  # changes as rows of their days
    rs = {"type": "redshift", "dsn": "postgresql://x/dev", "staging": "s3://b/s",
          "iam_role": "default"}  # fmt: skip
    history = {**rs, "changes": "append", "schema": "log"}
    config = make_config(tmp_path, destinations={"rs": rs, "log": history}, **fed)
    with pytest.raises(ConfigError, match=r"applies the changes of source\(s\) pg by key"):
        rp.replaceable(config, "rs")
    rp.replaceable(config, "log")  # every change a row of its day
    config = make_config(tmp_path, destinations={"dw": {"type": "duckdb", "only_keys": ["web"]}},
                         **fed)  # fmt: skip
    rp.replaceable(config, "dw")  # none of the source's events
    config = _config(tmp_path)
    replaying = config.layout.failed / "replay" / "replaying.dst=warehouse.2026-11-21T10-00.log"
    replaying.parent.mkdir(parents=True)
    replaying.write_text("")
    with pytest.raises(ConfigError, match="replay of failed events under way") as refused:
        rp.replaceable(config, "warehouse")
    assert "replay failed --destination warehouse" in (refused.value.fix or "")


def test_the_manifest_names_the_days_of_its_events(tmp_path: Path, spark: Any) -> None:
    data = tmp_path / "data"
    _three_days(data)
    process_pending(_config(data), spark)
    manifests = sorted((data / "archive").glob("*/*.manifest.json"))
    days = [Manifest.read(m).days for m in manifests]
    # "not a time" has no date: that file is read for every day; the offset counts for
    # its date and the days around it.
    assert days == [None, ("2026-11-20", "2026-11-21", "2026-11-22")]
