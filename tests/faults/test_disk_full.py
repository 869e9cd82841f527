"""A full disk, on a small filesystem made for the test (a 4 MB tmpfs): the collector
answers 503, nothing already written is damaged, nothing of a refused request is kept,
and it accepts events again by itself once space returns."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.conftest import WEB_SERVER
from tests.e2e.test_batch_pipeline import _seal


@pytest.fixture
def small_filesystem(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _post(url: str, first: int) -> httpx.Response:
    events = [{"event_id": f"e{i}", "pad": "x" * 200} for i in range(first, first + 50)]
    return httpx.post(url + "/api/v1/s2s/event", content=orjson.dumps(events),
                      headers={"X-Auth-Token": WEB_SERVER}, timeout=10)  # fmt: skip


def _logged(incoming: Path) -> list[str]:
    """The event ids in every segment; each line must be a whole JSON object."""
    ids = []
    for path in sorted(incoming.glob("incoming.tok=*.log")):
        for line in path.read_bytes().splitlines():
            ids.append(orjson.loads(line)["eventn_ctx"]["event_id"])
    return ids


def test_a_full_disk_answers_503_damages_nothing_and_recovers(
    small_filesystem: Path, start_collector: Any
) -> None:
    # Only a write that fails for lack of space turns it on (no free-space margin).
    c = start_collector(data_dir=small_filesystem / "data",
                        incoming={"min_free_disk_bytes": 0})  # fmt: skip
    stats = os.statvfs(small_filesystem)
    filler = small_filesystem / "filler"
    filler.write_bytes(b"\0" * (stats.f_bavail * stats.f_frsize - 256 * 1024))

    acknowledged: list[str] = []
    refused: list[str] = []
    first = 0
    for _ in range(200):
        response = _post(c.url, first)
        batch = [f"e{i}" for i in range(first, first + 50)]
        first += 50
        if response.status_code == 503:
            refused = batch
            break
        assert response.status_code == 200, response.text
        acknowledged += batch
    assert refused, "the disk never filled up"
    assert "No space left on device" in response.json()["error"], response.json()
    assert response.headers["Retry-After"]
    assert httpx.get(c.url + "/health").status_code == 503  # it says so to load balancers

    logged = _logged(c.layout.incoming)  # every line whole
    assert sorted(logged) == sorted(acknowledged)  # nothing lost, nothing of the refused

    filler.unlink()  # space returns
    deadline = time.monotonic() + 15
    while (response := _post(c.url, first)).status_code == 503:
        assert time.monotonic() < deadline, "did not recover by itself"
        time.sleep(0.5)
        first += 50
    assert response.status_code == 200
    acknowledged += [f"e{i}" for i in range(first, first + 50)]
    _seal(c)
    assert sorted(_logged(c.layout.incoming)) == sorted(acknowledged)


def test_a_full_disk_under_the_state_store_is_one_clear_transient_error(
    small_filesystem: Path,
) -> None:
    """`process --once` on a full disk ended in a raw sqlite3 traceback and exit 1: the
    state store says what happened in one line, as a TransientError (exit 75)."""
    from eventpipe.errors import TransientError
    from eventpipe.state.db import SqliteDatabase

    database = SqliteDatabase(small_filesystem / "state.db")
    stats = os.statvfs(small_filesystem)
    filler = small_filesystem / "filler"
    filler.write_bytes(b"\0" * (stats.f_bavail * stats.f_frsize - 64 * 1024))

    def fill() -> None:
        with database.transaction() as db:
            db.execute("CREATE TABLE t (x BLOB)")
            db.execute("INSERT INTO t VALUES (zeroblob(1000000))")

    with pytest.raises(TransientError) as info:
        fill()
    assert info.value.exit_code == 75
    assert "database or disk is full" in info.value.message
    assert info.value.fix == "free space on its disk"
    filler.unlink()
    with database.transaction() as db:  # space returns, and so does the store
        db.execute("CREATE TABLE t (x BLOB)")
