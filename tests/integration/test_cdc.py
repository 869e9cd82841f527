"""Change data capture from a real PostgreSQL server (``wal_level = logical``, wal2json)
into the log: the copy sees the tables at the slot's starting point, then every change
follows in order, once; a reader killed with SIGKILL over and over loses none."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import orjson
import psycopg

from eventpipe.config import Config
from eventpipe.sources.postgres import PostgresSource, lsn_int
from tests.conftest import make_config, read_lines
from tests.conftest import source_sql as _sql
from tests.process import EVENTPIPE, _env, run


def _config(tmp_path: Path, dsn: str, tables: str = "^public\\.") -> Config:
    return make_config(tmp_path / "data", sources={"pg": {"dsn": dsn, "tables": tables}})


def _logged(config: Config) -> list[dict[str, Any]]:
    """The source's events in the log (sealed and active), in order of position."""
    layout = config.layout
    events = read_lines([*layout.sealed_segments(), *layout.active_segments()])
    return sorted(events, key=lambda e: (e["_lsn"], e["_seq"]))


BIG = "SELECT string_agg(md5(g::text), '') FROM generate_series(1, 3000) g"
"""96,000 characters that do not compress much: TOASTed out of line."""

SCHEMA = (
    "CREATE TABLE orders (id int PRIMARY KEY, amount numeric(12,2), tags int[], meta jsonb, "
    "at timestamptz, ref uuid, blob bytea, note text)",
    "CREATE TABLE lines (order_id int, line int, qty bigint, PRIMARY KEY (order_id, line))",
    "CREATE TABLE notes (body text)",  # no primary key
    "CREATE TABLE other.hidden (id int)",
)


def test_the_copy_then_every_change_in_order(tmp_path: Path, source_database: str) -> None:
    _sql(source_database, "CREATE SCHEMA other", *SCHEMA,
         "INSERT INTO orders SELECT g, g * 1.5, ARRAY[g, 2], '{\"a\": 1}', "
         "'2026-11-20T10:00:00Z', gen_random_uuid(), '\\x0102', NULL FROM generate_series(1, 3) g",
         "INSERT INTO lines VALUES (1, 1, 10), (1, 2, 20)",
         f"INSERT INTO notes VALUES ('{'x' * 100_000}')",  # TOASTed
         "INSERT INTO other.hidden VALUES (1)")  # fmt: skip
    config = _config(tmp_path, source_database)
    source = PostgresSource(config, "pg")
    report = source.read(once=True)
    assert report.copied == {"public.lines": 2, "public.notes": 1, "public.orders": 3}
    logged = _logged(config)
    # Each table's copy starts with a truncate (a copy started over replaces the first).
    assert sorted(e["_namespace"] for e in logged if e["_op"] == "truncate") == [
        "public.lines", "public.notes", "public.orders"]  # fmt: skip
    copied = [e for e in logged if e["_op"] == "read"]
    assert len(copied) == 6
    [first] = [e for e in copied if e["_namespace"] == "public.orders" and e["id"] == 1]
    assert (first["amount"], first["tags"], first["meta"], first["blob"]) == (
        1.5, "{1,2}", '{"a": 1}', "0102")  # fmt: skip
    assert first["at"] == "2026-11-20 10:00:00+00"
    assert first["api_key"] == "pg"
    assert first["_key"] == "[1]"
    assert {e["_key"] for e in copied if e["_namespace"] == "public.lines"} == {"[1,1]", "[1,2]"}
    assert all("_key" not in e for e in copied if e["_namespace"] == "public.notes")  # no key
    assert len(next(e for e in copied if e["_namespace"] == "public.notes")["body"]) == 100_000

    _sql(source_database,
         "INSERT INTO orders (id, amount) VALUES (4, 99.99)",
         "UPDATE orders SET note = 'big', amount = 1e9 WHERE id = 1",
         "UPDATE orders SET id = 20 WHERE id = 2",  # the key changes
         "DELETE FROM orders WHERE id = 3",
         "UPDATE lines SET qty = 11 WHERE order_id = 1 AND line = 1",
         "TRUNCATE notes",
         "ALTER TABLE orders ADD COLUMN color text",
         "INSERT INTO orders (id, color) VALUES (5, 'red')",
         "INSERT INTO other.hidden VALUES (2)",
         f"INSERT INTO orders (id, note) VALUES (6, ({BIG}))",  # stored out of line
         "UPDATE orders SET amount = 7 WHERE id = 6")  # the WAL leaves note out  # fmt: skip
    report = source.read(once=True)
    assert report.copied == {}
    changes = [e for e in _logged(config) if e["_op"] != "read" and e["_seq"] > 0]
    assert [(e["_op"], e["_namespace"]) for e in changes] == [
        ("insert", "public.orders"), ("update", "public.orders"), ("update", "public.orders"),
        ("delete", "public.orders"), ("update", "public.lines"), ("truncate", "public.notes"),
        ("insert", "public.orders"), ("insert", "public.orders"), ("update", "public.orders"),
    ]  # fmt: skip
    assert report.changes == 9
    assert len(changes[8]["note"]) == 96_000  # read from the table: the update is whole
    assert changes[8]["amount"] == 7
    lsns = [e["_lsn"] for e in changes]
    assert len(set(lsns)) == len(lsns)  # one transaction each
    assert min(lsns) >= lsn_int(source.progress().start or "0/0")
    assert max(e["_lsn"] for e in copied) < min(lsns)  # every change sorts after the copy
    assert (changes[1]["note"], changes[1]["amount"]) == ("big", 1000000000.00)
    assert "_old_key" not in changes[1]  # the key stayed
    assert (changes[2]["id"], changes[2]["_key"], changes[2]["_old_key"]) == (20, "[20]", "[2]")
    assert (changes[3]["id"], changes[3]["_key"]) == (3, "[3]")  # a delete: its key
    assert changes[4]["_key"] == "[1,1]"
    assert "_key" not in changes[5]  # a truncate
    assert changes[6]["color"] == "red"
    assert all(e["_timestamp"] == e["_commit_time"] for e in changes)
    # Nothing more: the slot was moved past what was logged.
    assert source.read(once=True).changes == 0
    progress = source.progress()
    assert progress.copied
    assert progress.changes == 9
    assert set(progress.tables) == {"public.orders", "public.lines", "public.notes"}
    # What status shows of it: each table's state and rows, the changes and the slot.
    config_file = tmp_path / "eventpipe.yaml"
    config_file.write_bytes(orjson.dumps({"data_dir": str(config.layout.root), "sources": {
        "pg": {"dsn": source_database, "tables": "^public\\."}}}))  # fmt: skip
    shown = run("status", "-c", str(config_file))
    assert shown.returncode == 0, shown.stderr
    lines = [" ".join(line.replace("|", " ").split()) for line in shown.stdout.splitlines()]
    assert "pg public.orders sync 3" in lines
    assert f"pg (changes) sync 9 slot eventpipe_pg at {progress.confirmed}" in lines


