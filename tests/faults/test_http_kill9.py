"""kill -9 `eventpipe process --once` while it sends to an HTTP API, then run it again:
every event reaches the API, and the only events it gets twice are those of requests
that were in flight at the kill, which the resumed run counts as possible duplicates."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest

from tests.addevents import AddEventsServer, addevents_server
from tests.process import EVENTPIPE, _env, write_config

EVENTS = 3000
SESSIONS = ["page", "click", "signup", "purchase"]


def _segments(data: Path) -> None:
    incoming = data / "incoming"
    incoming.mkdir(parents=True)
    for part in range(3):
        lines = [
            orjson.dumps({
                "event_type": SESSIONS[i % 4], "seq": part * 1000 + i, "text": "x" * 100,
                "api_key": "web", "_timestamp": "2026-11-21T10:00:00.000000Z",
            }) + b"\n"
            for i in range(EVENTS // 3)
        ]  # fmt: skip
        name = f"incoming.tok=web-2026-11-21T10-00-0{part}.000.log"
        (incoming / name).write_bytes(b"".join(lines))


def _process(config: Path, api: AddEventsServer | None = None, kill_at: int = 0) -> str:
    """Run ``process --once``; with ``api``, kill it once the API has seen ``kill_at``
    requests. Returns its log."""
    proc = subprocess.Popen(
        [*EVENTPIPE, "process", "--once", "-c", str(config)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env(),
    )  # fmt: skip
    if api is None:
        _, log = proc.communicate(timeout=300)
        assert proc.returncode == 0, log
        return log
    deadline = time.monotonic() + 240
    while len(api.requests) < kill_at and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before the kill: the test proved nothing"
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    return ""


@pytest.mark.slow
def test_a_run_killed_while_sending_resends_only_what_was_in_flight(tmp_path: Path) -> None:
    with addevents_server() as api:
        api.behaviour.delay = 0.03  # a request takes a while: some are in flight at the kill
        data = tmp_path / "data"
        _segments(data)
        config = write_config(
            tmp_path / "eventpipe.yaml", data, 0,
            destinations={"api": {"type": "http", "url": api.url, "group_by": ["event_type"],
                                  "max_payload_bytes": 4000}},
            spark={"master": "local[2]", "spark.sql.shuffle.partitions": 2},
        )  # fmt: skip
        _process(config, api, kill_at=40)
        before = len(api.delivered)
        log = _process(config)
        assert api.violations == []
        seqs = Counter(e["attrs"]["seq"] for e in api.delivered)
        assert sorted(seqs) == list(range(EVENTS))  # nothing lost
        twice = sum(n - 1 for n in seqs.values())
        counted = re.search(r"(\d+) possible duplicate\(s\)", log)
        assert counted is not None, log
        # At most the request each session had in flight at the kill came twice, and
        # the resumed run counted those events.
        assert twice <= int(counted.group(1))
        per_request = max(len(r.events) for r in api.requests)
        assert int(counted.group(1)) <= len(SESSIONS) * per_request
        assert 0 < before < EVENTS  # the kill landed while sending
        assert "skipped as sent before" in log
