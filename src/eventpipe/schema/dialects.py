"""SQL column types per destination, from seed 1's table, plus DuckDB and timestamps.

| lattice   | Postgres       | Redshift                 | BigQuery   | ClickHouse           | Snowflake      | DuckDB        |
|-----------|----------------|--------------------------|------------|----------------------|----------------|---------------|
| STRING    | text           | character varying(65535) | string     | String               | text           | VARCHAR       |
| FLOAT64   | numeric(38,18) | numeric(38,18)           | float      | Float64              | numeric(38,18) | DOUBLE        |
| INT64     | bigint         | bigint                   | integer    | Int64                | bigint         | BIGINT        |
| INT128    | numeric(38,0)  | numeric(38,0)            | bignumeric | Decimal(38, 0)       | number(38,0)   | DECIMAL(38,0) |
| BOOL      | boolean        | boolean                  | boolean    | UInt8                | boolean        | BOOLEAN       |
| TIMESTAMP | timestamp      | timestamp                | timestamp  | DateTime64(6, 'UTC') | timestamp_ntz  | TIMESTAMP     |

INT128 (integers beyond int64, of at most 38 digits) is not in the seed's table; each
destination takes the widest exact integer it has (BigQuery's NUMERIC keeps only 29
integer digits, so BIGNUMERIC). Arrays are JSON text, so they take the STRING type. Timestamps are stored in UTC without
a zone (the seed is silent; every event's ``_timestamp`` is UTC). An explicit cast in a
mapping rule gives its own SQL type and wins over this table.

Each dialect also writes the DDL eventpipe patches tables with (``create_table``,
``add_column``, ``add_primary_key``): identifiers always quoted; BigQuery keys are
``NOT ENFORCED``; ClickHouse columns are ``Nullable`` except the key's and
``_timestamp`` (ClickHouse refuses Nullable keys), and a table needs an engine
(``ReplacingMergeTree(_timestamp)`` ordered by the key when there is one, so the newest
row wins on merge, and not partitioned: ClickHouse replaces rows within a partition only,
and a key's rows may have times months apart; ``MergeTree`` ordered by ``_timestamp``
and partitioned by its month otherwise).
"""  # noqa: E501

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from eventpipe.schema.types import DataType

TIMESTAMP_COLUMN = "_timestamp"


@dataclass(frozen=True)
class Dialect:
    name: str
    types: Mapping[DataType, str]
    quote_char: str = '"'
    primary_key: str = "PRIMARY KEY ({})"
    """The table constraint naming the key columns; empty: the engine keys by ORDER BY."""
    nullable: str = "{}"
    """A nullable column's type (ClickHouse columns are NOT NULL unless wrapped)."""
    backslash_escapes: bool = False
    """Quoted identifiers escape with a backslash (ClickHouse), not by doubling."""

    def sql_type(self, data_type: DataType) -> str:
        return self.types[data_type]

    def quote(self, identifier: str) -> str:
        """Quote an identifier, doubling the quote character inside it (or escaping it,
        a backslash and control characters with a backslash)."""
        q = self.quote_char
        if self.backslash_escapes:
            return q + identifier.translate(_BACKSLASHED) + q
        return q + identifier.replace(q, q + q) + q

    def literal(self, text: str) -> str:
        """``text`` as a string literal: the quote doubled, or (ClickHouse) a backslash
        and the quote escaped with a backslash."""
        if self.backslash_escapes:
            return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
        return "'" + text.replace("'", "''") + "'"

    def name_of(self, table: str, namespace: str | None = None) -> str:
        """``namespace.table`` (schema, dataset or database), quoted."""
        return f"{self.quote(namespace)}.{self.quote(table)}" if namespace else self.quote(table)

    def column(self, name: str, data_type: DataType) -> str:
        return f"{self.quote(name)} {self.nullable.format(self.sql_type(data_type))}"

    def create_table(
        self,
        table: str,
        columns: Sequence[tuple[str, DataType]],
        primary_key: Sequence[str] = (),
        namespace: str | None = None,
        sql_types: Mapping[str, str] | None = None,
        engine: str | None = None,
        on_cluster: str | None = None,
    ) -> str:
        """``CREATE TABLE`` with ``columns`` in order, and the primary key if any.
        ``sql_types``: a column's SQL type as written, instead of its lattice type's (a
        mapping's ClickHouse type; nullable or not already). ``engine``: ClickHouse's
        engine clause instead of :meth:`clickhouse_engine`'s; ``on_cluster``: made on
        every host of that ClickHouse cluster."""
        if self.name == "clickhouse":
            return self._create_clickhouse_table(
                table, columns, primary_key, namespace, sql_types or {},
                engine or self.clickhouse_engine(columns, primary_key), on_cluster,
            )  # fmt: skip
        own = sql_types or {}
        parts = [f"{self.quote(name)} {own[name]}" if name in own else self.column(name, data_type)
                 for name, data_type in columns]  # fmt: skip
        keys = ", ".join(self.quote(c) for c in primary_key)
        if primary_key and self.primary_key:
            parts.append(self.primary_key.format(keys))
        return f"CREATE TABLE {self.name_of(table, namespace)} ({', '.join(parts)})"

    def _create_clickhouse_table(
        self,
        table: str,
        columns: Sequence[tuple[str, DataType]],
        primary_key: Sequence[str],
        namespace: str | None,
        sql_types: Mapping[str, str],
        engine: str,
        on_cluster: str | None,
    ) -> str:
        """ClickHouse refuses a Nullable column in a sorting or partition key and as a
        ReplacingMergeTree's version, so the key's columns and ``_timestamp`` (which every
        event has) are not Nullable."""
        required = {*primary_key, TIMESTAMP_COLUMN}
        parts = [
            f"{self.quote(name)} {sql_types[name]}" if name in sql_types
            else f"{self.quote(name)} {self.sql_type(data_type)}" if name in required
            else self.column(name, data_type)
            for name, data_type in columns
        ]  # fmt: skip
        cluster = f" ON CLUSTER {self.quote(on_cluster)}" if on_cluster else ""
        name = self.name_of(table, namespace)
        return f"CREATE TABLE {name}{cluster} ({', '.join(parts)}) ENGINE = {engine}"

    def clickhouse_engine(
        self, columns: Sequence[tuple[str, DataType]], primary_key: Sequence[str]
    ) -> str:
        """The engine clause of a table eventpipe makes: partitioned by month of
        ``_timestamp``; a key means ``ReplacingMergeTree`` ordered by it, ``_timestamp``
        its version (the newest row wins on merge), and no partitions; otherwise
        ``MergeTree`` ordered by ``_timestamp``."""
        has_time = TIMESTAMP_COLUMN in dict(columns)
        ts = self.quote(TIMESTAMP_COLUMN)
        if primary_key:  # not partitioned: ClickHouse replaces rows within a partition only
            keys = ", ".join(self.quote(c) for c in primary_key)
            version = f"({ts})" if has_time else ""
            return f"ReplacingMergeTree{version} ORDER BY ({keys})"
        if has_time:
            return f"MergeTree PARTITION BY toYYYYMM({ts}) ORDER BY ({ts})"
        return "MergeTree ORDER BY tuple()"

    def add_column(
        self,
        table: str,
        name: str,
        data_type: DataType,
        namespace: str | None = None,
        sql_type: str | None = None,
        on_cluster: str | None = None,
    ) -> str:
        column = f"{self.quote(name)} {sql_type}" if sql_type else self.column(name, data_type)
        cluster = f" ON CLUSTER {self.quote(on_cluster)}" if on_cluster else ""
        return f"ALTER TABLE {self.name_of(table, namespace)}{cluster} ADD COLUMN {column}"

    def add_primary_key(
        self, table: str, primary_key: Sequence[str], namespace: str | None = None
    ) -> str | None:
        """``ALTER TABLE ... ADD PRIMARY KEY``, or None where a key cannot be added to an
        existing table (ClickHouse: the sorting key is fixed at creation)."""
        if not self.primary_key:
            return None
        keys = ", ".join(self.quote(c) for c in primary_key)
        return f"ALTER TABLE {self.name_of(table, namespace)} ADD {self.primary_key.format(keys)}"


