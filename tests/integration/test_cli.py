"""The `eventpipe` command as a user runs it: real processes, real signals, real files."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from eventpipe.config import load_config
from eventpipe.paths import DataLayout
from tests.conftest import read_lines
from tests.process import CollectorProcess, _env, free_port, run, write_config


def test_help_lists_the_commands_that_exist() -> None:
    result = run("--help")
    assert result.returncode == 0
    listed = {
        line.split()[0] for line in result.stdout.split("Commands:")[1].splitlines() if line.strip()
    }
    assert listed == {
        "archive",
        "collect",
        "console",
        "contract",
        "import",
        "init",
        "lake",
        "log",
        "process",
        "query",
        "read",
        "replay",
        "reprocess",
        "rotate",
        "run",
        "spark-archive",
        "spark-entry",
        "status",
    }


def test_archive_and_log_list_their_subcommands() -> None:
    for group, expected in (
        ("archive", {"cat", "restore", "verify"}),
        ("log", {"ack", "compact", "fill", "segments", "show", "status", "step"}),
    ):
        result = run(group, "--help")
        assert result.returncode == 0
        listed = {
            line.split()[0]
            for line in result.stdout.split("Commands:")[1].splitlines()
            if line.strip()
        }
        assert listed == expected


def test_version() -> None:
    from eventpipe import __version__

    result = run("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"eventpipe, version {__version__}"


def test_init_writes_a_working_config_once(tmp_path: Path) -> None:
    result = run("init", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    written = tmp_path / "eventpipe.yaml"
    assert (written.stat().st_mode & 0o777) == 0o600
    loaded = load_config(written)
    [key] = loaded.config.api_keys
    assert key.js is not None
    assert key.js.get_secret_value().startswith("js.")
    assert "#" in written.read_text()  # commented
    # The next step works as printed: `run` (a pipeline too), and a curl with the key.
    assert "next: `eventpipe run` (or `make run`)" in result.stdout
    assert f"api/v1/event?token={key.js.get_secret_value()}'" in result.stdout
    assert "eventpipe collect" not in result.stdout
    again = run("init", cwd=tmp_path)
    assert again.returncode == 2
    assert "already exists" in again.stderr
    assert "--force" in again.stderr
    other = run("init", "--force", cwd=tmp_path)
    assert other.returncode == 0
    assert load_config(written).config.api_keys[0] != key  # fresh secrets


def test_a_bad_config_stops_with_the_keys_path(tmp_path: Path) -> None:
    config = tmp_path / "eventpipe.yaml"
    config.write_text(yaml.safe_dump({"server": {"prot": 1}, "incoming": {"fsync": "maybe"}}))
    result = run("collect", "-c", str(config))
    assert result.returncode == 2
    assert "server.prot: unknown key (did you mean 'port'?)" in result.stderr
    assert "incoming.fsync" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_config_without_keys_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "eventpipe.yaml"
    config.write_text("server: {port: 0}\n")
    result = run("collect", "-c", str(config))
    assert result.returncode == 2
    assert "configures no key" in result.stderr


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[tuple[CollectorProcess, Path, DataLayout]]:
    port = free_port()
    data = tmp_path / "data"
    config = write_config(tmp_path / "eventpipe.yaml", data, port)
    proc = CollectorProcess(config, port, tmp_path / "collector.log")
    proc.wait_ready()
    yield proc, config, DataLayout(data)
    proc.kill()


def _send(proc: CollectorProcess, n: int) -> None:
    for i in range(n):
        response = httpx.post(
            proc.url + "/api/v1/event", params={"token": "js-web-secret-1"}, json={"i": i}
        )
        assert response.status_code == 200


def test_rotate_asks_the_running_collector(
    collector: tuple[CollectorProcess, Path, DataLayout],
) -> None:
    proc, config, layout = collector
    _send(proc, 3)
    result = run("rotate", "-c", str(config))
    assert result.returncode == 0, result.stderr
    sealed = layout.sealed_segments()  # one per worker that took events
    assert all(f"sealed {path}" in result.stdout for path in sealed)
    assert sorted(e["i"] for e in read_lines(sealed)) == [0, 1, 2]
    assert run("rotate", "-c", str(config)).stdout.startswith("nothing to seal")
    _send(proc, 1)  # still collecting, into a new active segment
    assert len(read_lines(layout.active_segments())) == 1


def test_status_counts_events_waiting_in_segments_not_sealed(
    collector: tuple[CollectorProcess, Path, DataLayout],
) -> None:
    """Events in a segment being written showed as `0 segment(s), 0.0 MB`: nothing to
    wait for, while a batch destination would load them only once sealed."""
    proc, config, _ = collector
    _send(proc, 3)
    shown = run("status", "-c", str(config))
    assert shown.returncode == 0, shown.stderr
    [line] = [x for x in shown.stdout.splitlines() if x.startswith("warehouse")]
    assert "0 segment(s), 0.0 MB + 3 event(s) not sealed yet" in line
    missing = run("query", "-c", str(config), "SELECT 1")
    assert "`eventpipe rotate` seals now" in missing.stderr


def test_sigterm_finishes_and_seals(collector: tuple[CollectorProcess, Path, DataLayout]) -> None:
    proc, _, layout = collector
    _send(proc, 5)
    proc.signal(signal.SIGTERM)
    assert proc.wait() == 0
    assert layout.active_segments() == []
    assert sorted(e["i"] for e in read_lines(layout.sealed_segments())) == list(range(5))
    assert "stopped; sealed" in proc.log_path.read_text()


def test_a_second_collector_on_the_same_data_dir_is_refused(
    collector: tuple[CollectorProcess, Path, DataLayout], tmp_path: Path
) -> None:
    _, _, layout = collector
    other = write_config(tmp_path / "other.yaml", layout.root, free_port())
    result = run("collect", "-c", str(other))
    assert result.returncode == 1
    assert "another eventpipe process (pid " in result.stderr  # one of its workers
    assert f"writes {layout.incoming} as writer" in result.stderr
    assert "fix:" in result.stderr


@pytest.mark.parametrize("workers", [1, 2])
def test_a_second_collector_on_a_port_in_use_exits_at_once(
    collector: tuple[CollectorProcess, Path, DataLayout], tmp_path: Path, workers: int
) -> None:
    """Workers share their port with SO_REUSEPORT, which any process of the user may
    join: a second eventpipe (another data directory, other keys) started on the port
    took half of the first one's connections. Now it exits, naming the holder."""
    proc, _, layout = collector
    other = write_config(tmp_path / "other.yaml", tmp_path / "other", proc.port,
                         server={"workers": workers})  # fmt: skip
    result = run("collect", "-c", str(other), timeout=30)
    assert result.returncode == 2, result.stderr
    assert f"127.0.0.1:{proc.port} is taken by pid " in result.stderr
    assert "eventpipe" in result.stderr  # the holder's command line
    assert "server.port" in result.stderr  # the fix
    _send(proc, 20)  # every request still reaches the first collector
    assert len(read_lines(layout.active_segments())) == 20


