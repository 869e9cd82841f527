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


def test_identifiers_are_quoted_with_quotes_doubled_or_escaped() -> None:
    assert POSTGRES.quote("select") == '"select"'
    assert POSTGRES.quote('a"b') == '"a""b"'
    # GoogleSQL and ClickHouse escape with a backslash: a doubled quote ends the name there.
    assert DIALECTS["bigquery"].quote("a`b") == "`a\\`b`"
    assert DIALECTS["bigquery"].literal("it's") == "'it\\'s'"


@pytest.mark.parametrize(
    ("dialect", "create", "add"),
    [
        ("postgres",
         'CREATE TABLE "s"."t" ("id" text, "n" bigint, "_timestamp" timestamp, PRIMARY KEY ("id"))',
         'ALTER TABLE "s"."t" ADD COLUMN "x y" numeric(38,18)'),
        ("redshift",
         'CREATE TABLE "s"."t" ("id" character varying(65535), "n" bigint, "_timestamp" '
         'timestamp, PRIMARY KEY ("id"))',
         'ALTER TABLE "s"."t" ADD COLUMN "x y" numeric(38,18)'),
        ("bigquery",
         "CREATE TABLE `s`.`t` (`id` string, `n` integer, `_timestamp` timestamp, "
         "PRIMARY KEY (`id`) NOT ENFORCED)",
         "ALTER TABLE `s`.`t` ADD COLUMN `x y` float"),
        ("clickhouse",
         "CREATE TABLE `s`.`t` (`id` String, `n` Nullable(Int64), `_timestamp` "
         "DateTime64(6, 'UTC')) ENGINE = ReplacingMergeTree(`_timestamp`) ORDER BY (`id`)",
         "ALTER TABLE `s`.`t` ADD COLUMN `x y` Nullable(Float64)"),
        ("snowflake",
         'CREATE TABLE "s"."t" ("id" text, "n" bigint, "_timestamp" timestamp_ntz, '
         'PRIMARY KEY ("id"))',
         'ALTER TABLE "s"."t" ADD COLUMN "x y" numeric(38,18)'),
        ("duckdb",
         'CREATE TABLE "s"."t" ("id" VARCHAR, "n" BIGINT, "_timestamp" TIMESTAMP, '
         'PRIMARY KEY ("id"))',
         'ALTER TABLE "s"."t" ADD COLUMN "x y" DOUBLE'),
    ],
)  # fmt: skip
def test_each_dialect_writes_its_ddl(dialect: str, create: str, add: str) -> None:
    d = DIALECTS[dialect]
    columns = [("id", S), ("n", N), ("_timestamp", T)]
    assert d.create_table("t", columns, ("id",), namespace="s") == create
    assert d.add_column("t", "x y", F, namespace="s") == add


def test_ddl_quotes_hostile_names_and_clickhouse_needs_an_engine_without_a_key() -> None:
    assert POSTGRES.create_table('a"; DROP TABLE x; --', [("select", S)]) == (
        'CREATE TABLE "a""; DROP TABLE x; --" ("select" text)'
    )
    assert DIALECTS["clickhouse"].create_table("t", [("a", B)]) == (
        "CREATE TABLE `t` (`a` Nullable(UInt8)) ENGINE = MergeTree ORDER BY tuple()"
    )
    assert POSTGRES.add_primary_key("t", ["id", "day"], "s") == (
        'ALTER TABLE "s"."t" ADD PRIMARY KEY ("id", "day")'
    )
    assert DIALECTS["clickhouse"].add_primary_key("t", ["id"]) is None
