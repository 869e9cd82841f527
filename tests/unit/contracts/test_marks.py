"""The mark the collector's check leaves on a line for the job: what it holds, which plans
it names (their digest), and what a check of the marked line leaves out so that it
gives the same verdict."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson

from eventpipe.contracts.check import Contracts, plans_digest, unmarked
from eventpipe.contracts.plans import read_plans
from eventpipe.reserved import CHECKED

DRAFT = "https://json-schema.org/draft/2020-12/schema"
PLAN: dict[str, Any] = {
    "$schema": DRAFT, "x-eventpipe": {"event_type": "checkout", "keys": ["web"]},
    "type": "object", "required": ["total"], "additionalProperties": False,
    "properties": {"event_type": {}, "api_key": {}, "eventn_ctx": {},
                   "total": {"type": "number", "minimum": 0}},
}  # fmt: skip


def _plans(tmp_path: Path, *plans: dict[str, Any]) -> Path:
    directory = tmp_path / "plans"
    directory.mkdir(exist_ok=True)
    for n, plan in enumerate(plans):
        (directory / f"{n}.json").write_bytes(orjson.dumps(plan))
    return directory


def _stored(event: dict[str, Any], mark: dict[str, Any] | None) -> bytes:
    """``event``'s line as the collector writes it (the mark its last key)."""
    return orjson.dumps(event if mark is None else {**event, CHECKED: mark})


def test_a_mark_holds_the_plans_digest_and_the_verdict(tmp_path: Path) -> None:
    contracts = Contracts(read_plans([_plans(tmp_path, PLAN)]))
    digest = contracts.digest
    good = {"event_type": "checkout", "api_key": "web", "total": 5}
    line = _stored(good, contracts.mark(good, contracts.check(good)))
    assert line == (b'{"event_type":"checkout","api_key":"web","total":5,'
                    b'"_eventpipe_checked":{"plans":"' + digest.encode() +
                    b'","plan":"checkout/1"}}')  # fmt: skip
    bad = {"event_type": "checkout", "api_key": "web", "total": -1, "coupon": "X"}
    assert contracts.mark(bad, contracts.check(bad)) == {
        "plans": digest, "plan": "checkout/1",
        "violations": orjson.dumps([
            "/ additionalProperties: Additional properties are not allowed ('coupon' was "
            "unexpected)", "/total minimum: -1 is less than the minimum of 0"]).decode(),
        "rules": ("additionalProperties", "minimum"), "pointers": ("/total",),
    }  # fmt: skip
    # A type some plan is for, but no plan for this key: marked as checked, no plan.
    other_key = {"event_type": "checkout", "api_key": "app", "total": 5}
    assert contracts.check(other_key) is None
    assert contracts.mark(other_key, None) == {"plans": digest}
    # A type no plan is for: the job does not check it either; no mark.
    assert contracts.mark({"event_type": "page_view"}, None) is None


def test_a_marked_line_checked_again_gives_the_verdict_its_mark_carries(tmp_path: Path) -> None:
    """The check of a line leaves out what the check itself adds: the mark, and the
    job's names for a verdict (a plan that allows no other keys would refuse them)."""
    contracts = Contracts(read_plans([_plans(tmp_path, PLAN)]))
    context = {"event_id": "1", "contract": "x", "contract_violations": []}
    event = {"event_type": "checkout", "api_key": "web", "total": 5, "eventn_ctx": context}
    mark = contracts.mark(event, contracts.check(unmarked(copy.deepcopy(event))))
    stored = orjson.loads(_stored(event, mark))
    assert stored["eventn_ctx"]["contract"] == "x"  # (the line as a client could send it)
    assert stored[CHECKED]["plan"] == "checkout/1"
    again = unmarked(stored)
    assert again == {"event_type": "checkout", "api_key": "web", "total": 5,
                     "eventn_ctx": {"event_id": "1"}}  # fmt: skip
    verdict = contracts.check(again)
    assert verdict is not None
    assert verdict.ok


def test_the_digest_changes_with_anything_that_changes_a_verdict(tmp_path: Path) -> None:
    def digest(*plans: dict[str, Any], version_field: str | None = None) -> str:
        directory = tmp_path / f"p{len(list(tmp_path.iterdir()))}"
        directory.mkdir()
        for n, plan in enumerate(plans):
            (directory / f"{n}.json").write_bytes(orjson.dumps(plan))
        return plans_digest(read_plans([directory]), version_field)

    other = {**PLAN, "x-eventpipe": {"event_type": "refund"}}
    same = digest(PLAN, other)
    assert len(same) == 16
    assert digest(PLAN, other) == same  # read again, from other files
    assert digest(PLAN) != same
    assert digest({**PLAN, "required": []}, other) != same
    assert digest({**PLAN, "x-eventpipe": {"event_type": "checkout", "version": 2}}, other) != same
    assert digest({**PLAN, "x-eventpipe": {"event_type": "checkout"}}, other) != same  # keys
    assert digest(PLAN, other, version_field="plan_version") != same
    assert Contracts(read_plans([_plans(tmp_path, PLAN)])).digest == digest(PLAN)
