"""Usage metering end to end (seed 5): generated usage events with duplicates,
corrections arriving in later batches, late events outside the lookback window,
multi-product events, optional and not_in filters, loaded by three runs into DuckDB and
compared row for row with the expected output computed independently in plain SQL."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pytest
import yaml

from eventpipe.config import Config
from eventpipe.errors import ConfigError
from eventpipe.processing.batch.job import process_pending
from eventpipe.processing.modes import reprocess as rp
from eventpipe.processing.steps.metering import load_products
from tests import metering_sql
from tests.conftest import make_config, read_lines

CATALOGUE = [
    {"product_uid": "api-calls", "event_name": "api_call"},
    {"product_uid": "api-calls-eu", "event_name": "api_call",
     "filters": [{"path": "$.properties.region", "_in": ["eu"]}]},
    {"product_uid": "storage-paid", "event_name": "storage",
     "filters": [{"path": "$.properties.tier", "not_in": ["free"], "optional": True}]},
    {"product_uid": "storage-big", "event_name": "storage",
     "filters": [{"path": "$.properties.size", "_in": ["large"]},
                 {"path": "$.properties.region", "not_in": ["apac"]}]},
    {"product_uid": "seats", "event_name": "seat"},
]  # fmt: skip


def _event(rng: random.Random, tx: str, now: datetime, late: bool) -> dict[str, Any]:
    properties: dict[str, Any] = {"name": rng.choice(["api_call", "storage", "seat", "login"])}
    for key, choices in {"region": ["eu", "us", "apac"], "tier": ["free", "pro"],
                         "size": ["large", "small"]}.items():  # fmt: skip
        if rng.random() < 0.7:
            properties[key] = rng.choice(choices)
    properties["usage"] = rng.randint(1, 100)
    metered = now - timedelta(days=200 if late else rng.uniform(0, 80))
    return {"api_key": "web", "transaction_id": tx, "customer_id": f"c{rng.randint(1, 9)}",
            "metered_at": metered.isoformat(), "properties": properties}  # fmt: skip


def _batches(now: datetime) -> list[list[dict[str, Any]]]:
    """Three batches: new events, duplicates (same batch and later), corrections (a newer
    received_at, other properties), versions older than one already loaded, late events
    (200 days old) and their duplicates."""
    rng = random.Random(2026)
    received = now - timedelta(hours=3)
    originals: dict[str, dict[str, Any]] = {}
    batches: list[list[dict[str, Any]]] = []
    for number in range(3):
        batch = []
        for n in range(120):
            received += timedelta(seconds=1)
            roll = rng.random()
            if originals and roll < 0.2:  # an exact duplicate
                batch.append(dict(rng.choice(list(originals.values()))))
                continue
            if originals and roll < 0.35:  # a correction: same key, newer, changed
                old = rng.choice(list(originals.values()))
                fixed = _event(rng, old["transaction_id"], now, late=False)
                fixed["metered_at"] = old["metered_at"]
                fixed["received_at"] = received.isoformat()
                originals[old["transaction_id"]] = fixed
                batch.append(fixed)
                continue
            if originals and roll < 0.42:  # an older version, arriving after
                old = rng.choice(list(originals.values()))
                stale = {**_event(rng, old["transaction_id"], now, late=False),
                         "metered_at": old["metered_at"],
                         "received_at": (now - timedelta(days=1)).isoformat()}  # fmt: skip
                batch.append(stale)
                continue
            tx = f"t{number}-{n}"
            event = _event(rng, tx, now, late=roll > 0.9)
            event["received_at"] = received.isoformat()
            originals[tx] = event
            batch.append(event)
        batches.append(batch)
    return batches


def _expected(
    events: list[dict[str, Any]], products: Any, cutoff: datetime
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    db = duckdb.connect()
    db.execute("CREATE TABLE raw (id INTEGER, doc JSON)")
    db.executemany("INSERT INTO raw VALUES (?, ?)",
                   [(i, json.dumps(e)) for i, e in enumerate(events)])  # fmt: skip
    since = cutoff.replace(tzinfo=None)
    db.execute(f"CREATE TABLE kept AS {metering_sql.NEWEST}", [since, since])
    metering_sql.load_products(db, products)
    db.execute(f"CREATE TABLE matched AS {metering_sql.MATCHES.format(events='kept')}")
    usage = db.execute(
        "SELECT json_extract_string(k.doc, '$.transaction_id'), m.product_uid, "
        "CAST(json_extract(k.doc, '$.properties.usage') AS BIGINT) "
        "FROM kept k JOIN matched m ON m.id = k.id ORDER BY ALL"
    ).fetchall()
    unclassified = db.execute(
        "SELECT json_extract_string(k.doc, '$.transaction_id'), "
        "CAST(json_extract(k.doc, '$.properties.usage') AS BIGINT) "
        "FROM kept k WHERE k.id NOT IN (SELECT id FROM matched) ORDER BY ALL"
    ).fetchall()
    return usage, unclassified


def _config(data: Path, catalogue: Path, **destination: Any) -> Config:
    return make_config(data, destinations={"billing": {
        "type": "duckdb", "metering": {"products": str(catalogue)}, **destination,
    }})  # fmt: skip


def _rows(config: Config, sql: str) -> list[tuple[Any, ...]]:
    dest = config.destinations["billing"]
    if dest.type == "duckdb":
        with duckdb.connect(str(config.layout.warehouse), read_only=True) as db:
            return db.execute(sql).fetchall()
    import psycopg

    assert dest.dsn is not None
    with psycopg.connect(dest.dsn) as db:
        db.execute(f'SET search_path TO "{dest.db_schema}"')
        return [tuple(r) for r in db.execute(sql.replace("ORDER BY ALL", "ORDER BY 1, 2, 3")
                                             ).fetchall()]  # fmt: skip


@pytest.mark.parametrize("kind", ["duckdb", "postgres"])
def test_metered_rows_equal_the_seeds_sql(
    tmp_path: Path, spark: Any, kind: str, request: pytest.FixtureRequest
) -> None:
    data = tmp_path / "data"
    catalogue = tmp_path / "products.yaml"
    catalogue.write_text(yaml.safe_dump(CATALOGUE))
    where: dict[str, Any] = {}
    if kind == "postgres":
        where = {"type": "postgres", "dsn": request.getfixturevalue("postgres_dsn"),
                 "schema": request.getfixturevalue("postgres_schema")}  # fmt: skip
    config = _config(data, catalogue, **where)
    now = datetime.now(UTC)
    batches = _batches(now)
    loaded = replaced = 0
    for number, batch in enumerate(batches):
        (data / "incoming").mkdir(parents=True, exist_ok=True)
        segment = data / "incoming" / f"incoming.tok=web-2026-11-21T1{number}-00-00.000.log"
        segment.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in batch))
        [report] = process_pending(config, spark)
        loaded += sum(report.loaded.values())
        replaced += report.replaced["billing"]
    events = [e for batch in batches for e in batch]
    cutoff = now - timedelta(days=90)
    usage, unclassified = _expected(events, load_products(catalogue), cutoff)
    got_usage = _rows(config, "SELECT transaction_id, product_uid, properties_usage "
                      "FROM usage_events ORDER BY ALL")  # fmt: skip
    got_unclassified = _rows(config, "SELECT transaction_id, properties_usage, 0 "
                             "FROM unclassified ORDER BY ALL")  # fmt: skip
    assert got_usage == usage
    assert [r[:2] for r in got_unclassified] == unclassified
    # Rows of earlier runs that a newer version replaced are counted.
    assert replaced > 0
    assert loaded - replaced == len(usage) + len(unclassified)
    # What the data held: each case the test is about happened.
    keys = [e["transaction_id"] for e in events]
    assert len(keys) - len(set(keys)) > 50  # duplicates and corrections
    assert len({u[0] for u in usage}) < len(usage)  # events of several products
    late = {e["transaction_id"] for e in events if e["metered_at"] < cutoff.isoformat()}
    assert any(keys.count(k) > 1 for k in late)  # a late duplicate: kept twice
    assert not (data / "failed").exists() or not list((data / "failed").iterdir())


def test_an_event_without_a_key_fails_and_the_catalogue_is_checked_first(
    tmp_path: Path, spark: Any
) -> None:
    data = tmp_path / "data"
    catalogue = tmp_path / "products.yaml"
    catalogue.write_text(yaml.safe_dump(CATALOGUE))
    (data / "incoming").mkdir(parents=True)
    (data / "incoming" / "incoming.tok=web-2026-11-21T10-00-00.000.log").write_bytes(
        b'{"api_key": "web", "properties": {"name": "seat"}}\n'
        b'{"api_key": "web", "transaction_id": "t1", "properties": {"name": "seat"}}\n'
    )
    missing = _config(data, tmp_path / "nowhere.yaml")
    with pytest.raises(ConfigError, match=r"nowhere\.yaml"):
        process_pending(missing, spark)
    config = _config(data, catalogue)
    [report] = process_pending(config, spark)
    assert report.loaded == {("billing", "usage_events"): 1}
    [failed] = read_lines([config.layout.failed_destination("billing")])
    assert failed["error"] == "metering: the event has no transaction_id"
    with pytest.raises(ConfigError, match="meters usage"):
        rp.replaceable(config, "billing")


def test_metering_needs_a_destination_that_replaces_rows() -> None:
    with pytest.raises(ConfigError, match=r"metering is for type duckdb or postgres"):
        make_config(Path("/tmp/x"), destinations={"lake": {
            "type": "parquet", "metering": {"products": "p.yaml"}}})  # fmt: skip
    with pytest.raises(ConfigError, match="metering replaces rows of earlier batches"):
        make_config(Path("/tmp/x"), destinations={"billing": {
            "type": "duckdb", "mode": "stream", "metering": {"products": "p.yaml"}}})  # fmt: skip


def _catalogue_table(config: Config, products: list[dict[str, Any]]) -> None:
    """``products`` as the rows of table ``products`` in the destination: filters as
    DuckDB JSON or PostgreSQL jsonb."""
    rows = [(p["product_uid"], p["event_name"], json.dumps(p.get("filters", [])))
            for p in products]  # fmt: skip
    dest = config.destinations["billing"]
    if dest.type == "duckdb":
        config.layout.warehouse.parent.mkdir(parents=True, exist_ok=True)
        with duckdb.connect(str(config.layout.warehouse)) as db:
            db.execute("CREATE OR REPLACE TABLE products "
                       "(product_uid VARCHAR, event_name VARCHAR, filters JSON)")  # fmt: skip
            db.executemany("INSERT INTO products VALUES (?, ?, ?)", rows)
        return
    import psycopg

    assert dest.dsn is not None
    with psycopg.connect(dest.dsn) as db:
        db.execute(f'CREATE SCHEMA IF NOT EXISTS "{dest.db_schema}"')
        db.execute(f'SET search_path TO "{dest.db_schema}"')
        db.execute("DROP TABLE IF EXISTS products")
        db.execute("CREATE TABLE products (product_uid text, event_name text, filters jsonb)")
        db.cursor().executemany("INSERT INTO products VALUES (%s, %s, %s)", rows)


@pytest.mark.parametrize("kind", ["duckdb", "postgres"])
def test_the_catalogue_can_be_a_table_of_the_destination_read_each_run(
    tmp_path: Path, spark: Any, kind: str, request: pytest.FixtureRequest
) -> None:
    data = tmp_path / "data"
    where: dict[str, Any] = {"type": "duckdb"}
    if kind == "postgres":
        where = {"type": "postgres", "dsn": request.getfixturevalue("postgres_dsn"),
                 "schema": request.getfixturevalue("postgres_schema")}  # fmt: skip
    config = make_config(data, destinations={"billing": {
        **where, "metering": {"products_table": "products"}}})  # fmt: skip
    incoming = data / "incoming"
    incoming.mkdir(parents=True)
    segment = incoming / "incoming.tok=web-2026-11-21T10-00-00.000.log"
    segment.write_bytes(
        b'{"api_key": "web", "transaction_id": "t1", "properties": {"name": "seat"}}\n'
    )
    with pytest.raises(ConfigError, match="products_table products of destination billing: "
                                          "no such table"):  # fmt: skip
        process_pending(config, spark)
    _catalogue_table(config, CATALOGUE)
    events = [
        {"api_key": "web", "transaction_id": "t1", "properties": {"name": "seat"}},
        {"api_key": "web", "transaction_id": "t2",
         "properties": {"name": "api_call", "region": "eu"}},
        {"api_key": "web", "transaction_id": "t3",
         "properties": {"name": "storage", "tier": "free", "size": "large", "region": "us"}},
    ]  # fmt: skip
    segment.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    process_pending(config, spark)
    sql = "SELECT transaction_id, product_uid, 0 FROM usage_events ORDER BY ALL"
    assert [r[:2] for r in _rows(config, sql)] == [
        ("t1", "seats"), ("t2", "api-calls"), ("t2", "api-calls-eu"), ("t3", "storage-big"),
    ]  # fmt: skip
    # A product added to the table applies from the next run on.
    _catalogue_table(config, [*CATALOGUE, {"product_uid": "logins", "event_name": "login"}])
    (incoming / "incoming.tok=web-2026-11-21T11-00-00.000.log").write_bytes(
        b'{"api_key": "web", "transaction_id": "t4", "properties": {"name": "login"}}\n'
    )
    process_pending(config, spark)
    assert [r[:2] for r in _rows(config, sql)] == [
        ("t1", "seats"), ("t2", "api-calls"), ("t2", "api-calls-eu"), ("t3", "storage-big"),
        ("t4", "logins"),
    ]  # fmt: skip


def test_the_catalogue_is_a_file_or_a_table() -> None:
    for metered in ({}, {"products": "p.yaml", "products_table": "products"}):
        with pytest.raises(ConfigError, match="products \\(a file\\) or products_table"):
            make_config(Path("/tmp/x"), destinations={"billing": {
                "type": "duckdb", "metering": metered}})  # fmt: skip