def test_embedded_defaults_generate_and_print_dev_keys(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()  # no eventpipe.yaml here: built-in defaults, with a port override
    port = free_port()
    proc = CollectorProcess(None, port, tmp_path / "out.log", cwd=run_dir)
    try:
        proc.wait_ready()
        keys = json.loads((run_dir / "data/dev_keys.json").read_text())
        response = httpx.post(
            proc.url + "/api/v1/event", params={"token": keys["js"]}, json={"a": 1}
        )
        assert response.status_code == 200
        proc.signal(signal.SIGINT)  # Ctrl-C
        assert proc.wait() == 0
    finally:
        proc.kill()
    text = proc.log_path.read_text()
    assert keys["js"] in text
    assert "try: curl" in text
    assert len(read_lines(DataLayout(run_dir / "data").sealed_segments())) == 1


def test_replay_names_an_unknown_destination(tmp_path: Path) -> None:
    config = write_config(tmp_path / "eventpipe.yaml", tmp_path / "data", 0)
    result = run("replay", "failed", "--destination", "nope", "-c", str(config))
    assert result.returncode == 2
    assert "no destination 'nope' (configured: warehouse)" in result.stderr


def test_query_reads_a_postgres_destination_in_its_schema(
    tmp_path: Path, postgres_dsn: str, postgres_schema: str
) -> None:
    from eventpipe.destinations.postgres import PostgresDestination
    from eventpipe.schema.diff import Table, diff
    from eventpipe.schema.types import DataType

    dest = PostgresDestination("pg", postgres_dsn, postgres_schema)
    dest.patch(diff(None, Table("events", {"kind": DataType.STRING})))
    config = write_config(tmp_path / "eventpipe.yaml", tmp_path / "data", free_port(),
                          destinations={"pg": {"type": "postgres", "dsn": postgres_dsn,
                                               "schema": postgres_schema}})  # fmt: skip
    result = run("query", "-c", str(config), "SELECT count(*) AS n FROM events")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].strip() == "n"
    assert "(1 row)" in result.stdout
    # Read-only: a write is refused, with PostgreSQL's reason.
    refused = run("query", "-c", str(config), "INSERT INTO events VALUES ('x')")
    assert refused.returncode == 1
    assert "read-only" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_a_wrong_query_gets_the_databases_answer_not_a_traceback(tmp_path: Path) -> None:
    import duckdb

    data = tmp_path / "data"
    data.mkdir()
    duckdb.connect(str(data / "warehouse.duckdb")).close()
    config = write_config(tmp_path / "eventpipe.yaml", data, free_port())
    result = run("query", "-c", str(config), "SELECT * FROM nowhere GROUP")
    assert result.returncode == 1
    assert result.stderr.startswith("error: warehouse: the query failed: Parser Error")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("mode", "hint"),
    [
        ("batch", "`eventpipe rotate` seals now, then `eventpipe process --once`"),
        ("stream", "appear within seconds"),
    ],
)
def test_query_before_anything_loaded_says_what_to_do(tmp_path: Path, mode: str, hint: str) -> None:
    config = write_config(tmp_path / "eventpipe.yaml", tmp_path / "data", free_port(),
                          destinations={"warehouse": {"type": "duckdb", "mode": mode}})  # fmt: skip
    result = run("query", "-c", str(config), "SELECT 1")
    assert result.returncode == 1
    assert "does not exist yet: nothing loaded so far" in result.stderr
    assert hint in result.stderr


