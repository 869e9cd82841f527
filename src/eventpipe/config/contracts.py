"""Data contracts: tracking plans and where they are checked (docs/contracts.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import Field, field_validator, model_validator

from eventpipe.config.base import Section


class ContractsConfig(Section):
    """Tracking plans: a JSON Schema per event type (eventpipe.contracts.plans)."""

    plans: tuple[Path, ...] = ()
    """Plan files (``.json``, ``.yaml``, ``.yml``) or directories of them, read when the
    config is: a plan that cannot be used stops eventpipe with its file and the reason."""
    collector: Literal["off", "flag", "reject"] = "off"
    """Where the collector checks each event against its plan: ``off``; ``flag``
    (accepted, its violations in its line's mark); ``reject`` (refused alone with its
    violations, in the answer and in failed/). The line of a checked event ends with
    its verdict and the plans' digest (``_eventpipe_checked``), which the job takes
    instead of checking the event again (docs/contracts.md)."""
    version_field: str | None = None
    """A top-level field of the event that names the version of its plan to check it
    against. Absent (or absent from the event): the newest version for it."""

    @field_validator("plans", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return (value,) if isinstance(value, str | Path) else value

    @model_validator(mode="after")
    def _plans_usable(self) -> ContractsConfig:
        from eventpipe.contracts.plans import PlanError, read_plans

        if self.collector != "off" and not self.plans:
            raise ValueError(f"collector: {self.collector} needs plans to check against")
        try:
            read_plans(self.plans)
        except PlanError as exc:
            raise ValueError(f"tracking plan {exc}") from None
        return self


Evolution = Literal["evolve", "freeze", "discard_row", "discard_value"]
"""What a load does with data its table cannot take as it is (dlt's schema contract
modes): ``evolve``, the table changes; ``freeze``, the event goes to failed/ with the
reason; ``discard_row``, the event is dropped and counted; ``discard_value``, the value
is dropped and counted, the rest of the event loads."""


class TableContract(Section):
    """What may change in a destination's tables as events arrive (docs/contracts.md).
    Also given as one word, which sets the three (``discard_value``: tables
    ``discard_row``)."""

    tables: Literal["evolve", "freeze", "discard_row"] = "evolve"
    """An event for a table the destination does not have: ``evolve`` creates it."""
    columns: Evolution = "evolve"
    """A field an existing table has no column for: ``evolve`` adds the column."""
    data_type: Evolution = "freeze"
    """A value its column's type cannot take exactly (``"abc"`` for a BIGINT column):
    ``freeze`` (the default: the column keeps its type, the event goes to failed/ naming
    the column); ``evolve`` keeps it in a column of its own type beside it,
    ``<column>__v_<type>``."""

    @model_validator(mode="before")
    @classmethod
    def _one_word(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        modes = get_args(Evolution)
        if value not in modes:
            raise ValueError(f"{value!r}: expected one of {', '.join(modes)} (or a mapping "
                             "of tables, columns and data_type)")  # fmt: skip
        table = "discard_row" if value == "discard_value" else value
        return {"tables": table, "columns": value, "data_type": value}


class SchemaContract(TableContract):
    """A destination's contract (``schema_contract``), with ``per_table`` exceptions."""

    per_table: dict[str, TableContract] = Field(default_factory=dict)
    """Contracts of tables by their name in the destination (after sanitising), in place
    of the destination's own."""

    def for_table(self, table: str) -> TableContract:
        if (own := self.per_table.get(table)) is not None:
            return own
        return TableContract(tables=self.tables, columns=self.columns, data_type=self.data_type)
