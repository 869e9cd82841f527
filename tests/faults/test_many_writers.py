"""Many writers, one log: a collector of two workers on this host and one on a second
"host" write one data directory under concurrent load, each killed with SIGKILL (workers
and all) at random moments and started again. Every acknowledged event is in the sealed
segments and loaded exactly once. Then the second host dies for good: the pipeline seals
what it left once its heartbeat is older than ``incoming.writer_timeout_seconds``.

The second host is a process in mount and UTS namespaces of its own (``unshare -m -u``):
another host name, its own empty ``/tmp``, and the shared directory mounted at another
path, as a second machine with the volume mounted would see it. It shares the network,
so the test reaches its port. ``EVENTPIPE_SOAK_KILLS`` raises the kills (``make soak``).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pytest

from eventpipe.config import parse_config
from eventpipe.log import writers
from eventpipe.paths import DataLayout, SegmentName
from eventpipe.processing.batch.job import process_pending
from tests.faults.test_collector_kill9 import _Load
from tests.process import CollectorProcess, free_port, run, write_config
from tests.standalone import empty_tmp

KILLS = max(8, int(os.environ.get("EVENTPIPE_SOAK_KILLS", "8")) // 5)
OTHER_HOST = "host-b"


def _size(path: Path) -> int:
    """A segment's size; 0 when it was sealed (renamed) since it was listed: the second
    host rotates every 64 KB under load."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _namespace(shared: Path, mount: Path) -> tuple[str, ...]:
    """Run a command as on a second host: ``shared`` mounted at ``mount``, ``/tmp``
    empty, host name OTHER_HOST."""
    script = f'mount --bind {shared} {mount} && {empty_tmp()} && hostname {OTHER_HOST} && exec "$@"'
    return ("unshare", "-m", "-u", "--", "sh", "-c", script, "sh")


def _check_namespaces_work() -> None:
    probe = subprocess.run(["unshare", "-m", "-u", "--", "sh", "-c", "mount -t tmpfs tmpfs /tmp"],
                           capture_output=True, text=True)  # fmt: skip
    assert probe.returncode == 0, (
        "this test runs a second 'host' in mount and UTS namespaces, and `unshare -m -u` "
        f"cannot make them here (it needs root or CAP_SYS_ADMIN): {probe.stderr.strip()}"
    )


@pytest.mark.slow
def test_two_hosts_of_writers_killed_at_random_lose_and_double_nothing(
    tmp_path: Path, spark: Any
) -> None:
    _check_namespaces_work()
    shared = tmp_path / "shared"  # the volume both "hosts" mount
    data = shared / "data"
    data.mkdir(parents=True)
    mount = Path("/var/tmp") / f"eventpipe-host-b-{uuid.uuid4().hex[:8]}"  # outside /tmp
    mount.mkdir()
    incoming = {"max_segment_bytes": 64_000, "writer_timeout_seconds": 10}
    port_a, port_b = free_port(), free_port()
    config_a = write_config(tmp_path / "a.yaml", data, port_a, incoming=incoming,
                            server={"workers": 2})  # fmt: skip
    # Written where the second host sees it: the shared volume, at its own mount path.
    write_config(shared / "b.yaml", mount / "data", port_b, incoming=incoming,
                 server={"workers": 1, "writer_id": "hostb"})  # fmt: skip

    def start(which: str) -> CollectorProcess:
        if which == "a":
            proc = CollectorProcess(config_a, port_a, tmp_path / "a.log")
        else:
            proc = CollectorProcess(mount / "b.yaml", port_b, tmp_path / "b.log",
                                    wrap=_namespace(shared, mount))  # fmt: skip
        proc.wait_ready()
        return proc

    procs = {"a": start("a"), "b": start("b")}
    loads = [_Load(procs["a"].url, "a"), _Load(procs["b"].url, "b")]
    for load in loads:
        load.start()
    rng = random.Random()
    kills: Counter[str] = Counter()
    try:
        for _ in range(KILLS):
            time.sleep(rng.uniform(0.1, 0.6))
            which = rng.choice("ab")
            procs[which].kill()  # SIGKILL to the collector and its workers
            kills[which] += 1
            procs[which] = start(which)
        layout = DataLayout(data)
        deadline = time.monotonic() + 10
        while not any(_size(p) for p in layout.writer_segments("hostb-0")):
            assert time.monotonic() < deadline, "the second host wrote nothing"
            time.sleep(0.05)
        procs["b"].kill()  # the second host is gone for good, mid-segment
        time.sleep(0.3)
    finally:
        for load in loads:
            load.stop()
        if procs["a"].proc.poll() is None:
            procs["a"].signal(signal.SIGTERM)
            assert procs["a"].wait() == 0
        procs["b"].kill()
        subprocess.run(["umount", str(mount)], capture_output=True)  # gone with its namespace
        shutil.rmtree(mount, ignore_errors=True)

    layout = DataLayout(data)
    left = {SegmentName.parse(p.name).writer for p in layout.active_segments()}  # type: ignore[union-attr]
    assert "hostb-0" in left, f"left active: {left}"
    # Host a stopped cleanly: its workers sealed what they wrote. A worker stopped while
    # it was still starting (the last start, on a loaded machine) has not yet sealed what
    # its killed predecessor left: that writer is dead (its lock free), and the run below
    # seals it as it seals any dead writer's segments.
    alive = {w for w in left - {"hostb-0"} if writers.state(layout, w, 10).alive}
    assert not alive, f"host a's writers still hold segments after it stopped: {alive}"
    lock = layout.writer_lock("hostb-0")
    assert writers.state(layout, "hostb-0", 10).host == OTHER_HOST
    assert writers.state(layout, "hostb-0", 10).alive  # its heartbeat is fresh: 10 s to go
    status = run("status", "-c", str(config_a))
    assert "hostb-0" in status.stdout, status.stdout
    assert OTHER_HOST in status.stdout
    old = time.time() - 11
    os.utime(lock, (old, old))  # as if 11 s passed without a heartbeat

    config = parse_config({"data_dir": str(data), "incoming": incoming}, source="test", env={})
    process_pending(config, spark)  # seals what the dead writer left, then loads
    assert layout.active_segments() == []
    assert writers.state(layout, "hostb-0", 10).host == writers.HOST  # taken over
    with duckdb.connect(str(layout.warehouse), read_only=True) as db:
        loaded = Counter(dict(db.execute(
            "SELECT eventn_ctx_event_id, count(*) FROM events GROUP BY 1"
        ).fetchall()))  # fmt: skip
    acked = [i for load in loads for i in load.acked]
    lost = [i for i in acked if loaded[i] == 0]
    duplicates = sum(count - 1 for count in loaded.values() if count > 1)
    by_writer = Counter(
        SegmentName.parse(p.name.removesuffix(".lz4")).writer  # type: ignore[union-attr]
        for p in layout.archive.rglob("incoming.tok=*.lz4")
    )
    print(
        f"\nkills: {dict(kills)}; {len(acked)} acknowledged, {sum(loaded.values())} loaded, "
        f"{duplicates} duplicates, {len(lost)} lost; segments by writer: {dict(by_writer)}"
    )
    assert len(acked) > 1000, "the load was too small to mean anything"
    assert {"hostb-0"} < set(by_writer), "both hosts' writers wrote segments"
    assert lost == []
    assert duplicates == 0
    assert all(orjson.loads(line) for p in layout.failed_received("web")
               for line in p.read_bytes().splitlines())  # fmt: skip