def test_query_on_an_http_sink_says_it_has_no_tables(tmp_path: Path) -> None:
    sink = {"type": "http", "url": "http://127.0.0.1:9/addEvents"}
    config = write_config(tmp_path / "eventpipe.yaml", tmp_path / "data", free_port(),
                          destinations={"api": sink})  # fmt: skip
    result = run("query", "-c", str(config), "--destination", "api", "SELECT 1")
    assert result.returncode != 0
    assert "api is an http sink: it has no tables to query" in result.stderr


def test_spark_entry_prints_the_file_spark_submit_runs() -> None:
    result = run("spark-entry")
    assert result.returncode == 0
    entry = result.stdout.strip()
    assert entry.endswith("eventpipe/cli/__main__.py")
    # Run as a script, as spark-submit runs it, the file is eventpipe's command line.
    as_script = subprocess.run([sys.executable, entry, "--version"], capture_output=True,
                               text=True, env=_env())  # fmt: skip
    assert as_script.returncode == 0, as_script.stderr
    assert as_script.stdout.startswith("eventpipe, version ")


def test_the_config_may_come_before_the_command_or_from_the_environment(tmp_path: Path) -> None:
    first = tmp_path / "first.yaml"
    first.write_text("data_dir: [not, a, path]\n")
    second = tmp_path / "second.yaml"
    second.write_text("server: {port: -1}\n")
    before = run("-c", str(first), "log", "status")
    assert before.returncode == 2
    assert "first.yaml" in before.stderr
    # The command's own -c wins over the one before it.
    after = run("-c", str(first), "log", "status", "-c", str(second))
    assert "second.yaml" in after.stderr
    environ = subprocess.run([sys.executable, "-m", "eventpipe.cli", "log", "status"],
                             capture_output=True, text=True, cwd=tmp_path,
                             env={**_env(), "EVENTPIPE_CONFIG": str(second)})  # fmt: skip
    assert environ.returncode == 2
    assert "second.yaml" in environ.stderr
