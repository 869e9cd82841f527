"""kill -9 `eventpipe process` while it streams events from a log being written (and
sealed meanwhile), start it again: in the end every event is in the destination once."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import duckdb
import orjson
import pytest

from tests.process import EVENTPIPE, _env, write_config

EVENTS = 3_000
CHUNK = 60


def _writer(incoming: Path, done: threading.Event) -> None:
    """Appends events to the active segment in chunks, as the collector does, and seals
    it (a rename) halfway."""
    rng = random.Random(3)
    incoming.mkdir(parents=True, exist_ok=True)
    active = incoming / "incoming.tok=web.log"
    for start in range(0, EVENTS, CHUNK):
        lines = b"".join(
            orjson.dumps({
                "event_type": rng.choice(["click", "view"]), "n": i, "api_key": "web",
                "_timestamp": "2026-11-22T10:00:00.000000Z",
                "eventn_ctx": {"event_id": f"e{i}"},
            }) + b"\n"
            for i in range(start, start + CHUNK)
        )  # fmt: skip
        with active.open("ab") as out:
            out.write(lines)
            out.flush()
            os.fsync(out.fileno())
        if start == EVENTS // 2:
            os.replace(active, incoming / "incoming.tok=web-2026-11-22T10-00-00.000.log")
        time.sleep(0.5)
    done.set()


def _rows(data: Path) -> tuple[int, int]:
    db = duckdb.connect(str(data / "warehouse.duckdb"), read_only=True)
    try:
        [(total, distinct)] = db.execute(
            "SELECT count(*), count(DISTINCT eventn_ctx_event_id) FROM "
            "(SELECT eventn_ctx_event_id FROM click UNION ALL SELECT eventn_ctx_event_id FROM view)"
        ).fetchall()
        return int(total), int(distinct)
    finally:
        db.close()


@pytest.mark.slow
def test_a_stream_killed_mid_flight_resumes_with_every_event_once(tmp_path: Path) -> None:
    data = tmp_path / "data"
    config = write_config(
        tmp_path / "eventpipe.yaml", data, 0,
        destinations={"warehouse": {"type": "duckdb", "mode": "stream",
                                    "table_name_template": "{{ event_type }}",
                                    "stream_interval_seconds": 0.5}},
        spark={"master": "local[2]", "spark.sql.shuffle.partitions": 2},
    )  # fmt: skip
    done = threading.Event()
    writer = threading.Thread(target=_writer, args=(data / "incoming", done))
    writer.start()
    progress = data / "incoming" / "queue.dst=warehouse" / "progress.json"
    kills, rng = 0, random.Random(5)
    while not done.is_set() or kills < 2:
        output = (tmp_path / f"process-{kills}.log").open("wb")
        proc = subprocess.Popen([*EVENTPIPE, "process", "-c", str(config)],
                                stdout=output, stderr=subprocess.STDOUT, env=_env())  # fmt: skip
        # Kill once this process has loaded a micro-batch, at a moment within the next ones.
        since = progress.stat().st_mtime if progress.exists() else 0.0
        deadline = time.monotonic() + 120
        while not (progress.exists() and progress.stat().st_mtime > since):
            if time.monotonic() > deadline:
                proc.kill()
                pytest.fail(
                    "no progress: " + (tmp_path / f"process-{kills}.log").read_text()[-4000:]
                )
            time.sleep(0.1)
        time.sleep(rng.uniform(0.2, 2.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        output.close()
        kills += 1
    writer.join()
    streamed, _ = _rows(data)
    assert streamed > 0  # it streamed between the kills
    final = subprocess.run([*EVENTPIPE, "process", "--once", "-c", str(config)],
                           capture_output=True, text=True, env=_env(), timeout=300)  # fmt: skip
    assert final.returncode == 0, final.stderr[-3000:]
    assert kills >= 2
    assert _rows(data) == (EVENTS, EVENTS)
    # The sealed segment was read by the stream, so the batch side archived it.
    assert not list((data / "incoming").glob("incoming.tok=web-*.log"))
