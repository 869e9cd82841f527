"""ClickHouse's HTTP interface as the destination uses it, against Debian's real server
(tests/clickhouse.py): what the server says it can do, exact answers, and each kind of
failure classified."""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from typing import Any

import pytest

from eventpipe.destinations.clickhouse.client import (
    ClickHouseClient,
    ServerError,
    classify,
)
from eventpipe.errors import ConfigError, TerminalError, TransientError
from eventpipe.schema.dialects import CLICKHOUSE
from eventpipe.schema.types import DataType
from tests.process import free_port


def _client(server: Any, **kwargs: Any) -> ClickHouseClient:
    return ClickHouseClient(server.url, password=server.password, **kwargs)


def test_the_servers_features_come_from_the_server(clickhouse_server: Any) -> None:
    with _client(clickhouse_server) as client:
        features = client.features()
    assert features.version.startswith("18.16")
    # Debian's 18.16: rows arrive as RowBinary or text, never Parquet; no microseconds
    # in DateTime; no insert deduplication tokens; LowCardinality behind a flag.
    assert {"RowBinary", "Native", "TabSeparated", "JSONEachRow"} <= features.input_formats
    assert not features.parquet_input
    assert not features.datetime64
    assert not features.deduplication_tokens
    assert features.low_cardinality_is_experimental


def test_answers_are_exact_and_named(clickhouse_server: Any) -> None:
    with _client(clickhouse_server) as client:
        names, rows = client.query(
            "SELECT toInt64(9223372036854775807) AS big, toUInt64(18446744073709551615) AS u, "
            "CAST(NULL AS Nullable(Int64)) AS missing, 'x' AS text, 2.5 AS f, "
            "toDecimal128('-99999999999999999999999999999999999999', 0) AS wide, "
            "toDecimal64('0.000000000000000001', 18) AS small"
        )
    assert names == ["big", "u", "missing", "text", "f", "wide", "small"]
    assert rows == [(2**63 - 1, 2**64 - 1, None, "x", 2.5, Decimal(-(10**38) + 1),
                     Decimal("0.000000000000000001"))]  # fmt: skip
    assert type(rows[0][4]) is float


def test_a_wrong_password_is_a_clear_error_without_the_password(clickhouse_server: Any) -> None:
    wrong = "not-the-password-" + clickhouse_server.password[::-1]
    with ClickHouseClient(clickhouse_server.url, password=wrong) as client:
        with pytest.raises(ConfigError) as info:
            client.query("SELECT 1")
        assert wrong not in repr(client)
    assert "refused user 'default'" in str(info.value)
    assert wrong not in str(info.value)


def test_a_bad_statement_is_terminal_with_the_servers_message(clickhouse_server: Any) -> None:
    with _client(clickhouse_server) as client, pytest.raises(ServerError) as info:
        client.execute("SELEC 1")
    assert info.value.code == 62  # SYNTAX_ERROR
    assert "Syntax error" in str(info.value)
    assert len(str(info.value)) < 1100  # the parser's whole list of keywords is cut


def test_a_read_only_user_cannot_write(clickhouse_server: Any) -> None:
    with _client(clickhouse_server, user="reader") as client:
        assert client.query("SELECT 1")[1] == [(1,)]
        with pytest.raises(ServerError) as info:
            client.execute("CREATE TABLE nope (a Int8) ENGINE = Memory")
    assert info.value.code == 164  # READONLY


def test_rows_in_a_format_go_in_one_insert(clickhouse_server: Any) -> None:
    with _client(clickhouse_server) as client:
        client.execute("DROP TABLE IF EXISTS client_rows")
        client.execute("CREATE TABLE client_rows (k Nullable(Int64), s String) ENGINE = Memory")
        rows = b'{"k":"9223372036854775807","s":"a"}\n{"k":null,"s":"b"}\n'
        client.execute("INSERT INTO client_rows FORMAT JSONEachRow", data=rows)
        assert client.query("SELECT k, s FROM client_rows ORDER BY s")[1] == [
            (2**63 - 1, "a"), (None, "b")]  # fmt: skip
        with pytest.raises(ServerError):  # a value the column cannot take: the server's words
            client.execute("INSERT INTO client_rows FORMAT JSONEachRow",
                           data=b'{"k":"x","s":"c"}\n')  # fmt: skip
        client.execute("DROP TABLE client_rows")


def test_no_server_is_transient() -> None:
    nobody = f"http://127.0.0.1:{free_port()}"
    with ClickHouseClient(nobody, timeout_seconds=5) as client, pytest.raises(TransientError):
        client.query("SELECT 1")


@pytest.mark.parametrize(
    ("status", "text", "kind"),
    [
        (500, "Code: 252, e.displayText() = DB::Exception: Too many parts (300)", TransientError),
        (500, "Code: 241, e.displayText() = DB::Exception: Memory limit exceeded", TransientError),
        (503, "Service Unavailable", TransientError),  # a proxy's answer: no code
        (500, "Code: 53, e.displayText() = DB::Exception: Type mismatch", TerminalError),
        (403, "Code: 516. DB::Exception: default: Authentication failed", ConfigError),
        (400, "Code: 27, e.displayText() = DB::Exception: Cannot parse input", TerminalError),
    ],
)
def test_errors_are_classified_by_the_servers_code(
    status: int, text: str, kind: type[Exception]
) -> None:
    error = classify(status, text, user="default", url="http://ch:8123/")
    assert type(error) is kind or (kind is TerminalError and isinstance(error, ServerError))


@pytest.mark.parametrize(
    ("columns", "key"),
    [
        ((("id", DataType.STRING), ("n", DataType.INT64), ("_timestamp", DataType.TIMESTAMP)),
         ("id",)),
        ((("n", DataType.FLOAT64), ("b", DataType.BOOL), ("_timestamp", DataType.TIMESTAMP)), ()),
        ((("huge", DataType.INT128), ("s", DataType.STRING)), ()),
    ],
)  # fmt: skip
def test_the_dialects_tables_are_ones_the_server_creates(
    clickhouse_server: Any, columns: tuple[tuple[str, DataType], ...], key: tuple[str, ...]
) -> None:
    # 18.16 has no DateTime64: its timestamps here are DateTime, the rest as the dialect has it.
    dialect = dataclasses.replace(
        CLICKHOUSE, types={**CLICKHOUSE.types, DataType.TIMESTAMP: "DateTime('UTC')"}
    )
    with _client(clickhouse_server) as client:
        client.execute("DROP TABLE IF EXISTS dialect_t")
        client.execute(dialect.create_table("dialect_t", columns, key, namespace="default"))
        client.execute(dialect.add_column("dialect_t", "added col", DataType.STRING, "default"))
        _, described = client.query(
            "SELECT name, type, is_in_sorting_key FROM system.columns "
            "WHERE database = 'default' AND table = 'dialect_t'"
        )
        client.execute("DROP TABLE dialect_t")
    types = {name: (sql_type, bool(sorting)) for name, sql_type, sorting in described}
    assert types["added col"] == ("Nullable(String)", False)
    for name, data_type in columns:
        nullable = name not in {*key, "_timestamp"}
        sql_type = dialect.sql_type(data_type)
        assert types[name][0] == (f"Nullable({sql_type})" if nullable else sql_type)
    sorted_by = {name for name, (_, sorting) in types.items() if sorting}
    assert sorted_by == (set(key) or ({"_timestamp"} & set(dict(columns))))
