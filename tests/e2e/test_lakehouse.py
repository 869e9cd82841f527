"""Iceberg and Delta tables through the pipeline: the same events give the same rows and
types as in DuckDB, read back with each format's own library; new columns arrive in
later batches; a reprocess replaces exactly a day's rows; the same on S3 (moto's server)."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from eventpipe.config import Config
from eventpipe.destinations.lakehouse import lattice_type
from eventpipe.destinations.registry import iceberg_catalog
from eventpipe.errors import ConfigError
from eventpipe.processing.batch.job import process_once, process_pending
from eventpipe.processing.modes import reprocess as rp
from eventpipe.processing.runtime.pipeline import Runtime
from eventpipe.reserved import DAY
from tests.conftest import WEB_SERVER, make_config
from tests.e2e.test_batch_pipeline import _post, _seal
from tests.e2e.test_reprocess import MOVE_N, REBUILT_20TH, _three_days
from tests.process import free_port, run, write_config

TEMPLATE = {"table_name_template": "{{ event_type }}"}
LAKES = {"ice": {"type": "iceberg", **TEMPLATE}, "lake": {"type": "delta", **TEMPLATE}}

EVENTS = [
    {"event_type": "order", "n": 1, "price": 9.5, "big": 10**30, "ok": True,
     "at": "2026-11-20T08:00:00Z", "tags": ["a", "b"], "user": {"id": 7, "plan": "pro"},
     "select": "a reserved word", "Mixed Case": "x", "_timestamp": "2026-11-20T23:59:00Z"},
    {"event_type": "order", "n": 2, "price": None, "ok": False, "user": {"id": 8},
     "_timestamp": "2026-11-21T00:01:00Z"},
    {"event_type": "view", "url": "/a", "_timestamp": "2026-11-21T10:00:00Z"},
]  # fmt: skip


def iceberg_rows(config: Config, dest_id: str, table: str) -> tuple[dict[str, Any], list[dict]]:
    """The table's Arrow schema and rows as pyiceberg reads them."""
    from pyiceberg.catalog import load_catalog

    dest = config.destinations[dest_id]
    catalog = load_catalog(dest_id, **iceberg_catalog(dest, config))  # type: ignore[arg-type]
    scanned = catalog.load_table((dest_id, table)).scan().to_arrow()
    return {f.name: f.type for f in scanned.schema}, scanned.to_pylist()


def delta_rows(config: Config, table: str) -> tuple[dict[str, Any], list[dict]]:
    """The table's Arrow schema and rows as deltalake reads them (the day column apart)."""
    from deltalake import DeltaTable

    read = DeltaTable(str(config.layout.root / "delta" / table)).to_pyarrow_table()
    return {f.name: f.type for f in read.schema}, read.to_pylist()


def _naive(row: dict[str, Any]) -> dict[str, Any]:
    """Instants as DuckDB's TIMESTAMP holds them: UTC wall-clock time."""
    return {
        k: v.astimezone(UTC).replace(tzinfo=None) if isinstance(v, datetime) else v
        for k, v in row.items()
        if k != DAY
    }


