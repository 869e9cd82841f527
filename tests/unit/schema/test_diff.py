"""Table diffs and dialect types."""

from __future__ import annotations

import pytest

from eventpipe.schema.dialects import DIALECTS, POSTGRES
from eventpipe.schema.diff import Conflict, Table, diff
from eventpipe.schema.types import DataType

B, N, F, T, S = (DataType.BOOL, DataType.INT64, DataType.FLOAT64, DataType.TIMESTAMP,
                 DataType.STRING)  # fmt: skip


def test_a_missing_table_is_created_with_every_column_and_the_key() -> None:
    patch = diff(None, Table("events", {"b": N, "a": S}, primary_key=("a",)))
    assert patch.create
    assert patch.add_columns == (("a", S), ("b", N))
    assert patch.set_primary_key == ("a",)


def test_only_missing_columns_are_added_and_extra_ones_ignored() -> None:
    existing = Table("events", {"a": S, "old": N})
    patch = diff(existing, Table("events", {"a": S, "z": B, "new": F}))
    assert not patch.create
    assert patch.add_columns == (("new", F), ("z", B))
    assert patch.conflicts == ()


def test_values_that_fit_are_no_conflict_and_nothing_is_narrowed() -> None:
    existing = Table("events", {"f": F, "s": S, "n": N})
    patch = diff(existing, Table("events", {"f": N, "s": T, "n": B}))
    assert patch.empty
    assert patch.conflicts == ()


def test_values_wider_than_the_column_are_conflicts_not_alterations() -> None:
    existing = Table("events", {"n": N, "t": T})
    patch = diff(existing, Table("events", {"n": S, "t": F}))
    assert patch.add_columns == ()
    assert patch.conflicts == (Conflict("n", N, S), Conflict("t", T, F))


def test_a_primary_key_is_set_once() -> None:
    assert diff(Table("e", {"id": S}), Table("e", {"id": S}, ("id",))).set_primary_key == ("id",)
    keyed = Table("e", {"id": S}, ("id",))
    assert diff(keyed, Table("e", {"id": S}, ("id",))).set_primary_key == ()


@pytest.mark.parametrize(
    ("dialect", "expected"),
    [
        ("postgres", ["text", "numeric(38,18)", "bigint", "boolean"]),
        ("redshift", ["character varying(65535)", "numeric(38,18)", "bigint", "boolean"]),
        ("bigquery", ["string", "float", "integer", "boolean"]),
        ("clickhouse", ["String", "Float64", "Int64", "UInt8"]),
        ("snowflake", ["text", "numeric(38,18)", "bigint", "boolean"]),
        ("duckdb", ["VARCHAR", "DOUBLE", "BIGINT", "BOOLEAN"]),
    ],
)
def test_dialect_types_follow_seed_1(dialect: str, expected: list[str]) -> None:
    d = DIALECTS[dialect]
    assert [d.sql_type(t) for t in (S, F, N, B)] == expected
    assert d.sql_type(T)  # every dialect types timestamps


def test_identifiers_are_quoted_with_quotes_doubled() -> None:
    assert POSTGRES.quote("select") == '"select"'
    assert POSTGRES.quote('a"b') == '"a""b"'
    assert DIALECTS["bigquery"].quote("a`b") == "`a``b`"
