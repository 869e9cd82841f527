"""`eventpipe contract infer` and `contract check` against an archive, as a user runs
them: drafts that the archive's own events meet, and a stricter plan's breakages counted
by plan, place and rule, with examples, before it is switched on."""

from __future__ import annotations

import json
from pathlib import Path

import orjson

from eventpipe.archive.write import archive_segment
from eventpipe.config import ArchiveConfig
from eventpipe.paths import DataLayout
from tests.process import run, write_config

SEGMENT = "incoming.tok=web-2026-11-20T10-00-00.000.log"


def _archived(tmp_path: Path) -> Path:
    """A day of 300 events: 200 checkouts (currency one of three, coupon now and then)
    and 100 page views of the type ``../../etc/passwd`` (a hostile name), plus a line
    that is not an object."""
    layout = DataLayout(tmp_path / "data")
    layout.incoming.mkdir(parents=True)
    events = [
        {"event_type": "checkout", "total": n * 1.5 if n % 2 else n,
         "currency": ["EUR", "USD", "GBP"][n % 3], "eventn_ctx": {"event_id": f"c-{n}"},
         **({"coupon": "WINTER"} if n % 10 == 0 else {})}
        for n in range(200)
    ] + [{"event_type": "../../etc/passwd", "url": f"https://x.example/{n}",
          "eventn_ctx": {"event_id": f"p-{n}"}} for n in range(100)]  # fmt: skip
    lines = b"".join(orjson.dumps(e) + b"\n" for e in events) + b"[1, 2]\n"
    (layout.incoming / SEGMENT).write_bytes(lines)
    archive_segment(layout, SEGMENT, ArchiveConfig(frame_events=100))
    return write_config(tmp_path / "eventpipe.yaml", layout.root, 0)


def test_infer_drafts_a_plan_per_type_that_its_events_meet(tmp_path: Path) -> None:
    config = _archived(tmp_path)
    out = tmp_path / "plans"
    drafted = run("contract", "infer", "--from", "2026-11-20", "--to", "2026-11-20",
                  "--out", str(out), "-c", str(config))  # fmt: skip
    assert drafted.returncode == 0, drafted.stderr
    assert "2 draft(s) from 300 event(s); 1 line(s) without an event_type skipped" in drafted.stdout
    assert sorted(p.name for p in out.iterdir()) == ["checkout.json", "etc_passwd.json"]
    checkout = json.loads((out / "checkout.json").read_text())
    assert checkout["x-eventpipe"] == {"event_type": "checkout", "version": 1}
    assert checkout["required"] == ["currency", "event_type", "eventn_ctx", "total"]
    assert checkout["properties"]["total"] == {"type": "number"}
    assert checkout["properties"]["currency"] == {"type": "string", "enum": ["EUR", "GBP", "USD"]}
    assert checkout["properties"]["coupon"] == {"type": "string", "enum": ["WINTER"]}
    assert "enum" not in checkout["properties"]["eventn_ctx"]["properties"]["event_id"]
    again = run("contract", "infer", "--from", "2026-11-20", "--to", "2026-11-20",
                "--out", str(out), "-c", str(config))  # fmt: skip
    assert again.returncode == 2
    assert "already has" in again.stderr
    assert "checkout.json" in again.stderr
    # The drafts describe what came: every archived event meets its plan.
    checked = run("contract", "check", str(out), "--from", "2026-11-20", "--to", "2026-11-20",
                  "-c", str(config))  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "301 event(s): 300 checked, 0 would break their plan" in checked.stdout


def test_check_counts_what_a_stricter_plan_would_refuse_by_place_and_rule(
    tmp_path: Path,
) -> None:
    config = _archived(tmp_path)
    plan = tmp_path / "checkout.json"
    plan.write_text(json.dumps({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "x-eventpipe": {"event_type": "checkout"},
        "type": "object", "required": ["total", "coupon"],
        "properties": {"total": {"type": "integer"}, "currency": {"enum": ["EUR", "USD"]}},
    }))  # fmt: skip
    checked = run("contract", "check", str(plan), "--from", "2026-11-20", "--to", "2026-11-20",
                  "-c", str(config))  # fmt: skip
    assert checked.returncode == 65
    report = checked.stdout.splitlines()
    assert report[0] == ("301 event(s): 200 checked, 186 would break their plan, "
                         "100 with no plan, 1 not JSON objects")  # fmt: skip
    assert report[1] == "plan checkout/1: 200 checked, 186 would break (93.0%)"
    assert "  / required: 180 event(s)" in report
    assert "  /total type: 100 event(s)" in report
    assert "  /currency enum: 66 event(s)" in report
    assert '    e.g. c-1: 1.5 is not of type "integer"' in report
    assert "186 archived event(s) would break their plan" in checked.stderr
    empty = run("contract", "check", str(plan), "--from", "2026-10-01", "--to", "2026-10-02",
                "-c", str(config))  # fmt: skip
    assert empty.returncode == 1
    assert "the archive has no event from 2026-10-01 to 2026-10-02" in empty.stderr
    hostile = tmp_path / "remote.json"
    hostile.write_text(json.dumps({"x-eventpipe": {"event_type": "a"},
                                   "$ref": "https://evil.example/s.json"}))  # fmt: skip
    refused = run("contract", "check", str(hostile), "--from", "2026-11-20", "--to",
                  "2026-11-20", "-c", str(config))  # fmt: skip
    assert refused.returncode == 2
    assert "outside this plan" in refused.stderr


def test_status_and_the_history_show_what_contracts_found_and_held_back(tmp_path: Path) -> None:
    from eventpipe.state.records import ContractCount
    from eventpipe.state.store import StateStore

    data = tmp_path / "data"
    config = write_config(tmp_path / "eventpipe.yaml", data, 0,
                          destinations={"warehouse": {"type": "duckdb"}})  # fmt: skip
    data.mkdir()
    store = StateStore(data / "state.sqlite")
    run_id = store.begin_run(["s1"], "once").run_id
    store.record_destination_run(run_id, "warehouse", skipped=0, failed=1, contracts=[
        ContractCount("table", "orders", "columns:freeze", 1),
        ContractCount("table", "orders", "data_type:discard_value", 3),
    ])  # fmt: skip
    status = run("status", "-c", str(config))
    assert status.returncode == 0, status.stderr
    lines = [line for line in status.stdout.splitlines() if "(contracts" in line]
    assert lines == [
        "warehouse: table orders: columns:freeze 1 event(s) (contracts, docs/contracts.md)",
        "warehouse: table orders: data_type:discard_value 3 event(s) (contracts, "
        "docs/contracts.md)",
    ]
    history = run("status", "--history", "-c", str(config))
    assert history.returncode == 0, history.stderr
    header, _, row, _ = history.stdout.splitlines()
    assert header.split("|")[-1].strip() == "contracts"
    assert row.split("|")[-1].strip() == (
        "table orders: columns:freeze 1; table orders: data_type:discard_value 3"
    )
