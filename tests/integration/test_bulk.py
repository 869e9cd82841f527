"""``POST /api/v1/s2s/bulk``: NDJSON stored as it streams, bad lines rejected alone by
number, ids from content so that a retried upload adds nothing, gzip, and a size limit
that keeps what came before it."""

from __future__ import annotations

import gzip
from typing import Any

import httpx
import orjson

from tests.conftest import WEB_JS, WEB_SERVER, read_lines
from tests.e2e.test_batch_pipeline import _seal

URL = "/api/v1/s2s/bulk"


def _ndjson(count: int, start: int = 0) -> bytes:
    return b"".join(orjson.dumps({"event_type": "tick", "n": n}) + b"\n"
                    for n in range(start, start + count))  # fmt: skip


def test_lines_stream_into_the_log_and_bad_ones_are_rejected_by_number(
    start_collector: Any,
) -> None:
    c = start_collector()
    body = _ndjson(2) + b"{broken\n\n" + _ndjson(1, 2) + b"[1]\n" + b'{"n": 9}'  # no last \n
    answer = httpx.post(c.url + URL, content=body, headers={"X-Auth-Token": WEB_SERVER})
    assert answer.status_code == 200
    found = answer.json()
    assert (found["status"], found["accepted"], found["rejected_count"]) == ("partial", 4, 2)
    [broken, array] = found["rejected"]
    assert broken["line"] == 3
    assert broken["error"].startswith("not valid JSON")
    assert array == {"line": 6, "error": "is a JSON array, not an object"}
    again = httpx.post(c.url + URL, content=body, headers={"X-Auth-Token": WEB_SERVER})
    assert again.json()["accepted"] == 4
    _seal(c)
    events = read_lines(c.layout.sealed_segments())
    ids = [e["eventn_ctx"]["event_id"] for e in events]
    assert len(ids) == 8
    assert len(set(ids)) == 4  # the retried upload's ids are the first's
    failed = read_lines(c.layout.failed_received("web"))
    assert sorted(f["error"].split(":")[0] for f in failed) == [
        "line 3",
        "line 3",
        "line 6",
        "line 6",
    ]


def test_gzip_and_the_size_limit_which_keeps_what_came_before(start_collector: Any) -> None:
    c = start_collector(server={"max_bulk_bytes": 4096})
    zipped = httpx.post(c.url + URL, content=gzip.compress(_ndjson(20)),
                        headers={"X-Auth-Token": WEB_SERVER,
                                 "Content-Encoding": "gzip"})  # fmt: skip
    assert zipped.json() == {"status": "ok", "accepted": 20}
    big = _ndjson(500)  # about 15 KB
    over = httpx.post(c.url + URL, content=big, headers={"X-Auth-Token": WEB_SERVER})
    assert over.status_code == 413
    kept = over.json()["accepted"]
    assert 0 < kept < 500
    assert "the lines before it are kept" in over.json()["error"]
    _seal(c)
    assert len(read_lines(c.layout.sealed_segments())) == 20 + kept


def test_bulk_takes_server_keys_only(start_collector: Any) -> None:
    c = start_collector()
    browser = httpx.post(c.url + URL, content=_ndjson(1), params={"token": WEB_JS})
    assert browser.status_code == 403
    nobody = httpx.post(c.url + URL, content=_ndjson(1))
    assert nobody.status_code == 401
