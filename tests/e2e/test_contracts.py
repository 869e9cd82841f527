"""Tracking plans in the job, end to end over HTTP: every event checked against its plan
as it was stored (not as Spark read it), marked in its row (``flag``), sent to failed/
with its violations (``reject``) or loaded into its table's side table (``quarantine``)
per destination, whatever the client claimed; where the collector checked an event
under the same plans, its verdict taken from the event's line."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import orjson

from eventpipe.contracts.check import Contracts
from eventpipe.contracts.plans import read_plans
from eventpipe.destinations.duckdb import DuckDBDestination
from eventpipe.locks import FileLocks
from eventpipe.processing.batch import job
from eventpipe.processing.batch.job import process_once
from eventpipe.processing.steps.contracts import PlanCheck, broken_rules
from eventpipe.reserved import CHECKED
from eventpipe.state.store import open_state
from tests.conftest import read_lines
from tests.e2e.test_batch_pipeline import _post, _seal

PLAN = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "x-eventpipe": {"event_type": "checkout"},
    "type": "object", "required": ["total"],
    "properties": {"total": {"type": "number", "minimum": 0},
                   "address": {"type": "object", "properties": {"zip": {"type": "string"}}}},
}  # fmt: skip


def _stored(event: dict[str, Any], contracts: Contracts) -> bytes:
    """``event``'s line as a collector that checks it under ``contracts`` stores it."""
    mark = contracts.mark(event, contracts.check(event))
    marked = event if mark is None else {**event, CHECKED: mark}
    return orjson.dumps(marked, option=orjson.OPT_APPEND_NEWLINE)


