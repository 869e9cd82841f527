"""Applying a source's changes (docs/cdc.md): what DuckDB and PostgreSQL do with a
batch whose rows are changes of a table with a key, rather than events to append.

A table's batch is **changes** when its columns hold a source's envelope: ``_op``,
``_key`` (the row's primary key as JSON text), ``_lsn`` and ``_seq`` (the order). Its
load, in the one transaction that records the batch:

1. The newest ``truncate`` of the batch empties the table; changes before it are void.
2. Each key's last change (by ``_lsn``, ``_seq``) decides: the row of an ``insert``,
   ``read`` or ``update`` replaces the key's row; a ``delete``, or an update that moved
   the key elsewhere (``_old_key``), leaves none. Every change of a row is whole (the
   reader reads what the WAL leaves out), so the last one is the row.
3. Rows without a key (a table without a primary key, in a batch of changes) are
   appended.

Why this is exact after any crash: a batch is applied once (its record); a reader that
dies logs again what it had not confirmed, always a run of changes in their order, so a
change applied twice is followed again by every change after it, and each sets a key to
what it is, or removes it: the last one still decides. A table without a primary key is
append-only: with nothing that names a row, an update or a delete cannot say which of
two equal rows it changed, so each change is a row of its own, its ``_op`` saying what
happened (as in Parquet).

The statements are the same SQL in DuckDB, PostgreSQL, Redshift and Snowflake: each
key's last change is chosen by ``ROW_NUMBER()`` (Redshift has no ``DISTINCT ON``), and
comparisons with NULL are spelled out (no ``IS DISTINCT FROM``); the changes are first in
a temporary table ``relation``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

OP, KEY, OLD_KEY, LSN, SEQ = "_op", "_key", "_old_key", "_lsn", "_seq"
ENVELOPE = (OP, KEY, LSN, SEQ)
"""The columns that make a batch one of changes."""
FINAL = "eventpipe_final"
"""The temporary table of each key's last change."""


def are_changes(columns: Collection[str]) -> bool:
    """Whether a batch with ``columns`` is a source's changes, applied by key."""
    return all(c in columns for c in ENVELOPE)


def apply(
    run: Callable[[str], Sequence[tuple[Any, ...]]],
    quote: Callable[[str], str],
    table: str,
    relation: str,
    columns: Collection[str],
    temporary: str | None = "TEMP TABLE {}",
) -> int:
    """Apply the changes in ``relation`` (a temporary table with ``columns``) to
    ``table`` (its SQL name), with ``run`` (a statement's rows; none for a write), in the
    caller's transaction; the changes handled. ``temporary``: how the dialect names a
    temporary table it creates; None: no table is created, each key's last change is a
    subquery of the two statements that read it (Snowflake commits a transaction at any
    ``CREATE``)."""
    op, key, lsn, seq = (quote(c) for c in ENVELOPE)
    (count,) = run(f"SELECT count(*) FROM {relation}")[0]
    cut = run(
        f"SELECT {lsn}, {seq} FROM {relation} WHERE {op} = 'truncate' "
        f"ORDER BY {lsn} DESC, {seq} DESC LIMIT 1"
    )
    after = "TRUE"
    if cut:
        last_lsn, last_seq = (int(v) for v in cut[0])  # integers from the batch, not text
        run(f"DELETE FROM {table} WHERE TRUE")  # BigQuery's DELETE takes a WHERE
        after = f"({lsn} > {last_lsn} OR ({lsn} = {last_lsn} AND {seq} > {last_seq}))"
    moved = ""
    if OLD_KEY in columns:
        old = quote(OLD_KEY)
        moved = (
            f" UNION ALL SELECT {old}, {lsn}, {seq}, 'delete' FROM {relation} WHERE {op} = "
            f"'update' AND {old} IS NOT NULL AND ({key} IS NULL OR {old} <> {key}) AND {after}"
        )
    last = (
        f"SELECT k, {lsn}, {seq}, {op} FROM (SELECT k, {lsn}, {seq}, {op}, ROW_NUMBER() "
        f"OVER (PARTITION BY k ORDER BY {lsn} DESC, {seq} DESC) AS eventpipe_n FROM "
        f"(SELECT {key} AS k, {lsn}, {seq}, {op} FROM {relation} WHERE {key} IS NOT NULL "
        f"AND {after}{moved}) AS actions) AS ranked WHERE eventpipe_n = 1"
    )
    final = FINAL if temporary else f"({last})"
    if temporary:
        run(f"CREATE {temporary.format(FINAL)} AS {last}")
    listed = ", ".join(quote(c) for c in columns)
    chosen = ", ".join(f"s.{quote(c)}" for c in columns)
    run(f"DELETE FROM {table} WHERE {key} IN (SELECT k FROM {final} AS f)")
    # One row per key: two changes of one key at one (_lsn, _seq) are one change read twice.
    run(
        f"INSERT INTO {table} ({listed}) SELECT {listed} FROM (SELECT {chosen}, ROW_NUMBER() "
        f"OVER (PARTITION BY s.{key} ORDER BY s.{lsn}) AS eventpipe_n FROM {relation} AS s "
        f"JOIN {final} AS f ON s.{key} = f.k AND s.{lsn} = f.{lsn} AND s.{seq} = f.{seq} "
        f"WHERE f.{op} <> 'delete') AS last WHERE eventpipe_n = 1"
    )
    run(
        f"INSERT INTO {table} ({listed}) SELECT {listed} FROM {relation} "
        f"WHERE {key} IS NULL AND ({op} IS NULL OR {op} <> 'truncate') AND {after}"
    )
    if temporary:
        run(f"DROP TABLE {FINAL}")
    return int(count)
