"""A ClickHouse cluster (``cluster:``): the tables eventpipe makes are replicated.

Every table, the loads table included, is made ``ON CLUSTER`` with the replicated twin of
its engine (``ReplicatedMergeTree``, ``ReplicatedReplacingMergeTree``), its replicas
under ``/clickhouse/tables/{shard}/<database>/<table>`` in ClickHouse's coordination
service (ZooKeeper or ClickHouse Keeper) with ``{replica}`` as each replica's name, both
macros from the servers' own config. Columns are added ``ON CLUSTER`` too. A load runs on
the replica at ``url`` as on a single server (a stage table of its own, then ``ATTACH``
or ``REPLACE PARTITION``, which ClickHouse replicates: the other replicas fetch the
parts); the stage and rebuild tables are plain tables of that replica, made with the
table's engine less the replication (:func:`local_engine`).

One shard only: ``ATTACH PARTITION`` reaches the replicas of the shard it runs on, so a
cluster of several shards would hold every row on the first; eventpipe refuses one
(:func:`check`) rather than load it unevenly.
"""

from __future__ import annotations

import re
from urllib.parse import quote as percent_encoded

from eventpipe.destinations.clickhouse.client import ClickHouseClient
from eventpipe.errors import ConfigError
from eventpipe.schema.dialects import CLICKHOUSE

REPLICA_PATH = "/clickhouse/tables/{shard}"
"""Where a table's replicas meet in the coordination service; the database and the
table's name follow, percent-encoded (a name with ``/`` stays one node)."""
MACROS = ("shard", "replica")

_LITERAL = r"'(?:[^'\\]|\\.)*'"
_REPLICATION_ARGUMENTS = re.compile(rf"\(\s*{_LITERAL}\s*,\s*{_LITERAL}\s*,?\s*")
"""The path and the replica's name opening a replicated engine's arguments."""


def on_cluster(cluster: str | None) -> str:
    """`` ON CLUSTER `name` `` for a statement every host runs; empty without one."""
    return f" ON CLUSTER {CLICKHOUSE.quote(cluster)}" if cluster else ""


def replicated(engine: str, database: str, table: str) -> str:
    """``engine`` (a MergeTree engine clause, as the dialect writes it) made replicated:
    ``ReplacingMergeTree(_timestamp) ORDER BY (id)`` becomes
    ``ReplicatedReplacingMergeTree('<path>', '{replica}', _timestamp) ORDER BY (id)``."""
    match = re.match(r"^(\w*MergeTree)(\(([^)]*)\))?", engine)
    if match is None:
        raise ValueError(f"not a MergeTree engine: {engine}")
    path = "/".join([REPLICA_PATH, percent_encoded(database, safe=""),
                     percent_encoded(table, safe="")])  # fmt: skip
    arguments = [CLICKHOUSE.literal(path), "'{replica}'"]
    if match.group(3):
        arguments.append(match.group(3))
    return f"Replicated{match.group(1)}({', '.join(arguments)}){engine[match.end() :]}"


def local_engine(create_query: str) -> str:
    """The engine clause of a table's ``CREATE`` statement (``system.tables``'s
    ``create_table_query``) less its replication: what a stage or rebuild table of the
    same partitions and sorting key is made with, on one replica only."""
    at = create_query.rfind(" ENGINE = ")
    if at < 0:
        raise ValueError(f"no engine in: {create_query[:200]}")
    engine = create_query[at + len(" ENGINE = ") :].strip()
    if not engine.startswith("Replicated"):
        return engine
    engine = engine.removeprefix("Replicated")
    name = re.match(r"\w+", engine)
    rest = engine[name.end() :] if name else engine
    arguments = _REPLICATION_ARGUMENTS.match(rest)
    if arguments:  # none: today's servers may take the path and name from their config
        rest = "(" + rest[arguments.end() :]
    return (name.group(0) if name else "") + rest


def check(ch: ClickHouseClient, cluster: str) -> None:
    """ConfigError unless ``cluster`` is one of the server's, of one shard, and the
    server defines the macros the replicas' path and names use."""
    _, rows = ch.query(
        "SELECT uniqExact(shard_num), count() FROM system.clusters "
        f"WHERE cluster = {CLICKHOUSE.literal(cluster)}"
    )
    shards, hosts = (int(v) for v in rows[0])
    if hosts == 0:
        _, names = ch.query("SELECT DISTINCT cluster FROM system.clusters ORDER BY cluster")
        known = ", ".join(str(n) for (n,) in names) or "none"
        raise ConfigError(
            f"cluster {cluster!r} is not in the server's remote_servers (it has: {known})"
        )
    if shards > 1:
        raise ConfigError(
            f"cluster {cluster!r} has {shards} shards: eventpipe loads a cluster of one shard "
            "and its replicas (docs/destinations.md, ClickHouse clusters)"
        )
    _, found = ch.query("SELECT macro FROM system.macros")
    missing = sorted(set(MACROS) - {str(m) for (m,) in found})
    if missing:
        raise ConfigError(
            f"cluster {cluster!r}: the server defines no macro {', '.join(missing)} "
            "(<macros> in its config: each replica's shard and name)"
        )