def _duckdb(config: Config, table: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    warehouse = Runtime(config).open_destination("warehouse")
    names, rows = warehouse.query(f'SELECT * FROM "{table}"')
    described = warehouse.describe(table)
    assert described is not None
    return dict(described.columns), [dict(zip(names, row, strict=True)) for row in rows]


def _by_id(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted((_naive(r) for r in rows), key=lambda r: r["eventn_ctx_event_id"])


def test_lakehouse_tables_hold_what_duckdb_holds(start_collector: Any, spark: Any) -> None:
    c = start_collector(destinations={"warehouse": {"type": "duckdb", **TEMPLATE}, **LAKES})
    # json, not orjson: an integer beyond 64 bits (an INT128 column) is sent as digits.
    posted = httpx.post(c.url + "/api/v1/s2s/event", content=json.dumps(EVENTS),
                        headers={"X-Auth-Token": WEB_SERVER})  # fmt: skip
    assert posted.status_code == 200, posted.text
    _seal(c)
    report = process_once(c.config, spark)
    assert report is not None
    assert sum(report.failed.values()) == 0
    for dest in ("warehouse", "ice", "lake"):
        assert report.loaded[(dest, "order")] == 2
        assert report.loaded[(dest, "view")] == 1
    # A later batch brings a column: added to the tables, earlier rows null in it.
    _post(c, [{"event_type": "order", "n": 3, "color": "red",
               "_timestamp": "2026-11-22T12:00:00Z"}], server=True)  # fmt: skip
    _seal(c)
    process_once(c.config, spark)
    for table in ("order", "view"):
        types, expected = _duckdb(c.config, table)
        ice_types, ice = iceberg_rows(c.config, "ice", table)
        delta_types, delta = delta_rows(c.config, table)
        assert _by_id(ice) == _by_id(expected), table
        assert _by_id(delta) == _by_id(expected), table
        assert {k: lattice_type(t) for k, t in ice_types.items()} == types
        assert {k: lattice_type(t) for k, t in delta_types.items() if k != DAY} == types
    [order] = [r for r in iceberg_rows(c.config, "ice", "order")[1] if r["n"] == 1]
    assert (order["big"], order["tags"], order["select"]) == (
        Decimal(10**30), '["a","b"]', "a reserved word")  # fmt: skip
    assert {r[DAY] for r in delta_rows(c.config, "order")[1]} == {
        date(2026, 11, 20), date(2026, 11, 21), date(2026, 11, 22)}  # fmt: skip
    # eventpipe query reads them too, and the batches their commits record.
    for dest_id in ("ice", "lake"):
        opened = Runtime(c.config).open_destination(dest_id)
        assert opened.query('SELECT count(*), count(color) FROM "order"')[1] == [(3, 1)]
        assert opened.query("SELECT count(*) FROM _eventpipe_loads")[1] == [(3,)]


def _reprocess_the_20th(spark: Any, after: Config, dest_id: str) -> Any:
    """Reprocess 2026-11-20 of _three_days into ``dest_id``, its rows checked; the
    destination, opened."""
    _, results = rp.reprocess(spark, after, dest_id, date(2026, 11, 20), date(2026, 11, 20))
    assert results[0].rows == {"page": 2, "click": 2}
    opened = Runtime(after).open_destination(dest_id)
    for table, rows in REBUILT_20TH.items():
        _, found = opened.query(
            f"SELECT eventn_ctx_event_id, strftime(_timestamp, '%Y-%m-%d'), number, n FROM {table}"
        )
        assert sorted(found) == rows, (dest_id, table)
    return opened


def test_a_reprocess_replaces_a_days_rows_in_lakehouse_tables(tmp_path: Path, spark: Any) -> None:
    data = tmp_path / "data"
    _three_days(data)
    process_pending(make_config(data, destinations=LAKES), spark)
    after = make_config(data, destinations={d: {**lake, "mappings": MOVE_N}
                                            for d, lake in LAKES.items()})  # fmt: skip
    for dest_id in LAKES:
        opened = _reprocess_the_20th(spark, after, dest_id)
        assert opened.tables() == ["click", "page"]  # the shadows went with the swap
        _, again = rp.reprocess(spark, after, dest_id, date(2026, 11, 20), date(2026, 11, 20))
        assert again == []
    # The operator's maintenance, from the command line: the same rows in fewer files.
    config_file = write_config(tmp_path / "eventpipe.yaml", data, free_port(),
                               destinations={d: {**lake, "mappings": MOVE_N}
                                             for d, lake in LAKES.items()})  # fmt: skip
    for dest_id in LAKES:
        compacted = run("lake", "compact", "--destination", dest_id, "-c", str(config_file))
        assert compacted.returncode == 0, compacted.stderr
        assert f"{dest_id}.page: " in compacted.stdout
        expired = run("lake", "expire", "--destination", dest_id, "-c", str(config_file))
        assert expired.returncode == 0, expired.stderr
        assert "version(s) expired" in expired.stdout
        opened = Runtime(after).open_destination(dest_id)
        _, found = opened.query("SELECT eventn_ctx_event_id, number, n FROM page")
        assert sorted(found) == [(e, number, n) for e, _, number, n in REBUILT_20TH["page"]]
    status = run("status", "-c", str(config_file))
    assert status.returncode == 0, status.stderr
    assert {"iceberg", "delta"} <= set(status.stdout.split())
    unknown = run("lake", "compact", "-c", str(config_file))
    assert unknown.returncode != 0
    assert "no iceberg or delta destination (configured: ice, lake)" in unknown.stderr


def test_lakes_on_s3_hold_what_duckdb_holds_and_a_reprocess_replaces_a_day_there(
    tmp_path: Path, spark: Any, s3_server: Any, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parquet, Iceberg and Delta on S3 (moto's server) through the pipeline, the
    credentials from the environment only: what DuckDB holds, then a day rebuilt."""
    from tests.s3 import ACCESS_KEY, REGION, SECRET_KEY

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_REGION", REGION)
    store = {"endpoint": s3_server.url}
    kinds = {**LAKES, "files": {"type": "parquet", **TEMPLATE}}
    lakes = {d: {**lake, "path": f"s3://{s3_bucket}/{d}", "s3": store} for d, lake in kinds.items()}
    data = tmp_path / "data"
    _three_days(data)
    config = make_config(data, destinations={"warehouse": {"type": "duckdb", **TEMPLATE}, **lakes})
    process_pending(config, spark)
    for table in ("page", "click"):
        _, expected = _duckdb(config, table)
        for dest_id in lakes:
            names, rows = (
                Runtime(config)
                .open_destination(dest_id)
                .query(f"SELECT eventn_ctx_event_id, n, _timestamp FROM {table}")
            )
            found = [dict(zip(names, row, strict=True)) for row in rows]
            assert sorted(map(_naive, found), key=str) == sorted(
                ({k: r[k] for k in names} for r in map(_naive, expected)), key=str
            ), (dest_id, table)
    assert any(k.endswith(".parquet") for k in s3_server.keys(s3_bucket, "files/page/"))
    after = make_config(data, destinations={d: {**lake, "mappings": MOVE_N}
                                            for d, lake in lakes.items()})  # fmt: skip
    for dest_id in LAKES:
        opened = _reprocess_the_20th(spark, after, dest_id)
        assert opened.tables() == ["click", "page"]  # the shadows went, from the bucket too
    with pytest.raises(ConfigError, match="an object store has no rename"):
        rp.replaceable(after, "files")
    # The credentials were handed to the libraries, never written.
    for path in (p for p in data.rglob("*") if p.is_file()):
        assert SECRET_KEY.encode() not in path.read_bytes(), path
