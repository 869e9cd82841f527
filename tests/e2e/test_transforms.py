"""A destination's namespace and transforms (filter, set, drop, python), between the log
and its tables: what each lets through, what it changes, and that a failing one sends
events to failed/ without stopping the run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import orjson
import pytest

from eventpipe.config import Config
from eventpipe.errors import ConfigError
from eventpipe.processing.batch.job import process_pending
from eventpipe.processing.batch.version import code_version
from eventpipe.state.store import open_state
from tests.conftest import make_config, read_lines

FUNCTIONS = "tests.transform_functions"


def _segment(data: Path, stamp: str, events: list[dict[str, Any]]) -> None:
    (data / "incoming").mkdir(parents=True, exist_ok=True)
    lines = b"".join(orjson.dumps({"api_key": "web", **e}) + b"\n" for e in events)
    (data / "incoming" / f"incoming.tok=web-{stamp}.log").write_bytes(lines)


def _config(data: Path, **destinations: dict[str, Any]) -> Config:
    return make_config(data, destinations={
        dest_id: {"type": "duckdb", "path": str(data / f"{dest_id}.duckdb"), **dest}
        for dest_id, dest in destinations.items()
    })  # fmt: skip


def _query(config: Config, dest_id: str, sql: str) -> list[tuple[Any, ...]]:
    with duckdb.connect(config.destinations[dest_id].path or "", read_only=True) as db:
        return db.execute(sql).fetchall()


def _tables(config: Config, dest_id: str) -> list[str]:
    rows = _query(config, dest_id, "SELECT table_name FROM information_schema.tables "
                  "WHERE table_name NOT LIKE '\\_%' ESCAPE '\\' ORDER BY 1")  # fmt: skip
    return [name for (name,) in rows]


USAGE = [
    {"event_type": "usage", "n": 1, "properties": {"usage_mb": 2048, "plan": "pro",
                                                   "debug": "x"}},
    {"event_type": "usage", "n": 2, "properties": {"usage_mb": 50, "plan": "free"}},
    {"event_type": "usage", "n": 3, "properties": {"usage_mb": "lots", "plan": "pro"}},
    {"event_type": "usage", "n": 4, "properties": {"plan": "pro"}},
    {"event_type": "page", "n": 5, "properties": {"usage_mb": 4096}},
]  # fmt: skip


def test_namespace_filter_set_and_drop(tmp_path: Path, spark: Any) -> None:
    data = tmp_path / "data"
    _segment(data, "2026-11-21T10-00-00.000", USAGE)
    config = _config(
        data,
        everything={"table_name_template": "{{ event_type }}"},
        billing={
            "table_name_template": "{{ event_type }}",
            "namespace": "^usage$",
            "transforms": [
                {"filter": "properties.usage_mb > 100 OR properties.plan = 'free'"},
                {
                    "set": {
                        "usage_gb": "properties.usage_mb / 1024",
                        "properties.tier": "upper(properties.plan)",
                        "ratio": "properties.usage_mb / (n - 2)",
                    }
                },
                {"drop": ["properties.debug", "properties.missing", "no_such_field"]},
            ],
        },
    )
    [report] = process_pending(config, spark)
    assert _tables(config, "everything") == ["page", "usage"]  # others untouched
    assert _query(config, "everything", "SELECT count(*) FROM usage") == [(4,)]
    assert _tables(config, "billing") == ["usage"]  # the namespace: no page table
    rows = _query(config, "billing", "SELECT n, usage_gb, properties_tier, ratio "
                  "FROM usage ORDER BY n")  # fmt: skip
    # n=3: "lots" is no number, the comparison null: filtered, not failed (and the batch
    # goes on); n=4 has no usage_mb; n=2's division by zero is null, not an error.
    assert rows == [(1, 2.0, "PRO", -2048.0), (2, 50 / 1024, "FREE", None)]
    columns = {c for (c,) in _query(config, "billing", "SELECT column_name FROM "
               "information_schema.columns WHERE table_name = 'usage'")}  # fmt: skip
    assert "properties_debug" not in columns
    assert report.filtered == {"everything": 0, "billing": 3}  # n=3, n=4, and the page
    assert report.failed == {"everything": 0, "billing": 0}
    summary = open_state(config).summary("billing")
    assert (summary.filtered, summary.failed, summary.rows_loaded) == (3, 0, 2)
    [run] = open_state(config).history()
    assert ("billing", 0, 0, 3) in run.events


def test_python_transforms_on_arrow_and_pandas(tmp_path: Path, spark: Any) -> None:
    data = tmp_path / "data"
    countries = ["de", "us", "fr", "de", "jp", "us"]
    _segment(data, "2026-11-21T10-00-00.000", [
        {"event_type": "visit", "n": n, "country": c} for n, c in enumerate(countries)
    ])  # fmt: skip
    config = _config(data, warehouse={"transforms": [
        {"python": f"{FUNCTIONS}:keep_even"},
        {"python": f"{FUNCTIONS}:with_region"},
    ]})  # fmt: skip
    [report] = process_pending(config, spark)
    rows = _query(config, "warehouse", "SELECT n, country, region FROM events ORDER BY n")
    assert rows == [(0, "DE", "eu"), (2, "FR", "eu"), (4, "JP", None)]
    assert report.filtered == {"warehouse": 3}


def test_a_python_transform_takes_lookups_that_found_nothing(
    tmp_path: Path, spark: Any, geo_database: Path
) -> None:
    """A lookup's result is a struct no event's own field declares nullable; an address
    the database lacks makes it null. The transform's output schema, learnt from a
    sample, must allow that null in any batch (it was a NullPointerException in a
    Spark task, then every event isolated)."""
    data = tmp_path / "data"
    _segment(data, "2026-11-21T10-00-00.000", [
        {"event_type": "visit", "n": n, "source_ip": ip,
         "eventn_ctx": {"event_id": f"e{n}", "user_agent": "Mozilla/5.0 (X11; Linux x86_64; "
                        "rv:133.0) Gecko/20100101 Firefox/133.0"}}
        for n, ip in enumerate(["81.2.69.10", "192.0.2.1", "192.0.2.2", "81.2.69.11"])
    ])  # fmt: skip
    config = make_config(data, enrichment={"ip_database": str(geo_database)}, destinations={
        "warehouse": {"type": "duckdb", "path": str(data / "warehouse.duckdb"),
                      "transforms": [{"python": f"{FUNCTIONS}:keep_even"}]},
    })  # fmt: skip
    [report] = process_pending(config, spark)
    rows = _query(config, "warehouse", "SELECT n, eventn_ctx_location_city, "
                  "eventn_ctx_parsed_ua_ua_family FROM events ORDER BY n")  # fmt: skip
    assert rows == [(0, "London", "Firefox"), (2, None, "Firefox")]
    assert report.failed == {"warehouse": 0}


def test_a_python_transform_that_raises_sends_its_batch_to_failed(
    tmp_path: Path, spark: Any
) -> None:
    data = tmp_path / "data"
    _segment(data, "2026-11-21T10-00-00.000", [
        {"event_type": "e", "n": 1}, {"event_type": "e", "n": 2, "boom": True},
    ])  # fmt: skip
    config = _config(
        data,
        checked={"transforms": [{"python": f"{FUNCTIONS}:fails_on_boom"}]},
        odd={"transforms": [{"python": f"{FUNCTIONS}:returns_nothing_usable"}]},
        plain={},
    )
    [report] = process_pending(config, spark)  # the run completes
    assert _query(config, "plain", "SELECT count(*) FROM events") == [(2,)]
    assert report.failed == {"checked": 2, "odd": 2, "plain": 0}
    failed = read_lines([config.layout.failed_destination("checked")])
    assert sorted(f["event"]["n"] for f in failed) == [1, 2]
    error = failed[0]["error"]
    assert error.startswith(
        f"python transform {FUNCTIONS}:fails_on_boom raised ValueError: boom in this batch"
    )
    assert "transform_functions.py:" in error
    assert "in fails_on_boom" in error
    [odd] = read_lines([config.layout.failed_destination("odd")])[:1]
    assert "returned list, not a pyarrow RecordBatch" in odd["error"]

    # Without the event that raises, the next run loads.
    _segment(data, "2026-11-21T11-00-00.000", [{"event_type": "e", "n": 3}])
    process_pending(config, spark)
    assert _query(config, "checked", "SELECT n FROM events") == [(3,)]


def test_a_filter_that_does_not_parse_stops_the_run_before_anything_loads(
    tmp_path: Path, spark: Any
) -> None:
    data = tmp_path / "data"
    _segment(data, "2026-11-21T10-00-00.000", USAGE)
    config = _config(data, warehouse={"transforms": [{"filter": "properties.usage_mb >"}]})
    with pytest.raises(ConfigError, match=r"transforms\[0\] \(filter\)"):
        process_pending(config, spark)
    assert not (data / "warehouse.duckdb").exists()
    missing = _config(data, warehouse={"transforms": [{"python": "tests.nowhere:f"}]})
    with pytest.raises(ConfigError, match=r"python transform tests\.nowhere:f"):
        process_pending(missing, spark)


def test_transforms_are_part_of_the_code_version(tmp_path: Path) -> None:
    plain = _config(tmp_path, w={})
    filtered = _config(tmp_path, w={"transforms": [{"filter": "n > 1"}]})
    other = _config(tmp_path, w={"transforms": [{"filter": "n > 2"}]})
    spaced = _config(tmp_path, w={"namespace": "^a"})
    versions = {code_version(c, "w") for c in (plain, filtered, other, spaced)}
    assert len(versions) == 4
    assert code_version(plain, "w") == code_version(_config(tmp_path, w={}), "w")


def test_a_changed_python_transform_changes_the_code_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = tmp_path / "my_transforms.py"
    module.write_text("def keep(batch):\n    return batch\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = _config(tmp_path, w={"transforms": [{"python": "my_transforms:keep"}]})
    before = code_version(config, "w")
    module.write_text("def keep(batch):\n    return batch.slice(0, 1)\n")
    assert code_version(config, "w") != before


def test_a_runs_report_names_the_filtered_events(capsys: pytest.CaptureFixture[str]) -> None:
    from eventpipe.cli.common import print_report
    from eventpipe.processing.batch.run import RunReport

    report = RunReport("run-1", ("s1",), False, loaded={("billing", "usage"): 2},
                       filtered={"billing": 3, "other": 0},
                       replaced={"billing": 4, "other": 0})  # fmt: skip
    print_report(report)
    lines = capsys.readouterr().out.splitlines()
    assert ("  billing: 3 event(s) filtered (namespace, transforms, or metering's older "
            "versions of a key)") in lines  # fmt: skip
    assert "  billing: 4 row(s) of earlier runs replaced by newer versions" in lines
    assert not any(line.startswith("  other:") for line in lines)


SECRET = "a-secret-of-32-characters-length"


def _hmac(value: str) -> str:
    import hashlib
    import hmac

    return hmac.new(SECRET.encode(), value.encode(), hashlib.sha256).hexdigest()


def test_hash_replaces_fields_by_their_keyed_hash(tmp_path: Path, spark: Any) -> None:
    data = tmp_path / "data"
    _segment(data, "2026-11-24T10-00-00.000", [
        {"eventn_ctx": {"event_id": "a"}, "userId": "u-1", "n": 1,
         "traits": {"email": "ada@example.com", "plan": "pro"}, "address": {"city": "Oslo"}},
        {"eventn_ctx": {"event_id": "b"}, "userId": 42, "n": 2, "traits": {"plan": "free"}},
        {"eventn_ctx": {"event_id": "c"}, "n": 3},
    ])  # fmt: skip
    hashing = {"hash": ["traits.email", "userId", "address", "nobody.has"], "secret": SECRET}
    config = _config(data, warehouse={"transforms": [hashing]})
    process_pending(config, spark)
    rows = _query(config, "warehouse", "SELECT eventn_ctx_event_id, traits_email, traits_plan, "
                  '"userId", address FROM events ORDER BY 1')  # fmt: skip
    assert rows == [
        ("a", _hmac("ada@example.com"), "pro", _hmac("u-1"), _hmac('{"city":"Oslo"}')),
        ("b", None, "free", _hmac("42"), None),  # as Python's hmac module, value as text
        ("c", None, None, None, None),
    ]
    other = _config(tmp_path / "other", warehouse={"transforms": [
        {**hashing, "secret": "another-secret-32-characters-long"}]})  # fmt: skip
    assert code_version(other, "warehouse") != code_version(config, "warehouse")


def test_hash_takes_a_secret_and_only_with_hash() -> None:
    from eventpipe.config import parse_config

    def error(step: dict[str, Any]) -> str:
        with pytest.raises(ConfigError) as refused:
            parse_config({"destinations": {"w": {"type": "duckdb", "transforms": [step]}}},
                         source="t", env={})  # fmt: skip
        return str(refused.value)

    assert "hash needs a secret" in error({"hash": ["userId"]})
    assert "secret goes with hash" in error({"drop": ["x"], "secret": SECRET})
    assert "at least 16 characters" in error({"hash": ["userId"], "secret": "short"})


def test_the_bot_recipe_filters_crawlers(tmp_path: Path, spark: Any) -> None:
    data = tmp_path / "data"
    agents = {"bot": "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
              "person": "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0",
              "unknown": None}  # fmt: skip
    _segment(data, "2026-11-24T10-00-00.000", [
        {"eventn_ctx": {"event_id": who, "user_agent": agent}} for who, agent in agents.items()
    ])  # fmt: skip
    recipe = {"filter": "coalesce(eventn_ctx.parsed_ua.bot, false) = false"}
    config = _config(data, warehouse={"transforms": [recipe]})
    process_pending(config, spark)
    kept = _query(config, "warehouse", "SELECT eventn_ctx_event_id FROM events ORDER BY 1")
    assert kept == [("person",), ("unknown",)]
