"""Lookup enrichment: MaxMind lookups, user agent parsing, once per distinct value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from eventpipe.errors import ConfigError
from eventpipe.processing.steps import lookup
from eventpipe.processing.steps.fields import set_path

CHROME = (
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/120.0.6099.71 Safari/537.36"
)
IPHONE = (
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like "
    "Gecko) Version/17.1 Mobile/15E148 Safari/604.1"
)
GOOGLEBOT = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"


def test_geo_of_an_address_in_the_database(geo_database: Path) -> None:
    geo = lookup.geo_of(str(geo_database), "81.2.69.160")
    assert geo is not None
    assert geo["country"] == "GB"
    assert geo["country_name"] == "United Kingdom"
    assert geo["region"] == "ENG"
    assert geo["city"] == "London"
    assert geo["zip"] == "SW1A"
    assert geo["latitude"] == pytest.approx(51.5142)
    assert geo["timezone"] == "Europe/London"
    assert geo["asn"] is None
    ipv6 = lookup.geo_of(str(geo_database), "2001:db8::1")
    assert ipv6 is not None
    assert ipv6["city"] == "Berlin"


@pytest.mark.parametrize("ip", ["10.0.0.1", "not an ip", "", "999.1.1.1"])
def test_geo_of_unknown_or_invalid_addresses_is_null(geo_database: Path, ip: str) -> None:
    assert lookup.geo_of(str(geo_database), ip) is None


def test_the_default_database_works_offline() -> None:
    database = lookup.default_ip_database()
    lookup.check_ip_database(database)
    geo = lookup.geo_of(database, "8.8.8.8")  # in every GeoLite2 City snapshot
    assert geo is not None
    assert geo["country"] == "US"


def test_a_bad_database_path_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="ip_database"):
        lookup.check_ip_database(str(tmp_path / "missing.mmdb"))


def test_user_agents_parse() -> None:
    chrome = lookup.user_agent_of(CHROME)
    assert chrome is not None
    assert (chrome["ua_family"], chrome["ua_version"]) == ("Chrome", "120.0.6099")
    assert (chrome["os_family"], chrome["os_version"]) == ("Windows", "10")
    assert chrome["bot"] is False
    iphone = lookup.user_agent_of(IPHONE)
    assert iphone is not None
    assert (iphone["device_brand"], iphone["device_model"]) == ("Apple", "iPhone")
    assert iphone["os_family"] == "iOS"
    bot = lookup.user_agent_of(GOOGLEBOT)
    assert bot is not None
    assert bot["bot"] is True


def test_each_distinct_value_is_looked_up_once() -> None:
    calls: list[str] = []

    def fake(value: str) -> dict[str, Any] | None:
        calls.append(value)
        return {"ua_family": value.upper()} | {k: None for k in ("ua_version", "os_family",
                "os_version", "device_family", "device_brand", "device_model", "bot")}  # fmt: skip

    arrow_type = pa.struct([(name, t) for name, _, t in lookup.UA_FIELDS])
    memo: dict[str, dict[str, Any] | None] = {}
    values = pa.array(["a", "b", None, "a", "a", "b"])
    out = lookup.lookup_distinct(values, fake, arrow_type, memo)
    assert sorted(calls) == ["a", "b"]
    assert [r["ua_family"] if r else None for r in out.to_pylist()] == [
        "A", "B", None, "A", "A", "B"
    ]  # fmt: skip
    lookup.lookup_distinct(pa.array(["b", "c"]), fake, arrow_type, memo)
    assert sorted(calls) == ["a", "b", "c"]  # "b" came from the memo


def test_rules_run_as_arrow_udfs_on_spark(spark: Any, geo_database: Path) -> None:
    frame = spark.createDataFrame(
        [("81.2.69.160", CHROME), ("10.1.1.1", None), (None, GOOGLEBOT)],
        "ip string, ua string",
    )
    ip = lookup.rule_function("ip_lookup", str(geo_database))
    ua = lookup.rule_function("user_agent_parse", str(geo_database))
    rows = frame.select(ip(frame.ip).alias("geo"), ua(frame.ua).alias("ua")).collect()
    assert rows[0]["geo"]["city"] == "London"
    assert rows[0]["ua"]["ua_family"] == "Chrome"
    assert rows[1]["geo"] is None
    assert rows[1]["ua"] is None
    assert rows[2]["geo"] is None
    assert rows[2]["ua"]["bot"] is True


def test_set_path_creates_parents_and_respects_the_condition(spark: Any) -> None:
    from pyspark.sql import functions as F

    frame = spark.createDataFrame([(1, ("x",)), (2, None)], "n long, ctx struct<a: string>")
    out = set_path(frame, ("ctx", "loc", "city"), F.lit("Paris"), F.col("n") == 1)
    rows = {r["n"]: r["ctx"] for r in out.collect()}
    assert rows[1]["a"] == "x"
    assert rows[1]["loc"]["city"] == "Paris"
    assert rows[2]["loc"]["city"] is None
    # A field that already holds something else is left alone, not overwritten.
    same = set_path(frame, ("ctx", "a", "deeper"), F.lit("y"))
    assert same.collect() == frame.collect()


def test_the_ip_database_is_checked_only_when_a_rule_reads_it(tmp_path: Path) -> None:
    from eventpipe.config import parse_config
    from eventpipe.processing.steps.lookup import Lookups

    def config(browser_rules: bool, rules: list[dict[str, str]]) -> Any:
        return parse_config({
            "data_dir": str(tmp_path), "enrichment": {
                "ip_database": str(tmp_path / "missing.mmdb"), "browser_rules": browser_rules},
            "destinations": {"w": {"type": "duckdb", "enrichment": rules}},
        }, source="test")  # fmt: skip

    ua = {"name": "user_agent_parse", "from": "/ua", "to": "/parsed"}
    assert [r.name for r in Lookups.plan(config(False, [ua])).rules] == ["user_agent_parse"]
    with pytest.raises(ConfigError, match="ip_database"):
        Lookups.plan(config(True, []))
    with pytest.raises(ConfigError, match="ip_database"):
        Lookups.plan(config(False, [{"name": "ip_lookup", "from": "/ip", "to": "/geo"}]))


def _ipv4_only_database(directory: Path) -> Path:
    """An IPv4 tree (ip_version 4) where two networks share one record."""
    from mmdb_writer import MMDBWriter
    from netaddr import IPSet

    writer = MMDBWriter(ip_version=4, database_type="GeoIP2-Country")
    shared = {"country": {"iso_code": "FR", "names": {"en": "France"}}}
    writer.insert_network(IPSet(["10.0.0.0/8", "192.168.1.0/24"]), shared)
    writer.insert_network(IPSet(["172.16.5.0/28"]), {"country": {"iso_code": "JP"}})
    path = directory / "ipv4-country.mmdb"
    writer.to_db_file(str(path))
    return path


@pytest.mark.parametrize("database", ["test-city (IPv6 tree)", "IPv4 tree", "GeoLite2 City"])
def test_lookups_through_the_search_tree_equal_the_readers_own(
    database: str, geo_database: Path, tmp_path: Path
) -> None:
    import random

    if database == "IPv4 tree":
        path = str(_ipv4_only_database(tmp_path))
    elif database == "GeoLite2 City":  # 28-bit records; the test databases have 24
        path = lookup.default_ip_database()
    else:
        path = str(geo_database)
    rng = random.Random(7)
    near = ["81.2.69.", "10.1.2.", "192.168.1.", "172.16.5.", "8.8.8."]
    values: list[str | None] = [
        f"{rng.choice(near)}{rng.randint(0, 255)}" if i % 2 else
        ".".join(str(rng.randint(0, 255)) for _ in range(4))
        for i in range(3000)
    ]  # fmt: skip
    values += [None, "", "not an ip", "1.2.3.4.5", "01.2.3.4", "256.0.0.1", "255.255.255.255",
               "0.0.0.0", "2001:db8::1", "::ffff:81.2.69.1", "81.2.69.160"]  # fmt: skip
    array = pa.array(values, pa.string())
    expected = [None if v is None else lookup.geo_of(path, v) for v in values]
    assert lookup.geo_lookup(path, array).to_pylist() == expected
    assert lookup.geo_lookup(path, array).to_pylist() == expected  # again, from what it kept
    assert any(e is not None for e in expected)


def test_each_database_record_is_decoded_once_per_worker(geo_database: Path) -> None:
    path = str(geo_database)
    records = lookup._geo_records(path)
    records.keys, records.rows, records.chunks, records.size = (
        records.keys[:0],
        records.rows[:0],
        [],
        0,
    )
    addresses = pa.array([f"81.2.69.{i}" for i in range(256)] * 3)  # one record
    rows = lookup.geo_lookup(path, addresses).to_pylist()
    assert {r["city"] for r in rows if r} == {"London"}
    assert records.size == 1


def test_a_batch_of_server_events_only_gets_no_browser_lookup(
    spark: Any, tmp_path: Path, geo_database: Path
) -> None:
    """The implicit browser rules are left out of a batch whose every line is a server
    event (``src: "api"`` at its top level), and kept as soon as one line may be a
    browser event; a destination's own rules are kept either way."""
    import orjson
    from pyspark.sql.types import StringType, StructField, StructType

    from eventpipe.config import parse_config
    from eventpipe.processing.batch.glance import glance
    from eventpipe.processing.steps.lookup import Lookups

    def lines(*events: Any, raw: bytes = b"") -> list[str]:
        path = tmp_path / f"segment-{len(list(tmp_path.iterdir()))}.log"
        path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events) + raw)
        return [str(path)]

    server = {"event": "signup", "source_ip": "81.2.69.160", "src": "api", "api_key": "web"}
    browser = {"event": "click", "source_ip": "81.2.69.160", "api_key": "web"}
    tricky = {**browser, "src": "web", "properties": {"src": "api"}}  # a property's src

    def may_hold_browser_events(paths: list[str], most: int | None = None) -> bool:
        return (glance(paths) if most is None else glance(paths, most)).browser_events

    assert not may_hold_browser_events(lines(server, server) + lines(server))
    assert not may_hold_browser_events(lines(server, raw=b"\n  \n"))  # blank lines
    assert may_hold_browser_events(lines(server, browser))
    assert may_hold_browser_events(lines(server, tricky))
    assert may_hold_browser_events(lines(server, {**server, "src": "API"}))  # Spark's test
    assert may_hold_browser_events(lines(server, raw=b'{"src":"api","n":NaN}\n'))
    assert may_hold_browser_events(lines(server, server), most=10)  # too large to read
    assert may_hold_browser_events([str(tmp_path / "gone.log")])

    config = parse_config({
        "data_dir": str(tmp_path / "data"), "enrichment": {"ip_database": str(geo_database)},
        "destinations": {"w": {"type": "duckdb", "enrichment": [
            {"name": "ip_lookup", "from": "/source_ip", "to": "/geo"}]}},
    }, source="test")  # fmt: skip
    schema = StructType([StructField(n, StringType()) for n in ("source_ip", "src", "api_key")])
    lookups = Lookups.plan(config)
    browser_only = {r.column for r in lookups.rules if r.destinations is None}
    own = {r.column for r in lookups.rules if r.destinations is not None}
    assert browser_only & set(lookups.computed(schema))  # the address is looked up for both
    assert set(lookups.computed(schema, browser_events=False)) == own