def test_numerics_keep_every_digit(tmp_path: Path, source_database: str) -> None:
    """A float64 holds about 16 digits: a numeric with more reaches the log as its text,
    in the copy and in the changes; one a float64 reads back exactly stays a number."""
    long = "24.57142857142857142857142857"
    _sql(source_database, "CREATE TABLE m (id int PRIMARY KEY, v numeric, w numeric(38,18))",
         f"INSERT INTO m VALUES (1, {long}, 1234567890228.456789), (2, 1.5, 0.25)")  # fmt: skip
    config = _config(tmp_path, source_database)
    source = PostgresSource(config, "pg")
    source.read(once=True)
    _sql(source_database, "UPDATE m SET v = 1e-30, w = 0.1 WHERE id = 1",
         "INSERT INTO m VALUES (3, 99999999999999999999.000000001, 7)")  # fmt: skip
    source.read(once=True)
    rows = [(e["_op"], e["id"], e["v"], e["w"]) for e in _logged(config) if "id" in e]
    assert rows == [
        ("read", 1, long, "1234567890228.456789000000000000"),  # PostgreSQL's text
        ("read", 2, 1.5, 0.25),
        ("update", 1, 1e-30, 0.1),
        ("insert", 3, "99999999999999999999.000000001", 7.0),
    ]


