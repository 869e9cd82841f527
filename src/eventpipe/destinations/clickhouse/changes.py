"""A source's changes applied by key on ClickHouse (docs/cdc.md): the table made again
with them, and swapped in whole.

ClickHouse has no transactional UPDATE or DELETE (its mutations rewrite parts in the
background, and a ``ReplacingMergeTree`` removes older rows only when it merges), so a
table of changes is made without partitions or sorting key (``ENGINE = MergeTree ORDER BY
tuple()``: :data:`ENGINE`; a keyless change has a null ``_key``, which a sorting key
refuses), and each batch is applied by rebuilding it:

1. the batch's changes are in the stage table (destination.py);
2. each key's last action is chosen (by ``_lsn``, ``_seq``; an update that moved a key
   is a delete of its old key, as destinations/changes.py has it), after the batch's
   newest ``truncate``;
3. a rebuild table ``AS`` the table takes the table's rows whose key the batch does not
   touch (none after a truncate), then the row of each key whose last action is not a
   delete, then the batch's rows without a key;
4. ``REPLACE PARTITION ID 'all'`` swaps it in, at once for every reader (``DROP
   PARTITION`` when nothing is left: :func:`swap_partition`).

Run again after a crash (before the batch's record), it gives the same table: a key's
row is its last change whichever table it starts from, a truncate empties it again, and
rows the batch itself brought (its ``_eventpipe_load``) are never kept from the table.
The cost is the table's size per batch: fine for the tables a source's database holds,
the reason stream mode is not offered for a large table of changes (docs/destinations.md).
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from eventpipe.destinations.changes import ENVELOPE, OLD_KEY
from eventpipe.destinations.clickhouse.client import ClickHouseClient
from eventpipe.errors import TerminalError
from eventpipe.schema.dialects import CLICKHOUSE

UNPARTITIONED = "all"
"""The partition id of every row of a table without a partition key."""
ENGINE = "MergeTree ORDER BY tuple()"
"""The engine of a table of changes."""
literal = CLICKHOUSE.literal


def apply(
    ch: ClickHouseClient,
    database: str,
    name: Callable[[str], str],
    table: str,
    stage: str,
    rebuild: str,
    columns: Collection[str],
    load: tuple[str, str],
    made_like: str = "",
) -> int:
    """Apply the changes in ``stage`` to ``table`` (names; ``name`` makes them SQL), by
    way of ``rebuild``; ``columns``: the batch's; ``load``: the load column and this
    batch's id; ``made_like``: what follows ``CREATE TABLE rebuild AS table`` (a
    cluster's local engine). Returns the changes handled."""
    q = CLICKHOUSE.quote
    op, key, lsn, seq = (q(c) for c in ENVELOPE)
    target, staged, fresh = name(table), name(stage), name(rebuild)
    if key_of_partitions := partition_key(ch, database, table):
        raise TerminalError(
            f"{table} is partitioned ({key_of_partitions}): a source's changes are applied to "
            "a table without partitions, the one eventpipe makes",
            fix="drop or rename the table for eventpipe to make it again", table=table,
        )  # fmt: skip
    [(count,)] = ch.query(f"SELECT count() FROM {staged}")[1]
    cut = ch.query(
        f"SELECT {lsn}, {seq} FROM {staged} WHERE {op} = 'truncate' "
        f"ORDER BY {lsn} DESC, {seq} DESC LIMIT 1"
    )[1]
    after = "1"
    if cut:
        last_lsn, last_seq = (int(v) for v in cut[0])  # integers from the batch, not text
        after = f"({lsn} > {last_lsn} OR ({lsn} = {last_lsn} AND {seq} > {last_seq}))"
    actions = (
        f"SELECT {key} AS k, {lsn} AS l, {seq} AS s, {op} AS o FROM {staged} "
        f"WHERE {key} IS NOT NULL AND {after}"
    )
    if OLD_KEY in columns:
        old = q(OLD_KEY)
        actions += (
            f" UNION ALL SELECT {old} AS k, {lsn} AS l, {seq} AS s, 'delete' AS o FROM {staged} "
            f"WHERE {op} = 'update' AND {old} IS NOT NULL AND {old} != {key} AND {after}"
        )
    last = f"SELECT k, l, s, o FROM ({actions}) ORDER BY k, l DESC, s DESC LIMIT 1 BY k"
    listed = ", ".join(q(c) for c in columns)
    load_column, batch_id = load
    ch.execute(f"DROP TABLE IF EXISTS {fresh}")
    ch.execute(f"CREATE TABLE {fresh} AS {target}{made_like}")
    if not cut:  # the table's rows that the batch leaves as they are
        ch.execute(
            f"INSERT INTO {fresh} SELECT * FROM {target} WHERE {q(load_column)} != "
            f"{literal(batch_id)} AND ({key} IS NULL OR {key} NOT IN (SELECT k FROM ({last})))"
        )
    ch.execute(
        f"INSERT INTO {fresh} ({listed}, {q(load_column)}) SELECT {listed}, {q(load_column)} "
        f"FROM {staged} WHERE ({key}, {lsn}, {seq}) IN "
        f"(SELECT k, l, s FROM ({last}) WHERE o != 'delete') LIMIT 1 BY {key}"
    )
    ch.execute(
        f"INSERT INTO {fresh} ({listed}, {q(load_column)}) SELECT {listed}, {q(load_column)} "
        f"FROM {staged} WHERE {key} IS NULL AND ifNull({op}, '') != 'truncate' AND {after}"
    )
    swap_partition(ch, target, UNPARTITIONED, fresh)
    ch.execute(f"DROP TABLE {fresh}")
    return int(count)


def swap_partition(ch: ClickHouseClient, target: str, partition: str, source: str) -> None:
    """``target``'s partition ``partition`` replaced by ``source``'s, at once for every
    reader (names are SQL). An empty ``source`` drops the partition: today's servers
    refuse to replace a partition from a table without rows in it."""
    [(rows,)] = ch.query(f"SELECT count() FROM {source}")[1]
    if int(rows) == 0:
        ch.execute(f"ALTER TABLE {target} DROP PARTITION ID {literal(partition)}")
    else:
        ch.execute(f"ALTER TABLE {target} REPLACE PARTITION ID {literal(partition)} FROM {source}")


def partition_key(ch: ClickHouseClient, database: str, table: str) -> str:
    """The table's partition key expression (``toYYYYMM(_timestamp)``), empty for a
    table without partitions (or none at all)."""
    _, rows = ch.query(
        "SELECT partition_key FROM system.tables "
        f"WHERE database = {literal(database)} AND name = {literal(table)}"
    )
    return str(rows[0][0]).replace("`", "") if rows else ""
