"""``eventpipe import``: NDJSON, JSON arrays and CSV, plain, gzip or zstd, into the log
through the collector's checks; bad lines rejected alone with their line numbers; the
same file twice adds nothing; a million lines with bad ones among them."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import Any

import orjson
import pytest
import zstandard

from eventpipe.collector.imports import import_files
from eventpipe.config import Config
from eventpipe.errors import ConfigError
from eventpipe.processing.batch.job import process_once
from eventpipe.reserved import CHECKED
from tests.conftest import make_config, read_lines
from tests.process import run, write_config


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return make_config(tmp_path / "data", destinations={"warehouse": {
        "type": "duckdb", "primary_key": ["eventn_ctx_event_id"]}})  # fmt: skip


def _logged(config: Config) -> list[dict[str, Any]]:
    return read_lines(config.layout.sealed_segments())


def test_each_format_and_compression_is_read(config: Config, tmp_path: Path) -> None:
    lines = tmp_path / "a.ndjson"
    lines.write_text("".join(json.dumps({"n": n, "kind": "line"}) + "\n" for n in range(3)))
    array = tmp_path / "b.json.gz"
    with gzip.open(array, "wt") as out:
        json.dump([{"n": n, "kind": "array", "event_id": f"id-{n}"} for n in range(2)], out)
    table = tmp_path / "c.csv.zst"
    table.write_bytes(zstandard.ZstdCompressor().compress(
        b"user.id,user.plan,kind,empty\n7,pro,csv,\n8,free,csv,\n"))  # fmt: skip
    reports = import_files(config, [lines, array, table], "shop")
    assert [(r.path.name, r.events) for r in reports] == [
        ("a.ndjson", 3), ("b.json.gz", 2), ("c.csv.zst", 2)]  # fmt: skip
    events = _logged(config)
    assert {e["api_key"] for e in events} == {"shop"}
    csv_rows = [e for e in events if e["kind"] == "csv"]
    assert csv_rows[0]["user"] == {"id": "7", "plan": "pro"}  # dotted headers nest; text
    assert "empty" not in csv_rows[0]  # an empty cell is absent
    assert sorted(e["eventn_ctx"]["event_id"] for e in events if e["kind"] == "array") == [
        "id-0", "id-1"]  # an event's own id is kept  # fmt: skip
    assert "source_ip" not in events[0]  # a file has no address to give


def test_bad_lines_are_rejected_alone_with_their_line_numbers(
    config: Config, tmp_path: Path
) -> None:
    source = tmp_path / "mixed.ndjson"
    source.write_bytes(b'{"n": 1}\n{"n": \n\n[1, 2]\n"text"\n{"n": 5, "deep": '
                       + b'{"a": ' * 70 + b"1" + b"}" * 71 + b'\n{"n": 6}\n')  # fmt: skip
    [report] = import_files(config, [source], "web")
    assert report.events == 2
    assert report.rejected == {"malformed_json": 1, "not_an_object": 2, "too_deep": 1}
    failed = read_lines(config.layout.failed_received("web"))
    assert sorted(f["error"].split(":")[0] for f in failed) == [
        "line 2", "line 4", "line 5", "line 6"]  # fmt: skip
    assert next(f for f in failed if f["error"].startswith("line 2"))["event"] == '{"n": \n'


def test_csv_is_read_strictly_and_bad_rows_are_refused_alone(
    config: Config, tmp_path: Path
) -> None:
    """An unterminated quote was one value to the end of the file, extra values were
    dropped silently: each is now a row refused with its line number."""
    source = tmp_path / "rows.csv"
    source.write_bytes(b'id,name\n1,one\n2,two,extra\n3\n\n4,"multi\nline"\n5,"open\n')
    [report] = import_files(config, [source], "web")
    assert report.events == 2
    assert report.rejected == {"bad_csv": 3}
    logged = sorted((e["id"], e["name"]) for e in _logged(config))
    assert logged == [("1", "one"), ("4", "multi\nline")]
    failed = read_lines(config.layout.failed_received("web"))
    assert sorted(f["error"] for f in failed) == [
        "line 3: has 3 values for the 2 columns of the header line",
        "line 4: has 1 values for the 2 columns of the header line",
        "line 8: is not CSV (RFC 4180): unexpected end of data",
    ]


def test_the_same_file_twice_adds_nothing(config: Config, tmp_path: Path, spark: Any) -> None:
    source = tmp_path / "events.ndjson"
    same = json.dumps({"event_type": "click", "x": 1}) + "\n"
    source.write_text(same * 2 + json.dumps({"event_type": "view"}) + "\n")
    [first] = import_files(config, [source], "web")
    [again] = import_files(config, [source], "web")
    assert first.events == 3
    assert again.skipped is not None
    assert again.skipped.startswith("already imported at ")
    [forced] = import_files(config, [source], "web", force=True)
    assert forced.events == 3
    events = _logged(config)
    ids = [e["eventn_ctx"]["event_id"] for e in events]
    assert len(ids) == 6
    assert len(set(ids)) == 3  # the forced import gave the same ids; identical lines differ
    report = process_once(config, spark)
    assert report is not None
    assert report.loaded == {("warehouse", "events"): 3}  # one row per id, in one run
    from tests.e2e.test_segment import _query_config

    assert _query_config(config, "SELECT count(*) FROM events") == [(3,)]  # by primary key


def test_imported_events_are_checked_against_their_plans_and_the_job_takes_the_verdicts(
    tmp_path: Path, spark: Any
) -> None:
    """An import checks each event it parses against its tracking plan and marks its line
    as the collector does under ``flag``; the destination loads the verdict."""
    plans = tmp_path / "plans"
    plans.mkdir()
    (plans / "checkout.json").write_bytes(orjson.dumps({
        "$id": "checkout/1", "x-eventpipe": {"event_type": "checkout"}, "type": "object",
        "properties": {"total": {"type": "number", "minimum": 0}}}))  # fmt: skip
    config = make_config(tmp_path / "data", destinations={"warehouse": {"type": "duckdb"}},
                         contracts={"plans": [str(plans)]})  # fmt: skip
    source = tmp_path / "orders.ndjson"
    source.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in [
        {"event_type": "checkout", "total": 5, "n": 1},
        {"event_type": "checkout", "total": -1, "n": 2},
        {"event_type": "view", "n": 3,
         "_eventpipe_checked": {"plans": "forged", "plan": "checkout/1"}}]))  # fmt: skip
    [report] = import_files(config, [source], "shop")
    assert (report.events, report.broken) == (3, 1)
    met, broke, other = sorted(_logged(config), key=lambda e: e["n"])
    digest = met[CHECKED]["plans"]
    assert met[CHECKED] == {"plans": digest, "plan": "checkout/1"}
    assert broke[CHECKED]["rules"] == ["minimum"]
    assert CHECKED not in other  # a mark in the file is not the import's: dropped
    assert process_once(config, spark) is not None
    from tests.e2e.test_segment import _query_config

    rows = _query_config(config, "SELECT n, eventn_ctx_contract, eventn_ctx_contract_violations "
                                 "FROM events ORDER BY n")  # fmt: skip
    assert [row[:2] for row in rows] == [(1, "checkout/1"), (2, "checkout/1"), (3, None)]
    assert rows[0][2] is None
    assert "/total minimum: -1 is less than the minimum of 0" in str(rows[1][2])


def test_a_key_that_does_not_exist_is_a_clear_error(config: Config, tmp_path: Path) -> None:
    source = tmp_path / "e.ndjson"
    source.write_text("{}\n")
    with pytest.raises(ConfigError, match="no api key 'nobody' \\(configured: shop, web\\)"):
        import_files(config, [source], "nobody")


@pytest.mark.slow
def test_a_million_lines_with_bad_ones_from_the_command_line(tmp_path: Path) -> None:
    rng = random.Random(5)
    bad = set(rng.sample(range(1, 1_000_001), 25))
    files = tmp_path / "export"  # a directory of files to import
    files.mkdir()
    source = files / "big.ndjson"
    with source.open("wb") as out:
        for n in range(1, 1_000_001):
            if n in bad:
                out.write(b'{"n": ' + str(n).encode() + b", oops}\n")
            else:
                out.write(orjson.dumps({"n": n, "event_type": "tick"}) + b"\n")
    config = write_config(tmp_path / "eventpipe.yaml", tmp_path / "data", 0)
    done = run("import", str(files), "--key", "web", "-c", str(config), timeout=280)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "big.ndjson: 999975 events, 25 rejected (25 malformed_json;" in done.stdout
    data = tmp_path / "data"
    logged = sum(len(p.read_bytes().splitlines()) for p in (data / "incoming").glob("incoming.*"))
    assert logged == 999_975
    failed = [json.loads(line) for p in (data / "failed").glob("failed.tok=web*")
              for line in p.read_text().splitlines()]  # fmt: skip
    assert sorted(int(f["error"].split(":")[0].removeprefix("line ")) for f in failed) == sorted(
        bad
    )


def test_embedded_defaults_import_with_the_development_key(tmp_path: Path) -> None:
    """No eventpipe.yaml: the collector's development key pair (data/dev_keys.json)."""
    events = tmp_path / "events.ndjson"
    events.write_text('{"event_type": "a"}\n{"event_type": "b"}\n')
    done = run("import", str(events), "--key", "dev", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "imported 2 events" in done.stdout
    assert (tmp_path / "data" / "dev_keys.json").exists()
