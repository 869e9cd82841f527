"""Tracking plans in the job: every event's line of the log checked against its plan on
Arrow batches (jsonschema-rs, eventpipe.contracts), in the pass that reads the run's
events, so that each destination reads the verdict (VERDICT: the plan, the violations as
JSON text, the rules broken and where; null when no plan is for the event). Where the
collector checked an event under the same plans, the verdict is read from its line's
mark instead (:class:`PlanCheck`), in Spark alone.

The line is checked as it was stored, not as Spark read it: a batch where a field came
as a number and as text reads both as text, and a check of what Spark read would call
the number's event wrong.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import pyarrow as pa

from eventpipe.config import Config
from eventpipe.contracts.check import Contracts, Verdict, plans_digest, unmarked
from eventpipe.contracts.plans import Plan, subschemas
from eventpipe.errors import ConfigError
from eventpipe.reserved import CHECKED

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

VERDICT_TYPE = "struct<plan:string,violations:string,rules:array<string>,pointers:array<string>>"
"""Each line's verdict: its plan; its violations (JSON text of the list: :func:`summary`
makes the one line of them); the rules it broke and where (JSON pointers), each once;
null where no plan is for the event. Violations, rules and pointers are null where it
met its plan."""

_checkers: dict[str, Contracts] = {}
_checkers_lock = threading.Lock()


def verdict_function(
    plans: Sequence[Plan], version_field: str | None
) -> Callable[[Column], Column]:
    """The function from a column of log lines to their verdicts. The plans travel with
    the job (their schemas, not their files: an executor may not see the driver's disk);
    each Python worker compiles them once. (pyarrow is imported at the module's top:
    Spark reads the function's annotations to know it takes Arrow arrays.)"""
    from pyspark.sql.functions import arrow_udf  # type: ignore[attr-defined]

    plans = tuple(plans)
    key = plans_digest(plans, version_field)

    def check_lines(lines: pa.Array) -> pa.Array:
        return verdicts(lines, _checker(key, plans, version_field))

    return arrow_udf(check_lines, VERDICT_TYPE)  # type: ignore[no-any-return]


def _checker(key: str, plans: Sequence[Plan], version_field: str | None) -> Contracts:
    with _checkers_lock:
        checker = _checkers.get(key)
        if checker is None:
            checker = _checkers[key] = Contracts(plans, version_field)
        return checker


CHECKED_AT_ONCE = 256
"""Lines parsed and checked together (Contracts.check_many): enough for the validator's
runs of a plan's events, few enough that an Arrow batch's events (10,000 by default) are
never all parsed at once: bounded memory, and fewer live objects for Python's collector
of cycles to walk."""


def verdicts(lines: pa.Array, contracts: Contracts) -> pa.Array:
    """Each line's verdict (a line that is not a JSON object, or null, has none)."""
    import orjson

    rows = lines.to_pylist()
    found: list[Verdict | None] = [None] * len(rows)
    loads = orjson.loads
    for first in range(0, len(rows), CHECKED_AT_ONCE):
        events: list[dict[str, Any]] = []
        places: list[int] = []
        for n, line in enumerate(rows[first : first + CHECKED_AT_ONCE], first):
            if line is None:
                continue
            try:
                event: Any = loads(line)
            except orjson.JSONDecodeError:
                continue
            if type(event) is dict:
                events.append(unmarked(event))
                places.append(n)
        for n, verdict in zip(places, contracts.check_many(events), strict=True):
            found[n] = verdict
    plans: list[str | None] = []
    listed: list[str | None] = []
    rules: list[tuple[str, ...] | None] = []
    pointers: list[tuple[str, ...] | None] = []
    for verdict in found:
        plans.append(None if verdict is None else verdict.plan)
        if verdict is None or verdict.ok:
            listed.append(None)
            rules.append(None)
            pointers.append(None)
            continue
        listed.append(orjson.dumps(verdict.listed()).decode())
        rules.append(verdict.rules)
        pointers.append(verdict.pointers)
    texts = pa.list_(pa.string())
    return pa.StructArray.from_arrays(
        [pa.array(plans, pa.string()), pa.array(listed, pa.string()),
         pa.array(rules, texts), pa.array(pointers, texts)],
        names=["plan", "violations", "rules", "pointers"],
    )  # fmt: skip


MARK_TYPE = (
    "struct<plans:string,plan:string,violations:string,rules:array<string>,pointers:array<string>>"
)
"""A line's mark as the job reads it (eventpipe.contracts.check.Contracts.mark): the
plans' digest, then the verdict as VERDICT_TYPE has it."""


def mark_type() -> StructType:
    from pyspark.sql.types import _parse_datatype_string

    return cast("StructType", _parse_datatype_string(MARK_TYPE))


class PlanCheck:
    """The config's tracking plans in a run: each event's verdict from its line
    (:meth:`of_lines`, in the Python workers), or from the mark the collector left on its
    line when it checked it under the same plans (:meth:`of_marks`, in Spark alone)."""

    def __init__(self, plans: Sequence[Plan], version_field: str | None) -> None:
        from pyspark.sql import functions as F

        from eventpipe.contracts.check import EVENT_TYPE

        self.digest = plans_digest(plans, version_field)
        self._verdict = verdict_function(plans, version_field)
        self._types = {p.event_type for p in plans}
        self._planned = F.col(EVENT_TYPE).cast("string").isin(sorted(self._types))

    def of_lines(self, line: Column) -> Column:
        """The verdicts of the lines of ``line`` (only the lines of events of a type some
        plan is for go to the Python workers; the rest have none)."""
        from pyspark.sql import functions as F

        return self._verdict(F.when(self._planned, line))

    def trusted(self, mark: Column) -> Column:
        """Whether the mark of ``mark`` was made under these plans."""
        from pyspark.sql import functions as F

        return F.coalesce(mark.getField("plans") == F.lit(self.digest), F.lit(False))

    def of_marks(self, mark: Column) -> Column:
        """The verdicts the marks of ``mark`` carry, where they were made under these
        plans (null elsewhere: :meth:`unchecked` says which of those a plan is for)."""
        from pyspark.sql import functions as F

        verdict = F.struct(*(mark.getField(name).alias(name)
                             for name in ("plan", "violations", "rules", "pointers")))  # fmt: skip
        return F.when(self.trusted(mark), verdict)

    def marked(self, paths: Sequence[str], sample: int = 64 * 1024) -> bool:
        """Whether the lines of the files ``paths`` look checked under these plans: in
        the first ``sample`` bytes of each, every line of an event of a type some plan
        is for carries a mark made under them. A guess, which spares a run with events
        that were not checked at the collector (an import, a bulk upload, events from
        before the plans) a pass over its events made in vain: whatever it guesses,
        every event's mark is looked at (:meth:`unchecked`)."""
        import orjson

        from eventpipe.contracts.check import EVENT_TYPE

        for path in paths:
            try:
                with open(path, "rb") as file:
                    head = file.read(sample)
            except OSError:
                continue  # not on the driver's disk: the run looks at every mark
            for line in head.splitlines()[:-1] if len(head) == sample else head.splitlines():
                try:
                    event = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
                if type(event) is not dict:
                    continue
                event_type = event.get(EVENT_TYPE)
                if type(event_type) is not str or event_type not in self._types:
                    continue
                mark = event.get(CHECKED)
                if type(mark) is not dict or mark.get("plans") != self.digest:
                    return False
        return True

    def unchecked(self, mark: Column) -> Column:
        """Whether an event of a type some plan is for has no mark made under these
        plans (its verdict is then to be made from its line)."""
        return self._planned & ~self.trusted(mark)


def plan_check(config: Config, schema: StructType) -> PlanCheck | None:
    """The config's tracking plans (read now) for a batch of events with ``schema``;
    None without plans, or when no event of the batch can have one."""
    from eventpipe.contracts.check import EVENT_TYPE
    from eventpipe.contracts.plans import PlanError, read_plans

    if not config.contracts.plans or EVENT_TYPE not in schema.fieldNames():
        return None
    try:
        plans = read_plans(config.contracts.plans)
    except PlanError as exc:
        raise ConfigError(f"tracking plan {exc}") from None
    if not plans:
        return None
    return PlanCheck(plans, config.contracts.version_field)


def summary(verdict: Column) -> Column:
    """The one line of a verdict's violations (``contract <plan>: <violation>; ...``, as
    eventpipe.contracts.check.Verdict.summary makes it); null where it met its plan."""
    from pyspark.sql import functions as F

    listed = F.from_json(verdict.getField("violations"), "array<string>")
    return F.concat(F.lit("contract "), verdict.getField("plan"), F.lit(": "),
                    F.array_join(listed, "; "))  # fmt: skip


KEYWORDS = frozenset({
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum",
    "exclusiveMinimum", "maxLength", "minLength", "pattern", "format", "maxItems", "minItems",
    "uniqueItems", "contains", "maxContains", "minContains", "items", "prefixItems",
    "additionalItems", "unevaluatedItems", "maxProperties", "minProperties", "required",
    "dependentRequired", "dependentSchemas", "dependencies", "properties",
    "patternProperties", "additionalProperties", "unevaluatedProperties", "propertyNames",
    "not", "anyOf", "oneOf", "allOf", "if", "then", "else", "$ref", "$dynamicRef",
    "contentEncoding", "contentMediaType", "contentSchema",
})  # fmt: skip
"""The rules a tally tells apart: JSON Schema's keywords (a rule is the last step of the
failed keyword's path in the schema, eventpipe.contracts.check)."""
TRACKED = 100_000
"""The most (plan, rules broken) combinations a tally counts exactly."""


class RuleTally:
    """The events that broke each (plan, rule), counted in the pass that stages a
    destination's rows, among the metrics observed there (shape.stage_flat), instead of
    a pass of their own over the verdicts (3.3 s of a 20 s run of 1M events on this
    2-core machine, bench/contracts.py).

    Each event that broke its plan is one item (:meth:`item`, carried to the flat rows
    in TALLIED): its plan and the set of rules it broke, counted by Spark's
    ``approx_top_k`` (:func:`tallied`; a frequent-items sketch, exact while it sees fewer
    distinct items than it tracks). The items can only be so many: a plan's rules are
    keywords of its schema, at most 2 ** (keywords it has) sets of them, and a tally is
    made only where all plans together make fewer than :data:`TRACKED`. An event whose
    rules are not all its plan's keywords (a property's ``false`` schema, a plan read
    otherwise since the check) is the item :data:`OTHER`, which makes the tally give up
    (:meth:`counted` is None): the run counts in a pass of its own then, as it does where
    no tally is made."""

    def __init__(self, allowed: dict[str, tuple[str, ...]]) -> None:
        self._ids = sorted(allowed)
        self._allowed = allowed

    @classmethod
    def of(cls, plans: Sequence[Plan], version_field: str | None) -> RuleTally | None:
        """The tally of ``plans``; None where they could make too many sets of rules (or
        there are none)."""
        own = {"unchecked", "version"} if version_field else {"unchecked"}  # the check's
        allowed: dict[str, set[str]] = {}
        for plan in plans:
            keys = {k for _, node in subschemas(plan.schema, "") for k in node}
            allowed.setdefault(plan.id, set(own)).update(KEYWORDS & keys)
        if not allowed or sum(2 ** len(rules) for rules in allowed.values()) >= TRACKED:
            return None
        return cls({plan: tuple(sorted(rules)) for plan, rules in allowed.items()})

    def item(self, verdict: Column) -> Column:
        """The item of each verdict of ``verdict`` (VERDICT_TYPE): the plan's place among
        the tally's and the rules, NUL between; :data:`OTHER`; null where it broke none."""
        from pyspark.sql import functions as F

        from eventpipe.processing.steps import lambdas

        plan, rules = verdict.getField("plan"), verdict.getField("rules")
        index = F.create_map(*(F.lit(v) for i, p in enumerate(self._ids) for v in (p, i)))
        allowed = F.create_map(*(F.lit(v) for p in self._ids
                                 for v in (p, list(self._allowed[p]))))  # fmt: skip
        known = F.element_at(allowed, plan)
        other = F.coalesce(lambdas.exists(
            rules, lambda r: ~F.coalesce(F.array_contains(known, r), F.lit(False)), "rule"
        ), F.lit(True))  # fmt: skip
        counted = F.concat_ws(
            "\u0000", F.element_at(index, plan).cast("string"), F.array_join(rules, "\u0000")
        )
        broke = rules.isNotNull() & (F.size(rules) > 0)
        return F.when(broke, F.when(other, F.lit(OTHER)).otherwise(counted))

    def counted(self, counts: dict[str, Any]) -> dict[tuple[str, str], int] | None:
        """The count of each (plan, rule) from the counts of the staging pass; None where
        the tally gave up, or its items were not counted there (a run resumed from counts
        written without them, a transform that dropped TALLIED)."""
        sets = counts.get(TALLY_METRIC)
        if sets is None or OTHER in sets:
            return None
        broken: Counter[tuple[str, str]] = Counter()
        for item, count in sets.items():
            index, *rules = item.split("\u0000")
            for rule in rules:
                broken[(self._ids[int(index)], rule)] += int(count)
        return dict(broken)


OTHER = "-"
"""The item of an event whose rules a tally cannot count (never a counted item's text,
which starts with a digit)."""
TALLY_METRIC = "broken_sets"


def tallied(item: Column) -> Column:
    """The aggregate of the items of ``item`` (:meth:`RuleTally.item`): each with the
    number of events it is, as a map."""
    from pyspark.sql import functions as F

    from eventpipe.processing.steps import lambdas

    top = F.call_function("approx_top_k", item, F.lit(TRACKED), F.lit(TRACKED))
    kept = lambdas.keep(top, lambda e: e.getField("item").isNotNull(), "tallied")
    return F.map_from_entries(kept).alias(TALLY_METRIC)


def rule_tally(config: Config) -> RuleTally | None:
    """The tally of the config's tracking plans (read now); None where there is none:
    the run counts in a pass of its own (:func:`broken_rules`)."""
    from eventpipe.contracts.plans import PlanError, read_plans

    try:
        plans = read_plans(config.contracts.plans)
    except PlanError:
        return None  # the check itself said why
    return RuleTally.of(plans, config.contracts.version_field)


def broken_rules(verdicts: DataFrame) -> dict[tuple[str, str], int]:
    """How many events broke each (plan, rule), from a frame of ``verdicts`` (VERDICT_TYPE,
    in column ``verdict``): one pass over the verdicts alone."""
    from pyspark.sql import functions as F

    verdict = F.col("verdict")
    broken = verdicts.select(verdict.getField("plan").alias("plan"),
                             F.explode(verdict.getField("rules")).alias("rule"))  # fmt: skip
    counted = broken.groupBy("plan", "rule").count().collect()
    return {(row["plan"], row["rule"]): int(row["count"]) for row in counted}
