"""Arrow columns as one block of ClickHouse's Native format, for ``INSERT ... FORMAT
Native``.

Native is ClickHouse's own columnar format, read by every server version (Parquet
input is missing before 19.x, and Debian's server is 18.16): a column of fixed-width
values is its Arrow buffer as it is, so a batch's staged Parquet becomes an insert
without a loop over its rows in Python. A block, as the HTTP interface reads it (no
block info, which only the TCP protocol carries):

    VarUInt columns, VarUInt rows, then per column:
    String name, String type, the column's values

with ``String`` = VarUInt length + bytes, ``Nullable(T)`` = one byte per row (1: null)
followed by T's values (a default under each null), integers and floats little-endian,
``UInt8`` for booleans, ``Decimal(38, 0)`` as 16-byte two's complement (Arrow's
decimal128 buffer), ``DateTime`` as UInt32 seconds and ``DateTime64(6, ...)`` as Int64
microseconds, since 1970-01-01 UTC.

A value a type cannot hold (a timestamp before 1970 or after 2106 for ``DateTime``)
raises :class:`UnencodableValue` naming the column and the rows: the destination sends
those rows' events to failed/ instead of letting the server refuse the whole insert.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from eventpipe.errors import TerminalError

FIXED: Mapping[str, pa.DataType] = {
    "Int64": pa.int64(),
    "UInt64": pa.uint64(),
    "Int32": pa.int32(),
    "UInt32": pa.uint32(),
    "Int8": pa.int8(),
    "UInt8": pa.uint8(),
    "Float64": pa.float64(),
    "Float32": pa.float32(),
}
"""Types whose values are their Arrow buffer, little-endian."""

_DECIMAL = re.compile(r"Decimal\((\d+),\s*(\d+)\)")
_DATETIME64 = re.compile(r"DateTime64\(\s*6\s*(,.*)?\)")
DATETIME_MAX_SECONDS = 2**32 - 1


class UnencodableValue(TerminalError):
    """Values of one column that its ClickHouse type cannot hold."""

    name = "clickhouse_unencodable"

    def __init__(self, column: str, sql_type: str, rows: Sequence[int], reason: str) -> None:
        super().__init__(f"{column}: {reason} ({sql_type})", column=column, rows=list(rows))
        self.column = column
        self.rows = list(rows)


def var_uint(value: int) -> bytes:
    """ClickHouse's VarUInt (LEB128)."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _string(text: str) -> bytes:
    raw = text.encode()
    return var_uint(len(raw)) + raw


def encode_block(table: pa.Table, types: Mapping[str, str]) -> bytes:
    """``table``'s columns named in ``types`` (name -> ClickHouse type), in that order,
    as one Native block."""
    return b"".join(block_parts(table, types))


def block_parts(table: pa.Table, types: Mapping[str, str]) -> list[bytes]:
    """:func:`encode_block` in the parts it is made of, to send without joining them."""
    parts = [var_uint(len(types)), var_uint(table.num_rows)]
    for name, sql_type in types.items():
        chunked = table.column(name)  # combine_chunks copies even a single chunk
        column = chunked.chunk(0) if chunked.num_chunks == 1 else chunked.combine_chunks()
        parts += [_string(name), _string(sql_type), _column(name, sql_type, column)]
    return parts


def _column(name: str, sql_type: str, values: pa.Array) -> bytes:
    if sql_type.startswith("Nullable(") and sql_type.endswith(")"):
        nulls: np.ndarray[Any, Any] = pc.is_null(values).to_numpy(zero_copy_only=False)
        nulls = nulls.astype(np.uint8)
        return nulls.tobytes() + _values(name, sql_type[9:-1], values)
    if values.null_count:
        rows = np.flatnonzero(pc.is_null(values).to_numpy(zero_copy_only=False))
        raise UnencodableValue(name, sql_type, rows.tolist(), "null in a non-Nullable column")
    return _values(name, sql_type, values)


