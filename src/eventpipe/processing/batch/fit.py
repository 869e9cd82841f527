"""A table's schema contract applied to one load (config/contracts.py, TableContract):
which new columns it may add, and per row what becomes of a value its table cannot take
(a new column it may not add, a value its column's type cannot take exactly): failed
(``freeze``), dropped with its event (``discard_row``), dropped alone
(``discard_value``), or kept in a column of its own (``evolve``).

Every event it holds back is counted, by table, part of the contract (``tables``,
``columns``, ``data_type``) and mode: RunReport.contracts, then the run history."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pyspark.sql import functions as F

from eventpipe.config import TableDestinationConfig
from eventpipe.config.contracts import TableContract
from eventpipe.processing.batch.run import ref
from eventpipe.processing.batch.shape import QUARANTINE_SUFFIX
from eventpipe.schema.casts import SPARK_TYPES, cast_to, conversion_problem
from eventpipe.schema.diff import Table
from eventpipe.schema.naming import finish_name
from eventpipe.schema.types import DataType, fits

if TYPE_CHECKING:
    from pyspark.sql import Column
    from pyspark.sql.types import DataType as SparkType


def contract_of(dest: TableDestinationConfig, table: str) -> TableContract:
    """The contract of ``table``: its own (``per_table``), else the destination's. A
    quarantine side table (``on_violation: quarantine``) is where what broke a plan goes:
    it is created and takes new columns whatever the destination's contract says."""
    contract = dest.schema_contract
    side = dest.on_violation == "quarantine" and table.endswith(QUARANTINE_SUFFIX)
    if side and table not in contract.per_table:
        return TableContract()
    return contract.for_table(table)


def refused_table(table: str, dest_id: str) -> str:
    """Why the events of a table the destination lacks fail (``tables: freeze``)."""
    return (f"table {table}: {dest_id} has no such table and its schema contract freezes "
            "its tables (schema_contract.tables: freeze)")  # fmt: skip


def variant_column(column: str, data_type: DataType) -> str:
    """Where ``data_type: evolve`` keeps the values of ``column`` its type cannot take:
    ``total`` -> ``total__v_string`` (dlt names its variant columns alike)."""
    return finish_name(f"{column}__v_{data_type.value.lower()}")


@dataclass
class Fit:
    """One load under its table's contract: the columns, and per row the conversions,
    why it fails, whether it is dropped, and what is counted."""

    table: str
    contract: TableContract
    wanted: dict[str, DataType]
    """The batch's columns the table may take (new ones only where columns evolve)."""
    refused: dict[str, DataType] = field(default_factory=dict)
    """New columns the contract does not let the table add."""

    @property
    def changes_rows(self) -> bool:
        """Whether rows are held back for new columns: the staged files cannot be loaded
        as they are."""
        return bool(self.refused)


def fit_columns(
    contract: TableContract, table: str, existing: Table | None, wanted: Mapping[str, DataType]
) -> Fit:
    """The batch's columns under ``contract``: a table that exists takes new columns only
    where its columns evolve (a new table takes all of its batch's)."""
    if existing is None or contract.columns == "evolve":
        return Fit(table, contract, dict(wanted))
    refused = {c: t for c, t in wanted.items() if c not in existing.columns}
    kept = {c: t for c, t in wanted.items() if c not in refused}
    return Fit(table, contract, kept, refused)


@dataclass
class RowRules:
    """Per row of one load: the values to load (by column), texts that fail the row,
    conditions that drop it, and counts to observe (name -> count_if condition)."""

    converted: dict[str, Column]
    targets: dict[str, DataType]
    spark_types: Mapping[str, SparkType]
    problems: list[Column] = field(default_factory=list)
    discards: list[Column] = field(default_factory=list)
    counted: dict[str, Column] = field(default_factory=dict)

    def count(self, entity: str, mode: str, condition: Column) -> None:
        name = f"{entity}:{mode}"
        previous = self.counted.get(name)
        self.counted[name] = condition if previous is None else previous | condition


def row_rules(
    fit: Fit,
    existing: Table | None,
    batch: Mapping[str, DataType],
    targets: Mapping[str, DataType],
    spark_types: Mapping[str, SparkType],
) -> RowRules:
    """The conversions of the kept columns to ``targets`` and what the contract makes of
    the values that do not fit (``batch``: the batch's own type of each column)."""
    rules = RowRules({}, dict(targets), spark_types)
    for name, target in targets.items():
        value = ref(name)
        converted = cast_to(value, target, spark_types[name])
        rules.converted[name] = converted
        if spark_types[name] != SPARK_TYPES[target]:
            problem = conversion_problem(value, name, target, converted)
            _value_that_does_not_fit(rules, fit, existing, batch[name], name, problem)
    for name in fit.refused:
        present = ref(name).isNotNull()
        mode = fit.contract.columns
        rules.count("columns", mode, present)
        if mode == "freeze":
            rules.problems.append(F.when(present, F.lit(
                f"column {name}: table {fit.table} has no such column and its schema "
                "contract freezes its columns (schema_contract.columns: freeze)")))  # fmt: skip
        elif mode == "discard_row":
            rules.discards.append(present)
    return rules


def _value_that_does_not_fit(
    rules: RowRules,
    fit: Fit,
    existing: Table | None,
    batch_type: DataType,
    name: str,
    problem: Column,
) -> None:
    """Where a value of column ``name`` does not convert exactly (``problem``, text where
    it does not): its event fails naming the column (schema/diff.py), unless the column
    exists and its contract says otherwise. (A new column is typed by its values: they
    convert.)"""
    value, target = ref(name), rules.targets[name]
    mode = fit.contract.data_type
    if existing is None or name not in existing.columns:
        rules.problems.append(problem)
        return
    rules.count("data_type", mode, problem.isNotNull())
    if mode == "discard_row":
        rules.discards.append(problem.isNotNull())
    elif mode == "evolve" and not fits(batch_type, target):
        # Beside the column, in one of the value's own type (or in the type that column
        # has already, where the value converts to it exactly).
        variant = variant_column(name, batch_type)
        kind = existing.columns.get(variant, batch_type)
        spark_type = rules.spark_types[name]
        kept = cast_to(value, kind, spark_type)
        rules.converted[variant] = F.when(problem.isNotNull(), kept)
        rules.targets[variant] = kind
        rules.problems.append(
            F.when(problem.isNotNull(), conversion_problem(value, variant, kind, kept))
        )
    elif mode != "discard_value":  # freeze (the conversion nulls it for discard_value)
        rules.problems.append(problem)