_BACKSLASHED = {
    ord("\\"): "\\\\",
    ord("`"): "\\`",
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    ord("\t"): "\\t",
    ord("\0"): "\\0",
}
"""ClickHouse's and GoogleSQL's (BigQuery's) escapes in a quoted identifier."""


def _types(
    string: str, double: str, integer: str, huge: str, boolean: str, ts: str
) -> Mapping[DataType, str]:
    return MappingProxyType(
        {
            DataType.STRING: string,
            DataType.FLOAT64: double,
            DataType.INT64: integer,
            DataType.INT128: huge,
            DataType.BOOL: boolean,
            DataType.TIMESTAMP: ts,
        }
    )


POSTGRES = Dialect(
    "postgres", _types("text", "numeric(38,18)", "bigint", "numeric(38,0)", "boolean", "timestamp")
)
REDSHIFT = Dialect(
    "redshift",
    _types(
        "character varying(65535)",
        "numeric(38,18)",
        "bigint",
        "numeric(38,0)",
        "boolean",
        "timestamp",
    ),
)
BIGQUERY = Dialect(
    "bigquery",
    _types("string", "float", "integer", "bignumeric", "boolean", "timestamp"),
    quote_char="`",
    primary_key="PRIMARY KEY ({}) NOT ENFORCED",  # BigQuery keys are informational
    backslash_escapes=True,  # GoogleSQL escapes quotes with a backslash; doubling is not one
)
CLICKHOUSE = Dialect(
    "clickhouse",
    _types("String", "Float64", "Int64", "Decimal(38, 0)", "UInt8", "DateTime64(6, 'UTC')"),
    quote_char="`",
    primary_key="",
    nullable="Nullable({})",
    backslash_escapes=True,
)
SNOWFLAKE = Dialect(
    "snowflake",
    _types("text", "numeric(38,18)", "bigint", "number(38,0)", "boolean", "timestamp_ntz"),
)
DUCKDB = Dialect(
    "duckdb", _types("VARCHAR", "DOUBLE", "BIGINT", "DECIMAL(38,0)", "BOOLEAN", "TIMESTAMP")
)

DIALECTS: Mapping[str, Dialect] = MappingProxyType(
    {d.name: d for d in (POSTGRES, REDSHIFT, BIGQUERY, CLICKHOUSE, SNOWFLAKE, DUCKDB)}
)