def test_each_destination_flags_rejects_or_quarantines_what_breaks_its_plan(
    start_collector: Any, spark: Any, tmp_path: Path
) -> None:
    plans = tmp_path / "plans"
    plans.mkdir()
    (plans / "checkout.json").write_bytes(orjson.dumps(PLAN))
    c = start_collector(
        contracts={"plans": [str(plans)]},  # the collector does not check: the job does
        destinations={
            "flagged": {"type": "duckdb", "path": str(tmp_path / "flagged.duckdb")},
            "strict": {"type": "duckdb", "path": str(tmp_path / "strict.duckdb"),
                       "on_violation": "reject"},
            "aside": {"type": "duckdb", "path": str(tmp_path / "aside.duckdb"),
                      "on_violation": "quarantine", "table_name_template": "{{ event_type }}"},
            "dropping": {"type": "duckdb", "path": str(tmp_path / "dropping.duckdb"),
                         "on_violation": "discard_value",
                         "mappings": {"fields": [{"src": "/total", "dst": "/amount",
                                                 "action": "move"}]}},
        },
    )  # fmt: skip
    # "total" comes as a number and as text: Spark reads both as text, the plan's check
    # sees each as it was sent. The last event claims a clean check it never had.
    _post(c, [
        {"event_type": "checkout", "n": 1, "total": 12, "tags": ["a", "b"],
         "_eventpipe_line": "an event's own field", "_eventpipe_verdict": {"plan": "x"}},
        {"event_type": "checkout", "n": 2, "total": "12"},
        {"event_type": "checkout", "n": 3, "total": -1},
        {"event_type": "page_view", "n": 4},
        {"event_type": "checkout", "n": 5, "eventn_ctx": {"contract": "checkout/1"}},
        {"event_type": "checkout", "n": 6, "total": 5, "address": {"zip": 123, "city": "Oslo"}},
    ], server=True)  # fmt: skip
    _seal(c)
    process_once(c.config, spark)

    def rows(path: Path, columns: str) -> list[tuple[Any, ...]]:
        warehouse = DuckDBDestination("w", path, FileLocks(c.layout.locks))
        return warehouse.query(f"SELECT {columns} FROM events ORDER BY n")[1]

    flagged = rows(tmp_path / "flagged.duckdb",
                   "n, eventn_ctx_contract, eventn_ctx_contract_violations")  # fmt: skip
    assert [(n, plan) for n, plan, _ in flagged] == [
        (1, "checkout/1"),
        (2, "checkout/1"),
        (3, "checkout/1"),
        (4, None),
        (5, "checkout/1"),
        (6, "checkout/1"),
    ]
    # The event's own fields named like the job's are its own columns, as without plans.
    warehouse = DuckDBDestination("w", tmp_path / "flagged.duckdb", FileLocks(c.layout.locks))
    own = "SELECT tags, __eventpipe_line, __eventpipe_verdict_plan FROM events WHERE n = 1"
    assert warehouse.query(own)[1] == [('["a","b"]', "an event's own field", "x")]
    violations = {n: orjson.loads(v) if v else None for n, _, v in flagged}
    assert violations == {
        1: None,
        2: ['/total type: "12" is not of type "number"'],
        3: ["/total minimum: -1 is less than the minimum of 0"],
        4: None,
        5: ['/ required: "total" is a required property'],
        6: ['/address/zip type: 123 is not of type "string"'],
    }
    # Only what met its plan (or had none) is loaded: no violations column is made.
    strict = rows(tmp_path / "strict.duckdb", "n, eventn_ctx_contract")
    assert strict == [(1, "checkout/1"), (4, None)]
    failed = read_lines([c.layout.failed_destination("strict")])
    assert sorted((f["event"]["n"], f["error"]) for f in failed) == [
        (2, 'contract checkout/1: /total type: "12" is not of type "number"'),
        (3, "contract checkout/1: /total minimum: -1 is less than the minimum of 0"),
        (5, 'contract checkout/1: / required: "total" is a required property'),
        (6, 'contract checkout/1: /address/zip type: 123 is not of type "string"'),
    ]
    assert not c.layout.failed_destination("flagged").exists()
    # Quarantined: what broke its plan loads into its table's side table, with why.
    aside = DuckDBDestination("w", tmp_path / "aside.duckdb", FileLocks(c.layout.locks))
    tables = sorted(t for t in aside.tables() if not t.startswith("_eventpipe"))
    assert tables == ["checkout", "checkout_quarantine", "page_view"]
    assert aside.query("SELECT n FROM checkout")[1] == [(1,)]
    quarantined = aside.query("SELECT n, eventn_ctx_contract_violations "
                              "FROM checkout_quarantine ORDER BY n")[1]  # fmt: skip
    assert [(n, orjson.loads(v)) for n, v in quarantined] == [
        (n, violations[n]) for n in (2, 3, 5, 6)
    ]
    assert not c.layout.failed_destination("aside").exists()
    # discard_value: the values that broke the plan are dropped (found where the mapping
    # moved them), the rest loads with the violations; a missing field drops nothing.
    dropped = rows(tmp_path / "dropping.duckdb",
                   "n, amount, address_city, eventn_ctx_contract_violations")  # fmt: skip
    assert [(n, amount, city, v and orjson.loads(v)) for n, amount, city, v in dropped] == [
        (1, "12", None, None),
        (2, None, None, violations[2]),
        (3, None, None, violations[3]),
        (4, None, None, None),
        (5, None, None, violations[5]),
        (6, "5", "Oslo", violations[6]),
    ]
    # The only zip sent broke the plan: dropped, it made no column.
    warehouse = DuckDBDestination("w", tmp_path / "dropping.duckdb", FileLocks(c.layout.locks))
    described = warehouse.describe("events")
    assert described is not None
    assert "address_zip" not in described.columns
    assert not c.layout.failed_destination("dropping").exists()
    # Each destination counts its events that broke each plan's rules (an event once per
    # rule), in status and the run history.
    state = open_state(c.config)
    for name in ("flagged", "strict", "aside", "dropping"):
        counted = {(k.subject, k.rule): k.events for k in state.contract_counts(name)}
        assert counted == {("checkout/1", "type"): 2, ("checkout/1", "minimum"): 1,
                           ("checkout/1", "required"): 1}, name  # fmt: skip


