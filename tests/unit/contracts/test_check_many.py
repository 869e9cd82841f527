"""Many events checked at once (``Contracts.check_many``, the collector's and the job's
way): the validator is asked whether a run of a plan's events all meet it, so it must
never say yes where one of them does not, whatever the plan refers to; the verdicts are
then those of one event at a time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from eventpipe.contracts.check import RUN, Contracts
from eventpipe.contracts.plans import compiled_many, read_plans

DRAFT = "https://json-schema.org/draft/2020-12/schema"
# Plans that refer to their own parts in each of the ways a plan may: by pointer without
# an $id, under an absolute $id, under a relative one, by anchor, recursively, through a
# dynamic reference, and in an older draft whose $ref ignores its siblings.
PLANS: list[dict[str, Any]] = [
    {"$schema": DRAFT, "x-eventpipe": {"event_type": "by_pointer"},
     "$defs": {"money": {"type": "number", "minimum": 0}},
     "type": "object", "required": ["total"], "properties": {"total": {"$ref": "#/$defs/money"}}},
    {"$schema": DRAFT, "$id": "https://plans.example.com/absolute/3",
     "x-eventpipe": {"event_type": "absolute", "version": 3},
     "$defs": {"code": {"type": "string", "pattern": "^[A-Z]{3}$"}},
     "type": "object", "properties": {"currency": {"$ref": "#/$defs/code"},
                                      "again": {"$ref": "https://plans.example.com/absolute/3#/$defs/code"}}},
    {"$schema": DRAFT, "$id": "relative/1", "x-eventpipe": {"event_type": "relative"},
     "$defs": {"id": {"type": "integer", "minimum": 1}},
     "properties": {"user": {"$ref": "#/$defs/id"}}},
    {"$schema": DRAFT, "x-eventpipe": {"event_type": "by_anchor"},
     "$defs": {"url": {"$anchor": "url", "type": "string", "format": "uri"}},
     "properties": {"page": {"$ref": "#url"}}},
    {"$schema": DRAFT, "x-eventpipe": {"event_type": "tree"},
     "$defs": {"node": {"type": "object", "required": ["name"], "properties": {
         "name": {"type": "string"},
         "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
     "properties": {"root": {"$ref": "#/$defs/node"}}},
    {"$schema": DRAFT, "x-eventpipe": {"event_type": "dynamic"}, "$dynamicAnchor": "meta",
     "properties": {"label": {"$dynamicRef": "#meta"}, "size": {"type": "integer"}},
     "required": ["size"]},
    {"$schema": "http://json-schema.org/draft-07/schema#", "x-eventpipe": {"event_type": "draft7"},
     "definitions": {"n": {"type": "integer"}},
     "properties": {"count": {"$ref": "#/definitions/n", "type": "string"}}},
]  # fmt: skip
MEET = {
    "by_pointer": {"total": 12.5},
    "absolute": {"currency": "EUR", "again": "USD"},
    "relative": {"user": 3},
    "by_anchor": {"page": "https://shop.example.com/p/1"},
    "tree": {"root": {"name": "a", "children": [{"name": "b", "children": [{"name": "c"}]}]}},
    "dynamic": {"size": 1, "label": {"size": 2, "label": {"size": 3}}},
    "draft7": {"count": 3},
}
BREAK = {
    "by_pointer": {"total": -1},
    "absolute": {"currency": "EUR", "again": "usd"},
    "relative": {"user": 0},
    "by_anchor": {"page": "not a uri"},
    "tree": {"root": {"name": "a", "children": [{"children": []}]}},
    "dynamic": {"size": 1, "label": {"size": 2, "label": {"label": 3}}},
    "draft7": {"count": "3"},
}


@pytest.fixture(scope="module")
def contracts(tmp_path_factory: pytest.TempPathFactory) -> Contracts:
    directory = tmp_path_factory.mktemp("plans")
    for n, plan in enumerate(PLANS):
        (directory / f"{n}.json").write_bytes(orjson.dumps(plan))
    return Contracts(read_plans([directory]))


def _event(event_type: str, values: dict[str, Any]) -> dict[str, Any]:
    return {"event_type": event_type, "api_key": "web", **values}


@pytest.mark.parametrize("plan", PLANS, ids=[p["x-eventpipe"]["event_type"] for p in PLANS])
def test_the_validator_of_many_says_all_meet_only_when_each_does(plan: dict[str, Any]) -> None:
    event_type = plan["x-eventpipe"]["event_type"]
    many = compiled_many(Path(f"{event_type}.json"), plan)
    assert many is not None, "the plan's events would be checked one by one"
    good, bad = _event(event_type, MEET[event_type]), _event(event_type, BREAK[event_type])
    assert many.is_valid([good, good, good])
    assert not many.is_valid([bad])
    assert not many.is_valid([good, bad, good])


def test_many_events_get_the_verdicts_each_gets_alone(contracts: Contracts) -> None:
    events: list[dict[str, Any]] = []
    for n in range(3 * RUN):  # runs that all meet their plans, and runs with one that breaks
        for event_type in MEET:
            values = BREAK[event_type] if n in (5, RUN + 7) else MEET[event_type]
            events.append(_event(event_type, values))
    events += [_event("no_plan", {"x": 1}), {"event_type": ["not", "text"]}, {"no": "type"}]
    alone = [contracts.check(event) for event in events]
    assert contracts.check_many(events) == alone
    broken = [n for n, verdict in enumerate(alone) if verdict is not None and not verdict.ok]
    assert len(broken) == 2 * len(BREAK)
    assert alone[-3:] == [None, None, None]


def test_a_version_asked_for_and_a_value_json_has_not_are_told_as_alone(tmp_path: Path) -> None:
    directory = tmp_path / "plans"
    directory.mkdir()
    for version in (1, 2):
        plan = {"$schema": DRAFT, "x-eventpipe": {"event_type": "checkout", "version": version},
                "properties": {"total": {"type": "number", "maximum": 10 * version}}}  # fmt: skip
        (directory / f"{version}.json").write_bytes(orjson.dumps(plan))
    contracts = Contracts(read_plans([directory]), version_field="plan_version")
    events = [
        {"event_type": "checkout", "total": 15},
        {"event_type": "checkout", "total": 15, "plan_version": 1},
        {"event_type": "checkout", "total": 5, "plan_version": 1},
        {"event_type": "checkout", "total": 5, "plan_version": 7},
        {"event_type": "checkout", "total": {1, 2}},
    ]
    verdicts = contracts.check_many(events)
    assert verdicts == [contracts.check(event) for event in events]
    assert [v.ok for v in verdicts if v is not None] == [True, False, True, False, False]
    rules = [v.violations[0].rule if v is not None and v.violations else None for v in verdicts]
    assert rules == [None, "maximum", None, "version", "unchecked"]


def test_a_plan_broken_in_every_run_is_asked_about_in_runs_less_and_less(
    tmp_path: Path,
) -> None:
    """Where a plan's runs keep failing, its events are checked one by one for the next
    1, 2, 4... calls (each failed run was a check for nothing); a run that all meet it
    ends that. The verdicts are the same either way."""
    directory = tmp_path / "plans"
    directory.mkdir()
    (directory / "plan.json").write_bytes(orjson.dumps(PLANS[0]))
    contracts = Contracts(read_plans([directory]))
    chosen = contracts._for_any["by_pointer"][0]
    asked: list[int] = []
    real = chosen.many

    class Counting:
        def is_valid(self, events: list[Any]) -> bool:
            asked.append(len(events))
            return bool(real.is_valid(events))

    object.__setattr__(chosen, "many", Counting())  # the frozen plan's validator, counted
    good, bad = _event("by_pointer", MEET["by_pointer"]), _event("by_pointer", BREAK["by_pointer"])
    mixed = [good, bad, good] * 10
    for _ in range(10):
        assert contracts.check_many(mixed) == [contracts.check(e) for e in mixed]
    assert len(asked) == 3  # calls 1, 3 and 6; 7 to 10 wait
    assert contracts.check_many([good] * 40) == [contracts.check(good)] * 40  # call 11
    assert asked[3:] == [32, 8]  # in runs again, and it met the plan
    contracts.check_many([good] * 5)
    assert asked[5:] == [5]  # so the next call asks in runs at once
