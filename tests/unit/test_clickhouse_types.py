"""ClickHouse's own types in a mapping: which are passed through, and as what."""

from __future__ import annotations

import pytest

from eventpipe.destinations.clickhouse.types import column_type, lattice, own_type
from eventpipe.schema.types import DataType


@pytest.mark.parametrize(
    ("written", "own"),
    [
        ("Lowcardinality(String)", "LowCardinality(String)"),  # seed 1's spelling
        ("LowCardinality(Nullable(String))", "LowCardinality(Nullable(String))"),
        ("uint32", "UInt32"),
        ("Enum8('a' = 1, 'b' = 2)", "Enum8('a' = 1, 'b' = 2)"),
        ("DateTime64(3, 'UTC')", "DateTime64(3, 'UTC')"),
        ("INT64", None),  # eventpipe's lattice name: each destination's own type for it
        ("bigint", None),
        ("timestamptz", None),
        ("varchar(255)", None),
    ],
)
def test_clickhouse_types_are_recognised_and_spelled_as_clickhouse_does(
    written: str, own: str | None
) -> None:
    assert own_type(written) == own


def test_a_mapped_column_is_nullable_inside_low_cardinality_unless_required() -> None:
    assert column_type("LowCardinality(String)", required=False) == (
        "LowCardinality(Nullable(String))"
    )
    assert column_type("LowCardinality(String)", required=True) == "LowCardinality(String)"
    assert column_type("UInt32", required=False) == "Nullable(UInt32)"
    assert column_type("Nullable(UInt32)", required=False) == "Nullable(UInt32)"
    assert lattice("LowCardinality(Nullable(String))") is DataType.STRING
    assert lattice("Nullable(UInt64)") is DataType.INT128


def test_string_literals_escape_as_each_engine_reads_them() -> None:
    from eventpipe.schema.dialects import CLICKHOUSE, DUCKDB

    assert CLICKHOUSE.literal("it's a \\ path") == "'it\\'s a \\\\ path'"
    assert DUCKDB.literal("it's a \\ path") == "'it''s a \\ path'"
