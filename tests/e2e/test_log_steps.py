"""`eventpipe log step`, `log ack` and `log show --destination`: an operator looks at a
destination's next events, takes them one at a time or skips them, and the pipeline then
goes on from there, with nothing loaded twice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import orjson
import pytest

from eventpipe.config import Config
from eventpipe.log.inspect import Position
from eventpipe.processing.batch.job import process_pending
from eventpipe.processing.modes.log_steps import UnfinishedRunError, acknowledge, step
from eventpipe.processing.modes.preview import preview
from eventpipe.state.store import StateStore
from tests.conftest import make_config
from tests.process import run, write_config

S1, S2, S3 = (f"web-2026-11-21T10-00-0{i}.000" for i in (1, 2, 3))


def _segment(data: Path, segment: str, events: list[dict[str, Any] | bytes]) -> None:
    (data / "incoming").mkdir(parents=True, exist_ok=True)
    lines = [e if isinstance(e, bytes) else orjson.dumps(e) for e in events]
    (data / "incoming" / f"incoming.tok={segment}.log").write_bytes(b"\n".join(lines) + b"\n")


def _config(data: Path) -> Config:
    return make_config(data, destinations={"warehouse": {
        "type": "duckdb", "table_name_template": "{{ event_type }}",
    }})  # fmt: skip


def _rows(data: Path, table: str) -> list[tuple[Any, ...]]:
    with duckdb.connect(str(data / "warehouse.duckdb"), read_only=True) as db:
        return db.execute(f"SELECT n FROM {table} ORDER BY n").fetchall()


def test_step_takes_one_event_at_a_time_and_the_run_takes_the_rest(
    tmp_path: Path, spark: Any
) -> None:
    data = tmp_path / "data"
    _segment(data, S1, [
        {"event_type": "click", "n": 1},
        {"event_type": "click", "n": 2, "_timestamp": "not a time"},  # fails: the cast
        {"event_type": "click", "n": 3},
    ])  # fmt: skip
    _segment(data, S2, [{"event_type": "click", "n": 4}])
    config = _config(data)

    first = step(config, spark, "warehouse")
    assert first is not None
    assert first.position == Position(S1, 0)
    assert orjson.loads(first.line) == {"event_type": "click", "n": 1}
    assert first.report.loaded == {("warehouse", "click"): 1}
    assert _rows(data, "click") == [(1,)]

    second = step(config, spark, "warehouse")
    assert second is not None
    assert second.position == Position(S1, 1)
    assert second.report.failed == {"warehouse": 1}
    [failed] = config.layout.failed_destination("warehouse").read_bytes().splitlines()
    assert orjson.loads(failed)["event"]["n"] == 2
    assert StateStore(config.layout.state).cursors("warehouse") == {f"incoming.tok={S1}.log": 2}

    # The next run takes the rest of S1 (line 2 only) and S2: nothing twice.
    reports = process_pending(config, spark)
    assert reports[-1].loaded == {("warehouse", "click"): 2}
    assert _rows(data, "click") == [(1,), (3,), (4,)]
    assert not config.layout.sealed_segments()  # both archived
    assert step(config, spark, "warehouse") is None  # nothing pending


def test_ack_skips_events_and_the_run_goes_on_after_them(tmp_path: Path, spark: Any) -> None:
    data = tmp_path / "data"
    _segment(data, S1, [{"event_type": "click", "n": n} for n in (1, 2)])
    _segment(data, S2, [{"event_type": "click", "n": n} for n in (3, 4, 5)])
    _segment(data, S3, [{"event_type": "click", "n": 6}])
    config = _config(data)
    assert acknowledge(config, "warehouse", Position(S2, 0)) == [S1, f"{S2}:0"]
    assert acknowledge(config, "warehouse", Position(S2, 0)) == []  # done already
    process_pending(config, spark)
    assert _rows(data, "click") == [(4,), (5,), (6,)]
    assert not config.layout.sealed_segments()


def test_step_and_ack_refuse_to_take_an_unfinished_run_apart(tmp_path: Path, spark: Any) -> None:
    data = tmp_path / "data"
    for segment in (S1, S2):
        _segment(data, segment, [{"event_type": "click", "n": 1}])
    config = _config(data)
    names = [f"incoming.tok={s}.log" for s in (S1, S2)]
    store = StateStore(config.layout.state)
    store.begin_run(names, "once", {"warehouse": names})  # killed before it loaded
    with pytest.raises(UnfinishedRunError, match="has not finished run"):
        step(config, spark, "warehouse")
    with pytest.raises(UnfinishedRunError, match="all together or not at all"):
        acknowledge(config, "warehouse", Position(S1, 0))
    # The whole run is acknowledged: the destination finished it, nothing loads.
    assert acknowledge(config, "warehouse", Position(S2, 0)) == [S1, S2]
    assert store.unfinished_runs() == []
    assert process_pending(config, spark) == []


def test_show_for_a_destination_gives_table_and_columns(tmp_path: Path, spark: Any) -> None:
    config = make_config(tmp_path / "data", destinations={"warehouse": {
        "type": "duckdb", "table_name_template": "{{ event_type }}", "only_keys": ["web"],
    }})  # fmt: skip
    lines = [
        orjson.dumps({"event_type": "Page View", "user": {"id": 7}, "api_key": "web"}),
        b"{not json",
        orjson.dumps({"event_type": "", "api_key": "web"}),
        orjson.dumps({"event_type": "buy", "api_key": "shop"}),
        orjson.dumps({"event_type": "buy", "_timestamp": "never", "api_key": "web"}),
    ]
    shown = preview(config, spark, "warehouse", lines)
    assert (shown[0].table, shown[0].columns) == ("page_view", {
        "event_type": "Page View", "user_id": 7, "api_key": "web",
    })  # fmt: skip
    assert shown[1].error == "line is not a JSON object"
    assert shown[2].table == ""  # skipped
    assert shown[3].error is not None
    assert "only_keys" in shown[3].error
    assert shown[4].table is None
    assert shown[4].error is not None
    assert "_timestamp" in shown[4].error


def test_show_with_tracking_plans_gives_the_verdict_columns_and_none_of_the_jobs_own(
    tmp_path: Path, spark: Any
) -> None:
    from eventpipe.contracts.check import Contracts
    from eventpipe.contracts.plans import read_plans
    from eventpipe.reserved import CHECKED

    plans = tmp_path / "plans"
    plans.mkdir()
    (plans / "buy.json").write_bytes(orjson.dumps({
        "x-eventpipe": {"event_type": "buy"}, "type": "object",
        "properties": {"total": {"type": "number", "minimum": 0}},
    }))  # fmt: skip
    config = make_config(tmp_path / "data", contracts={"plans": [str(plans)]}, destinations={
        "warehouse": {"type": "duckdb", "table_name_template": "{{ event_type }}"}})  # fmt: skip
    contracts = Contracts(read_plans([plans]))
    marked = {"event_type": "buy", "total": -1}
    marked[CHECKED] = contracts.mark(marked, contracts.check(marked))
    lines = [orjson.dumps(marked), orjson.dumps({"event_type": "buy", "total": 5})]
    shown = preview(config, spark, "warehouse", lines)
    assert [s.table for s in shown] == ["buy", "buy"]
    violations = ["/total minimum: -1 is less than the minimum of 0"]
    assert orjson.loads(shown[0].columns.pop("eventn_ctx_contract_violations")) == violations
    assert shown[0].columns == {"event_type": "buy", "total": -1,
                                "eventn_ctx_contract": "buy/1"}  # fmt: skip
    assert shown[1].columns == {"event_type": "buy", "total": 5, "eventn_ctx_contract": "buy/1"}


def test_log_step_and_ack_as_a_user_runs_them(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _segment(data, S1, [{"event_type": "click", "n": 1}, {"event_type": "click", "n": 2}])
    config = write_config(tmp_path / "eventpipe.yaml", data, 0, destinations={"warehouse": {
        "type": "duckdb", "table_name_template": "{{ event_type }}"}},
        spark={"master": "local[1]", "spark.sql.shuffle.partitions": 1},
    )  # fmt: skip
    stepped = run("log", "step", "--destination", "warehouse", "-c", str(config), timeout=300)
    assert stepped.returncode == 0, stepped.stderr
    assert stepped.stdout.splitlines()[0].startswith(f"{S1}:0\t")
    assert "loaded into click: 1 row(s)" in stepped.stdout
    acked = run("log", "ack", "--destination", "warehouse", "--to", f"{S1}:1", "-c", str(config))
    assert acked.returncode == 0, acked.stderr
    assert acked.stdout.strip() == f"acknowledged warehouse up to {S1}"
    assert _rows(data, "click") == [(1,)]
    wrong = run("log", "ack", "--destination", "nope", "--to", S1, "-c", str(config))
    assert wrong.returncode == 2
    assert "no destination 'nope'" in wrong.stderr
