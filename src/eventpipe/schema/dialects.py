"""SQL column types per destination, from seed 1's table, plus DuckDB and timestamps.

| lattice   | Postgres       | Redshift                 | BigQuery  | ClickHouse              | Snowflake      | DuckDB    |
|-----------|----------------|--------------------------|-----------|-------------------------|----------------|-----------|
| STRING    | text           | character varying(65535) | string    | String                  | text           | VARCHAR   |
| FLOAT64   | numeric(38,18) | numeric(38,18)           | float     | Float64                 | numeric(38,18) | DOUBLE    |
| INT64     | bigint         | bigint                   | integer   | Int64                   | bigint         | BIGINT    |
| BOOL      | boolean        | boolean                  | boolean   | UInt8                   | boolean        | BOOLEAN   |
| TIMESTAMP | timestamp      | timestamp                | timestamp | DateTime64(6, 'UTC')    | timestamp_ntz  | TIMESTAMP |

Arrays are JSON text, so they take the STRING type. Timestamps are stored in UTC without
a zone (the seed is silent; every event's ``_timestamp`` is UTC). An explicit cast in a
mapping rule gives its own SQL type and wins over this table.
"""  # noqa: E501

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from eventpipe.schema.types import DataType


@dataclass(frozen=True)
class Dialect:
    name: str
    types: Mapping[DataType, str]
    quote_char: str = '"'

    def sql_type(self, data_type: DataType) -> str:
        return self.types[data_type]

    def quote(self, identifier: str) -> str:
        """Quote an identifier, doubling the quote character inside it."""
        q = self.quote_char
        return q + identifier.replace(q, q + q) + q


def _types(string: str, double: str, integer: str, boolean: str, ts: str) -> Mapping[DataType, str]:
    return MappingProxyType(
        {
            DataType.STRING: string,
            DataType.FLOAT64: double,
            DataType.INT64: integer,
            DataType.BOOL: boolean,
            DataType.TIMESTAMP: ts,
        }
    )


POSTGRES = Dialect("postgres", _types("text", "numeric(38,18)", "bigint", "boolean", "timestamp"))
REDSHIFT = Dialect(
    "redshift",
    _types("character varying(65535)", "numeric(38,18)", "bigint", "boolean", "timestamp"),
)
BIGQUERY = Dialect(
    "bigquery", _types("string", "float", "integer", "boolean", "timestamp"), quote_char="`"
)
CLICKHOUSE = Dialect(
    "clickhouse",
    _types("String", "Float64", "Int64", "UInt8", "DateTime64(6, 'UTC')"),
    quote_char="`",
)
SNOWFLAKE = Dialect(
    "snowflake", _types("text", "numeric(38,18)", "bigint", "boolean", "timestamp_ntz")
)
DUCKDB = Dialect("duckdb", _types("VARCHAR", "DOUBLE", "BIGINT", "BOOLEAN", "TIMESTAMP"))

DIALECTS: Mapping[str, Dialect] = MappingProxyType(
    {d.name: d for d in (POSTGRES, REDSHIFT, BIGQUERY, CLICKHOUSE, SNOWFLAKE, DUCKDB)}
)
