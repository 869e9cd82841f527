"""What belongs to the server stays the server's, and no secret reaches the disk.

Someone holding the public browser key tries every field the server sets (``src``,
``source_ip``, ``api_key``, another event's id, a ``_timestamp`` far in the future, a
tracking plan's marks of a clean check) on
every endpoint that takes that key; then secrets are sent every way a client could send
them, in requests taken and refused, and every file under data/ and every table of
DuckDB and PostgreSQL is searched for them. Real HTTP on 127.0.0.1, the real pipeline.
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import lz4.frame
import orjson

from eventpipe.destinations.duckdb import DuckDBDestination
from eventpipe.locks import FileLocks
from eventpipe.processing.batch.job import process_once
from tests.conftest import SHOP_JS, WEB_JS, WEB_SERVER, RunningCollector, read_lines
from tests.e2e.test_batch_pipeline import _seal

FUTURE = "2999-01-01T00:00:00Z"
SERVER_ID = "order-1"
FORGED = {"contract": "checkout/1", "contract_violations": []}
"""A tracking plan's marks, claiming a clean check that never happened."""


def _basic(secret: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{secret}:".encode()).decode()}


def _lying(n: int) -> dict[str, Any]:
    """A browser event that claims what only the server may say."""
    return {"event_type": "claim", "n": n, "source_ip": "10.9.9.9", "api_key": "shop",
            "_timestamp": FUTURE, "eventn_ctx": {"event_id": SERVER_ID, **FORGED}}  # fmt: skip


def _segment(n: int) -> dict[str, Any]:
    return {"userId": "u1", "event": "claim", "properties": {"n": n}, "messageId": SERVER_ID,
            "timestamp": FUTURE, "context": {"ip": "10.9.9.9"}, "eventn_ctx": FORGED}  # fmt: skip


def _send_every_way(c: RunningCollector) -> None:
    """The lying event through each endpoint a browser key opens."""
    url = c.url
    browser = httpx.post(f"{url}/api/v1/event", params={"token": WEB_JS}, json=[_lying(1)])
    assert browser.json()["accepted"] == 1
    track = httpx.post(f"{url}/v1/track", json=_segment(2), headers=_basic(WEB_JS))
    assert track.json()["accepted"] == 1
    in_body = httpx.post(f"{url}/v1/batch", json={"writeKey": WEB_JS, "batch": [
        {**_segment(3), "type": "track"}]})  # fmt: skip
    assert in_body.json()["accepted"] == 1
    data = base64.b64encode(orjson.dumps({**_segment(4), "writeKey": WEB_JS})).decode()
    pixel = httpx.get(f"{url}/v1/pixel/track", params={"data": data})
    assert pixel.status_code == 200


def test_a_browser_key_sets_no_server_only_field(start_collector: Any) -> None:
    c = start_collector()
    received = datetime.now(UTC)
    _send_every_way(c)
    refused = httpx.post(f"{c.url}/api/v1/event", params={"token": WEB_JS},
                         json=[{"event_type": "claim", "src": " API "}, {"ok": 1}])  # fmt: skip
    assert refused.json()["rejected"] == [
        {"index": 0, "error": 'src "api" marks events sent with a server key; a '
                              "browser key cannot send it"}]  # fmt: skip
    events = [e for e in read_lines(c.layout.active_segments()) if "ok" not in e]
    assert len(events) == 4
    for event in events:
        assert event["source_ip"] == "127.0.0.1"
        assert event["api_key"] == "web"
        assert event.get("src") != "api"
        # The browser's id lives in its key's namespace: it never names a server event.
        assert event["eventn_ctx"]["event_id"] == f"js:web:{SERVER_ID}"
        stamp = datetime.fromisoformat(event["_timestamp"])
        assert received - timedelta(seconds=5) < stamp < datetime.now(UTC)
        kept = datetime.fromisoformat(event["eventn_ctx"]["client_timestamp"])
        assert kept == datetime.fromisoformat(FUTURE)
        assert not set(FORGED) & set(event["eventn_ctx"])
    [record] = read_lines(list(c.layout.failed.glob("*.log")))
    assert record["event"]["src"] == " API "
    # A server key is believed: its own id, source_ip and time are kept.
    own = {"event_id": SERVER_ID, "_timestamp": FUTURE, "source_ip": "10.1.1.1"}
    httpx.post(f"{c.url}/api/v1/s2s/event", headers={"X-Auth-Token": WEB_SERVER}, json=own)
    server = [e for e in read_lines(c.layout.active_segments()) if e.get("src") == "api"]
    assert [(e["eventn_ctx"]["event_id"], e["_timestamp"], e["source_ip"]) for e in server] == [
        (SERVER_ID, FUTURE, "10.1.1.1")
    ]


def test_a_browser_event_never_replaces_a_server_row(start_collector: Any, spark: Any) -> None:
    c = start_collector(destinations={"warehouse": {
        "type": "duckdb", "table_name_template": "{{ event_type }}",
        "primary_key": ["eventn_ctx_event_id"]}})  # fmt: skip
    sent = {
        "event_type": "claim",
        "n": 0,
        "event_id": SERVER_ID,
        "_timestamp": "2026-01-01T00:00:00Z",
    }
    httpx.post(f"{c.url}/api/v1/s2s/event", headers={"X-Auth-Token": WEB_SERVER}, json=sent)
    httpx.post(f"{c.url}/api/v1/event", params={"token": WEB_JS}, json={**_lying(1), "src": "web"})
    _seal(c)
    assert process_once(c.config, spark) is not None
    rows = _duckdb(c).query("SELECT eventn_ctx_event_id, n, src FROM claim ORDER BY n")[1]
    assert rows == [(SERVER_ID, 0, "api"), (f"js:web:{SERVER_ID}", 1, "web")]


SECRETS = (WEB_JS, WEB_SERVER, SHOP_JS)


def test_no_secret_is_written_anywhere(
    start_collector: Any, spark: Any, postgres_dsn: str, postgres_schema: str
) -> None:
    c = start_collector(destinations={
        "warehouse": {"type": "duckdb", "table_name_template": "{{ event_type }}"},
        "pg": {"type": "postgres", "dsn": postgres_dsn, "schema": postgres_schema,
               "table_name_template": "{{ event_type }}"}})  # fmt: skip
    url = c.url
    copied = {"headers": {"authorization": f"Bearer {WEB_SERVER}"}, "WRITEKEY": SHOP_JS}
    # Taken: the key in writeKey fields of any casing and depth, and inside other text.
    context = {"writeKey": WEB_JS, "debug": copied}
    track = {"userId": "u", "event": "e", "writeKey": WEB_JS, "context": context}
    httpx.post(f"{url}/v1/track", json=track, headers=_basic(WEB_JS))
    props = {"WriteKey": "x", "note": WEB_SERVER}
    httpx.post(f"{url}/api/v1/s2s/event", headers={"X-Auth-Token": WEB_SERVER},
               json=[{"event_type": "e", "props": props}])  # fmt: skip
    # Refused before the Segment checks, with the key in the body and in the message.
    httpx.post(f"{url}/v1/batch", json={"writeKey": WEB_SERVER, "batch": [
        {"type": "track", "writeKey": WEB_SERVER}]})  # fmt: skip
    data = base64.b64encode(orjson.dumps({"writeKey": WEB_JS, "event": "no user"})).decode()
    httpx.get(f"{url}/v1/pixel/track", params={"data": data})
    # More than ten refused: the request's raw body is recorded, secrets and all.
    many = [{"type": "track", "userId": "u", "writeKey": WEB_JS}] * 12
    httpx.post(f"{url}/v1/batch", json={"batch": many, "writeKey": WEB_JS})
    browser = [{"event_type": "e", "secret": WEB_JS}] + [f"not an object {WEB_JS}"] * 11
    httpx.post(f"{url}/api/v1/event", params={"token": WEB_JS}, json=browser)
    # Jitsu 2's paths: the key in X-Write-Key, the SDK's masked copy in the body.
    jitsu = {"anonymousId": "a", "event": "j", "writeKey": "web:***",
             "properties": {"note": WEB_SERVER}}  # fmt: skip
    httpx.post(f"{url}/api/s/s2s/track", json=jitsu, headers={"X-Write-Key": f"web:{WEB_SERVER}"})
    httpx.post(f"{url}/api/s/track", json={"event": "no user", "writeKey": WEB_JS},
               headers={"X-Write-Key": f"web:{WEB_JS}"})  # fmt: skip
    # Bulk: a good line and a refused one, each with a secret in it.
    lines = [{"event_type": "j", "note": WEB_JS}, [WEB_SERVER]]
    httpx.post(f"{url}/api/v1/s2s/bulk", headers={"X-Auth-Token": WEB_SERVER},
               content=b"\n".join(orjson.dumps(line) for line in lines))  # fmt: skip
    # Malformed bodies that carry a secret, on every event endpoint.
    torn = b'{"writeKey": "' + WEB_JS.encode() + b'", "event": '
    for path, headers in [
        ("/api/v1/event?token=" + WEB_JS, {}),
        ("/api/v1/s2s/event", {"X-Auth-Token": WEB_SERVER}),
        ("/v1/track", _basic(WEB_JS)),
        ("/v1/batch", {}),
        ("/api/s/track", {"X-Write-Key": f"web:{WEB_JS}"}),
        ("/api/s/s2s/track", {"X-Write-Key": f"web:{WEB_SERVER}"}),
    ]:
        answer = httpx.post(url + path, content=torn, headers=headers)
        assert answer.status_code == 400, (path, answer.text)
    _seal(c)
    report = process_once(c.config, spark)
    assert report is not None
    assert report.loaded[("warehouse", "j")] == 2
    assert report.loaded[("warehouse", "e")] == 3
    assert report.loaded[("pg", "e")] == 3
    written = _every_file(c.layout.root)
    assert written, "nothing was written: the test proves nothing"
    assert b"[redacted]" in written
    for secret in SECRETS:
        assert secret.encode() not in written
    assert b'"writekey"' not in written.lower()
    tables = _every_value(c, postgres_dsn, postgres_schema)
    assert "[redacted]" in tables
    for secret in SECRETS:
        assert secret not in tables
    assert "writekey" not in tables.lower()


def _duckdb(c: RunningCollector) -> DuckDBDestination:
    return DuckDBDestination("warehouse", c.layout.warehouse, FileLocks(c.layout.locks))


def _every_file(root: Path) -> bytes:
    """Every file under ``root``, archives decompressed (DuckDB's own file is read
    through its tables)."""
    found = []
    for path in root.rglob("*"):
        if not path.is_file() or path.suffix in (".duckdb", ".wal"):
            continue
        data = path.read_bytes()
        if path.suffix == ".lz4":
            data = lz4.frame.decompress(data)
        found.append(data)
    return b"\n".join(found)


def _every_value(c: RunningCollector, dsn: str, schema: str) -> str:
    """Every column name and value of every table of both databases, as text."""
    import psycopg

    duck = _duckdb(c)
    names = [t for (t,) in duck.query("SELECT table_name FROM information_schema.tables")[1]]
    text = []
    for table in names:
        columns, rows = duck.query(f'SELECT * FROM "{table}"')
        text.append(repr((columns, rows)))
    with psycopg.connect(dsn) as db:
        tables = db.execute("SELECT table_name FROM information_schema.tables "
                            "WHERE table_schema = %s", [schema]).fetchall()  # fmt: skip
        for (table,) in tables:
            cursor = db.execute(f'SELECT * FROM "{schema}"."{table}"')
            columns = [d.name for d in cursor.description or []]
            text.append(repr((columns, cursor.fetchall())))
    return "\n".join(text)
