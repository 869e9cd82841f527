"""Where is my event, end to end: events posted over HTTP and processed by a real run
(Spark, DuckDB), then traced through the console's API by their ids: one loaded (its
table), one failed (its reason), one filtered by the destination's transforms (processed,
in no table), one waiting in a segment not sealed yet; after the archive took their
segment, one found there, and one by the message id an SDK gave it; an id that is no id
refused; the ledger of the run: acknowledged = loaded + failed + skipped + filtered +
dropped, and what waits; and the destinations page: the tables' columns and types, and
which run created each table or added each column."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from eventpipe.processing.batch.job import process_once
from eventpipe.state.store import open_state
from tests.conftest import stored_events
from tests.e2e.test_batch_pipeline import _post, _seal
from tests.integration.test_console import TOKEN, RunningConsole, _logged_in
from tests.process import write_config

BEARER = {"Authorization": f"Bearer {TOKEN}"}


def test_where_is_my_event_traces_each_outcome(
    start_collector: Any, spark: Any, tmp_path: Path
) -> None:
    c = start_collector(
        console={"token": TOKEN},
        destinations={"warehouse": {
            "type": "duckdb", "table_name_template": "{{ event_type }}",
            "mappings": {"fields": [{"action": "cast", "src": "/n", "type": "INT64"}]},
            "transforms": [{"filter": "event_type != 'hidden'"}],
        }},
    )  # fmt: skip
    message_id = "3f0a9c2e-5b7d-4e1f-9a8b-2c6d4e8f0a1b"  # an SDK's (a UUIDv4: tells no day)
    _post(c, [{"event_type": "page", "n": 1}, {"event_type": "page", "n": "five"},
              {"event_type": "hidden", "n": 3},
              {"event_type": "page", "n": 6, "messageId": message_id}], server=True)  # fmt: skip
    ids = {e["n"]: e["eventn_ctx"]["event_id"] for e in stored_events(c)}
    _seal(c)
    process_once(c.config, spark)
    _post(c, [{"event_type": "page", "n": 4}], server=True)
    ids[4] = stored_events(c)[-1]["eventn_ctx"]["event_id"]
    # The file a command started from the console reads (a process of its own).
    destinations = c.config.model_dump(mode="json")["destinations"]
    config_file = write_config(tmp_path / "eventpipe.yaml", c.layout.root, 0,
                               destinations=destinations)  # fmt: skip
    console = RunningConsole(c.config, config_file)
    try:

        def traced(event_id: str) -> dict[str, Any]:
            answer = httpx.get(console.url + "/api/trace", params={"id": event_id},
                               headers=BEARER, timeout=30)  # fmt: skip
            assert answer.status_code == 200, answer.text
            body: dict[str, Any] = answer.json()
            return body

        def finished(kind: str) -> dict[str, Any]:
            """The console's command of ``kind`` (its own process), once it ended."""
            deadline = time.monotonic() + 180
            while True:
                shown = httpx.get(console.url + "/api/replays", headers=BEARER).json()
                [done] = [r for r in shown if r["kind"] == kind]
                if done["state"] != "running":
                    return done
                assert time.monotonic() < deadline, done
                time.sleep(0.5)

        def at(event_id: str) -> tuple[str, str | None, str]:
            [warehouse] = traced(event_id)["destinations"]
            return warehouse["state"], warehouse["table"], warehouse["detail"]

        loaded = traced(ids[1])
        assert loaded["event"]["n"] == 1
        [where] = loaded["stored"]
        assert (where["where"], where["line"]) == ("archive", 0)  # archived after the run
        assert at(ids[1]) == ("loaded", "page", "a row of table page")
        by_message = traced(message_id)
        assert by_message["event"]["n"] == 6
        assert by_message["stored"][0]["where"] == "archive"
        assert at(message_id) == ("loaded", "page", "a row of table page")
        [run] = open_state(c.config).history(1)
        assert loaded["destinations"][0]["run_id"] == run.run_id
        row = loaded["destinations"][0]["row"]  # the row it became
        assert (row["eventn_ctx_event_id"], row["n"], row["event_type"]) == (ids[1], 1, "page")
        state, _, detail = at(ids["five"])
        assert state == "failed"
        assert "column n (INT64) cannot take five" in detail
        state, table, detail = at(ids[3])
        assert (state, table) == ("processed", None)
        assert detail.startswith("in no table: filtered")
        waiting = traced(ids[4])
        assert waiting["stored"][0]["where"] == "log"
        assert waiting["destinations"][0]["state"] == "waiting"
        assert "not sealed yet" in waiting["destinations"][0]["detail"]
        # How the waiting event, still in the active segment, would land (log show
        # --stdin --destination, the event as stored: its own process, with Spark).
        preview = {"id": ids[4], "destination": "warehouse"}
        started = httpx.post(console.url + "/api/trace/preview", headers=BEARER, data=preview)
        assert started.status_code == 200, started.text
        shown = finished("preview")
        assert shown["state"] == "done", shown["output"]
        [landing] = [line for line in shown["output"] if "\ttable page\t" in line]
        assert landing.startswith("stdin:0\t")
        assert '"n":4' in landing
        with _logged_in(console.url) as browser:
            page_text = browser.get("/trace", params={"id": ids[4]}).text
        assert "table page" in page_text
        assert "&#34;n&#34;:4" in page_text  # its columns, as escaped text
        unknown = {"id": "01900000-0000-7000-8000-000000000000", "destination": "warehouse"}
        refused = httpx.post(console.url + "/api/trace/preview", headers=BEARER, data=unknown)
        assert refused.status_code == 404
        nowhere = traced("01900000-0000-7000-8000-000000000000")
        assert (nowhere["stored"], nowhere["destinations"][0]["state"]) == ([], "unknown")
        refused = httpx.get(console.url + "/api/trace", params={"id": "x' OR '1'='1"},
                            headers=BEARER)  # fmt: skip
        assert refused.status_code == 400
        # The ledger: the run's three events, each accounted for; the fourth waits once
        # its segment is sealed.
        _seal(c)
        books = httpx.get(console.url + "/api/ledger", headers=BEARER, timeout=30).json()
        [line] = books["runs"]
        assert (line["run_id"], line["destination"]) == (run.run_id, "warehouse")
        assert {k: line[k] for k in ("acknowledged", "loaded", "failed", "skipped", "filtered",
                                     "dropped", "difference")} == {
            "acknowledged": 4, "loaded": 2, "failed": 1, "skipped": 0, "filtered": 1,
            "dropped": 0, "difference": 0,
        }  # fmt: skip
        assert books["waiting"] == [{"destination": "warehouse", "segments": 1, "events": 1}]
        # Over a range of days: the runs started then, added up per destination.
        day = datetime.now(UTC).date()
        ranged = httpx.get(console.url + "/api/ledger", headers=BEARER,
                           params={"since": day.isoformat(), "until": day.isoformat()})  # fmt: skip
        [total] = ranged.json()["totals"]
        assert {k: total[k] for k in ("destination", "runs", "acknowledged", "loaded",
                                      "difference")} == {
            "destination": "warehouse", "runs": 1, "acknowledged": 4, "loaded": 2,
            "difference": 0,
        }  # fmt: skip
        later = (day + timedelta(days=1)).isoformat()
        none = httpx.get(console.url + "/api/ledger", headers=BEARER, params={"since": later})
        assert (none.json()["runs"], none.json()["totals"]) == ([], [])
        bad = httpx.get(console.url + "/api/ledger", headers=BEARER, params={"since": "soon"})
        assert bad.status_code == 400
        # The destinations page: a second run adds a column; the history says which run
        # created the table and which added it.
        _post(c, [{"event_type": "page", "n": 7, "coupon": "WINTER"}], server=True)
        _seal(c)
        process_once(c.config, spark)
        second = open_state(c.config).history(1)[0].run_id
        answer = httpx.get(console.url + "/api/destinations", headers=BEARER, timeout=30)
        [view] = answer.json()
        assert (view["id"], view["type"], view["error"]) == ("warehouse", "duckdb", None)
        [page] = [t for t in view["tables"] if t["name"] == "page"]
        columns = dict(page["columns"])
        assert (columns["n"], columns["coupon"]) == ("INT64", "STRING")
        changes = {(ch["change"], ch["column"]): ch["run_id"] for ch in view["changes"]
                   if ch["table"] == "page"}  # fmt: skip
        assert changes[("create", "n")] == run.run_id
        assert changes[("add", "coupon")] == second
        assert ("create", "coupon") not in changes
        assert {(ld["run_id"], ld["table"], ld["rows"]) for ld in view["loads"]} >= {
            (run.run_id, "page", 2),
            (second, "page", 2),
        }
        with _logged_in(console.url) as browser:
            html = browser.get("/destinations").text
            runs_page = browser.get("/runs").text
        version = open_state(c.config).history(1)[0].code_versions["warehouse"]
        assert f"warehouse: {version[:12]}" in runs_page  # each run's code version
        assert f"<td>add</td><td>coupon</td><td>STRING</td><td>{second}</td>" in html
        # Reprocess from the runs page (its API): the dry runs say what would be rebuilt,
        # without Spark; a day that is no day is refused.
        today = datetime.now(UTC).date().isoformat()

        def reprocess(**form: str) -> dict[str, Any]:
            asked = {"destination": "warehouse", "from": today, "to": today, "dry_run": "1"}
            started = httpx.post(console.url + "/api/reprocess", headers=BEARER,
                                 data={**asked, **form}, timeout=30)  # fmt: skip
            assert started.status_code == 200, started.text
            return finished("reprocess")

        up_to_date = reprocess()
        assert up_to_date["state"] == "done", up_to_date
        assert "0 day(s) to rebuild in 0 run(s), 1 up to date" in up_to_date["output"][-1]
        forced = reprocess(force="1")
        assert forced["selection"] == f"a dry run of days {today} to {today}, every day (force)"
        assert any(
            line.startswith(f"warehouse {today}: would rebuild") for line in forced["output"]
        )
        refused = httpx.post(console.url + "/api/reprocess", headers=BEARER,
                             data={"destination": "warehouse", "from": "yesterday"})  # fmt: skip
        assert refused.status_code == 400
    finally:
        console.stop()
