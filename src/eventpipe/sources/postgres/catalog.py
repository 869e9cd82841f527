"""What a PostgreSQL source asks of its database beside the WAL: the chosen tables, their
columns and primary keys, rows as one JSON text each (in the forms wal2json gives
values), the values an update left out, and a point every committed read sees."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
from psycopg import sql

from eventpipe.errors import TransientError
from eventpipe.sources.postgres.values import loads

NATIVE = frozenset({"smallint", "integer", "bigint", "numeric", "real", "double precision",
                    "boolean"})  # fmt: skip
"""Column types whose values are JSON numbers or booleans (the rest are text)."""
VISIBLE_WAIT_SECONDS = 60.0
"""How long a table read again waits for the transactions open when it began."""


async def visible_point(db: psycopg.Connection[Any], source_id: str) -> str:
    """A WAL position such that a read started after this returns sees every transaction
    that committed before it: the position now, then a wait until every transaction that
    had an id by then has ended (one may have written its commit before the position and
    not be visible yet). Changes after the position sort after what the read returns."""
    point = db.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    horizon = db.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text").fetchone()
    assert point is not None
    assert horizon is not None
    deadline = time.monotonic() + VISIBLE_WAIT_SECONDS
    while True:
        ended = db.execute(
            "SELECT pg_snapshot_xmin(pg_current_snapshot()) >= %s::xid8", [horizon[0]]
        ).fetchone()
        if ended and ended[0]:
            return str(point[0])
        if time.monotonic() > deadline:
            raise TransientError(
                f"source {source_id}: a table read again waits for transactions open for "
                f"more than {VISIBLE_WAIT_SECONDS:g} s",
                fix="end the long transactions (pg_stat_activity); the reader tries again",
            )
        await asyncio.sleep(0.05)


def filled_without_changes(db: psycopg.Connection[Any], table: str, columns: list[str]) -> bool:
    """Whether any of ``columns`` (added to ``table``) has values in rows that existed
    before it that no change carried: a ``DEFAULT`` (PostgreSQL 11 keeps a constant one
    aside, a volatile one rewrites the table; neither is in the WAL's row changes) or a
    generated column."""
    found = db.execute(
        "SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass(%s) "
        "AND attname = ANY(%s) AND (atthasdef OR atthasmissing OR attgenerated <> '')",
        [identifier(table).as_string(db), columns],
    ).fetchone()
    return bool(found and found[0])


def identifier(table: str) -> sql.Composable:
    """``schema.table`` as SQL: each part quoted as an identifier."""
    schema, name = table.split(".", 1)
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(name))


def table_columns(db: psycopg.Connection[Any], table: str) -> list[tuple[str, str]]:
    """The table's columns and their types, in order."""
    schema, name = table.split(".", 1)
    rows = db.execute(
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
        [schema, name],
    ).fetchall()
    return [(str(c), str(t)) for c, t in rows]


def primary_key(db: psycopg.Connection[Any], table: str) -> list[str]:
    """The table's primary key columns, in the key's order (as wal2json lists them)."""
    rows = db.execute(
        "SELECT a.attname FROM pg_index i CROSS JOIN unnest(i.indkey) WITH ORDINALITY "
        "AS k(attnum, n) JOIN pg_attribute a ON a.attrelid = i.indrelid "
        "AND a.attnum = k.attnum WHERE i.indrelid = %s::regclass AND i.indisprimary "
        "ORDER BY k.n",
        [identifier(table).as_string(db)],
    ).fetchall()
    return [str(name) for (name,) in rows]


def value_text(column: str, data_type: str) -> sql.Composable:
    """A column's value as wal2json gives it: numbers and booleans as they are, ``bytea``
    as hex digits, the rest as PostgreSQL's text."""
    name = sql.Identifier(column)
    if data_type in NATIVE:
        return name
    if data_type == "bytea":
        return sql.SQL("encode({}, 'hex')").format(name)
    return sql.SQL("{}::text").format(name)


def as_json(columns: list[tuple[str, str]]) -> sql.Composable:
    """The columns as one JSON object's text, each value as :func:`value_text` gives it.
    ``json_build_object`` takes
    100 arguments: a wider table's columns are built in parts, joined as ``jsonb``."""
    parts = [
        sql.SQL("json_build_object({})").format(sql.SQL(", ").join(
            sql.SQL("{}, {}").format(
                sql.Literal(c),
                value_text(c, t),
            )
            for c, t in columns[i : i + 50]
        ))
        for i in range(0, max(len(columns), 1), 50)
    ]  # fmt: skip
    if len(parts) == 1:
        return sql.SQL("{}::text").format(parts[0])
    return sql.SQL("({})::text").format(
        sql.SQL(" || ").join(sql.SQL("{}::jsonb").format(p) for p in parts)
    )


def table_names(db: psycopg.Connection[Any]) -> list[str]:
    """Every base table outside the system schemas, ``schema.table``, in order."""
    rows = db.execute(
        "SELECT table_schema || '.' || table_name FROM information_schema.tables "
        "WHERE table_type = 'BASE TABLE' AND table_schema NOT IN ('pg_catalog', "
        "'information_schema') ORDER BY 1"
    ).fetchall()
    return [name for (name,) in rows]


class Catalog:
    """What the changes need of the source's tables beyond the WAL, on a connection:
    their columns, and the values an update left out."""

    def __init__(self, db: psycopg.Connection[Any]) -> None:
        self.db = db
        self.columns: dict[str, dict[str, str]] = {}
        """``schema.table`` -> its columns and their types, in order."""

    def whole(self, table: str, row: dict[str, Any], key: list[str]) -> dict[str, Any]:
        """``row`` of an update with the columns the WAL left out (unchanged TOASTed
        values) read from the table by key; as it is if the row is gone (a later change
        deletes or moves it)."""
        columns = self.columns.get(table)
        if columns is None or not columns.keys() >= row.keys():  # new, or it changed
            columns = self.columns[table] = dict(table_columns(self.db, table))
        if len(row) >= len(columns):
            return row
        missing = [(name, t) for name, t in columns.items() if name not in row]
        if not missing:
            return row
        where = sql.SQL(" AND ").join(
            sql.SQL("{} = %s").format(value_text(name, columns.get(name, "text"))) for name in key
        )
        found = self.db.execute(
            sql.SQL("SELECT {} FROM {} WHERE {}").format(
                as_json(missing), identifier(table), where
            ),
            [row[name] for name in key],
        ).fetchone()
        return {**row, **loads(found[0])} if found else row
