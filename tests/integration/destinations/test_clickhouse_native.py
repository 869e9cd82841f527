"""Arrow columns inserted as ClickHouse's Native format into Debian's real server, and
read back exactly (tests/clickhouse.py)."""

from __future__ import annotations

import decimal
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pytest

from eventpipe.destinations.clickhouse.client import ClickHouseClient
from eventpipe.destinations.clickhouse.native import UnencodableValue, encode_block, var_uint

TYPES = {
    "s": "Nullable(String)",
    "i": "Nullable(Int64)",
    "f": "Nullable(Float64)",
    "b": "Nullable(UInt8)",
    "d": "Nullable(Decimal(38, 0))",
    "t": "Nullable(DateTime)",
    "k": "String",
}
LONG = "é" * 70 + "x" * 20_000  # a VarUInt length of three bytes, multi-byte characters
ROWS = [
    ("", 0, 0.0, False, decimal.Decimal(0), datetime(1970, 1, 1, tzinfo=UTC), "a"),
    (None, None, None, None, None, None, "b"),
    ("名前 🎉\t\n\\'\"\x00", 2**63 - 1, -1.5e300, True, decimal.Decimal(10**37),
     datetime(2106, 2, 7, 6, 28, 15, tzinfo=UTC), "c"),
    (LONG, -(2**63), 1.7976931348623157e308, True, decimal.Decimal(-(10**38) + 1),
     datetime(2026, 11, 27, 7, 0, 1, 999_999, tzinfo=UTC), "d"),
    ("x" * 127, 1, 2.5, False, decimal.Decimal(-1), None, "e"),
    ("y" * 128, None, None, None, None, datetime(2026, 1, 1, tzinfo=UTC), "f"),
]  # fmt: skip


def _table(rows: list[tuple[Any, ...]]) -> pa.Table:
    columns = list(zip(*rows, strict=True))
    return pa.table({
        "s": pa.array(columns[0], pa.string()), "i": pa.array(columns[1], pa.int64()),
        "f": pa.array(columns[2], pa.float64()), "b": pa.array(columns[3], pa.bool_()),
        "d": pa.array(columns[4], pa.decimal128(38, 0)),
        "t": pa.array(columns[5], pa.timestamp("us", tz="UTC")),
        "k": pa.array(columns[6], pa.string()),
    })  # fmt: skip


@pytest.fixture
def client(clickhouse_server: Any) -> Any:
    with ClickHouseClient(clickhouse_server.url, password=clickhouse_server.password) as client:
        client.execute("DROP TABLE IF EXISTS native_rows")
        columns = ", ".join(f"{name} {sql_type}" for name, sql_type in TYPES.items())
        client.execute(f"CREATE TABLE native_rows ({columns}) ENGINE = Memory")
        yield client
        client.execute("DROP TABLE native_rows")


def test_var_uint_is_leb128() -> None:
    assert var_uint(0) == b"\x00"
    assert var_uint(127) == b"\x7f"
    assert var_uint(128) == b"\x80\x01"
    assert var_uint(300) == b"\xac\x02"


def test_every_type_goes_in_as_one_block_and_comes_back_exact(client: Any) -> None:
    # Sliced: an Arrow array that starts inside its buffers.
    table = pa.concat_tables([_table(ROWS[:1]), _table(ROWS)]).slice(1)
    client.execute("INSERT INTO native_rows FORMAT Native", data=encode_block(table, TYPES))
    names, rows = client.query(
        "SELECT s, i, f, b, toUnixTimestamp(t), k FROM native_rows ORDER BY k"
    )
    assert names == ["s", "i", "f", "b", "toUnixTimestamp(t)", "k"]
    # Decimals as the server writes them in text (18.16's toString garbles Decimal128).
    text = client.execute("SELECT d FROM native_rows ORDER BY k FORMAT TSV").decode()
    decimals = [None if v == "\\N" else v for v in text.splitlines()]
    rows = [(*row[:4], d, *row[4:]) for row, d in zip(rows, decimals, strict=True)]
    assert len(rows) == len(ROWS)
    for got, sent in zip(rows, ROWS, strict=True):
        s, i, f, b, d, t, k = sent
        expected_time = None if t is None else int(t.timestamp())  # DateTime: whole seconds
        expected = (s, i, f, None if b is None else int(b),
                    None if d is None else str(d), expected_time, k)  # fmt: skip
        assert got == expected, (k, got[:2])


def test_a_time_datetime_cannot_hold_names_its_rows(client: Any) -> None:
    rows = [ROWS[0], (*ROWS[0][:5], datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC), "z"),
            (*ROWS[0][:5], datetime(2106, 2, 7, 6, 28, 16, tzinfo=UTC), "z2")]  # fmt: skip
    with pytest.raises(UnencodableValue) as info:
        encode_block(_table(rows), TYPES)
    assert info.value.column == "t"
    assert info.value.rows == [1, 2]


def test_a_null_in_a_column_that_cannot_be_null_is_refused() -> None:
    table = pa.table({"k": pa.array(["a", None], pa.string())})
    with pytest.raises(UnencodableValue) as info:
        encode_block(table, {"k": "String"})
    assert info.value.rows == [1]
