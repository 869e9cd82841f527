"""The exit codes schedulers read (docs/orchestration.md): 0 done, 99 nothing to do when
asked, 75 worth a retry, 2 a configuration that cannot be used. (65, a data error:
tests/integration/test_archive_cli.py and tests/e2e/test_reprocess.py.)"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from eventpipe.config import load_config
from eventpipe.processing.runtime.pipeline import pipeline_lock
from tests.process import run


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "eventpipe.yaml"
    path.write_text(yaml.safe_dump({
        "data_dir": str(tmp_path / "data"),
        "api_keys": [{"id": "web", "js": "js-web-secret-1", "server": "s2s-web-secret-1"}],
        "spark": {"master": "local[1]"},
    }))  # fmt: skip
    return path


def test_nothing_to_do_is_0_or_the_code_asked_for_without_a_spark_session(tmp_path: Path) -> None:
    config = _config(tmp_path)
    started = time.monotonic()
    idle = run("process", "--once", "-c", str(config))
    assert idle.returncode == 0, idle.stderr
    assert "nothing to process" in idle.stdout
    skipped = run("process", "--once", "--idle-exit-code", "99", "-c", str(config))
    assert skipped.returncode == 99, skipped.stderr
    nothing = run("reprocess", "--from", "2026-11-20", "--idle-exit-code", "99", "-c", str(config))
    assert nothing.returncode == 99, nothing.stdout + nothing.stderr
    assert "0 day(s) rebuilt" in nothing.stdout
    # No Spark session was started for any of them (each would take seconds, and say so).
    assert "Spark" not in idle.stderr + skipped.stderr
    print(f"three idle commands in {time.monotonic() - started:.1f} s")


def test_a_configuration_that_cannot_be_used_is_2(tmp_path: Path) -> None:
    config = tmp_path / "eventpipe.yaml"
    config.write_text("destinations: {dw: {type: duckdb, nonsense: 1}}\n")
    refused = run("process", "--once", "-c", str(config))
    assert refused.returncode == 2
    assert "nonsense" in refused.stderr


@pytest.mark.slow
def test_a_pipeline_already_running_is_75_worth_a_retry(tmp_path: Path) -> None:
    config = _config(tmp_path)
    events = tmp_path / "e.ndjson"
    events.write_text('{"event_type": "e"}\n')
    assert run("import", str(events), "--key", "web", "-c", str(config)).returncode == 0
    with pipeline_lock(load_config(config).config):  # another pipeline holds the directory
        busy = run("process", "--once", "-c", str(config), timeout=180)
    assert busy.returncode == 75, busy.stderr
    assert "another pipeline" in busy.stderr
