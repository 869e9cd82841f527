"""Tracking plans read and checked before anything runs: hostile plans refused with the
file and the reason; events matched to their plan by type, key, source and version, and
each violation named by its JSON pointer and rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from eventpipe.config import parse_config
from eventpipe.contracts.check import MAX_VIOLATIONS, Contracts
from eventpipe.contracts.plans import MAX_PLAN_BYTES, PlanError, read_plans
from eventpipe.errors import ConfigError

DRAFT = "https://json-schema.org/draft/2020-12/schema"


def _plan(directory: Path, name: str, event_type: str, **schema: Any) -> Path:
    selector = {"event_type": event_type, **schema.pop("selector", {})}
    path = directory / name
    path.write_bytes(orjson.dumps({"$schema": DRAFT, "x-eventpipe": selector, **schema}))
    return path


PAGE = {"type": "object", "required": ["url"],
        "properties": {"url": {"type": "string", "format": "uri"},
                       "n": {"type": "integer", "minimum": 0}}}  # fmt: skip


@pytest.mark.parametrize(
    ("schema", "refusal"),
    [
        ({"$ref": "https://schemas.example.com/page.json"}, "outside this plan; plans are read"),
        ({"properties": {"a": {"$ref": "other.json#/x"}}}, "outside this plan"),
        ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"allOf": [{"$ref": "#/$defs/a"}]}},
          "$ref": "#/$defs/a"}, "refers back to itself through $ref"),
        ({"$ref": "#"}, "refers back to itself"),
        ({"$ref": "#/$defs/missing"}, "points to nothing in this plan"),
        ({"type": "nope"}, "not a valid JSON Schema"),
        ({"properties": {"a": {"pattern": "(unclosed"}}}, "not a valid JSON Schema"),
    ],
)  # fmt: skip
def test_a_hostile_or_broken_plan_is_refused_with_its_file_and_reason(
    tmp_path: Path, schema: dict[str, Any], refusal: str
) -> None:
    path = _plan(tmp_path, "bad.json", "page_view", **schema)
    with pytest.raises(PlanError, match=r"bad\.json") as refused:
        read_plans([path])
    assert refusal in str(refused.value)


def test_a_recursive_schema_that_looks_into_the_event_is_a_plan(tmp_path: Path) -> None:
    tree = {"$defs": {"node": {"type": "object", "properties": {
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
        "$ref": "#/$defs/node"}  # fmt: skip
    [plan] = read_plans([_plan(tmp_path, "tree.json", "tree", **tree)])
    contracts = Contracts([plan])
    deep = {"event_type": "tree", "children": [{"children": [{"children": 5}]}]}
    verdict = contracts.check(deep)
    assert verdict is not None
    where = [(v.pointer, v.rule) for v in verdict.violations]
    assert where == [("/children/0/children/0/children", "type")]


def test_a_plan_too_large_unparsable_or_saying_nothing_of_its_events_is_refused(
    tmp_path: Path,
) -> None:
    big = tmp_path / "big.json"
    big.write_bytes(b'{"x-eventpipe": {"event_type": "a"}, "description": "'
                    + b"x" * (10 * 1024 * 1024) + b'"}')  # fmt: skip
    with pytest.raises(PlanError, match=f"a tracking plan may have {MAX_PLAN_BYTES:,}"):
        read_plans([big])
    broken = tmp_path / "broken.json"
    broken.write_bytes(b'{"x-eventpipe": ')
    with pytest.raises(PlanError, match=r"broken\.json: not JSON"):
        read_plans([broken])
    not_json = tmp_path / "not_json.yaml"
    not_json.write_text("x-eventpipe: {event_type: a}\nenum: !!set {a, b}\n")
    with pytest.raises(PlanError, match=r"not_json\.yaml: not a JSON Schema"):
        read_plans([not_json])
    twice = tmp_path / "twice.yaml"
    twice.write_text("x-eventpipe: {event_type: a}\ntype: object\nrequired: [a]\n"
                     "required: [b]\n")  # fmt: skip
    with pytest.raises(PlanError, match=r"twice\.yaml: not YAML: 'required' is given twice"):
        read_plans([twice])
    anonymous = tmp_path / "anonymous.yaml"
    anonymous.write_text("type: object\n")
    with pytest.raises(PlanError, match='add "x-eventpipe"'):
        read_plans([anonymous])
    with pytest.raises(PlanError, match="no such file or directory"):
        read_plans([tmp_path / "nowhere"])


def test_two_plans_for_the_same_events_and_version_are_refused(tmp_path: Path) -> None:
    _plan(tmp_path, "a.json", "page_view", selector={"version": 2})
    _plan(tmp_path, "b.json", "page_view", selector={"version": 2})
    with pytest.raises(PlanError, match="version 2 of the plan for 'page_view' is also in"):
        read_plans([tmp_path])


def test_events_meet_the_plan_for_their_type_key_source_and_version(tmp_path: Path) -> None:
    _plan(tmp_path, "page_v1.json", "page_view", **PAGE)
    newer = {**PAGE, "required": ["url", "title"]}
    _plan(tmp_path, "page_v2.yaml", "page_view", selector={"version": 2}, **newer)
    _plan(tmp_path, "shop_only.json", "order", selector={"keys": ["shop"]}, required=["total"])
    _plan(tmp_path, "api_only.json", "signup", selector={"sources": ["api"]}, required=["email"])
    contracts = Contracts(read_plans([tmp_path]), version_field="schema_version")

    def check(event: dict[str, Any]) -> list[tuple[str, str]] | None:
        verdict = contracts.check(event)
        return None if verdict is None else [(v.pointer, v.rule) for v in verdict.violations]

    assert check({"event_type": "page_view", "url": "https://x.example/a"}) == [("", "required")]
    assert check({"event_type": "page_view", "url": "https://x.example/a", "title": "A"}) == []
    pinned = {"event_type": "page_view", "url": "https://x.example/a", "schema_version": 1}
    assert check(pinned) == []
    assert contracts.check(pinned).plan == "page_view/1"  # type: ignore[union-attr]
    assert check({**pinned, "schema_version": 7}) == [("/schema_version", "version")]
    assert check({"event_type": "page_view", "url": 5, "n": -1, "title": "A"}) == [
        ("/n", "minimum"), ("/url", "type"),
    ]  # fmt: skip
    assert check({"event_type": "page_view", "url": "not a uri", "title": "A"}) == [
        ("/url", "format")
    ]
    assert check({"event_type": "order", "api_key": "web"}) is None  # the plan is shop's
    assert check({"event_type": "order", "api_key": "shop"}) == [("", "required")]
    assert check({"event_type": "signup", "src": "jitsu"}) is None
    assert check({"event_type": "signup", "src": "api"}) == [("", "required")]
    assert check({"event_type": "no_plan"}) is None


def test_violations_recorded_are_bounded_and_the_rest_counted(tmp_path: Path) -> None:
    many = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(30)}}
    contracts = Contracts(read_plans([_plan(tmp_path, "wide.json", "wide", **many)]))
    verdict = contracts.check({"event_type": "wide", **{f"p{i}": "x" * 1000 for i in range(30)}})
    assert verdict is not None
    assert (len(verdict.violations), verdict.more) == (MAX_VIOLATIONS, 30 - MAX_VIOLATIONS)
    assert all(len(v.message) <= 200 for v in verdict.violations)
    assert verdict.summary().endswith(f"and {30 - MAX_VIOLATIONS} more")
    # Every violation's place and rule, past the ones listed too (what discard_value
    # drops and the counts count).
    assert verdict.rules == ("type",)
    assert verdict.pointers == tuple(sorted(f"/p{i}" for i in range(30)))


def test_the_config_names_a_plan_that_cannot_be_used(tmp_path: Path) -> None:
    bad = _plan(tmp_path, "remote.json", "page_view", **{"$ref": "http://169.254.169.254/x"})
    with pytest.raises(ConfigError, match=r"remote\.json.*outside this plan"):
        parse_config({"contracts": {"plans": str(bad)}}, source="test")
    with pytest.raises(ConfigError, match="collector: reject needs plans"):
        parse_config({"contracts": {"collector": "reject"}}, source="test")
    good = _plan(tmp_path, "page.json", "page_view", **PAGE)
    config = parse_config({"contracts": {"plans": [str(good)], "collector": "flag"}},
                          source="test")  # fmt: skip
    assert config.contracts.plans == (good,)


def test_the_jobs_verdicts_of_an_arrow_batch_of_lines(tmp_path: Path) -> None:
    import pyarrow as pa

    from eventpipe.processing.steps.contracts import verdicts

    contracts = Contracts(read_plans([_plan(tmp_path, "page.json", "page_view", **PAGE)]))
    lines = pa.array([
        orjson.dumps({"event_type": "page_view", "url": "https://x.example/"}).decode(),
        orjson.dumps({"event_type": "page_view", "url": 5}).decode(),
        orjson.dumps({"event_type": "other"}).decode(),
        "{not json",
        "[1, 2]",
        None,
    ])  # fmt: skip
    found = verdicts(lines, contracts).to_pylist()
    nothing = {"violations": None, "rules": None, "pointers": None}
    assert found[0] == {"plan": "page_view/1", **nothing}
    assert found[1] == {
        "plan": "page_view/1",
        "violations": '["/url type: 5 is not of type \\"string\\""]',
        "rules": ["type"],
        "pointers": ["/url"],
    }
    assert found[2:] == [{"plan": None, **nothing}] * 4


def test_plans_read_again_reuse_their_validators(tmp_path: Path) -> None:
    from eventpipe.contracts.plans import compiled

    path = _plan(tmp_path, "page.json", "page_view", **PAGE)
    first, again = read_plans([path]), read_plans([path])  # as every run reads them
    assert first[0].schema is not again[0].schema
    assert compiled(path, first[0].schema) is compiled(path, again[0].schema)
