"""A cluster's engines: a table's replicated twin, and a stage's engine read back from a
replicated table (the forms of 18.16 and of today's servers)."""

from __future__ import annotations

import pytest

from eventpipe.destinations.clickhouse.cluster import local_engine, replicated

PATH = "'/clickhouse/tables/{shard}/db/"


@pytest.mark.parametrize(
    ("engine", "made"),
    [
        ("MergeTree PARTITION BY toYYYYMM(`_timestamp`) ORDER BY (`_timestamp`)",
         f"ReplicatedMergeTree({PATH}t', '{{replica}}') PARTITION BY toYYYYMM(`_timestamp`) "
         "ORDER BY (`_timestamp`)"),
        ("ReplacingMergeTree(`_timestamp`) ORDER BY (`id`)",
         f"ReplicatedReplacingMergeTree({PATH}t', '{{replica}}', `_timestamp`) ORDER BY (`id`)"),
        ("ReplacingMergeTree ORDER BY (`id`)",
         f"ReplicatedReplacingMergeTree({PATH}t', '{{replica}}') ORDER BY (`id`)"),
        ("MergeTree ORDER BY tuple()",
         f"ReplicatedMergeTree({PATH}t', '{{replica}}') ORDER BY tuple()"),
    ],
)  # fmt: skip
def test_a_tables_engine_is_made_replicated_with_its_own_arguments_kept(
    engine: str, made: str
) -> None:
    assert replicated(engine, "db", "t") == made


def test_a_replica_path_takes_a_tables_name_as_one_node_without_macros_or_quotes() -> None:
    made = replicated("MergeTree ORDER BY tuple()", "db", "a/{replica}'b ü")
    assert made.startswith(f"ReplicatedMergeTree({PATH}a%2F%7Breplica%7D%27b%20%C3%BC', ")


@pytest.mark.parametrize(
    ("engine", "local"),
    [
        # 18.16's create_table_query
        ("ReplicatedMergeTree('/clickhouse/tables/{shard}/d/m', '{replica}') PARTITION BY "
         "toYYYYMM(_timestamp) ORDER BY _timestamp SETTINGS index_granularity = 8192",
         "MergeTree() PARTITION BY toYYYYMM(_timestamp) ORDER BY _timestamp "
         "SETTINGS index_granularity = 8192"),
        ("ReplicatedReplacingMergeTree('/c/it\\'s', '{replica}', _timestamp) ORDER BY id",
         "ReplacingMergeTree(_timestamp) ORDER BY id"),
        # today's servers, the path and name from their config
        ("ReplicatedReplacingMergeTree ORDER BY id", "ReplacingMergeTree ORDER BY id"),
        ("ReplicatedReplacingMergeTree(_timestamp) ORDER BY id",
         "ReplacingMergeTree(_timestamp) ORDER BY id"),
        ("MergeTree ORDER BY tuple()", "MergeTree ORDER BY tuple()"),  # not replicated
    ],
)  # fmt: skip
def test_a_stage_is_made_with_the_tables_engine_less_the_replication(
    engine: str, local: str
) -> None:
    assert local_engine(f"CREATE TABLE d.`x) ENGINE = Memory` (a String) ENGINE = {engine}") == (
        local
    )