def test_each_destination_evolves_freezes_or_discards_what_its_tables_lack(
    start_collector: Any, spark: Any, tmp_path: Path
) -> None:
    """Schema contracts at load (dlt's vocabulary): the same two batches into five
    destinations. The second brings a new field (``coupon``) and a value its column's
    type cannot take (``total`` "abc" into BIGINT)."""

    def duckdb(name: str, contract: Any) -> dict[str, Any]:
        return {"type": "duckdb", "path": str(tmp_path / f"{name}.duckdb"),
                "schema_contract": contract}  # fmt: skip

    c = start_collector(destinations={
        "frozen": duckdb("frozen", {"columns": "freeze"}),
        "lenient": duckdb("lenient", {"columns": "discard_value", "data_type": "discard_value"}),
        "dropping": duckdb("dropping", {"columns": "discard_row", "data_type": "discard_row"}),
        "evolving": duckdb("evolving", "evolve"),
        "closed": {**duckdb("closed", {"tables": "freeze",
                                       "per_table": {"order": {"tables": "evolve"}}}),
                   "table_name_template": "{{ event_type }}"},
    })  # fmt: skip
    _post(c, [{"event_type": "order", "n": 1, "total": 10}], server=True)
    _seal(c)
    process_once(c.config, spark)
    _post(c, [
        {"event_type": "order", "n": 2, "total": 11, "coupon": "X"},
        {"event_type": "order", "n": 3, "total": "abc"},
        {"event_type": "order", "n": 4, "total": 12},
        {"event_type": "refund", "n": 5},
    ], server=True)  # fmt: skip
    _seal(c)
    process_once(c.config, spark)

    def table(name: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        warehouse = DuckDBDestination("w", tmp_path / f"{name}.duckdb", FileLocks(c.layout.locks))
        described = warehouse.describe("events")
        assert described is not None, f"{name} has no table events"
        columns = [k for k in ("n", "total", "coupon", "total__v_string")
                   if k in described.columns]  # fmt: skip
        return columns, warehouse.query(f"SELECT {', '.join(columns)} FROM events ORDER BY n")[1]

    def failed(name: str) -> list[tuple[int, str]]:
        records = read_lines([c.layout.failed_destination(name)])
        return sorted((f["event"]["n"], f["error"]) for f in records)

    # freeze: the table gets no new column; the events it cannot take go to failed/.
    assert table("frozen") == (["n", "total"], [(1, 10), (4, 12), (5, None)])
    assert failed("frozen") == [
        (2, "column coupon: table events has no such column and its schema contract "
            "freezes its columns (schema_contract.columns: freeze)"),
        (3, "column total (INT64) cannot take abc"),
    ]  # fmt: skip
    # discard_value: what does not fit is dropped, the rest of the event loads.
    assert table("lenient") == (["n", "total"], [(1, 10), (2, 11), (3, None), (4, 12), (5, None)])
    # discard_row: the event is dropped.
    assert table("dropping") == (["n", "total"], [(1, 10), (4, 12), (5, None)])
    # evolve: the column is added; a value of another type lands beside its column.
    assert table("evolving") == (
        ["n", "total", "coupon", "total__v_string"],
        [(1, 10, None, None), (2, 11, "X", None), (3, None, None, "abc"), (4, 12, None, None),
         (5, None, None, None)],
    )  # fmt: skip
    for name in ("lenient", "dropping", "evolving"):
        assert not c.layout.failed_destination(name).exists(), name
    # tables: freeze (but for its table "order"): no other table is created; its events
    # fail, saying why.
    closed = DuckDBDestination("w", tmp_path / "closed.duckdb", FileLocks(c.layout.locks))
    assert [t for t in closed.tables() if not t.startswith("_eventpipe")] == ["order"]
    assert failed("closed") == [
        (3, "column total (INT64) cannot take abc"),
        (5, "table refund: closed has no such table and its schema contract freezes its "
            "tables (schema_contract.tables: freeze)"),
    ]  # fmt: skip
    # Every event held back is counted per table and what the contract did.
    state = open_state(c.config)
    counted = {d: {(k.subject, k.rule): k.events for k in state.contract_counts(d)}
               for d in ("frozen", "lenient", "dropping", "evolving", "closed")}  # fmt: skip
    assert counted == {
        "frozen": {("events", "columns:freeze"): 1, ("events", "data_type:freeze"): 1},
        "lenient": {("events", "columns:discard_value"): 1,
                    ("events", "data_type:discard_value"): 1},
        "dropping": {("events", "columns:discard_row"): 1, ("events", "data_type:discard_row"): 1},
        "evolving": {("events", "data_type:evolve"): 1},
        "closed": {("order", "data_type:freeze"): 1, ("refund", "tables:freeze"): 1},
    }  # fmt: skip


def test_the_job_takes_the_collectors_verdict_made_under_its_plans_and_checks_the_rest(
    start_collector: Any, spark: Any, tmp_path: Path, monkeypatch: Any, caplog: Any
) -> None:
    """With ``contracts.collector: flag`` each checked line ends with its verdict and the
    plans' digest: the job takes it and checks no line again. A line without such a mark
    is checked: a client's forged mark (dropped at the collector), a segment that was
    not checked at the collector, events collected under plans that have changed since."""
    plans = tmp_path / "plans"
    plans.mkdir()
    (plans / "checkout.json").write_bytes(orjson.dumps(PLAN))
    warehouse = tmp_path / "flagged.duckdb"
    c = start_collector(
        contracts={"plans": [str(plans)], "collector": "flag"},
        destinations={"flagged": {"type": "duckdb", "path": str(warehouse)}},
    )
    contracts = Contracts(read_plans([plans]))
    forged = {CHECKED: {"plans": contracts.digest, "plan": "checkout/1"}}
    _post(c, [{"event_type": "checkout", "n": 1, "total": 12},
              {"event_type": "checkout", "n": 2, "total": -1, **forged},
              {"event_type": "page_view", "n": 3, **forged}], server=True)  # fmt: skip
    _post(c, [{"event_type": "checkout", "n": 4, "total": "12", **forged}])
    _seal(c)
    checked: list[int] = []  # runs whose lines went to the Python workers
    of_lines = PlanCheck.of_lines
    monkeypatch.setattr(PlanCheck, "of_lines",
                        lambda self, line: checked.append(1) or of_lines(self, line))  # fmt: skip
    counted: list[int] = []  # passes of their own counting broken rules
    monkeypatch.setattr(job, "broken_rules",
                        lambda verdicts: counted.append(1) or broken_rules(verdicts))  # fmt: skip

    def flagged() -> dict[int, tuple[Any, Any]]:
        columns = "n, eventn_ctx_contract, eventn_ctx_contract_violations"
        rows = DuckDBDestination("w", warehouse, FileLocks(c.layout.locks)).query(
            f"SELECT {columns} FROM events"
        )[1]
        return {n: (plan, v and orjson.loads(v)) for n, plan, v in rows}

    process_once(c.config, spark)
    assert checked == []
    assert counted == []  # counted as the rows were staged (steps.contracts.RuleTally)
    minimum = ["/total minimum: -1 is less than the minimum of 0"]
    text = ['/total type: "12" is not of type "number"']
    assert flagged() == {1: ("checkout/1", None), 2: ("checkout/1", minimum), 3: (None, None),
                         4: ("checkout/1", text)}  # fmt: skip
    described = DuckDBDestination("w", warehouse, FileLocks(c.layout.locks)).describe("events")
    assert described is not None
    assert not [k for k in described.columns if "checked" in k]  # a mark is no column
    assert {(k.subject, k.rule): k.events for k in open_state(c.config).contract_counts("flagged")
            } == {("checkout/1", "minimum"): 1, ("checkout/1", "type"): 1}  # fmt: skip

    # A segment the collector did not check, its first 64 KiB marked (a guess from them
    # says every line is): the one line without a mark is checked all the same.
    lines = []
    for n in range(100, 800):
        event = {"event_type": "checkout", "n": n, "total": n, "_timestamp": "2026-11-21T10:00:00Z"}
        lines.append(_stored(event, contracts))
    assert sum(map(len, lines)) > 64 * 1024
    lines.append(
        b'{"event_type":"checkout","n":6,"total":-5,"_timestamp":"2026-11-21T10:00:01Z"}\n'
    )
    (c.layout.incoming / "incoming.tok=web-2026-11-21T10-00-00.000.log").write_bytes(
        b"".join(lines)
    )
    with caplog.at_level(logging.INFO, logger="eventpipe.processing"):
        process_once(c.config, spark)
    assert checked == [1]
    assert "without a mark made under the run's plans" in caplog.text
    found = flagged()
    assert found[6] == ("checkout/1", ["/total minimum: -5 is less than the minimum of 0"])
    assert all(found[n] == ("checkout/1", None) for n in range(100, 800))

    # Collected under one plan, processed under its next version: checked again.
    _post(c, [{"event_type": "checkout", "n": 7, "total": 5}], server=True)
    _seal(c)
    (plans / "checkout.json").write_bytes(
        orjson.dumps(
            {
                **PLAN,
                "properties": {**PLAN["properties"], "total": {"type": "number", "minimum": 10}},
            }
        )
    )
    process_once(c.config, spark)
    assert checked == [1, 1]
    assert flagged()[7] == ("checkout/1", ["/total minimum: 5 is less than the minimum of 10"])


def test_a_verdict_read_from_its_mark_equals_the_one_made_from_its_line(
    spark: Any, tmp_path: Path
) -> None:
    """Whatever the violations quote (quotes, backslashes, control characters, non-ASCII,
    markup, a line separator), the verdict Spark reads from a line's mark is the one the
    Python workers make of the line."""
    from pyspark.sql import functions as F

    from eventpipe.processing.batch.read import read_events
    from eventpipe.reserved import LINE

    plans = tmp_path / "plans"
    plans.mkdir()
    (plans / "signup.json").write_bytes(orjson.dumps({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "x-eventpipe": {"event_type": "signup"},
        "properties": {"name": {"type": "string", "maxLength": 1},
                       "tags": {"type": "array", "items": {"enum": ["a"]}}},
    }))  # fmt: skip
    contracts = Contracts(read_plans([plans]))
    names = ['a"b', "back\\slash", "tab\tnew\nline\x01\x1f", "é😀 ü", "</script><b>",
             "\u2028\u2029", "x" * 300, "ok"]  # fmt: skip
    lines = []
    for n, name in enumerate([*names, "o"]):  # the last meets the plan
        tags = ["a", name] if name != "o" else ["a"]
        event = {"event_type": "signup", "n": n, "name": name, "tags": tags}
        lines.append(_stored(event, contracts))
    log = tmp_path / "events.log"
    log.write_bytes(b"".join(lines))
    check = PlanCheck(read_plans([plans]), None)
    raw = read_events(spark, [str(log)], lines=True, marks=True)
    rows = raw.select("n", check.of_marks(F.col(CHECKED)).alias("mark"),
                      check.of_lines(F.col(LINE)).alias("line")).collect()  # fmt: skip
    assert len(rows) == len(names) + 1
    for row in rows:
        assert row["mark"] is not None
        assert row["mark"].asDict() == row["line"].asDict(), row["n"]
    assert [row["n"] for row in rows if row["mark"]["violations"] is None] == [len(names)]


def test_a_staged_run_checks_the_lines_of_events_whose_marks_it_cannot_take(
    spark: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    """A run of several destinations stages its events with the verdicts of their marks;
    an event of a planned type without one (past the 64 KiB the guess looks at) sends
    the run back to its lines: every verdict in the copy is one made under its plans."""
    from eventpipe.config import parse_config
    from eventpipe.processing.batch.read import stage_events
    from eventpipe.processing.steps.lookup import Lookups
    from eventpipe.reserved import UNCHECKED, VERDICT

    plans = tmp_path / "plans"
    plans.mkdir()
    (plans / "checkout.json").write_bytes(orjson.dumps(PLAN))
    config = parse_config({
        "data_dir": str(tmp_path / "data"), "contracts": {"plans": [str(plans)]},
        "destinations": {"a": {"type": "duckdb"}, "b": {"type": "parquet"}},
    }, source="test")  # fmt: skip
    contracts = Contracts(read_plans([plans]))
    lines = []
    for n in range(1000):
        event = {"event_type": "checkout", "n": n, "total": n - 1}  # the first breaks it
        lines.append(_stored(event, contracts))
    marked_only, mixed = tmp_path / "marked.log", tmp_path / "mixed.log"
    marked_only.write_bytes(b"".join(lines))
    mixed.write_bytes(b"".join(lines) + b'{"event_type":"checkout","n":1000,"total":-5}\n')
    lookups = Lookups.plan(config)
    checked: list[str] = []  # runs whose lines went to the Python workers
    of_lines = PlanCheck.of_lines

    def spied(self: PlanCheck, line: Any) -> Any:
        checked.append(run_id)
        return of_lines(self, line)

    monkeypatch.setattr(PlanCheck, "of_lines", spied)
    for run_id, log in (("marked", marked_only), ("mixed", mixed)):
        events = stage_events(spark, config, run_id, [str(log)], lookups, staged=True)
        assert UNCHECKED not in events.columns
        assert checked == ([] if run_id == "marked" else ["mixed"])
        rows = {row["n"]: row[VERDICT] for row in events.select("n", VERDICT).collect()}
        assert rows[0]["violations"] == orjson.dumps(
            ["/total minimum: -1 is less than the minimum of 0"]).decode()  # fmt: skip
        assert all(rows[n]["violations"] is None for n in range(1, 1000))
        if run_id == "mixed":
            assert rows[1000]["violations"] == orjson.dumps(
                ["/total minimum: -5 is less than the minimum of 0"]).decode()  # fmt: skip


def test_the_guess_of_marked_lines_reads_any_line_without_failing(
    spark: Any, tmp_path: Path
) -> None:
    """The driver's look at the first lines of a run's files takes what any line holds
    (an event type that is a list, a line that is not JSON, a mark that is not an
    object) and says whether each planned event there has a mark made under the plans."""
    plans = tmp_path / "plans"
    plans.mkdir()
    (plans / "checkout.json").write_bytes(orjson.dumps(PLAN))
    check = PlanCheck(read_plans([plans]), None)
    contracts = Contracts(read_plans([plans]))
    odd = [b'{"event_type":["checkout"],"total":1}\n', b"not json\n", b"[1]\n",
           b'{"event_type":{"a":1}}\n']  # fmt: skip
    good = _stored({"event_type": "checkout", "total": 1}, contracts)
    (tmp_path / "a.log").write_bytes(b"".join(odd) + good)
    assert check.marked([str(tmp_path / "a.log"), str(tmp_path / "absent.log")])
    forged = b'{"event_type":"checkout","total":1,"_eventpipe_checked":5}\n'
    (tmp_path / "b.log").write_bytes(good + forged)
    assert not check.marked([str(tmp_path / "a.log"), str(tmp_path / "b.log")])
