"""Schema contracts in config (dlt's vocabulary): one word or a mapping, per table
exceptions, and the quarantine's side tables, which always take what comes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from eventpipe.config.contracts import TableContract
from eventpipe.config.destinations import DuckDBConfig
from eventpipe.processing.batch.fit import contract_of, fit_columns, variant_column
from eventpipe.schema.diff import Table
from eventpipe.schema.types import DataType


def _duckdb(**settings: object) -> DuckDBConfig:
    return DuckDBConfig(type="duckdb", path="w.duckdb", **settings)


def test_by_default_tables_and_columns_evolve_and_types_freeze() -> None:
    assert _duckdb().schema_contract.for_table("events") == TableContract(
        tables="evolve", columns="evolve", data_type="freeze"
    )


@pytest.mark.parametrize(
    ("word", "tables", "rest"),
    [("evolve", "evolve", "evolve"), ("freeze", "freeze", "freeze"),
     ("discard_row", "discard_row", "discard_row"),
     ("discard_value", "discard_row", "discard_value")],
)  # fmt: skip
def test_one_word_sets_all_three(word: str, tables: str, rest: str) -> None:
    contract = _duckdb(schema_contract=word).schema_contract.for_table("t")
    assert (contract.tables, contract.columns, contract.data_type) == (tables, rest, rest)


def test_a_table_of_its_own_takes_its_own_contract() -> None:
    dest = _duckdb(schema_contract={"columns": "freeze", "per_table": {"raw": "evolve"}})
    assert dest.schema_contract.for_table("raw").columns == "evolve"
    assert dest.schema_contract.for_table("orders").columns == "freeze"


def test_the_quarantine_table_evolves_whatever_the_destination_freezes() -> None:
    dest = _duckdb(schema_contract="freeze", on_violation="quarantine")
    assert contract_of(dest, "orders_quarantine").tables == "evolve"
    assert contract_of(dest, "orders").tables == "freeze"
    # Without a quarantine, a table of that name is an ordinary one.
    assert contract_of(_duckdb(schema_contract="freeze"), "orders_quarantine").tables == "freeze"


@pytest.mark.parametrize(
    ("contract", "message"),
    [("frozen", "'frozen': expected one of evolve, freeze, discard_row, discard_value"),
     ({"tables": "discard_value"}, "Input should be 'evolve', 'freeze' or 'discard_row'"),
     ({"columns": "freeze", "rows": "freeze"}, "Extra inputs are not permitted")],
)  # fmt: skip
def test_a_contract_that_cannot_be_is_refused_with_its_reason(
    contract: object, message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        _duckdb(schema_contract=contract)


def test_new_columns_are_refused_only_where_the_table_exists_and_columns_do_not_evolve() -> None:
    frozen = TableContract(columns="freeze")
    batch = {"n": DataType.INT64, "coupon": DataType.STRING}
    table = Table("orders", {"n": DataType.INT64})
    fit = fit_columns(frozen, "orders", table, batch)
    assert (fit.wanted, fit.refused) == ({"n": DataType.INT64}, {"coupon": DataType.STRING})
    # A new table takes every column of its batch; an evolving one too.
    assert fit_columns(frozen, "orders", None, batch).refused == {}
    assert fit_columns(TableContract(), "orders", table, batch).refused == {}


def test_a_value_of_another_type_lands_in_a_column_named_for_its_type() -> None:
    assert variant_column("total", DataType.STRING) == "total__v_string"
    long = variant_column("x" * 80, DataType.FLOAT64)
    assert len(long) <= 64
    assert long.startswith("x")
