"""kill -9 the collector under concurrent load, 50 times: every acknowledged event is in
the sealed segments exactly once, nothing in them is torn, and the pipeline loads each
into DuckDB exactly once. `make soak` runs it with more kills (EVENTPIPE_SOAK_KILLS).
And kill -9 of the supervisor alone leaves no worker serving."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import duckdb
import httpx
import orjson
import pytest

from eventpipe import locks
from eventpipe.log.segments import SegmentLog
from eventpipe.log.settings import LogSettings
from eventpipe.paths import DataLayout
from eventpipe.processing.batch.job import process_pending
from tests.conftest import WEB_SERVER, make_config
from tests.process import CollectorProcess, free_port, running_in_group, write_config

KILLS = int(os.environ.get("EVENTPIPE_SOAK_KILLS", "50"))
CLIENTS = 6
BUDGET_SECONDS = 10.0 * KILLS


class _Load:
    """Clients posting batches with unique ids; they record the ids that got a 200."""

    def __init__(self, url: str, prefix: str = "") -> None:
        self.url = url
        self.prefix = prefix
        """Before each id: loads of one test send ids apart."""
        self.acked: list[str] = []
        self.sent = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._client, args=(n,), daemon=True) for n in range(CLIENTS)
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self.threads:
            thread.join(10)

    def _client(self, n: int) -> None:
        rng = random.Random(n)
        seq = 0
        with httpx.Client(timeout=3.0) as client:
            while not self._stop.is_set():
                ids = [f"{self.prefix}c{n}-{seq}-{k}" for k in range(rng.randint(1, 30))]
                seq += 1
                body = orjson.dumps(
                    [{"event_id": i, "pad": "x" * rng.randint(0, 400)} for i in ids]
                )
                try:
                    response = client.post(
                        self.url + "/api/v1/s2s/event",
                        content=body,
                        headers={"X-Auth-Token": "s2s-web-secret-1"},
                    )
                except httpx.TransportError:
                    time.sleep(0.01)  # the collector is down; these ids were never acknowledged
                    continue
                with self._lock:
                    self.sent += len(ids)
                    if response.status_code == 200:
                        self.acked.extend(ids)


@pytest.mark.slow
def test_acknowledged_events_survive_repeated_kill9(tmp_path: Path, spark: Any) -> None:
    port = free_port()
    data = tmp_path / "data"
    # Small segments so that kills also land around size-based sealing.
    config = write_config(
        tmp_path / "eventpipe.yaml", data, port, incoming={"max_segment_bytes": 64_000}
    )
    log_path = tmp_path / "collector.log"
    proc = CollectorProcess(config, port, log_path)
    proc.wait_ready()
    load = _Load(proc.url)
    load.start()
    rng = random.Random(2026)
    started = time.monotonic()
    kills = 0
    try:
        while kills < KILLS and time.monotonic() - started < BUDGET_SECONDS:
            time.sleep(rng.uniform(0.05, 0.5))
            proc.kill()
            kills += 1
            proc = CollectorProcess(config, port, log_path)
            proc.wait_ready()
        time.sleep(0.3)
    finally:
        load.stop()
        proc.signal(signal.SIGTERM)
        assert proc.wait() == 0

    assert kills >= KILLS, f"only {kills} kills fitted in {BUDGET_SECONDS} s"
    layout = DataLayout(data)
    # Seen after a clean stop on a loaded machine: a worker the stop reached while it
    # still imported ended by SIGTERM's default, before its handler (workers now start
    # with the stop signals blocked). The collectors' account of the last stops says
    # which writer left a segment, and why.
    log_tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-40:])
    assert layout.active_segments() == [], log_tail
    seen: Counter[str] = Counter()
    for segment in layout.sealed_segments():
        for line in segment.read_bytes().splitlines():
            seen[orjson.loads(line)["eventn_ctx"]["event_id"]] += 1  # every line parses
    assert len(load.acked) > 1000, "the load was too small to mean anything"
    missing = [i for i in load.acked if seen[i] == 0]
    doubled = [i for i, count in seen.items() if count > 1]
    assert missing == [], f"{len(missing)} acknowledged events lost"
    assert doubled == [], f"{len(doubled)} events written twice"
    segments = len(layout.sealed_segments())

    # Then into DuckDB: each acknowledged event exactly once.
    process_pending(make_config(data), spark)
    with duckdb.connect(str(layout.warehouse), read_only=True) as db:
        loaded = Counter(dict(db.execute(
            "SELECT eventn_ctx_event_id, count(*) FROM events GROUP BY 1"
        ).fetchall()))  # fmt: skip
    lost = [i for i in load.acked if loaded[i] == 0]
    duplicates = sum(count - 1 for count in loaded.values() if count > 1)
    print(
        f"\n{kills} kills, {len(load.acked)} acknowledged, {sum(seen.values())} stored in "
        f"{segments} segments, {sum(loaded.values())} loaded, {duplicates} duplicates, "
        f"{len(lost)} lost"
    )
    assert lost == []
    assert duplicates == 0


def test_workers_stop_and_seal_when_their_supervisor_is_killed(tmp_path: Path) -> None:
    """Only the supervisor of two workers gets SIGKILL: no worker is left serving alone;
    each gets SIGTERM, and what it acknowledged is sealed. The metrics directory it
    could not remove is removed by the next collector's start."""
    port = free_port()
    data = tmp_path / "data"
    config = write_config(tmp_path / "eventpipe.yaml", data, port, server={"workers": 2})
    temporary = {"TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    proc = CollectorProcess(config, port, tmp_path / "collector.log", env=temporary)
    proc.wait_ready()
    group = proc.proc.pid  # the collector runs in a session of its own
    ids = [f"orphan-{n}" for n in range(20)]
    try:
        with httpx.Client(timeout=10) as client:
            for event_id in ids:
                answer = client.post(proc.url + "/api/v1/s2s/event",
                                     json={"event_id": event_id},
                                     headers={"X-Auth-Token": WEB_SERVER})  # fmt: skip
                assert answer.status_code == 200, answer.text
        assert len(running_in_group(group)) > 2  # the supervisor, its workers, their helpers

        os.kill(proc.proc.pid, signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
        deadline = time.monotonic() + 30
        while running_in_group(group) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert running_in_group(group) == [], "workers were left running without their supervisor"
    finally:  # kill_left_behind passes over a collector whose supervisor is dead
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    layout = DataLayout(data)
    assert layout.active_segments() == []
    stored = [orjson.loads(line)["event_id"] for segment in layout.sealed_segments()
              for line in segment.read_bytes().splitlines()]  # fmt: skip
    assert sorted(stored) == sorted(ids)

    left = [path.name for path in (tmp_path / "tmp").glob("eventpipe-metrics-*")]
    assert left, "the killed supervisor's metrics directory"
    assert all(name.startswith(f"eventpipe-metrics-{group}@") for name in left)
    again = CollectorProcess(config, port, tmp_path / "again.log", env=temporary)
    try:
        again.wait_ready()
        now = [path.name for path in (tmp_path / "tmp").glob("eventpipe-metrics-*")]
        assert len(now) == 1
        assert now[0].startswith(f"eventpipe-metrics-{again.proc.pid}@")
    finally:
        again.signal(signal.SIGTERM)
    assert again.wait(30) == 0
    assert list((tmp_path / "tmp").glob("eventpipe-metrics-*")) == []


def test_a_worker_stopped_while_it_starts_seals_what_its_predecessor_left(
    tmp_path: Path,
) -> None:
    """A killed worker's segment is sealed by the next one with its writer id. A stop
    that comes while that next one still waits for the id (the killed one's children
    held it a moment longer) lets it take the id and seal first, then exit cleanly: the
    stop leaves nothing active."""
    port = free_port()
    data = tmp_path / "data"
    config = write_config(
        tmp_path / "eventpipe.yaml", data, port, server={"workers": 2, "writer_id": "w"}
    )
    layout = DataLayout(data)
    left = SegmentLog(layout, LogSettings(), writer="w-1")  # as a kill -9 leaves it
    left.open()

    async def append() -> None:
        await left.start()
        await left.append("web", b'{"event_id":"left-behind"}\n')

    asyncio.run(append())
    left.close_sync()
    assert len(layout.active_segments()) == 1
    held = locks.acquire(layout.writer_lock("w-1"))  # worker 1 waits for it
    proc = CollectorProcess(config, port, tmp_path / "collector.log")
    try:
        proc.wait_ready()  # worker 0 serves the port
        proc.signal(signal.SIGTERM)
        time.sleep(1.0)  # worker 1 has its SIGTERM, and still waits
    finally:
        os.close(held)
    assert proc.wait(30) == 0
    assert layout.active_segments() == [], proc.log_path.read_text(errors="replace")[-3000:]
    stored = [orjson.loads(line)["event_id"] for segment in layout.sealed_segments()
              for line in segment.read_bytes().splitlines()]  # fmt: skip
    assert stored == ["left-behind"]
