"""Counting the events that broke each (plan, rule) in the pass that stages a
destination's rows (steps.contracts.RuleTally), on a real Spark session: the same counts
as the pass of their own (broken_rules), and a tally that gives up where it could not
be exact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
from pyspark.sql import functions as F

from eventpipe.contracts.check import Contracts
from eventpipe.contracts.plans import read_plans
from eventpipe.processing.batch.shape import stage_flat
from eventpipe.processing.steps.contracts import (
    KEYWORDS,
    OTHER,
    TALLY_METRIC,
    TRACKED,
    VERDICT_TYPE,
    RuleTally,
    broken_rules,
    verdicts,
)
from eventpipe.reserved import ERROR, TABLE, TALLIED

DRAFT = "https://json-schema.org/draft/2020-12/schema"
CHECKOUT: dict[str, Any] = {
    "$schema": DRAFT, "x-eventpipe": {"event_type": "checkout"},
    "type": "object", "required": ["total", "currency"],
    "properties": {"total": {"type": "number", "minimum": 0},
                   "currency": {"enum": ["EUR", "USD"]},
                   "coupon": {"type": "string", "pattern": "^[A-Z]+$"}},
}  # fmt: skip
SIGNUP: dict[str, Any] = {
    "$schema": DRAFT, "x-eventpipe": {"event_type": "signup"},
    "type": "object", "required": ["email"],
    "properties": {"email": {"type": "string", "format": "email", "maxLength": 40},
                   "password": False},
}  # fmt: skip


def _tallied(spark: Any, tmp_path: Path, events: list[dict[str, Any]], *plans: Any) -> tuple:
    """What the tally of ``plans`` counts over the verdicts of ``events`` as their rows
    are staged (shape.stage_flat), beside what the pass of their own counts."""
    directory = tmp_path / "plans"
    directory.mkdir()
    for n, plan in enumerate(plans):
        (directory / f"{n}.json").write_bytes(orjson.dumps(plan))
    read = read_plans([directory])
    lines = pa.array([orjson.dumps(e) for e in events], pa.binary())
    made = verdicts(lines, Contracts(read)).to_pylist()
    frame = spark.createDataFrame([(v,) for v in made], f"verdict {VERDICT_TYPE}")
    tally = RuleTally.of(read, None)
    assert tally is not None
    flat = frame.select(
        F.lit("events").alias(TABLE), F.lit(None).cast("string").alias(ERROR),
        F.lit(1).alias("n"), tally.item(F.col("verdict")).alias(TALLIED),
    )  # fmt: skip
    staged, counts = stage_flat(flat, tmp_path / "dst=w")
    assert TALLIED not in staged.columns  # counted, never staged
    return tally.counted(counts), broken_rules(frame)


def test_the_tally_counts_what_the_pass_of_its_own_counts(spark: Any, tmp_path: Path) -> None:
    events = [
        {"event_type": "checkout", "total": 10, "currency": "EUR"},  # met its plan
        {"event_type": "checkout", "total": -1, "currency": "EUR"},  # minimum
        {"event_type": "checkout", "total": -1, "currency": "YEN"},  # minimum, enum
        {"event_type": "checkout", "total": "x", "currency": "YEN", "coupon": 5},  # type x2
        {"event_type": "checkout", "currency": "EUR", "coupon": "abc"},  # required, pattern
        {"event_type": "signup", "email": 7},  # type
        {"event_type": "signup", "email": "not an address " * 3},  # format, maxLength
        {"event_type": "signup"},  # required
        {"event_type": "page_view"},  # no plan
    ] * 3  # fmt: skip
    tallied, counted = _tallied(spark, tmp_path, events, CHECKOUT, SIGNUP)
    assert tallied == counted
    assert tallied[("checkout/1", "type")] == 3  # each rule once an event
    assert tallied[("checkout/1", "minimum")] == 6
    assert tallied[("signup/1", "required")] == 3
    assert sum(tallied.values()) == 3 * 11


def test_a_rule_that_is_not_a_keyword_makes_the_tally_give_up(spark: Any, tmp_path: Path) -> None:
    # A property whose schema is ``false``: the rule is the property's name.
    events = [{"event_type": "signup", "email": "a@b.example", "password": "x"},
              {"event_type": "signup"}]  # fmt: skip
    tallied, counted = _tallied(spark, tmp_path, events, SIGNUP)
    assert tallied is None
    assert counted == {("signup/1", "password"): 1, ("signup/1", "required"): 1}


def test_a_verdict_of_a_plan_the_tally_does_not_know_makes_it_give_up(
    spark: Any, tmp_path: Path
) -> None:
    directory = tmp_path / "plans"
    directory.mkdir()
    (directory / "signup.json").write_bytes(orjson.dumps(SIGNUP))
    tally = RuleTally.of(read_plans([directory]), None)
    assert tally is not None
    frame = spark.createDataFrame([(("checkout/1", "[]", ["type"], ["/total"]),)],
                                  f"verdict {VERDICT_TYPE}")  # fmt: skip
    [row] = frame.select(tally.item(F.col("verdict")).alias("item")).collect()
    assert row["item"] == OTHER
    assert tally.counted({TALLY_METRIC: {OTHER: 1, "0\x00type": 3}}) is None
    assert tally.counted({"skipped": 0}) is None  # counts written before tallies


def test_plans_that_could_break_too_many_sets_of_rules_get_no_tally(tmp_path: Path) -> None:
    keywords = sorted(k for k in KEYWORDS if not k.startswith("$"))
    assert 2 ** len(keywords) >= TRACKED
    plan = {**SIGNUP, "properties": {k: {} for k in keywords}}  # names, not rules: counted
    directory = tmp_path / "plans"
    directory.mkdir()
    (directory / "wide.json").write_bytes(orjson.dumps(plan))
    assert RuleTally.of(read_plans([directory]), None) is None
    (directory / "wide.json").write_bytes(orjson.dumps(SIGNUP))
    assert RuleTally.of(read_plans([directory]), None) is not None
