"""The run history: every run recorded with its trigger, times, segments, rows per
destination x table, failures and code versions; `eventpipe status --history` shows it.
In the SQLite store under data/ and in a PostgreSQL one (``state: {type: postgres}``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from eventpipe.processing.batch.job import process_pending
from eventpipe.processing.batch.run import DestinationsFailingError
from eventpipe.processing.batch.version import code_version
from eventpipe.state.store import TableRun, open_state
from tests.conftest import make_config
from tests.process import free_port, run, write_config


def _segment(data: Path, stamp: str, events: list[dict[str, Any]]) -> None:
    (data / "incoming").mkdir(parents=True, exist_ok=True)
    lines = b"".join(orjson.dumps(e) + b"\n" for e in events)
    (data / "incoming" / f"incoming.tok=web-{stamp}.log").write_bytes(lines)


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_runs_are_recorded_with_rows_failures_and_code_versions(
    tmp_path: Path, spark: Any, store: str, request: pytest.FixtureRequest
) -> None:
    data = tmp_path / "data"
    state = request.getfixturevalue("postgres_state") if store == "postgres" else {}
    down = f"postgresql://nobody@127.0.0.1:{free_port()}/none"  # nothing listens there
    destinations = {
        "warehouse": {"type": "duckdb", "table_name_template": "{{ event_type }}"},
        "pg": {"type": "postgres", "dsn": down},
    }
    config = make_config(data, destinations=destinations, state=state)
    _segment(data, "2026-11-20T10-00-00.000", [
        {"event_type": "page", "n": 1}, {"event_type": "page", "n": 2},
        {"event_type": "click", "n": 3}, {"event_type": "", "n": 4},
    ])  # fmt: skip
    with pytest.raises(DestinationsFailingError):
        process_pending(config, spark)
    [stopped] = open_state(config).history()
    assert stopped.status == "interrupted"  # pg owes it
    # The mapping changes: the warehouse's code version with it; pg is gone.
    changed = make_config(data, destinations={"warehouse": {
        **destinations["warehouse"],
        "mappings": {"fields": [{"src": "/n", "dst": "/number", "action": "move"}]},
    }}, state=state)  # fmt: skip
    _segment(data, "2026-11-20T11-00-00.000", [{"event_type": "page", "n": 5}])
    process_pending(changed, spark)

    second, first = open_state(config).history()
    assert (data / "state.sqlite").exists() == (store == "sqlite")
    # pg left the config: nobody owes the first run any more.
    assert (first.trigger, first.segments, first.status) == ("once", 1, "done")
    assert first.code_versions == {
        "warehouse": code_version(config, "warehouse"), "pg": code_version(config, "pg"),
    }  # fmt: skip
    tables = {(t.destination, t.table): t for t in first.tables}
    assert tables[("warehouse", "page")] == TableRun("warehouse", "page", "ok", 2, None)
    assert tables[("warehouse", "click")].rows == 1
    assert tables[("pg", "*")].status == "failed"
    assert "127.0.0.1" in (tables[("pg", "*")].error or "")
    assert ("warehouse", 1, 0, 0) in first.events  # the empty table name: skipped
    assert first.finished_at is not None
    assert first.started_at <= first.finished_at

    assert second.status == "done"
    assert second.code_versions == {"warehouse": code_version(changed, "warehouse")}
    assert second.code_versions["warehouse"] != first.code_versions["warehouse"]
    assert [(t.table, t.rows) for t in second.tables] == [("page", 1)]

    path = write_config(tmp_path / "eventpipe.yaml", data, 0, destinations={
        "warehouse": {"type": "duckdb", "table_name_template": "{{ event_type }}"},
    }, state=state)  # fmt: skip
    result = run("status", "--history", "--limit", "1", "-c", str(path))
    assert result.returncode == 0, result.stderr
    header, _, row, count = result.stdout.splitlines()
    assert header.split(" | ")[0].strip() == "run"
    cells = [c.strip() for c in row.split("|")]
    assert cells[0] == second.run_id
    assert cells[3:8] == ["once", "done", "1", "warehouse", second.code_versions["warehouse"]]
    assert cells[8] == "page 1"
    assert count == "(1 row)"
    status = run("status", "-c", str(path))
    assert status.returncode == 0, status.stderr
    [where] = [line for line in status.stdout.splitlines() if line.startswith("state: ")]
    if store == "postgres":
        host_port = state["dsn"].split("@")[1]  # 127.0.0.1:<port>/postgres
        assert where == f"state: postgres {host_port} schema {state['schema']}"
    else:
        assert where == f"state: {data / 'state.sqlite'}"
