"""Tracking plans at the collector, over real HTTP on 127.0.0.1: ``reject`` refuses an
event that breaks its plan alone, with its violations in the answer and in failed/;
``flag`` accepts it marked, its line ending with the verdict for the job; an event
records its plan; what a client claims under the contract's names is never kept."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from eventpipe.contracts.check import Contracts, unmarked
from eventpipe.contracts.plans import read_plans
from eventpipe.reserved import CHECKED
from tests.conftest import (
    WEB_JS,
    WEB_SERVER,
    refused_events,
    stored_events,
)

PLAN = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://plans.example.com/checkout/1",
    "x-eventpipe": {"event_type": "checkout"},
    "type": "object",
    "required": ["total", "currency"],
    "properties": {"total": {"type": "number", "minimum": 0},
                   "currency": {"enum": ["EUR", "USD"]}},
}  # fmt: skip
GOOD = {"event_type": "checkout", "total": 12.5, "currency": "EUR"}
BAD = {"event_type": "checkout", "total": -3, "currency": "<script>alert(1)</script>"}
OTHER = {"event_type": "page_view"}  # no plan for it: not checked


@pytest.fixture
def plans(tmp_path: Path) -> Path:
    directory = tmp_path / "plans"
    directory.mkdir()
    (directory / "checkout.json").write_bytes(orjson.dumps(PLAN))
    return directory


def test_reject_refuses_an_event_that_breaks_its_plan_alone_and_says_why(
    start_collector: Any, plans: Path
) -> None:
    c = start_collector(contracts={"plans": [str(plans)], "collector": "reject"})
    answer = httpx.post(f"{c.url}/api/v1/s2s/event", headers={"X-Auth-Token": WEB_SERVER},
                        content=orjson.dumps([GOOD, BAD, OTHER]))  # fmt: skip
    assert answer.status_code == 200
    body = answer.json()
    assert (body["status"], body["accepted"]) == ("partial", 2)
    [rejected] = body["rejected"]
    assert rejected["index"] == 1
    assert rejected["error"] == (
        "contract https://plans.example.com/checkout/1: /currency enum: "
        '"<script>alert(1)</script>" is not one of "EUR" or "USD"; '
        "/total minimum: -3 is less than the minimum of 0"
    )
    good, other = stored_events(c)
    assert good[CHECKED]["plan"] == "https://plans.example.com/checkout/1"
    assert "violations" not in good[CHECKED]
    assert CHECKED not in other
    [failed] = refused_events(c)
    assert failed["event"]["total"] == -3
    assert failed["error"].startswith("item 1: contract https://plans.example.com/checkout/1")
    only_bad = httpx.post(f"{c.url}/api/v1/s2s/event", headers={"X-Auth-Token": WEB_SERVER},
                          content=orjson.dumps(BAD))  # fmt: skip
    assert only_bad.status_code == 400
    assert only_bad.json()["rejected"][0]["error"].startswith("contract ")
    metrics = httpx.get(f"{c.url}/metrics").text
    assert 'reason="contract_violation"} 2.0' in metrics
    plan = 'plan="https://plans.example.com/checkout/1"'
    assert (
        f'eventpipe_contract_violations_total{{action="refused",{plan},rule="enum"}} 2.0' in metrics
    )
    assert (
        f'eventpipe_contract_violations_total{{action="refused",{plan},rule="minimum"}} 2.0'
        in metrics
    )


def test_flag_accepts_an_event_that_breaks_its_plan_marked_and_a_claim_is_not_kept(
    start_collector: Any, plans: Path
) -> None:
    c = start_collector(contracts={"plans": [str(plans)], "collector": "flag"})
    # A browser claims a clean check for a bad event: the collector's own check replaces it.
    claimed = {**BAD, "eventn_ctx": {"contract": "forged", "contract_violations": []}}
    answer = httpx.post(f"{c.url}/api/v1/event", params={"token": WEB_JS},
                        content=orjson.dumps([GOOD, claimed]))  # fmt: skip
    assert answer.json() == {"status": "ok", "accepted": 2}
    good, bad = stored_events(c)
    assert good[CHECKED]["plan"] == "https://plans.example.com/checkout/1"
    assert bad[CHECKED]["plan"] == "https://plans.example.com/checkout/1"
    assert orjson.loads(bad[CHECKED]["violations"]) == [
        '/currency enum: "<script>alert(1)</script>" is not one of "EUR" or "USD"',
        "/total minimum: -3 is less than the minimum of 0",
    ]
    # The job's names for a verdict: what the client claimed there is dropped.
    assert not {"contract", "contract_violations"} & set(bad["eventn_ctx"])
    assert not refused_events(c)
    # A bulk upload's lines are checked and marked the same way.
    bulk = httpx.post(f"{c.url}/api/v1/s2s/bulk", headers={"X-Auth-Token": WEB_SERVER},
                      content=orjson.dumps(GOOD) + b"\n" + orjson.dumps(BAD) + b"\n")  # fmt: skip
    assert bulk.json()["accepted"] == 2
    good, bad = stored_events(c)[2:]
    assert "violations" not in good[CHECKED]
    assert orjson.loads(bad[CHECKED]["violations"])[1].startswith("/total minimum")


def test_a_browser_event_never_keeps_the_marks_of_a_check(start_collector: Any) -> None:
    c = start_collector()  # no plans: the collector checks nothing
    forged = {"event_type": "checkout", "eventn_ctx": {"contract": "forged",
                                                       "contract_violations": []}}  # fmt: skip
    answer = httpx.post(f"{c.url}/api/v1/event", params={"token": WEB_JS},
                        content=orjson.dumps(forged))  # fmt: skip
    assert answer.status_code == 200
    [stored] = stored_events(c)
    assert not {"contract", "contract_violations"} & set(stored["eventn_ctx"])


def test_flag_ends_each_checked_line_with_its_verdict_and_drops_a_clients_mark(
    start_collector: Any, plans: Path
) -> None:
    """The mark the job may take instead of checking the line again: the plans' digest
    and the verdict, the line's last key; what a client sends under its name (with the
    right digest, claiming a clean check) is dropped, whatever its key."""
    c = start_collector(contracts={"plans": [str(plans)], "collector": "flag"})
    contracts = Contracts(read_plans([plans]))
    forged = {CHECKED: {"plans": contracts.digest, "plan": PLAN["$id"]}}
    body = orjson.dumps([GOOD, {**BAD, **forged}, {**OTHER, **forged}])
    answer = httpx.post(f"{c.url}/api/v1/event", params={"token": WEB_JS}, content=body)
    assert answer.json() == {"status": "ok", "accepted": 3}
    answer = httpx.post(f"{c.url}/api/v1/s2s/event", headers={"X-Auth-Token": WEB_SERVER},
                        content=orjson.dumps({**BAD, "n": 4, **forged}))  # fmt: skip
    assert answer.json() == {"status": "ok", "accepted": 1}
    lines = c.layout.active_segment("web", c.writer).read_bytes().splitlines()
    good, bad, other, server = (orjson.loads(line) for line in lines)
    plan = {"plans": contracts.digest, "plan": PLAN["$id"]}
    assert good[CHECKED] == plan
    broken = {**plan,
              "violations": orjson.dumps([
                  '/currency enum: "<script>alert(1)</script>" is not one of "EUR" or "USD"',
                  "/total minimum: -3 is less than the minimum of 0"]).decode(),
              "rules": ["enum", "minimum"], "pointers": ["/currency", "/total"]}  # fmt: skip
    assert bad[CHECKED] == broken
    assert server[CHECKED] == broken
    assert CHECKED not in other  # no plan for its type: the job does not check it either
    # Each mark is what a check of its line as stored (without the check's own fields)
    # gives, the line's last key.
    for line, event in zip(lines, (good, bad, other, server), strict=True):
        mark = contracts.mark(event, contracts.check(unmarked(dict(event))))
        if mark is None:
            assert CHECKED.encode() not in line
        else:
            assert line.endswith(b',"' + CHECKED.encode() + b'":' + orjson.dumps(mark) + b"}")
