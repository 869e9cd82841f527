"""Data contracts: tracking plans and where they are checked (docs/contracts.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import field_validator, model_validator

from eventpipe.config.base import Section


class ContractsConfig(Section):
    """Tracking plans: a JSON Schema per event type (eventpipe.contracts.plans)."""

    plans: tuple[Path, ...] = ()
    """Plan files (``.json``, ``.yaml``, ``.yml``) or directories of them, read when the
    config is: a plan that cannot be used stops eventpipe with its file and the reason."""
    collector: Literal["off", "flag", "reject"] = "off"
    """Where the collector checks each event against its plan: ``off``; ``flag``
    (accepted, marked with ``eventn_ctx.contract_violations``); ``reject`` (refused
    alone with its violations, in the answer and in failed/). A checked event records
    its plan's id in ``eventn_ctx.contract``."""
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