def test_a_column_added_with_a_default_reaches_the_rows_that_existed(
    tmp_path: Path, source_database: str
) -> None:
    """PostgreSQL gives the rows that exist a new column's DEFAULT without a change in
    the WAL: the reader notices the column and reads the table again, as updates placed
    after every change the read saw and before every later one, so that the destinations
    end equal to the source, even where no row changes again."""
    _sql(source_database, "CREATE TABLE k (id int PRIMARY KEY, v text)",
         "CREATE TABLE bare (v text)",
         "INSERT INTO k VALUES (1, 'a'), (2, 'b')", "INSERT INTO bare VALUES ('x')")  # fmt: skip
    config = _config(tmp_path, source_database)
    source = PostgresSource(config, "pg")
    source.read(once=True)
    _sql(source_database, "INSERT INTO k VALUES (3, 'c')")
    source.read(once=True)
    _sql(source_database, "ALTER TABLE k ADD COLUMN w int DEFAULT 7",
         "ALTER TABLE k ADD COLUMN n text", "ALTER TABLE bare ADD COLUMN w int DEFAULT 7",
         "INSERT INTO k (id, v) VALUES (4, 'd')")  # fmt: skip
    report = source.read(once=True)
    logged = _logged(config)
    [three] = [e for e in logged if e.get("id") == 3 and e["_op"] == "insert"]
    [four] = [e for e in logged if e.get("id") == 4 and e["_op"] == "insert"]
    again = [e for e in logged if e["_op"] == "update" and e["_seq"] == 0]
    assert sorted((e["id"], e["v"], e["w"], e["n"]) for e in again) == [
        (1, "a", 7, None), (2, "b", 7, None), (3, "c", 7, None), (4, "d", 7, None)]  # fmt: skip
    assert len({e["_lsn"] for e in again}) == 1
    assert three["_lsn"] < four["_lsn"] < again[0]["_lsn"]  # after what the read saw
    assert all(e["_namespace"] == "public.k" for e in again)  # bare: no key, left as it is
    assert report.changes == 1 + 4  # the rows read again count as changes logged
    assert source.progress().columns["public.k"] == ["id", "v", "w", "n"]
    assert source.read(once=True).changes == 0  # noticed once
    # A column added to a table that never changes again: noticed all the same.
    _sql(source_database, "ALTER TABLE k ADD COLUMN z text DEFAULT 'zz'")
    assert source.read(once=True).changes == 4
    assert {e["z"] for e in _logged(config) if "z" in e} == {"zz"}
    _sql(source_database, "UPDATE k SET z = 'later' WHERE id = 1")
    assert source.read(once=True).changes == 1
    last = _logged(config)[-1]  # in position order: the update after the rows read again
    assert (last["_op"], last["id"], last["z"]) == ("update", 1, "later")


def test_a_reader_killed_over_and_over_loses_no_change(
    tmp_path: Path, source_database: str
) -> None:
    _sql(source_database, "CREATE SCHEMA other", *SCHEMA[:3])
    config = _config(tmp_path, source_database)
    config_file = tmp_path / "eventpipe.yaml"
    config_file.write_bytes(orjson.dumps({
        "data_dir": str(config.layout.root),
        "sources": {"pg": {"dsn": source_database, "tables": "^public\\.", "poll_seconds": 0.05,
                             "max_changes": 200}},
    }))  # fmt: skip
    rng = random.Random(28)
    log_file = (tmp_path / "reader.log").open("ab")
    kills = 0
    writes = 0
    with psycopg.connect(source_database, autocommit=True) as db:
        db.execute("SET synchronous_commit = on")
        for _ in range(10):
            reader = subprocess.Popen([*EVENTPIPE, "read", "pg", "-c", str(config_file)],
                                      stdout=log_file, stderr=log_file, env=_env())  # fmt: skip
            # The first reader has the time to start and copy; the others are killed at
            # random moments, while they read changes.
            deadline = time.monotonic() + (4.0 if kills == 0 else rng.uniform(0.5, 2.0))
            while time.monotonic() < deadline:
                n = writes
                db.execute("INSERT INTO orders (id, amount) VALUES (%s, %s)", [n, n])
                db.execute("UPDATE orders SET note = 'seen' WHERE id = %s", [n])
                writes += 1
            os.kill(reader.pid, signal.SIGKILL)
            reader.wait()
            kills += 1
    log_file.close()
    PostgresSource(config, "pg").read(once=True)  # what was left
    events = _logged(config)
    changes = {(e["_op"], e["id"]) for e in events if e["_op"] in ("insert", "update")}
    copied = {e["id"] for e in events if e["_op"] == "read"}
    for n in range(writes):  # each change is logged (the copy may hold the first rows)
        assert ("insert", n) in changes or n in copied, f"insert {n} lost"
        assert ("update", n) in changes or n in copied, f"update {n} lost"
    assert len(copied) < writes // 2, "the kills did not land while changes were read"
    # A change logged twice (logged, then killed before the slot moved) has one id, and
    # an id is one change.
    ids_of: dict[tuple[Any, ...], set[str]] = {}
    for e in events:
        place = (e["_namespace"], e["_op"], e.get("id"), e["_lsn"], e["_seq"])
        ids_of.setdefault(place, set()).add(e["eventn_ctx"]["event_id"])
    assert all(len(ids) == 1 for ids in ids_of.values())
    assert len({e["eventn_ctx"]["event_id"] for e in events}) == len(ids_of)
    assert kills == 10
    assert writes > 100
    print(f"{writes} inserts and updates, {kills} kills, {len(events)} events logged for "
          f"{len(ids_of)} distinct changes and rows")  # fmt: skip
