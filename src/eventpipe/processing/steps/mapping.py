"""Mapping (seed 1's MappingStep): configured field rules, applied to the leaves of a batch
before they are named and flattened.

Rules run in their configured order, each on the result of the ones before:

* ``move``: the value or whole subtree at ``src`` goes to ``dst`` (an object's leaves keep
  their keys below ``dst``). ``dst`` may be a pointer or a plain column name.
* ``remove``: the value or subtree at ``src`` is dropped.
* ``cast``: the column at ``src`` gets ``type`` (a lattice type or a common SQL alias, see
  :func:`eventpipe.schema.types.parse_type`), which wins over the type inferred from the values.
* ``constant``: ``dst`` is set to ``value`` in every event (optionally with ``type``).

With ``keep_unmapped: false`` only what a rule moved, cast or set survives, plus
``_timestamp`` (eventpipe needs it for upserts and table templates).

The implicit casts of seed 1 (``_timestamp``, and ``eventn_ctx/utc_time`` sent by the
browser SDK, to TIMESTAMP) apply unless a configured rule names the same column.

A rule whose ``src`` is absent from a batch does nothing for that batch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import orjson
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

from eventpipe.errors import ConfigError
from eventpipe.processing.steps.fields import quoted
from eventpipe.schema.naming import column_name
from eventpipe.schema.pointers import parse_pointer
from eventpipe.schema.types import DataType, parse_type

if TYPE_CHECKING:
    from eventpipe.config import MappingConfig

IMPLICIT_CASTS = {"_timestamp": DataType.TIMESTAMP, "eventn_ctx_utc_time": DataType.TIMESTAMP}
ALWAYS_KEPT = ("_timestamp",)


@dataclass(frozen=True)
class Leaf:
    """One value position of a batch: its path (original keys), Spark type, and where its
    value comes from: the frame's field at ``source``, or ``value`` (a constant)."""

    path: tuple[str, ...]
    spark_type: T.DataType
    value: Column | None = None
    """Its value where it is not read from the frame (a rule's constant)."""
    mapped: bool = False
    """Touched by a rule: survives ``keep_unmapped: false``."""
    source: tuple[str, ...] | None = None
    """The path it was read from, when it was (a ``move`` changes ``path`` only)."""

    @property
    def column(self) -> Column:
        """Its value as a column: an array read from the frame as its JSON text. Made
        when asked for (a call into the JVM each): a wide batch's flattening asks for the
        columns of colliding leaves only, and writes the others as :attr:`sql`."""
        if self.value is not None:
            return self.value
        assert self.sql is not None
        return F.expr(self.sql)

    @property
    def sql(self) -> str | None:
        """:attr:`column` as SQL text, for a leaf read from the frame (None otherwise)."""
        if self.value is not None or self.source is None:
            return None
        path = ".".join(quoted(key) for key in self.source)
        return f"to_json({path})" if isinstance(self.spark_type, T.ArrayType) else path


@dataclass(frozen=True)
class Rule:
    action: str
    src: tuple[str, ...] = ()
    dst: tuple[str, ...] = ()
    type: DataType | None = None
    value: object = None


@dataclass(frozen=True)
class Mapping:
    rules: tuple[Rule, ...] = ()
    keep_unmapped: bool = True

    @classmethod
    def from_config(cls, config: MappingConfig) -> Mapping:
        """Rules from a destination's ``mappings`` (validated there already)."""
        rules = []
        for i, spec in enumerate(config.fields):
            where = f"mappings.fields[{i}]"
            rules.append(
                Rule(
                    action=spec.action,
                    src=parse_pointer(spec.src, where=f"{where}.src") if spec.src else (),
                    dst=parse_pointer(spec.dst, where=f"{where}.dst") if spec.dst else (),
                    type=parse_type(spec.type, where=f"{where}.type") if spec.type else None,
                    value=spec.value,
                )
            )
        return cls(tuple(rules), config.keep_unmapped)

    def apply(self, leaves: list[Leaf]) -> tuple[list[Leaf], dict[str, DataType]]:
        """The leaves after every rule, and the explicit type of each cast column."""
        casts: dict[str, DataType] = {}
        for rule in self.rules:
            leaves, cast = _apply(rule, leaves)
            if cast is not None:
                casts[cast[0]] = cast[1]
        if not self.keep_unmapped:
            leaves = [leaf for leaf in leaves if leaf.mapped or leaf.path in _KEPT_PATHS]
        names = {column_name(leaf.path) for leaf in leaves}
        explicit = {c: t for c, t in IMPLICIT_CASTS.items() if c in names}
        explicit.update(casts)
        return leaves, explicit


_KEPT_PATHS = {(name,) for name in ALWAYS_KEPT}


def _under(path: tuple[str, ...], prefix: tuple[str, ...]) -> bool:
    return path[: len(prefix)] == prefix


def _apply(rule: Rule, leaves: list[Leaf]) -> tuple[list[Leaf], tuple[str, DataType] | None]:
    if rule.action == "remove":
        return [leaf for leaf in leaves if not _under(leaf.path, rule.src)], None
    if rule.action == "move":
        moved = [
            replace(leaf, path=rule.dst + leaf.path[len(rule.src) :], mapped=True)
            if _under(leaf.path, rule.src)
            else leaf
            for leaf in leaves
        ]
        if rule.type is not None and any(_under(leaf.path, rule.src) for leaf in leaves):
            return moved, (column_name(rule.dst), rule.type)
        return moved, None
    if rule.action == "cast":
        assert rule.type is not None  # checked by the config model
        marked = [replace(leaf, mapped=True) if leaf.path == rule.src else leaf for leaf in leaves]
        return marked, (column_name(rule.src), rule.type)
    if rule.action == "constant":
        kept = [leaf for leaf in leaves if not _under(leaf.path, rule.dst)]
        column, spark_type = _literal(rule.value)
        kept.append(Leaf(rule.dst, spark_type, column, mapped=True))
        cast = (column_name(rule.dst), rule.type) if rule.type is not None else None
        return kept, cast
    raise ConfigError(f"unknown mapping action {rule.action!r}")


def _literal(value: object) -> tuple[Column, T.DataType]:
    """A constant as a column: scalars as themselves, objects and arrays as JSON text."""
    if isinstance(value, bool):
        return F.lit(value), T.BooleanType()
    if isinstance(value, int):
        return F.lit(value).cast("long"), T.LongType()
    if isinstance(value, float):
        return F.lit(value), T.DoubleType()
    if value is None:
        return F.lit(None).cast("string"), T.StringType()
    if isinstance(value, str):
        return F.lit(value), T.StringType()
    return F.lit(orjson.dumps(value).decode()), T.StringType()
