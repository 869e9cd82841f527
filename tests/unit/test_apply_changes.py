"""A batch of a source's changes applied by key (destinations/changes.py), on DuckDB in
memory: the same SQL runs in PostgreSQL (tests/e2e/test_cdc.py runs both)."""

from __future__ import annotations

from typing import Any

import duckdb

from eventpipe.destinations import changes
from eventpipe.schema.dialects import DUCKDB

COLUMNS = ["_op", "_key", "_old_key", "_lsn", "_seq", "v"]


def _apply(table: list[tuple[Any, ...]], batch: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """``table``'s rows after ``batch`` (rows of COLUMNS): (key, v), sorted; the same with
    each key's last change in a temporary table and as a subquery (Snowflake's way)."""
    found = [_applied(table, batch, temporary) for temporary in ("TEMP TABLE {}", None)]
    assert found[0] == found[1]
    return found[0]


def _applied(
    table: list[tuple[Any, ...]], batch: list[tuple[Any, ...]], temporary: str | None
) -> list[tuple[Any, ...]]:
    db = duckdb.connect()
    schema = "_op VARCHAR, _key VARCHAR, _old_key VARCHAR, _lsn BIGINT, _seq BIGINT, v VARCHAR"
    db.execute(f"CREATE TABLE t ({schema})")
    db.execute(f"CREATE TEMP TABLE eventpipe_changes ({schema})")
    for rows, into in ((table, "t"), (batch, "eventpipe_changes")):
        if rows:
            db.executemany(f"INSERT INTO {into} VALUES (?, ?, ?, ?, ?, ?)", rows)
    handled = changes.apply(lambda sql: db.execute(sql).fetchall(), DUCKDB.quote, "t",
                            "eventpipe_changes", COLUMNS, temporary)  # fmt: skip
    assert handled == len(batch)
    assert db.execute("SELECT count(*) FROM duckdb_tables() WHERE temporary").fetchone() == (1,)
    found = db.execute("SELECT _key, v FROM t ORDER BY _key NULLS FIRST, v").fetchall()
    db.close()
    return found


def test_each_keys_last_change_decides_whatever_the_order_of_the_rows() -> None:
    before = [("read", "[1]", None, 9, 1, "a"), ("read", "[2]", None, 9, 2, "b")]
    batch = [
        ("update", "[1]", None, 30, 1, "a3"),
        ("update", "[1]", None, 20, 1, "a2"),  # older: rows come in any order
        ("delete", "[2]", None, 25, 1, None),
        ("insert", "[3]", None, 26, 1, "c"),
        ("insert", "[3]", None, 26, 1, "c"),  # the same change logged twice
    ]
    assert _apply(before, batch) == [("[1]", "a3"), ("[3]", "c")]


def test_an_update_of_the_key_moves_the_row_and_a_key_can_come_back() -> None:
    before = [("read", "[1]", None, 9, 1, "a")]
    batch = [
        ("update", "[10]", "[1]", 20, 1, "moved"),
        ("insert", "[1]", None, 21, 1, "new one"),
        ("update", "[11]", "[10]", 22, 1, "moved again"),
    ]
    assert _apply(before, batch) == [("[11]", "moved again"), ("[1]", "new one")]


def test_a_truncate_empties_the_table_and_voids_the_changes_before_it() -> None:
    before = [("read", "[1]", None, 9, 1, "a"), (None, None, None, None, None, "an event")]
    batch = [
        ("insert", "[2]", None, 10, 1, "gone"),
        ("truncate", None, None, 11, 1, None),
        ("insert", "[3]", None, 11, 2, "after"),
        ("insert", "[4]", None, 9, 5, "older than the truncate"),
        (None, None, None, 12, 1, "a row without a key"),
    ]
    assert _apply(before, batch) == [(None, "a row without a key"), ("[3]", "after")]


def test_replaying_a_run_of_changes_changes_nothing() -> None:
    """A reader that died logs again what it had not confirmed: the run of changes after
    some point, in order. Applied again over their own result, the table stays."""
    batch = [
        ("insert", "[1]", None, 10, 1, "a"),
        ("update", "[2]", "[1]", 11, 1, "a"),
        ("insert", "[1]", None, 12, 1, "b"),
        ("delete", "[2]", None, 13, 1, None),
    ]
    once = _apply([], batch)
    rows = [("insert", k, None, 99, 1, v) for k, v in once]  # the table as it is now
    for start in range(len(batch)):
        assert _apply(rows, batch[start:]) == once == [("[1]", "b")]