def _values(name: str, sql_type: str, values: pa.Array) -> bytes:
    """The values of a column without its null map (a default where null)."""
    if sql_type == "String":
        return _strings(values)
    if sql_type in FIXED:
        if pa.types.is_boolean(values.type):
            values = pc.cast(values, pa.uint8())
        array = pc.cast(values, FIXED[sql_type], safe=True).fill_null(0)
        numbers: np.ndarray[Any, Any] = array.to_numpy(zero_copy_only=False)
        return numbers.astype(numbers.dtype.newbyteorder("<"), copy=False).tobytes()
    if (decimal := _DECIMAL.fullmatch(sql_type)) is not None:
        precision, scale = int(decimal.group(1)), int(decimal.group(2))
        if precision > 38:
            raise ValueError(f"{sql_type}: wider than 16 bytes")
        cast = pc.cast(values, pa.decimal128(38, scale)).fill_null(0)
        data = cast.buffers()[1]
        width = 4 if precision <= 9 else 8 if precision <= 18 else 16
        wide = np.frombuffer(data, dtype="<i8", count=2 * len(cast), offset=cast.offset * 16)
        if width == 16:
            return wide.tobytes()
        return wide[0::2].astype(f"<i{width}").tobytes()  # small precisions: the low word
    if sql_type == "DateTime" or sql_type.startswith("DateTime("):
        micros = _micros(values)
        seconds: np.ndarray[Any, Any] = np.floor_divide(micros, 1_000_000)
        bad = (seconds < 0) | (seconds > DATETIME_MAX_SECONDS)
        if bad.any():
            raise UnencodableValue(name, sql_type, np.flatnonzero(bad).tolist(),
                                   "a time before 1970 or after 2106")  # fmt: skip
        return seconds.astype("<u4").tobytes()
    if _DATETIME64.fullmatch(sql_type):
        return _micros(values).astype("<i8").tobytes()
    raise ValueError(f"{name}: no Native encoding for {sql_type}")


def _micros(values: pa.Array) -> np.ndarray[Any, Any]:
    """Microseconds since 1970 UTC of a timestamp column, 0 where null."""
    cast = pc.cast(values, pa.timestamp("us", tz=getattr(values.type, "tz", None)))
    micros: np.ndarray[Any, Any] = (
        pc.cast(cast, pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
    )
    return micros


def _strings(values: pa.Array) -> bytes:
    """Each value as VarUInt length + UTF-8 bytes, built from Arrow's offsets and data
    buffers at once (nulls are empty): the values' bytes keep their order, so they fill
    every byte of the output but the lengths'."""
    if values.null_count:  # a null's slot may still span bytes: make it empty
        values = values.fill_null("" if pa.types.is_string(values.type)
                                  or pa.types.is_large_string(values.type) else b"")  # fmt: skip
    if not pa.types.is_large_string(values.type) and not pa.types.is_large_binary(values.type):
        values = pc.cast(values, pa.large_string() if pa.types.is_string(values.type)
                         else pa.large_binary())  # fmt: skip
    count = len(values)
    if count == 0:
        return b""
    _, offsets_buffer, data_buffer = values.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype="<i8", count=count + 1, offset=values.offset * 8)
    lengths = np.diff(offsets)
    data = (np.frombuffer(data_buffer, dtype=np.uint8)[offsets[0] : offsets[-1]]
            if data_buffer is not None else np.zeros(0, dtype=np.uint8))  # fmt: skip
    if int(lengths.max()) < 0x80:  # every length one byte: put them between the values
        return np.insert(data, offsets[:-1] - offsets[0], lengths.astype(np.uint8)).tobytes()
    # Bytes of each length's VarUInt: 1 below 2^7, 2 below 2^14, and so on.
    width = np.ones(count, dtype=np.int64)
    for bits in range(7, 63, 7):
        width += lengths >= (1 << bits)
    heads = np.cumsum(width + lengths) - width - lengths  # where each value's VarUInt starts
    out = np.empty(int(heads[-1] + width[-1] + lengths[-1]), dtype=np.uint8)
    is_head = np.zeros(len(out), dtype=bool)
    remaining = lengths.copy()
    for byte in range(int(width.max())):
        has = width > byte
        more = np.where(width > byte + 1, 0x80, 0)
        at = heads[has] + byte
        out[at] = ((remaining & 0x7F) | more)[has].astype(np.uint8)
        is_head[at] = True
        remaining >>= 7
    out[~is_head] = data
    return out.tobytes()
